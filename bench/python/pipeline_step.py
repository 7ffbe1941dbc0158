"""One decode step through presets.Pipeline from Python, against the same step run in C++
(issue 47's goal: <= 1.1x the C++ time). SmolLM2-135M's shape (30 layers, 3 KV heads, 9 query
heads, head_dim 64, d_model 576), one sequence of 4,096 cached tokens, kvscout_default at 10 %,
float16 caches.

    build/python-venv/bin/python bench/python/pipeline_step.py [--tokens 4096] [--reps 21]

The anchor is the same pipeline object, the same arrays, the same calls per layer (speculate of
layer l + 1, attend of layer l) looped in C++ (Pipeline._time_steps); the two alternate, and the
medians are printed with their ratio. What differs is only the Python loop and the binding's
argument passing. Random data, seeded (the step's time does not depend on the values)."""

import argparse
import statistics
import time

import numpy as np

import kvscout
from kvscout import presets

L, H, HQ, D, DM = 30, 3, 9, 64, 576


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    n = a.tokens
    r = np.random.default_rng(0)
    p = presets.preset("kvscout_default", D)
    shape = kvscout.DecodeShape(num_seqs=1, num_kv_heads=H, num_q_heads=HQ, head_dim=D,
                                d_model=DM, max_tokens=n + 1, scale=D ** -0.5, num_layers=L)
    cal = presets.calibrate(p, shape, kvscout.RopeConfig(D),
                            r.standard_normal((L, 64, HQ, D)).astype(np.float32),
                            r.standard_normal((L, 64, H, D)).astype(np.float32))
    w_q = [(r.standard_normal((HQ * D, DM)) / 24).astype(np.float16) for _ in range(L)]
    pipe = presets.Pipeline(p, shape, cal, a.budget, w_q, dtype="float16", threads=a.threads)
    k = r.standard_normal((L, 1, H, n + 1, D)).astype(np.float16)
    v = r.standard_normal((L, 1, H, n + 1, D)).astype(np.float16)
    views = [kvscout.KVView(k[l], v[l]) for l in range(L)]
    ids, pos = np.zeros(n, np.int32), np.arange(n, dtype=np.int32)
    for l in range(L):
        pipe.append(l, np.ascontiguousarray(k[l, 0, :, :n].transpose(1, 0, 2)), ids, pos)
    xs = r.standard_normal((L, 1, DM)).astype(np.float32)
    qs = r.standard_normal((L, 1, HQ, D)).astype(np.float32)
    k_cur = r.standard_normal((L, 1, H, D)).astype(np.float16)
    v_cur = r.standard_normal((L, 1, H, D)).astype(np.float16)
    lens, positions = np.array([n], np.int32), np.array([n], np.int32)
    out = np.zeros((1, HQ, D), np.float32)
    skip = pipe.skip_layers

    def python_step():
        for l in range(L):
            if skip <= l + 1 < L:
                pipe.speculate(l + 1, xs[l], positions, lens, views[l + 1])
            pipe.attend(l, qs[l], lens, views[l], k_cur=k_cur[l], v_cur=v_cur[l], out=out)

    tensors = [view._tensors for view in views]

    def cpp_step():
        return pipe._time_steps(1, xs, qs, positions, lens, tensors, k_cur, v_cur, out, skip)

    python_step(), cpp_step()  # warm-up
    py, cpp = [], []
    for _ in range(a.reps):
        t0 = time.perf_counter_ns()
        python_step()
        py.append((time.perf_counter_ns() - t0) / 1e3)
        cpp.append(cpp_step() / 1e3)
    st = pipe.stats()
    rows = st.rows[skip:].sum() / (len(py) + len(cpp) + 2) / (L - skip) / H
    mp, mc = statistics.median(py), statistics.median(cpp)
    print(f"kvscout_default, SmolLM2-135M shape, {n} tokens, budget {a.budget}, float16 caches, "
          f"{a.threads} thread(s); {rows:.0f} rows per (layer, KV head) of {n}")
    print(f"{'one step':<40} {'median us':>10}")
    print(f"{'C++ loop over the same calls (anchor)':<40} {mc:>10.1f}")
    print(f"{'Python loop through the binding':<40} {mp:>10.1f}")
    print(f"ratio Python / C++: {mp / mc:.3f} (goal <= 1.1); binding cost per layer "
          f"{(mp - mc) / L:.1f} us")


if __name__ == "__main__":
    main()
