"""kvscout.Gather (gather_executor_host kept across calls): the same rows as gather() and
gather_paged() over several calls with one thread pool; refusals. Seeded."""

import numpy as np
import pytest

import kvscout

S, H, T, D, CAP = 2, 3, 96, 64, 20


def selection(r, lens):
    idx = np.zeros((S, H, CAP), np.int32)
    cnt = np.zeros((S, H), np.int32)
    for s in range(S):
        for h in range(H):
            n = int(r.integers(1, CAP + 1))
            idx[s, h, :n] = np.sort(r.choice(lens[s], n, replace=False))
            cnt[s, h] = n
    return idx, cnt


def test_gather_object_is_the_gather_over_many_calls():
    r = np.random.default_rng(5)
    lens = np.array([96, 41], np.int32)
    k = r.standard_normal((S, H, T, D)).astype(np.float16)
    v = r.standard_normal((S, H, T, D)).astype(np.float16)
    g = kvscout.Gather(S, H, CAP, D, dtype=np.float16, threads=3)
    kv = kvscout.KVView(k, v)
    for _ in range(3):
        idx, cnt = selection(r, lens)
        got = g(kv, idx, cnt, seq_lens=lens)
        want = kvscout.gather(k, v, lens, idx, cnt)
        for s in range(S):
            for h in range(H):
                c = cnt[s, h]
                assert np.array_equal(got[0][s, h, :c], want[0][s, h, :c])
                assert np.array_equal(got[1][s, h, :c], v[s, h, idx[s, h, :c]])
    # Pages, FlashInfer's form: pages of 8 tokens in order.
    pages = k.reshape(S, H, T // 8, 8, D).transpose(0, 2, 1, 3, 4).reshape(-1, H, 8, D).copy()
    vpages = v.reshape(S, H, T // 8, 8, D).transpose(0, 2, 1, 3, 4).reshape(-1, H, 8, D).copy()
    indptr = np.array([0, 12, 18], np.int32)
    ids = np.concatenate([np.arange(12), 12 + np.arange(6)]).astype(np.int32)
    last = np.array([8, 1], np.int32)
    gp = kvscout.Gather(S, H, CAP, D, dtype="float16", layout="hnd", pages="indptr")
    kvp = kvscout.KVView(pages, vpages, "hnd", indptr=indptr, page_ids=ids, last_page_len=last)
    idx, cnt = selection(r, lens)
    kr, vr = gp(kvp, idx, cnt)
    for s in range(S):
        for h in range(H):
            c = cnt[s, h]
            assert np.array_equal(kr[s, h, :c], k[s, h, idx[s, h, :c]])
            assert np.array_equal(vr[s, h, :c], v[s, h, idx[s, h, :c]])


def test_gather_object_refuses_bad_input():
    g = kvscout.Gather(S, H, CAP, D, dtype="float32")
    k = np.zeros((S, H, T, D), np.float32)
    lens = np.array([96, 41], np.int32)
    idx = np.zeros((S, H, CAP), np.int32)
    cnt = np.zeros((S, H), np.int32)
    with pytest.raises(ValueError, match="expected the gather's hnd with pages=None"):
        g(kvscout.KVView(k, k, "nhd"), idx, cnt, seq_lens=lens)
    with pytest.raises(TypeError, match="k_cache: dtype float16, expected float32"):
        g(kvscout.KVView(k.astype(np.float16), k.astype(np.float16)), idx, cnt, seq_lens=lens,
          k_rows=np.zeros((S, H, CAP, D), np.float16), v_rows=np.zeros((S, H, CAP, D), np.float16))
    with pytest.raises(ValueError, match="pages 'vllm', expected None"):
        kvscout.Gather(S, H, CAP, D, dtype="float32", pages="vllm")
    with pytest.raises(ValueError, match=r"k_rows: shape \[2, 3, 20, 64\], "
                                         r"expected \[2, 3, 21, 64\]"):
        g(kvscout.KVView(k, k), np.zeros((S, H, CAP + 1), np.int32), cnt, seq_lens=lens)
    wide = np.zeros((S, H, CAP + 1, D), np.float32)
    with pytest.raises(ValueError, match=r"selection shape \[2, 3, 21\] differs from the "
                                         r"executor's \[2, 3, 20\]"):
        g(kvscout.KVView(k, k), np.zeros((S, H, CAP + 1), np.int32), cnt, seq_lens=lens,
          k_rows=wide, v_rows=wide.copy())
