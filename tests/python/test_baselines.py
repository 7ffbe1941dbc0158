"""The baseline policies from Python (StreamingPolicy, OraclePolicy, QuestPolicy, H2OPolicy)
against their definitions restated in NumPy (score/streaming.hpp, oracle.hpp, quest.hpp, h2o.hpp),
the oracle over every cache layout, and their refusals. Seeded."""

import numpy as np
import pytest

import kvscout

S, H, G, D, T = 2, 2, 3, 64, 200
LENS = np.array([200, 77], np.int32)


def shape(layers=1):
    return kvscout.DecodeShape(num_seqs=S, num_kv_heads=H, num_q_heads=H * G, head_dim=D,
                               max_tokens=T, scale=D ** -0.5, num_layers=layers)


def group_scores(logits, aggregation):
    """logits [G, n] of one KV head's query group -> [n] (score/detail/aggregate.hpp)."""
    if aggregation == "max_logit":
        return logits.max(axis=0)
    if aggregation == "mean_logit":
        return logits.mean(axis=0)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)).sum(axis=0)


def test_streaming():
    out = kvscout.StreamingPolicy(shape(), sinks=4).score(LENS)
    for s, n in enumerate(LENS):
        want = np.arange(n, dtype=np.float32)
        want[:4] = np.inf
        assert np.array_equal(out[s, :, :n], np.broadcast_to(want, (H, n)))


@pytest.mark.parametrize("aggregation", ["sum_prob", "max_logit", "mean_logit"])
def test_oracle_is_the_true_scores_over_every_layout(aggregation):
    r = np.random.default_rng(1)
    k = r.standard_normal((S, H, T, D)).astype(np.float16)
    v = np.zeros_like(k)
    q = r.standard_normal((S, H * G, D)).astype(np.float32)
    oracle = kvscout.OraclePolicy(shape(), aggregation)
    ref = oracle.score(q, LENS, kvscout.KVView(k, v, "hnd"))
    for s, n in enumerate(LENS):
        for h in range(H):
            logits = q[s, h * G:(h + 1) * G].astype(float) @ k[s, h, :n].astype(float).T * D ** -0.5
            assert np.allclose(ref[s, h, :n], group_scores(logits, aggregation), rtol=2e-5,
                               atol=1e-6), (s, h)
    nhd = kvscout.KVView(np.ascontiguousarray(k.transpose(0, 2, 1, 3)),
                         np.ascontiguousarray(v.transpose(0, 2, 1, 3)), "nhd")
    page = 8
    blocks = T // page
    pages = np.ascontiguousarray(k.reshape(S, H, blocks, page, D).transpose(0, 2, 1, 3, 4)
                                 .reshape(S * blocks, H, page, D))
    table = np.arange(S * blocks, dtype=np.int32).reshape(S, blocks)
    paged = kvscout.KVView(pages, np.zeros_like(pages), "hnd", block_table=table)
    for view in (nhd, paged):
        got = oracle.score(q, LENS, view)
        for s, n in enumerate(LENS):
            assert np.array_equal(got[s, :, :n], ref[s, :, :n])


def test_quest_bounds_whole_pages():
    r = np.random.default_rng(2)
    page = 16
    quest = kvscout.QuestPolicy(shape(layers=2), page_size=page)
    keys = r.standard_normal((S, T, H, D)).astype(np.float32)
    for s, n in enumerate(LENS):
        quest.append(1, keys[s, :n], np.full(n, s, np.int32), np.arange(n, dtype=np.int32))
    q = r.standard_normal((S, H * G, D)).astype(np.float32)
    out = quest.score(1, q, LENS)
    for s, n in enumerate(LENS):
        for h in range(H):
            for p in range(-(-n // page)):
                kp = keys[s, p * page:min(n, (p + 1) * page), h].astype(float)
                mn, mx = kp.min(axis=0), kp.max(axis=0)
                qg = q[s, h * G:(h + 1) * G].astype(float)
                bound = (np.maximum(qg * mn, qg * mx).sum(axis=1) * D ** -0.5).max()
                got = out[s, h, p * page:min(n, (p + 1) * page)]
                assert np.allclose(got, bound, rtol=1e-5, atol=1e-5), (s, h, p)
                assert (got == got[0]).all()
                # The bound holds for every key of the page.
                assert (qg @ kp.T * D ** -0.5).max() <= got[0] + 1e-4
    with pytest.raises(ValueError, match=r"layer 2 is out of range \[0, 2\)"):
        quest.score(2, q, LENS)
    with pytest.raises(TypeError, match="keys: dtype float16, expected float32"):
        quest.append(0, keys[0, :3].astype(np.float16), np.zeros(3, np.int32),
                     np.arange(3, dtype=np.int32))


def test_h2o_accumulates_the_attention_mass():
    r = np.random.default_rng(3)
    h2o = kvscout.H2OPolicy(shape(layers=2))
    k = r.standard_normal((S, H, T, D)).astype(np.float32)
    v = r.standard_normal((S, H, T, D)).astype(np.float32)
    total = np.zeros((S, H, T))
    cap = 40
    for step in range(2):
        lens = LENS - 2 + step
        idx = np.zeros((S, H, cap), np.int32)
        cnt = np.zeros((S, H), np.int32)
        for s in range(S):
            for h in range(H):
                pick = np.sort(r.choice(lens[s], cap, replace=False))
                idx[s, h], cnt[s, h] = pick, cap
        kr, vr = kvscout.gather(k, v, lens, idx, cnt)
        q = r.standard_normal((S, H * G, D)).astype(np.float32)
        kc, vc = k[np.arange(S), :, lens], v[np.arange(S), :, lens]  # the token at position len
        probs = np.zeros((S, H, cap + 1), np.float32)
        kvscout.decode_attention(kr, vr, idx, cnt, q, D ** -0.5, k_cur=kc, v_cur=vc, probs=probs)
        h2o.observe(1, idx, cnt, probs, lens)
        for s in range(S):
            for h in range(H):
                rows = np.concatenate([k[s, h, idx[s, h]], kc[s, h][None]]).astype(float)
                logits = q[s, h * G:(h + 1) * G].astype(float) @ rows.T * D ** -0.5
                mass = group_scores(logits, "sum_prob")
                assert np.allclose(probs[s, h], mass, rtol=1e-5, atol=1e-6)
                total[s, h, idx[s, h]] += mass[:-1]
                total[s, h, lens[s]] += mass[-1]
    got = h2o.score(1, LENS)
    for s, n in enumerate(LENS):
        assert np.allclose(got[s, :, :n], total[s, :, :n], rtol=1e-5, atol=1e-6)
    assert not h2o.score(0, LENS)[:, :, :LENS.min()].any()  # layer 0 observed nothing
    h2o.reset(0)
    assert not h2o.score(1, LENS)[0, :, :LENS[0]].any()
    with pytest.raises(ValueError, match="expected at most stride = 40 probabilities"):
        h2o.observe(1, idx, cnt, probs[..., :40].copy(), LENS)
    with pytest.raises(ValueError, match=r"sequence 5 is out of range \[0, 2\)"):
        h2o.reset(5)


def test_oracle_refuses_bad_input():
    k = np.zeros((S, H, T, D), np.float32)
    q = np.zeros((S, H * G, D), np.float32)
    oracle = kvscout.OraclePolicy(shape())
    with pytest.raises(TypeError, match="expected a kvscout.KVView"):
        oracle.score(q, LENS, (k, k))
    with pytest.raises(ValueError, match="aggregation 'mean', expected one of"):
        kvscout.OraclePolicy(shape(), "mean")
    with pytest.raises(ValueError, match="num_q_heads = 5 must be a positive multiple"):
        oracle.score(np.zeros((S, 5, D), np.float32), LENS, kvscout.KVView(k, k))
