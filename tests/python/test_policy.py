"""The InfiniGen policy from Python (infinigen_policy_host, one layer, RoPE-plane plans) against
InfiniGen's scoring restated in NumPy float64: the partial query is W_Q x + b on the kept planes'
channels, rotated at the token's position; the partial keys are the RoPE'd keys' channels; a KV
head's score is scale * q~ . k~ aggregated over its query heads. Seeded."""

import numpy as np
import pytest

import kvscout

S, H, G, D, DM, T = 2, 2, 3, 64, 96, 160
HQ = H * G
SCALE = 0.125


def rope_rotate(v, pos, theta, planes_all=True):
    """split_half RoPE of v [..., D] at position pos, every plane."""
    out = v.astype(np.float64).copy()
    half = D // 2
    for j in range(half):
        ang = pos * theta ** (-2.0 * j / D)
        a, b = v[..., j].astype(np.float64), v[..., j + half].astype(np.float64)
        out[..., j] = a * np.cos(ang) - b * np.sin(ang)
        out[..., j + half] = a * np.sin(ang) + b * np.cos(ang)
    return out


def channels_of(planes):
    """rope_planes_plan's channel order for split_half: plane by plane, (j, j + D / 2)."""
    return [c for j in planes for c in (j, j + D // 2)]


class World:
    def __init__(self, seed=11):
        r = np.random.default_rng(seed)
        self.w_q = (r.standard_normal((HQ * D, DM)) / np.sqrt(DM)).astype(np.float32)
        self.b_q = (0.1 * r.standard_normal(HQ * D)).astype(np.float32)
        self.lens = np.array([150, 61], dtype=np.int32)
        self.keys = r.standard_normal((S, T, H, D)).astype(np.float32)  # after RoPE
        self.keys[..., :4] *= 3  # a few strong planes, as real keys have
        self.x = r.standard_normal((S, DM)).astype(np.float32)
        self.q = r.standard_normal((S, HQ, D)).astype(np.float32)
        self.positions = self.lens.copy()
        self.planes = np.array([[0, 1, 2, 3, 9, 17, 20, 30], [0, 2, 3, 5, 8, 13, 21, 31]],
                               dtype=np.int32)
        self.shape = kvscout.DecodeShape(num_seqs=S, num_kv_heads=H, num_q_heads=HQ, head_dim=D,
                                         d_model=DM, max_tokens=T, scale=SCALE)
        self.rope = kvscout.RopeConfig(D)

    def filled(self, policy):
        for s in range(S):
            n = int(self.lens[s])
            policy.append(self.keys[s, :n], np.full(n, s, np.int32), np.arange(n, dtype=np.int32))
        return policy

    def reference(self, planes, query, agg):
        """scores [S, H, T] in float64 for the rows each sequence holds."""
        out = np.full((S, H, T), np.nan)
        for s in range(S):
            n = int(self.lens[s])
            for h in range(H):
                ch = channels_of(planes[h])
                k = self.keys[s, :n, h][:, ch].astype(np.float64)
                logits = np.stack([k @ query[s, h * G + i][ch] * SCALE for i in range(G)])
                if agg == "max_logit":
                    out[s, h, :n] = logits.max(axis=0)
                elif agg == "mean_logit":
                    out[s, h, :n] = logits.mean(axis=0)
                else:  # sum_prob: each head's softmax over the row, summed
                    p = np.exp(logits - logits.max(axis=1, keepdims=True))
                    out[s, h, :n] = (p / p.sum(axis=1, keepdims=True)).sum(axis=0)
        return out

    def speculative_query(self):
        q = (self.x.astype(np.float64) @ self.w_q.T.astype(np.float64) + self.b_q).reshape(S, HQ, D)
        return np.stack([rope_rotate(q[s], int(self.positions[s]), 10000.0) for s in range(S)])


def close(got, want, rtol=2e-5, atol=2e-5):
    rows = ~np.isnan(want)
    return np.allclose(got[rows], want[rows], rtol=rtol, atol=atol)


@pytest.mark.parametrize("agg", ["max_logit", "mean_logit"])
def test_score_is_infinigen_scoring(agg):
    w = World()
    plans = kvscout.rope_planes_plans(w.rope, w.planes)
    policy = w.filled(kvscout.InfiniGenPolicy(w.shape, plans, w.w_q, w.b_q, aggregation=agg))
    got = policy.score(w.x, w.positions, w.lens)
    assert close(got, w.reference(w.planes, w.speculative_query(), agg))


def test_score_query_over_the_correction_channels():
    w = World()
    # 16 planes per head that hold the speculation's 8 (the correction reads them too).
    wide = np.array([sorted(list(w.planes[h]) + [p for p in range(32) if p not in w.planes[h]][:8])
                     for h in range(H)], dtype=np.int32)
    policy = w.filled(kvscout.InfiniGenPolicy(
        w.shape, kvscout.rope_planes_plans(w.rope, w.planes), w.w_q, w.b_q,
        correction_plans=kvscout.rope_planes_plans(w.rope, wide), query_aggregation="sum_prob"))
    got = policy.score_query(w.q, w.lens)
    assert close(got, w.reference(wide, w.q.astype(np.float64), "sum_prob"))
    # score() still reads the speculation's r channels only.
    assert close(policy.score(w.x, w.positions, w.lens),
                 w.reference(w.planes, w.speculative_query(), "max_logit"))


def quantized(x, bits=2, group=32):
    """quantized_partial_key_cache's format restated: per channel over complete groups of `group`
    tokens, min and step = (max - min) / levels, codes rounded to nearest (ties to even); the
    newest incomplete group stays exact. x [n, r] float32 -> what scoring reads, float64."""
    levels = 2**bits - 1
    out = x.astype(np.float64).copy()
    for g0 in range(0, len(x) - len(x) % group, group):
        tile = x[g0:g0 + group]
        lo = tile.min(axis=0).astype(np.float32)
        step = ((tile.max(axis=0).astype(np.float64) - lo) / levels).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            code = np.where(step > 0, np.rint((tile.astype(np.float64) - lo) / step), 0)
        code = np.clip(code, 0, levels)
        out[g0:g0 + group] = (lo + step * code.astype(np.float32)).astype(np.float32)
    return out


def test_two_bit_keys_score_the_quantised_keys():
    """key_bits 2 (kvscout_default's partial keys): the scores are InfiniGen's over the keys as
    KIVI's per-channel 2-bit groups of 32 tokens decode them, the newest partial group exact."""
    w = World()
    plans = kvscout.rope_planes_plans(w.rope, w.planes)
    policy = w.filled(kvscout.InfiniGenPolicy(w.shape, plans, w.w_q, w.b_q, key_bits=2))
    got = policy.score(w.x, w.positions, w.lens)
    q = w.speculative_query()
    for s in range(S):
        n = int(w.lens[s])
        for h in range(H):
            ch = channels_of(w.planes[h])
            k = quantized(w.keys[s, :n, h][:, ch])
            want = np.max([k @ q[s, h * G + i][ch] * SCALE for i in range(G)], axis=0)
            assert np.allclose(got[s, h, :n], want, rtol=1e-4, atol=1e-4)
    exact = w.filled(kvscout.InfiniGenPolicy(w.shape, plans, w.w_q, w.b_q))
    assert not np.allclose(exact.score(w.x, w.positions, w.lens)[0, 0, :128], got[0, 0, :128])


def test_half_weights_and_caller_workspace():
    w = World()
    plans = kvscout.rope_planes_plans(w.rope, w.planes)
    nbytes = kvscout.InfiniGenPolicy.workspace_bytes(w.shape, plans.r)
    ws = kvscout.topk_workspace(nbytes)
    policy = w.filled(kvscout.InfiniGenPolicy(w.shape, plans, w.w_q.astype(np.float16),
                                              w.b_q.astype(np.float16), workspace=ws))
    assert policy.workspace is ws
    got = policy.score(w.x, w.positions, w.lens)
    assert close(got, w.reference(w.planes, w.speculative_query(), "max_logit"), 2e-2, 2e-2)


def test_policy_refuses_bad_input():
    w = World()
    plans = kvscout.rope_planes_plans(w.rope, w.planes)
    with pytest.raises(ValueError, match=r"w_q: shape \[384, 95\], expected \[384, 96\]"):
        kvscout.InfiniGenPolicy(w.shape, plans, w.w_q[:, :95].copy())
    with pytest.raises(TypeError, match="w_q: dtype int32"):
        kvscout.InfiniGenPolicy(w.shape, plans, w.w_q.astype(np.int32))
    with pytest.raises(ValueError, match=r"planes: shape \[3, 8\], expected \[2, 8\]"):
        kvscout.InfiniGenPolicy(w.shape, kvscout.rope_planes_plans(w.rope, np.zeros((3, 8))), w.w_q)
    with pytest.raises(ValueError, match="plane 40"):
        bad = w.planes.copy()
        bad[1, 7] = 40
        kvscout.InfiniGenPolicy(w.shape, kvscout.rope_planes_plans(w.rope, bad), w.w_q)
    with pytest.raises(ValueError, match="key_bits = 3 was not built"):
        kvscout.InfiniGenPolicy(w.shape, plans, w.w_q, key_bits=3)
    with pytest.raises(ValueError, match="aggregation 'max'"):
        kvscout.InfiniGenPolicy(w.shape, plans, w.w_q, aggregation="max")
    policy = kvscout.InfiniGenPolicy(w.shape, plans, w.w_q)
    with pytest.raises(ValueError, match=r"keys: shape \[4, 2, 32\], expected \[\*, 2, 64\]"):
        policy.append(w.keys[0, :4, :, :32].copy(), np.zeros(4, np.int32), np.arange(4, dtype=np.int32))
    with pytest.raises(ValueError, match="7"):  # sequence 7 of a 2-sequence policy
        policy.append(w.keys[0, :1], np.array([7], np.int32), np.array([0], np.int32))
    with pytest.raises(ValueError, match=r"x: shape \[2, 95\], expected \[2, 96\]"):
        policy.score(w.x[:, :95].copy(), w.positions, w.lens)
    with pytest.raises(ValueError, match=r"q: shape \[2, 6, 32\], expected \[2, 6, 64\]"):
        policy.score_query(w.q[..., :32].copy(), w.lens)
    # Without correction plans score_query reads the speculation's channels.
    assert close(w.filled(policy).score_query(w.q, w.lens),
                 w.reference(w.planes, w.q.astype(np.float64), "max_logit"))


def test_skew_plans_score_their_channels():
    """A skew mode's plans (post_rope_skew with A = identity, any r channels): the partial query is
    the RoPE'd full query's channels, the keys' the same channels."""
    w = World()
    chans = np.array([[0, 3, 8, 20, 33, 40, 51, 63], [1, 2, 9, 31, 32, 45, 50, 60]], np.int32)
    A = np.tile(np.eye(D, dtype=np.float32), (H, 1, 1))
    plans = kvscout.SkewPlans(mode="post_rope_skew", r=8, rope=w.rope, A=A, channels=chans)
    policy = w.filled(kvscout.InfiniGenPolicy(w.shape, plans, w.w_q, w.b_q))
    got = policy.score(w.x, w.positions, w.lens)
    q = w.speculative_query()
    want = np.full((S, H, T), np.nan)
    for s in range(S):
        n = int(w.lens[s])
        for h in range(H):
            k = w.keys[s, :n, h][:, chans[h]].astype(np.float64)
            want[s, h, :n] = np.max([k @ q[s, h * G + i][chans[h]] * SCALE for i in range(G)], 0)
    assert close(got, want)
    with pytest.raises(ValueError, match=r"A: shape \[2, 64\], expected \[2, 64, 64\]"):
        kvscout.InfiniGenPolicy(w.shape, kvscout.SkewPlans(mode="post_rope_skew", r=8,
                                                           rope=w.rope, A=A[:, 0].copy(),
                                                           channels=chans), w.w_q)


def test_one_call_at_a_time_and_one_policy_per_workspace():
    """Calls release the GIL; a policy's calls take turns (its scratch is shared): threads get
    the bits a lone call gets. Two live policies cannot share a workspace."""
    import threading

    w = World()
    plans = kvscout.rope_planes_plans(w.rope, w.planes)
    policy = w.filled(kvscout.InfiniGenPolicy(w.shape, plans, w.w_q, w.b_q))
    alone = policy.score(w.x, w.positions, w.lens)
    bad = []

    def work():
        for _ in range(30):
            got = policy.score(w.x, w.positions, w.lens)
            if any(not np.array_equal(got[s, :, : w.lens[s]], alone[s, :, : w.lens[s]])
                   for s in range(S)):
                bad.append(1)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
    with pytest.raises(ValueError, match="holds another live InfiniGenPolicy's state"):
        kvscout.InfiniGenPolicy(w.shape, plans, w.w_q, workspace=policy.workspace)
    with pytest.raises(ValueError, match="out and the policy's workspace share memory"):
        policy.score(w.x, w.positions, w.lens,
                     out=policy.workspace[: S * H * T * 4].view(np.float32).reshape(S, H, T))
    n = kvscout.InfiniGenPolicy.workspace_bytes(w.shape, plans.r, aggregation="sum_prob")
    assert n > kvscout.InfiniGenPolicy.workspace_bytes(w.shape, plans.r)
    kvscout.InfiniGenPolicy(w.shape, plans, w.w_q, aggregation="sum_prob",
                            workspace=kvscout.topk_workspace(n))
    with pytest.raises(ValueError, match="RoPE head_dim 128, expected the shape's head_dim 64"):
        kvscout.InfiniGenPolicy(w.shape, kvscout.rope_planes_plans(kvscout.RopeConfig(128),
                                                                   w.planes), w.w_q)
