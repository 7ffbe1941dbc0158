"""Per-call cost of kvscout's Python binding on the CPU (issue 47's goal: <= 2 us, 3 tensors,
median), beside a pure-Python call in the same run as the anchor.

    build/python-venv/bin/python bench/python/call_overhead.py [calls]

Each entry point is called with the smallest inputs it accepts, so the time is the binding's
(tvm-ffi's argument passing, the C++ checks, the part's construction) and not the work."""

import statistics
import sys
import time

import numpy as np

import kvscout
from kvscout import _parts


def per_call_us(f, calls):
    samples = []
    for _ in range(calls // 1000):
        t0 = time.perf_counter_ns()
        for _ in range(1000):
            f()
        samples.append((time.perf_counter_ns() - t0) / 1000 / 1000)
    return statistics.median(samples)


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    scores = np.zeros((1, 1, 1), np.float32)
    lens = np.zeros((1,), np.int32)
    idx = np.zeros((1, 1, 1), np.int32)
    cnt = np.zeros((1, 1), np.int32)
    ws = kvscout.topk_workspace(kvscout.topk_workspace_bytes(1, 1, 1, 1, 1))
    k = np.zeros((1, 1, 1, 64), np.float16)
    kr = np.zeros((1, 1, 1, 64), np.float16)
    vr = np.zeros((1, 1, 1, 64), np.float16)
    q = np.zeros((1, 1, 64), np.float32)
    out = np.zeros((1, 1, 64), np.float32)
    none = np.zeros((0,), np.float16)

    def py_noop(a, b, c):
        return None

    rows = [
        ("pure-Python function, 3 arguments (anchor)", lambda: py_noop(scores, lens, idx)),
        ("device_status_describe(0): an int in, a string out", lambda: _parts._describe(0)),
        ("topk_select, bound entry point: 5 tensors, 4 numbers",
         lambda: _parts._topk_select(scores, lens, idx, cnt, 1, 0, 0, 0.0, ws)),
        ("topk_select, the Python wrapper (checks, caller's buffers)",
         lambda: kvscout.topk_select(scores, lens, 1, indices=idx, counts=cnt, workspace=ws)),
        ("gather, bound entry point: 7 tensors (1 row of head_dim 64)",
         lambda: _parts._gather(0, k, k, lens, idx, cnt, kr, vr, 1)),
        ("decode_attention, bound entry point: 9 tensors (0 rows)",
         lambda: _parts._decode_attention(kr, vr, idx, cnt, q, out, none, none, 0.125, none)),
    ]
    print(f"{'call':62s} median us/call ({calls} calls, batches of 1000)")
    for name, f in rows:
        f()
        print(f"{name:62s} {per_call_us(f, calls):8.3f}")


if __name__ == "__main__":
    main()
