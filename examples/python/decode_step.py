"""One decode step of one attention layer through kvscout's Python package, on CPU arrays: the
step examples/02_cuda_decode_step.cu runs on the device. The layer's KV cache sits in host memory;
InfiniGen's speculation guesses which cached tokens the layer will attend to and only their K/V
rows are fetched:

  1. speculate  InfiniGenPolicy: a partial query (r of head_dim channels) from the hidden state,
                scored against the partial key cache
  2. select     topk_select: the best `budget` tokens per (sequence, KV head)
  3. fetch      gather: only the selected rows
  4. attend     decode_attention over the fetched rows and the new token

It prints the rows and bytes fetched against a dense fetch, and the share of each query head's
attention mass (softmax over every cached row, in NumPy) that the fetched rows hold, beside as
many rows chosen at random.

    build/python-venv/bin/python examples/python/decode_step.py
"""

import numpy as np

import kvscout

S, H, HQ, D, D_MODEL = 2, 2, 8, 64, 256  # 2 sequences, GQA: 4 query heads per KV head
MAX_TOKENS, R, BUDGET = 1024, 16, 64      # cache slots, partial dimension, rows per head
SCALE = 1 / np.sqrt(D)


def rope(v, pos, theta=10000.0):
    """RoPE of v [..., D] at position pos, split-half planes (j, j + D / 2)."""
    j = np.arange(D // 2)
    ang = pos * theta ** (-2.0 * j / D)
    a, b = v[..., : D // 2], v[..., D // 2 :]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)], -1)


def main():
    rng = np.random.default_rng(2025)
    lens = np.array([1000, 613], dtype=np.int32)  # cached tokens per sequence

    # The layer's offloaded cache [S, H, max_tokens, D] (fp16, keys after RoPE, with a few large
    # channels, RoPE planes 0-7, as real keys have), and the prefill's keys as the model made
    # them: [tokens, H, D] with each token's sequence and position.
    k_cache = np.zeros((S, H, MAX_TOKENS, D), np.float16)
    v_cache = np.zeros_like(k_cache)
    big = np.where(np.arange(D) % 32 < 8, 3.0, 1.0)
    for s in range(S):
        k_cache[s, :, : lens[s]] = rng.standard_normal((H, lens[s], D)) * big
        v_cache[s, :, : lens[s]] = rng.standard_normal((H, lens[s], D))
    prefill_keys = np.ascontiguousarray(
        np.concatenate([k_cache[s, :, : lens[s]].transpose(1, 0, 2) for s in range(S)]))
    seq_ids = np.concatenate([np.full(n, s, np.int32) for s, n in enumerate(lens)])
    token_ids = np.concatenate([np.arange(n, dtype=np.int32) for n in lens])

    # The layer's W_Q and this step's inputs: the hidden state x the speculation reads, the
    # layer's query RoPE(W_Q x) at the new token's position (an engine computes it from layer i's
    # own input; this example reuses x) and the new token's K / V.
    w_q = (rng.standard_normal((HQ * D, D_MODEL)) / np.sqrt(D_MODEL)).astype(np.float32)
    x = rng.standard_normal((S, D_MODEL)).astype(np.float32)
    q = np.stack([rope((w_q @ x[s]).reshape(HQ, D), lens[s]) for s in range(S)]).astype(np.float32)
    k_new = rng.standard_normal((S, H, D)).astype(np.float16)
    v_new = rng.standard_normal((S, H, D)).astype(np.float16)

    # ---- set-up: the shape, the policy with its plans (RoPE planes 0-7 of each KV head: what
    # calibration finds on real activations, where the keys are large), its prefill ------------
    shape = kvscout.DecodeShape(num_seqs=S, num_kv_heads=H, num_q_heads=HQ, head_dim=D,
                                d_model=D_MODEL, max_tokens=MAX_TOKENS, scale=SCALE)
    plans = kvscout.rope_planes_plans(kvscout.RopeConfig(D), np.tile(np.arange(R // 2), (H, 1)))
    policy = kvscout.InfiniGenPolicy(shape, plans, w_q)
    policy.append(prefill_keys, seq_ids, token_ids)
    keep = kvscout.KeepSet(sinks=4, recent=16)

    # ---- the decode step ----------------------------------------------------------------------
    scores = policy.score(x, lens, lens)  # the new token's position is its sequence's length
    idx, cnt = kvscout.topk_select(scores, lens, budget=BUDGET, keep=keep)
    k_rows, v_rows = kvscout.gather(k_cache, v_cache, lens, idx, cnt, layout="hnd")
    out = kvscout.decode_attention(k_rows, v_rows, idx, cnt, q, SCALE, k_cur=k_new, v_cur=v_new)

    # ---- what crossed the link, and how close it came -----------------------------------------
    fetched, total = int(cnt.sum()), int(lens.sum()) * H
    row_bytes = 2 * D * k_cache.itemsize  # a K row and a V row
    print(f"rows fetched: {fetched} of {total} cached rows ({100 * fetched / total:.1f}%), "
          f"{BUDGET} per (sequence, KV head)")
    print(f"bytes moved:  {fetched * row_bytes} of {total * row_bytes} for a dense fetch")
    # The attention mass the fetched rows hold: each query head's softmax over every cached row
    # (NumPy, float64), summed over the rows its KV head fetched; a random choice of as many rows
    # per head is the anchor.
    covered, anchor = [], []
    for s in range(S):
        n = int(lens[s])
        for qh in range(HQ):
            h = qh // (HQ // H)
            logits = k_cache[s, h, :n].astype(np.float64) @ q[s, qh] * SCALE
            p = np.exp(logits - logits.max())
            p /= p.sum()
            covered.append(p[idx[s, h, : cnt[s, h]]].sum())
            anchor.append(p[rng.choice(n, size=int(cnt[s, h]), replace=False)].sum())
    print(f"attention mass on the fetched rows: {np.mean(covered):.3f} "
          f"(as many rows chosen at random: {np.mean(anchor):.3f})")

if __name__ == "__main__":
    main()
