"""presets.Pipeline (presets::pipeline_host) from Python: a whole step over a small model's layers
is bit for bit the parts composed by hand in Python (policy_for_layer, topk_select, gather,
score_query, correction_select, decode_attention); each cache layout gives the same bits; the
statistics count what was fetched; bad input raises. Seeded."""

import dataclasses

import numpy as np
import pytest

import kvscout
from kvscout import presets

pytestmark = pytest.mark.skipif(not presets.calibration_available(), reason="built without Eigen")

L, H, G, D, DM, T = 4, 2, 2, 64, 32, 256
LENS = np.array([200, 131], np.int32)
S = len(LENS)


@dataclasses.dataclass
class Model:
    p: presets.SpeculationPreset
    shape: kvscout.DecodeShape
    cal: presets.Calibration
    w_q: list
    k: np.ndarray  # [L, S, H, T, D] (HND caches per layer)
    v: np.ndarray
    x: np.ndarray  # [L, S, DM]
    q: np.ndarray  # [L, S, Hq, D]
    k_cur: np.ndarray  # [L, S, H, D]
    v_cur: np.ndarray


def model(name="kvscout_default", dtype=np.float32, seed=11):
    r = np.random.default_rng(seed)
    p = presets.preset(name, D)
    shape = kvscout.DecodeShape(num_seqs=S, num_kv_heads=H, num_q_heads=H * G, head_dim=D,
                                d_model=DM, max_tokens=T, scale=D ** -0.5, num_layers=L)
    cq = r.standard_normal((L, 64, H * G, D)).astype(np.float32)
    cq[..., 3] *= 3
    ck = r.standard_normal((L, 64, H, D)).astype(np.float32)
    cal = presets.calibrate(p, shape, kvscout.RopeConfig(D), cq, ck)
    w_q = [(r.standard_normal((H * G * D, DM)) / 5).astype(np.float32) for _ in range(L)]
    k = r.standard_normal((L, S, H, T, D)).astype(dtype)
    k[..., 3] *= 2
    v = r.standard_normal((L, S, H, T, D)).astype(dtype)
    return Model(p, shape, cal, w_q, k, v, r.standard_normal((L, S, DM)).astype(np.float32),
                 r.standard_normal((L, S, H * G, D)).astype(np.float32),
                 r.standard_normal((L, S, H, D)).astype(dtype),
                 r.standard_normal((L, S, H, D)).astype(dtype))


def keys_of(m, l):
    """Layer l's cached keys as append() takes them: [n, H, D], sequence ids and positions."""
    ks = [m.k[l, s, :, :LENS[s]].transpose(1, 0, 2) for s in range(S)]
    ids = np.concatenate([np.full(LENS[s], s, np.int32) for s in range(S)])
    pos = np.concatenate([np.arange(LENS[s], dtype=np.int32) for s in range(S)])
    return np.ascontiguousarray(np.concatenate(ks).astype(np.float32)), ids, pos


def run_pipeline(m, pipe, views):
    for l in range(L):
        pipe.append(l, *keys_of(m, l))
    outs = []
    for l in range(L):
        if l + 1 < L and l + 1 >= m.p.skip_layers:
            pipe.speculate(l + 1, m.x[l], LENS, LENS, views[l + 1])
        outs.append(pipe.attend(l, m.q[l], LENS, views[l], k_cur=m.k_cur[l], v_cur=m.v_cur[l]))
    return outs


def by_hand(m, l, pipe_budgets):
    """Layer l's attention from the bound parts, as pipeline_host composes them."""
    lens = LENS
    kv = (m.k[l], m.v[l])
    if l < m.p.skip_layers:  # dense: every cached row
        idx = np.zeros((S, H, T), np.int32)
        cnt = np.zeros((S, H), np.int32)
        for s in range(S):
            idx[s, :, :lens[s]] = np.arange(lens[s])
            cnt[s] = lens[s]
        kr, vr = kvscout.gather(*kv, lens, idx, cnt, "hnd")
        return kvscout.decode_attention(kr, vr, idx, cnt, m.q[l], m.shape.scale, k_cur=m.k_cur[l],
                                        v_cur=m.v_cur[l]), None
    pol = presets.policy_for_layer(m.p, m.shape, m.cal, l, m.w_q[l])
    pol.append(*keys_of(m, l))
    scores = pol.score(m.x[l - 1], lens, lens)
    idx, cnt = kvscout.topk_select(scores, lens, **pipe_budgets.selector_args(l))
    kr, vr = kvscout.gather(*kv, lens, idx, cnt, "hnd")
    if pipe_budgets.correction_capacity == 0:
        return kvscout.decode_attention(kr, vr, idx, cnt, m.q[l], m.shape.scale,
                                        k_cur=m.k_cur[l], v_cur=m.v_cur[l]), (idx, cnt, None)
    late = pol.score_query(m.q[l], lens)
    aidx, acnt = kvscout.correction_select(late, lens, idx, cnt, **pipe_budgets.correction_args(l))
    ak, av = kvscout.gather(*kv, lens, aidx, acnt, "hnd")
    cap, extra = idx.shape[2], aidx.shape[2]
    ji = np.zeros((S, H, cap + extra), np.int32)
    jk = np.zeros((S, H, cap + extra, D), kr.dtype)
    jv = np.zeros_like(jk)
    for s in range(S):
        for h in range(H):
            a, b = cnt[s, h], acnt[s, h]
            ji[s, h, :a], ji[s, h, a:a + b] = idx[s, h, :a], aidx[s, h, :b]
            jk[s, h, :a], jk[s, h, a:a + b] = kr[s, h, :a], ak[s, h, :b]
            jv[s, h, :a], jv[s, h, a:a + b] = vr[s, h, :a], av[s, h, :b]
    out = kvscout.decode_attention(jk, jv, ji, cnt + acnt, m.q[l], m.shape.scale,
                                   k_cur=m.k_cur[l], v_cur=m.v_cur[l])
    return out, (idx, cnt, acnt)


@pytest.mark.parametrize("name,dtype", [("kvscout_default", np.float32),
                                        ("kvscout_speculation_only", np.float16)])
def test_a_step_is_the_parts_composed_by_hand(name, dtype):
    m = model(name, dtype)
    pipe = presets.Pipeline(m.p, m.shape, m.cal, 0.1, m.w_q, dtype=dtype, layout="hnd")
    assert pipe.rotated_keys and pipe.budgets.capacity > 0
    views = [kvscout.KVView(m.k[l], m.v[l], "hnd") for l in range(L)]
    outs = run_pipeline(m, pipe, views)
    st = pipe.stats()
    for l in range(L):
        want, sel = by_hand(m, l, pipe.budgets)
        assert np.array_equal(outs[l], want), f"layer {l}"
        if sel is None:
            assert st.rows[l] == 0
            continue
        got_idx, got_cnt = pipe.last_selection(l)
        assert np.array_equal(got_cnt, sel[1])
        for s in range(S):
            for h in range(H):
                c = sel[1][s, h]
                assert np.array_equal(got_idx[s, h, :c], sel[0][s, h, :c])
        fetched = sel[1].sum()
        if sel[2] is not None:
            assert st.corrected[l] == sel[2].sum()
            fetched += st.corrected[l]
        assert st.rows[l] == fetched
        assert st.bytes[l] == fetched * 2 * D * np.dtype(dtype).itemsize
    # The share of the rows each (sequence, head) fetched: the budget's, less than dense.
    assert st.rows[m.p.skip_layers:].sum() < 0.5 * H * LENS.sum() * (L - m.p.skip_layers)
    if pipe.budgets.correction_capacity:
        ai, ac = pipe.last_correction()
        assert ac.sum() == st.corrected[L - 1] and st.corrected.sum() > 0
    else:
        assert pipe.last_correction() is None


def paged(k, v, page, order, form, rng):
    """k / v [S, H, T, D] as shuffled pages of `page` tokens, NHD or HND, with vLLM's block table
    or FlashInfer's indptr form."""
    blocks = [-(-int(n) // page) for n in LENS]
    P = sum(blocks) + 3
    ids = rng.permutation(P)[:sum(blocks)].astype(np.int32)
    shape = (P, page, H, D) if order == "nhd" else (P, H, page, D)
    kp, vp = np.zeros(shape, k.dtype), np.zeros(shape, k.dtype)
    at = 0
    table = np.full((S, max(blocks)), -1, np.int32)
    for s in range(S):
        for b in range(blocks[s]):
            pid = ids[at + b]
            table[s, b] = pid
            n = min(page, LENS[s] - b * page)
            for src, dst in ((k, kp), (v, vp)):
                rows = src[s, :, b * page:b * page + n]  # [H, n, D]
                if order == "nhd":
                    dst[pid, :n] = rows.transpose(1, 0, 2)
                else:
                    dst[pid, :, :n] = rows
        at += blocks[s]
    if form == "block_table":
        return kvscout.KVView(kp, vp, order, block_table=table)
    indptr = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int32)
    last = np.array([LENS[s] - (blocks[s] - 1) * page for s in range(S)], np.int32)
    return kvscout.KVView(kp, vp, order, indptr=indptr, page_ids=ids, last_page_len=last)


def test_every_layout_gives_the_same_bits():
    m = model("kvscout_default", np.float16, seed=5)
    rng = np.random.default_rng(2)
    ref = None
    for layout, pages in (("hnd", None), ("nhd", None), ("nhd", "block_table"),
                          ("hnd", "block_table"), ("nhd", "indptr"), ("hnd", "indptr")):
        if pages is None:
            views = [kvscout.KVView(m.k[l] if layout == "hnd" else
                                    np.ascontiguousarray(m.k[l].transpose(0, 2, 1, 3)),
                                    m.v[l] if layout == "hnd" else
                                    np.ascontiguousarray(m.v[l].transpose(0, 2, 1, 3)), layout)
                     for l in range(L)]
        else:
            views = [paged(m.k[l], m.v[l], 16, layout, pages, rng) for l in range(L)]
        pipe = presets.Pipeline(m.p, m.shape, m.cal, 0.15, m.w_q, dtype="float16",
                                layout=layout, pages=pages, threads=2)
        outs = run_pipeline(m, pipe, views)
        if ref is None:
            ref = outs
        for l in range(L):
            assert np.array_equal(outs[l], ref[l]), f"{layout} {pages} layer {l}"


def test_bad_input_raises_naming_it():
    m = model()
    p, shape, cal = m.p, m.shape, m.cal
    with pytest.raises(ValueError, match="kvscout_default selects by threshold; it builds top-k"):
        presets.Pipeline(dataclasses.replace(p, selector="threshold"), shape, cal, 0.1, m.w_q,
                         dtype="float32")
    with pytest.raises(ValueError, match="the calibration's plans are rope_planes, "
                                         "infinigen_paper's mode is post_rope_skew"):
        presets.Pipeline(presets.preset("infinigen_paper", D), shape, cal, 0.1, m.w_q,
                         dtype="float32")
    with pytest.raises(ValueError, match="key_bits = 4 was not built"):
        presets.Pipeline(dataclasses.replace(p, key_bits=4), shape, cal, 0.1, m.w_q,
                         dtype="float32")
    with pytest.raises(TypeError, match="dtype 'float64', expected float32, float16 or bfloat16"):
        presets.Pipeline(p, shape, cal, 0.1, m.w_q, dtype=np.float64)
    with pytest.raises(ValueError, match=r"layer 2's W_Q has 4096 elements, expected "
                                         r"num_q_heads \* head_dim \* d_model = 8192"):
        presets.Pipeline(p, shape, cal, 0.1, m.w_q[:2] + [m.w_q[2][:128]] + m.w_q[3:],
                         dtype="float32")
    with pytest.raises(ValueError, match="3 W_Q and 0 b_Q spans, expected one per layer"):
        presets.Pipeline(p, shape, cal, 0.1, m.w_q[:3], dtype="float32")
    with pytest.raises(ValueError, match="the calibration covers 4 layers, expected the shape's "
                                         "num_layers 5"):
        presets.Pipeline(p, dataclasses.replace(shape, num_layers=5), cal, 0.1, m.w_q,
                         dtype="float32")
    with pytest.raises(ValueError, match="layout 'thd', expected one of"):
        presets.Pipeline(p, shape, cal, 0.1, m.w_q, dtype="float32", layout="thd")
    with pytest.raises(ValueError, match="head_dim 96 was not built"):
        presets.Pipeline(p, dataclasses.replace(shape, head_dim=96), cal, 0.1, m.w_q,
                         dtype="float32")
    pipe = presets.Pipeline(p, shape, cal, 0.1, m.w_q, dtype="float32")
    views = [kvscout.KVView(m.k[l], m.v[l]) for l in range(L)]
    with pytest.raises(ValueError, match=r"attend\(3\) without speculate\(3\) first"):
        pipe.attend(3, m.q[3], LENS, views[3])
    with pytest.raises(ValueError, match="layer 1 is not speculated"):
        pipe.speculate(1, m.x[0], LENS, LENS, views[1])
    with pytest.raises(ValueError, match=r"layer 7 is out of range \[0, 4\)"):
        pipe.append(7, *keys_of(m, 0))
    with pytest.raises(ValueError, match="expected the pipeline's hnd with pages=None"):
        pipe.speculate(2, m.x[1], LENS, LENS, kvscout.KVView(m.k[2], m.v[2], "nhd"))
    with pytest.raises(TypeError, match="expected a kvscout.KVView"):
        pipe.speculate(2, m.x[1], LENS, LENS, (m.k[2], m.v[2]))
    with pytest.raises(TypeError, match="k_cache: dtype float16, expected float32"):
        pipe.speculate(2, m.x[1], LENS, LENS, kvscout.KVView(m.k[2].astype(np.float16),
                                                            m.v[2].astype(np.float16)))
    with pytest.raises(ValueError, match=r"x: shape \[2, 31\], expected \[2, 32\]"):
        pipe.speculate(2, m.x[1][:, :31].copy(), LENS, LENS, views[2])
    with pytest.raises(ValueError, match=r"k_cache: shape \[2, 2, 128, 64\], expected 2 "
                                         r"sequences of 256 tokens"):
        pipe.speculate(2, m.x[1], LENS, LENS, kvscout.KVView(m.k[2][:, :, :128].copy(),
                                                            m.v[2][:, :, :128].copy()))
    pipe.speculate(2, m.x[1], LENS, LENS, views[2])
    with pytest.raises(ValueError, match="the output out shares memory with the input q"):
        q = m.q[2].copy()
        pipe.attend(2, q, LENS, views[2], out=q)
    with pytest.raises(ValueError, match=r"k_cur: shape \[2, 2, 32\], expected \[2, 2, 64\]"):
        pipe.attend(2, m.q[2], LENS, views[2], k_cur=m.k_cur[2][..., :32].copy(),
                    v_cur=m.v_cur[2][..., :32].copy())
    with pytest.raises(ValueError, match="k_cur and v_cur: pass both"):
        pipe.attend(2, m.q[2], LENS, views[2], k_cur=m.k_cur[2])
    ro = m.q[2].copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="q: a read-only NumPy array"):
        pipe.attend(2, ro, LENS, views[2])
    with pytest.raises(ValueError, match="the page table: pass block_table"):
        kvscout.KVView(m.k[2], m.v[2], block_table=np.zeros((2, 1), np.int32),
                       indptr=np.zeros(3, np.int32))
    out = pipe.attend(2, m.q[2], LENS, views[2])  # the checks above left the step intact
    assert np.isfinite(out).all()
