"""kvscout's Python package, host backend: each bound part against an independent NumPy reference
(top-k with the library's tie rule, the gather as fancy indexing, attention in float64), and its
refusals of bad input. Seeded."""

import math

import numpy as np
import pytest

import kvscout

RNG_SEED = 2026


def rng():
    return np.random.default_rng(RNG_SEED)


# ---- top-k ------------------------------------------------------------------------------------


def row_budget(budget, share, keep, n):
    """select/concepts.hpp's row_budget, restated."""
    if not share > 0:
        return budget
    b = max(0, math.ceil(share * n - 1e-9))
    return min(max(b, keep.sinks + keep.recent), budget)


def topk_reference(scores, lens, budget, keep, share=0.0):
    """Per row: every token if the row fits, else the keep-set and the best other tokens, ties to
    the lower index, NaN never chosen by score; ascending."""
    S, H, _ = scores.shape
    out = {}
    for s in range(S):
        n = int(lens[s])
        b = row_budget(budget, share, keep, n)
        for h in range(H):
            if n <= b:
                out[s, h] = list(range(n))
                continue
            head = min(keep.sinks, n)
            tail = max(head, n - keep.recent)
            kept = list(range(head)) + list(range(tail, n))
            cand = [t for t in range(head, tail) if not np.isnan(scores[s, h, t])]
            cand.sort(key=lambda t: (-scores[s, h, t], t))
            out[s, h] = sorted(kept + cand[: b - len(kept)])
    return out


@pytest.mark.parametrize("share", [0.0, 0.3])
def test_topk_matches_reference(share):
    r = rng()
    S, H, T = 3, 2, 200
    scores = r.standard_normal((S, H, T)).astype(np.float32)
    scores[0, 0, 50:60] = 1.5  # ties: the lower indices win
    scores[1, 1, 7] = np.nan
    scores[2, 0, 100] = -np.inf
    lens = np.array([200, 37, 120], dtype=np.int32)
    keep = kvscout.KeepSet(4, 16)
    idx, cnt = kvscout.topk_select(scores, lens, budget=48, keep=keep, budget_share=share)
    want = topk_reference(scores, lens, 48, keep, share)
    for (s, h), rows in want.items():
        assert cnt[s, h] == len(rows)
        assert idx[s, h, : cnt[s, h]].tolist() == rows


def test_topk_caller_buffers_and_workspace():
    r = rng()
    scores = r.standard_normal((1, 1, 64)).astype(np.float32)
    lens = np.array([64], dtype=np.int32)
    nbytes = kvscout.topk_workspace_bytes(1, 1, 64, 16, 8)
    ws = kvscout.topk_workspace(nbytes)
    idx = np.full((1, 1, 16), -7, dtype=np.int32)
    cnt = np.zeros((1, 1), dtype=np.int32)
    got = kvscout.topk_select(scores, lens, 8, indices=idx, counts=cnt, workspace=ws)
    assert got[0] is idx and got[1] is cnt
    assert cnt[0, 0] == 8 and (idx[0, 0, 8:] == -7).all()  # past the count: untouched
    assert idx[0, 0, :8].tolist() == sorted(np.argsort(-scores[0, 0], kind="stable")[:8].tolist())


# ---- the gather -------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["hnd", "nhd"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("D", [64, 128])
def test_gather_is_fancy_indexing(layout, dtype, D):
    r = rng()
    S, H, T, cap = 2, 3, 50, 12
    shape = (S, H, T, D) if layout == "hnd" else (S, T, H, D)
    k = r.standard_normal(shape).astype(dtype)
    v = r.standard_normal(shape).astype(dtype)
    lens = np.array([50, 20], dtype=np.int32)
    idx = np.zeros((S, H, cap), dtype=np.int32)
    cnt = np.zeros((S, H), dtype=np.int32)
    for s in range(S):
        for h in range(H):
            n = int(r.integers(0, cap + 1))
            idx[s, h, :n] = np.sort(r.choice(lens[s], size=n, replace=False))
            cnt[s, h] = n
    kr, vr = kvscout.gather(k, v, lens, idx, cnt, layout=layout, threads=2)
    for s in range(S):
        for h in range(H):
            sel = idx[s, h, : cnt[s, h]]
            ks = k[s, h, sel] if layout == "hnd" else k[s, sel, h]
            vs = v[s, h, sel] if layout == "hnd" else v[s, sel, h]
            assert np.array_equal(kr[s, h, : cnt[s, h]], ks)
            assert np.array_equal(vr[s, h, : cnt[s, h]], vs)


# ---- attention --------------------------------------------------------------------------------


def attention_reference(kr, vr, cnt, q, scale, k_cur=None, v_cur=None):
    S, Hq, D = q.shape
    H = kr.shape[1]
    g = Hq // H
    out = np.zeros((S, Hq, D))
    for s in range(S):
        for qh in range(Hq):
            h = qh // g
            K = kr[s, h, : cnt[s, h]].astype(np.float64)
            V = vr[s, h, : cnt[s, h]].astype(np.float64)
            if k_cur is not None:
                K = np.vstack([K, k_cur[s, h].astype(np.float64)])
                V = np.vstack([V, v_cur[s, h].astype(np.float64)])
            if len(K) == 0:
                continue
            logits = K @ q[s, qh].astype(np.float64) * scale
            p = np.exp(logits - logits.max())
            out[s, qh] = p @ V / p.sum()
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("current", [False, True])
def test_attention_matches_float64(dtype, current):
    r = rng()
    S, H, g, cap, D = 2, 2, 4, 24, 64
    kr = r.standard_normal((S, H, cap, D)).astype(dtype)
    vr = r.standard_normal((S, H, cap, D)).astype(dtype)
    idx = np.tile(np.arange(cap, dtype=np.int32), (S, H, 1))
    cnt = np.array([[24, 5], [1, 17]], dtype=np.int32)
    q = r.standard_normal((S, H * g, D)).astype(np.float32)
    kc = r.standard_normal((S, H, D)).astype(dtype) if current else None
    vc = r.standard_normal((S, H, D)).astype(dtype) if current else None
    out = kvscout.decode_attention(kr, vr, idx, cnt, q, 0.125, k_cur=kc, v_cur=vc)
    want = attention_reference(kr, vr, cnt, q, 0.125, kc, vc)
    assert np.abs(out - want).max() < 1e-5


def test_one_step_select_gather_attend():
    """The three parts as a step: attention over the gathered top-k rows equals the reference
    over the same rows read straight from the cache."""
    r = rng()
    S, H, g, T, D = 2, 2, 2, 300, 128
    k = r.standard_normal((S, H, T, D)).astype(np.float16)
    v = r.standard_normal((S, H, T, D)).astype(np.float16)
    lens = np.array([300, 140], dtype=np.int32)
    q = r.standard_normal((S, H * g, D)).astype(np.float32)
    scores = np.einsum("shtd,shd->sht", k.astype(np.float32), q[:, ::g]).astype(np.float32)
    idx, cnt = kvscout.topk_select(scores, lens, budget=32, keep=kvscout.KeepSet(4, 8))
    kr, vr = kvscout.gather(k, v, lens, idx, cnt)
    out = kvscout.decode_attention(kr, vr, idx, cnt, q, 1 / math.sqrt(D))
    direct_k = np.zeros_like(kr)
    direct_v = np.zeros_like(vr)
    for s in range(S):
        for h in range(H):
            sel = idx[s, h, : cnt[s, h]]
            direct_k[s, h, : len(sel)] = k[s, h, sel]
            direct_v[s, h, : len(sel)] = v[s, h, sel]
    want = attention_reference(direct_k, direct_v, cnt, q, 1 / math.sqrt(D))
    assert (cnt == 32).all()
    assert np.abs(out - want).max() < 1e-5


# ---- bad input: an exception naming the value, never a crash ------------------------------------


def small_case():
    r = rng()
    k = r.standard_normal((1, 1, 16, 64)).astype(np.float32)
    lens = np.array([16], dtype=np.int32)
    idx = np.zeros((1, 1, 4), dtype=np.int32)
    cnt = np.zeros((1, 1), dtype=np.int32)
    return k, lens, idx, cnt


def test_bad_dtypes_raise_type_error():
    k, lens, idx, cnt = small_case()
    scores = np.zeros((1, 1, 16), dtype=np.float64)
    with pytest.raises(TypeError, match="scores: dtype float64, expected float32"):
        kvscout.topk_select(scores, lens, 4)
    with pytest.raises(TypeError, match="seq_lens: dtype int64, expected int32"):
        kvscout.topk_select(scores.astype(np.float32), lens.astype(np.int64), 4)
    with pytest.raises(TypeError, match="k_cache: dtype int32, expected float32, float16 or"):
        kvscout.gather(k.astype(np.int32), k.astype(np.int32), lens, idx, cnt)
    with pytest.raises(TypeError, match="v_cache / k_rows / v_rows must be too, got float16"):
        kvscout.gather(k, k.astype(np.float16), lens, idx, cnt)


def test_bad_shapes_and_layouts_raise_value_error():
    k, lens, idx, cnt = small_case()
    with pytest.raises(ValueError, match=r"head_dim 32 was not built, expected 64 or 128"):
        kvscout.gather(k[..., :32].copy(), k[..., :32].copy(), lens, idx, cnt)
    with pytest.raises(ValueError, match=r"k_cache: not contiguous"):
        kvscout.gather(k[:, :, ::2], k[:, :, ::2], lens, idx, cnt)
    with pytest.raises(ValueError, match=r"seq_lens: shape \[2\], expected \[1\]"):
        kvscout.gather(k, k, np.array([16, 16], dtype=np.int32), idx, cnt)
    with pytest.raises(ValueError, match=r"layout 'nchw', expected 'hnd' or 'nhd'"):
        kvscout.gather(k, k, lens, idx, cnt, layout="nchw")
    with pytest.raises(ValueError, match=r"counts: shape \[1, 2\], expected \[1, 1\]"):
        kvscout.gather(k, k, lens, idx, np.zeros((1, 2), dtype=np.int32))


def test_library_errors_reach_python():
    k, lens, idx, cnt = small_case()
    scores = np.zeros((1, 1, 16), dtype=np.float32)
    # The C++ part's own check, its message verbatim.
    with pytest.raises(ValueError, match="budget"):
        kvscout.topk_select(scores, lens, budget=2, keep=kvscout.KeepSet(4, 4))
    with pytest.raises(ValueError, match="budget = 1099511627776 does not fit a 32-bit int"):
        kvscout.topk_select(scores, lens, budget=2**40, capacity=4, indices=idx, counts=cnt,
                            workspace=kvscout.topk_workspace(4096))
    cnt[0, 0] = 1
    idx[0, 0, 0] = 99  # past the sequence's 16 tokens
    with pytest.raises(ValueError, match="99"):
        kvscout.gather(k, k, lens, idx, cnt)
    with pytest.raises(ValueError, match="workspace"):
        kvscout.topk_select(scores, lens, 4, workspace=kvscout.topk_workspace(8))
    with pytest.raises(ValueError, match="k_cur and v_cur"):
        kvscout.decode_attention(k, k, idx, cnt, np.zeros((1, 1, 64), np.float32), 1.0,
                                 k_cur=k[0, :, 0])


def test_device_status_words():
    assert kvscout.device_status_describe(0) == "ok"
    assert "token index out of range" in kvscout.device_status_describe(1)


def test_aliased_outputs_are_refused():
    """An output that shares memory with an input or another output would change what was
    checked while the part runs: refused, naming both."""
    k, lens, idx, cnt = small_case()
    scores = np.zeros((1, 1, 16), dtype=np.float32)
    with pytest.raises(ValueError, match="the output counts shares memory with the input seq_lens"):
        kvscout.topk_select(scores, lens, 4, indices=idx, counts=lens.reshape(1, 1),
                            workspace=kvscout.topk_workspace(4096))
    ws = kvscout.topk_workspace(4096)
    with pytest.raises(ValueError, match="indices and workspace share memory"):
        kvscout.topk_select(scores, lens, 4, indices=ws[:16].view(np.int32).reshape(1, 1, 4),
                            counts=cnt, workspace=ws)
    kr = np.zeros((1, 1, 4, 64), np.float32)
    q = np.zeros((1, 1, 64), np.float32)
    with pytest.raises(ValueError, match="the output out shares memory with the input k_rows"):
        kvscout.decode_attention(kr, np.zeros_like(kr), idx, cnt, q, 1.0, out=kr[0, :, 0:1, :])
    with pytest.raises(ValueError, match="k_rows and v_rows share memory"):
        kvscout.gather(k, k, lens, idx, cnt, k_rows=kr, v_rows=kr)
    with pytest.raises(ValueError, match="the output v_rows shares memory with the input seq_lens"):
        rows = np.zeros((1, 1, 4, 64), np.float32)
        kvscout.gather(k, k, rows.reshape(-1)[:1].view(np.int32), idx, cnt, v_rows=rows)
    table = np.zeros((1, 2), np.int32)
    pages = np.zeros((2, 8, 1, 64), np.float32)
    with pytest.raises(ValueError, match="the output k_rows shares memory with the input block_table"):
        kr2 = np.zeros((1, 1, 4, 64), np.float32)
        kvscout.gather_paged(pages, pages, idx, cnt, block_table=kr2.reshape(-1)[:2].view(np.int32)
                             .reshape(1, 2), seq_lens=np.array([16], np.int32), k_rows=kr2)


def test_read_only_and_empty_arrays():
    k, lens, idx, cnt = small_case()
    scores = np.zeros((1, 1, 16), dtype=np.float32)
    scores.flags.writeable = False
    with pytest.raises(ValueError, match="scores: a read-only NumPy array"):
        kvscout.topk_select(scores, lens, 4)
    with pytest.raises(ValueError, match=r"scores: shape \[16\], expected \[S, H, T\]"):
        kvscout.topk_select(np.zeros(16, np.float32), lens, 4)
    # No sequences: nothing to do, nothing written, no error.
    i0, c0 = kvscout.topk_select(np.zeros((0, 1, 16), np.float32), np.zeros(0, np.int32), 4)
    assert i0.shape == (0, 1, 4) and c0.shape == (0, 1)
    kr, vr = kvscout.gather(np.zeros((0, 1, 16, 64), np.float32), np.zeros((0, 1, 16, 64), np.float32),
                            np.zeros(0, np.int32), i0, c0)
    assert kr.shape == (0, 1, 4, 64)


def test_torch_tensors_where_torch_is_installed():
    """CPU torch tensors take the same path as NumPy (DLPack), bfloat16 included; a CUDA tensor is
    refused by name in this host-only build. Skipped where torch is not installed (CI installs
    only NumPy)."""
    torch = pytest.importorskip("torch")
    r = rng()
    k = torch.from_numpy(r.standard_normal((2, 2, 40, 64)).astype(np.float32)).to(torch.bfloat16)
    lens = torch.tensor([40, 17], dtype=torch.int32)
    scores = torch.from_numpy(r.standard_normal((2, 2, 40)).astype(np.float32))
    idx, cnt = kvscout.topk_select(scores, lens, budget=8, keep=kvscout.KeepSet(1, 2))
    assert isinstance(idx, torch.Tensor) and idx.dtype == torch.int32
    kr, vr = kvscout.gather(k, k.clone(), lens, idx, cnt)
    for s in range(2):
        for h in range(2):
            sel = idx[s, h, : cnt[s, h]].long()
            assert torch.equal(kr[s, h, : cnt[s, h]], k[s, h, sel])
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="expected a CPU tensor"):
            kvscout.topk_select(scores.cuda(), lens.cuda(), 8)


# ---- the paged gather -------------------------------------------------------------------------


def paged_case(layout, dtype, D, r):
    """A cache of 9 pages of 8 tokens for 2 sequences (26 and 13 tokens), pages scattered, and a
    random selection; the tokens as a dense [S, H, T, D] array for the reference."""
    S, H, page, P = 2, 2, 8, 9
    lens = np.array([26, 13], dtype=np.int32)
    table = np.array([[7, 2, 5, 0], [3, 8, 0, 0]], dtype=np.int32)  # block table, 4 per sequence
    shape = (P, page, H, D) if layout == "nhd" else (P, H, page, D)
    k = r.standard_normal(shape).astype(dtype)
    v = r.standard_normal(shape).astype(dtype)
    dense_k = np.zeros((S, H, 32, D), dtype)
    dense_v = np.zeros_like(dense_k)
    for s in range(S):
        for t in range(lens[s]):
            p, o = table[s, t // page], t % page
            dense_k[s, :, t] = k[p, o] if layout == "nhd" else k[p, :, o]
            dense_v[s, :, t] = v[p, o] if layout == "nhd" else v[p, :, o]
    cap = 6
    idx = np.zeros((S, H, cap), np.int32)
    cnt = np.zeros((S, H), np.int32)
    for s in range(S):
        for h in range(H):
            n = int(r.integers(1, cap + 1))
            idx[s, h, :n] = np.sort(r.choice(lens[s], size=n, replace=False))
            cnt[s, h] = n
    return k, v, lens, table, dense_k, dense_v, idx, cnt


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("form", ["block_table", "indptr"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_paged_gather_is_fancy_indexing(layout, form, dtype):
    r = rng()
    k, v, lens, table, dk, dv, idx, cnt = paged_case(layout, dtype, 64, r)
    if form == "block_table":
        tables = dict(block_table=table, seq_lens=lens)
    else:  # the same pages in FlashInfer's CSR form
        pages = [table[s, : (lens[s] + 7) // 8] for s in range(2)]
        tables = dict(indptr=np.array([0, len(pages[0]), len(pages[0]) + len(pages[1])], np.int32),
                      page_ids=np.concatenate(pages).astype(np.int32),
                      last_page_len=np.array([(n - 1) % 8 + 1 for n in lens], np.int32))
    kr, vr = kvscout.gather_paged(k, v, idx, cnt, layout=layout, **tables)
    for s in range(2):
        for h in range(2):
            sel = idx[s, h, : cnt[s, h]]
            assert np.array_equal(kr[s, h, : cnt[s, h]], dk[s, h, sel])
            assert np.array_equal(vr[s, h, : cnt[s, h]], dv[s, h, sel])


def test_paged_gather_refuses_bad_tables():
    r = rng()
    k, v, lens, table, _, _, idx, cnt = paged_case("nhd", np.float32, 64, r)
    with pytest.raises(ValueError, match="pass block_table and seq_lens"):
        kvscout.gather_paged(k, v, idx, cnt, block_table=table)
    bad = table.copy()
    bad[0, 1] = 40  # a page id past the 9 pages
    with pytest.raises(ValueError, match="40"):
        kvscout.gather_paged(k, v, idx, cnt, block_table=bad, seq_lens=lens)
    with pytest.raises(ValueError, match=r"indptr\[2\] = 9 pages, page_ids holds 5"):
        kvscout.gather_paged(k, v, idx, cnt, indptr=np.array([0, 4, 9], np.int32),
                             page_ids=np.zeros(5, np.int32),
                             last_page_len=np.array([2, 5], np.int32))
    with pytest.raises(ValueError, match=r"indptr\[0\] = 3, indptr\[1\] = 1"):
        kvscout.gather_paged(k, v, idx, cnt, indptr=np.array([3, 1, 4], np.int32),
                             page_ids=np.zeros(5, np.int32),
                             last_page_len=np.array([2, 5], np.int32))


# ---- the correction step's selection ------------------------------------------------------------


@pytest.mark.parametrize("share", [0.0, 0.2])
def test_correction_adds_the_best_missed_rows(share):
    """The rows the speculation missed, best late score first (ties to the lower index, NaN
    never), extra at most, or up to ceil(total_share * len) rows in all."""
    r = rng()
    S, H, T = 2, 2, 120
    late = r.standard_normal((S, H, T)).astype(np.float32)
    late[0, 1, 30:40] = 2.0  # ties
    late[1, 0, 5] = np.nan
    lens = np.array([120, 9], dtype=np.int32)
    spec_scores = r.standard_normal((S, H, T)).astype(np.float32)
    si, sc = kvscout.topk_select(spec_scores, lens, budget=16, keep=kvscout.KeepSet(2, 2))
    extra = 8
    idx, cnt = kvscout.correction_select(late, lens, si, sc, extra, total_share=share)
    for s in range(S):
        n = int(lens[s])
        for h in range(H):
            taken = set(si[s, h, : sc[s, h]].tolist())
            want_n = extra if share == 0 else max(0, min(extra, row_budget(n, share,
                                                                       kvscout.KeepSet(), n)
                                                        - len(taken)))
            missed = [t for t in range(n) if t not in taken]
            if len(missed) > want_n:
                missed = [t for t in missed if not np.isnan(late[s, h, t])]
                missed.sort(key=lambda t: (-late[s, h, t], t))
                missed = missed[:want_n]
            assert idx[s, h, : cnt[s, h]].tolist() == sorted(missed)
            assert not taken & set(idx[s, h, : cnt[s, h]].tolist())


def test_correction_refuses_bad_input():
    r = rng()
    late = r.standard_normal((1, 1, 32)).astype(np.float32)
    lens = np.array([32], np.int32)
    si, sc = kvscout.topk_select(late, lens, budget=4)
    with pytest.raises(ValueError, match="extra = 0 must be in"):
        kvscout.correction_select(late, lens, si, sc, 0)
    with pytest.raises(ValueError, match="total_share = 1.5"):
        kvscout.correction_select(late, lens, si, sc, 4, total_share=1.5)
    with pytest.raises(ValueError, match=r"a selection of \[2, 1, capacity\]"):
        kvscout.correction_select(late, lens, np.zeros((2, 1, 4), np.int32),
                                  np.zeros((2, 1), np.int32), 4)
    with pytest.raises(ValueError, match="the output indices shares memory with the input "
                                         "spec_indices"):
        kvscout.correction_select(late, lens, si, sc, 4, indices=si,
                                  counts=np.zeros((1, 1), np.int32),
                                  workspace=kvscout.topk_workspace(1 << 16))
