"""The presets by name, their budgets and calibration from Python, against the definitions in
include/kvscout/presets.hpp and skew/calibrate.hpp restated in NumPy. Seeded."""

import math

import numpy as np
import pytest

import kvscout
from kvscout import presets

needs_calibration = pytest.mark.skipif(not presets.calibration_available(),
                                       reason="built without Eigen")


def test_presets_by_name():
    d = presets.preset("kvscout_default", 64)
    assert (d.mode, d.r, d.aggregation, d.query_aggregation) == ("rope_planes", 32, "max_logit",
                                                                  "sum_prob")
    assert (d.correction_share, d.correction_r, d.key_bits) == (0.25, 64, 2)
    assert (d.keep, d.skip_layers, d.layer_rule, d.layer_floor) == (kvscout.KeepSet(4, 16), 2,
                                                                    "coverage", 0.5)
    assert d.policy_correction_r() == 64
    p = presets.preset("infinigen_paper", 128)
    assert (p.mode, p.r, p.selector, p.alpha, p.rule, p.keep) == (
        "post_rope_skew", 25, "threshold", 4.0, "infinigen_mean", kvscout.KeepSet(0, 0))
    s = presets.preset("kvscout_speculation_only", 64)
    assert (s.correction_share, s.key_bits, s.layer_rule, s.policy_correction_r()) == (0, 0, None, 0)
    with pytest.raises(ValueError, match="preset 'infinigen', expected infinigen_paper"):
        presets.preset("infinigen", 64)


def row_budget(budget, share, sinks, recent, n):
    if not share > 0:
        return budget
    return min(max(max(0, math.ceil(share * n - 1e-9)), sinks + recent), budget)


def budgets_reference(p, L, T, budget, shares):
    """presets::budgets restated."""
    k = p.keep
    spec, total = np.zeros(L), np.zeros(L)
    cap = min(T, max(1, k.sinks + k.recent))
    extra = 0
    for l in range(min(p.skip_layers, L), L):
        share = 1.0 if shares is None else shares[l]
        s = budget * (1 - p.correction_share) * share
        t = (budget * (1 - p.correction_share) + budget * p.correction_share) * share
        s = s if s != 0 else 5e-324
        spec[l], total[l] = s, t
        cap = max(cap, row_budget(T, s, k.sinks, k.recent, T))
        if p.correction_share > 0:
            extra = max(extra, row_budget(T, t - s, 0, 0, T) + 1)
    corr = max(1, min(extra, cap)) if p.correction_share > 0 else 0
    return spec, total, cap, corr


@pytest.mark.parametrize("name", ["kvscout_default", "kvscout_speculation_only"])
def test_budgets_are_presets_budgets(name):
    p = presets.preset(name, 64)
    shape = kvscout.DecodeShape(num_seqs=1, num_kv_heads=3, num_q_heads=9, head_dim=64,
                                max_tokens=4096, num_layers=6)
    shares = np.array([0, 0, 0.6, 1.4, 0.9, 1.1])
    for b in (0.05, 0.1, 0.2):
        got = presets.budgets(p, shape, b, shares)
        spec, total, cap, corr = budgets_reference(p, 6, 4096, b, shares)
        assert np.allclose(got.speculated, spec, rtol=1e-12) and np.allclose(got.total, total)
        assert (got.capacity, got.correction_capacity) == (cap, corr)
    with pytest.raises(ValueError, match="budget = 1.5: expected a share of the cached rows"):
        presets.budgets(p, shape, 1.5)
    with pytest.raises(ValueError, match=r"layer_shares: shape \[2\], expected \[6\]"):
        presets.budgets(p, shape, 0.1, [1.0, 1.0])


@needs_calibration
def test_calibrate_rope_planes_ranks_planes_by_norm():
    """kvscout_default's plans: per KV head the r / 2 RoPE planes of largest summed norm over its
    query group's samples (calibrate.hpp), ascending; the correction's every plane; mass curves
    non-decreasing in [0, 1]."""
    r = np.random.default_rng(3)
    L, n, H, G, D = 4, 48, 2, 2, 64
    q = r.standard_normal((L, n, H * G, D)).astype(np.float32)
    q[..., 5] *= 4  # plane 5 (channels 5 and 37) large
    k = r.standard_normal((L, n, H, D)).astype(np.float32)
    p = presets.preset("kvscout_default", D)
    shape = kvscout.DecodeShape(num_seqs=1, num_kv_heads=H, num_q_heads=H * G, head_dim=D,
                                max_tokens=512, scale=0.125, num_layers=L)
    cal = presets.calibrate(p, shape, kvscout.RopeConfig(D), q, k)
    assert cal.first_layer == 2 and cal.plans[0] is None and cal.plans[1] is None
    for l in range(2, L):
        for h in range(H):
            x = q[l][:, h * G:(h + 1) * G].reshape(-1, D).astype(np.float64)
            norms = np.sqrt(x[:, : D // 2] ** 2 + x[:, D // 2:] ** 2).sum(axis=0)
            want = np.sort(np.argsort(-norms, kind="stable")[: p.r // 2])
            assert cal.plans[l].planes[h].tolist() == want.tolist()
            assert 5 in cal.plans[l].planes[h]
            assert cal.correction_plans[l].planes[h].tolist() == list(range(D // 2))
    curves = cal.mass_curves
    assert curves.shape == (L, p.layer_bins)
    assert (np.diff(curves[2:], axis=1) >= -1e-12).all() and curves[2:].max() <= 1 + 1e-9
    shares = cal.layer_shares(p, 0.1)
    assert shares.shape == (L,) and np.isclose(shares[2:].mean(), 1.0)
    # A preset policy from the calibration: its scores are finite over the rows it holds.
    w_q = (r.standard_normal((H * G * D, 32)) / 6).astype(np.float32)
    shape32 = kvscout.DecodeShape(num_seqs=1, num_kv_heads=H, num_q_heads=H * G, head_dim=D,
                                  d_model=32, max_tokens=64, scale=0.125, num_layers=L)
    pol = presets.policy_for_layer(p, shape32, cal, 3, w_q)
    pol.append(k[3, :40], np.zeros(40, np.int32), np.arange(40, dtype=np.int32))
    lens = np.array([40], np.int32)
    assert np.isfinite(pol.score(np.ones((1, 32), np.float32), lens, lens)[0, :, :40]).all()
    assert np.isfinite(pol.score_query(q[3, :1], lens)[0, :, :40]).all()
    with pytest.raises(ValueError, match="layer 1 has no plans"):
        presets.policy_for_layer(p, shape32, cal, 1, w_q)
    with pytest.raises(ValueError, match=r"k: shape \[4, 47, 2, 64\], expected \[4, 48, 2, 64\]"):
        presets.calibrate(p, shape, kvscout.RopeConfig(D), q, k[:, :47].copy())


@needs_calibration
def test_policy_for_layer_is_the_preset_configured_by_hand():
    """policy_for_layer gives the bits of the policy configured field by field from the preset
    (plans, correction plans, 2-bit keys, both aggregations); the budgets' selector and
    correction arguments run the step's selections."""
    import dataclasses

    r = np.random.default_rng(8)
    L, n, H, G, D, DM, T = 3, 40, 2, 2, 64, 32, 96
    q = r.standard_normal((L, n, H * G, D)).astype(np.float32)
    k = r.standard_normal((L, n, H, D)).astype(np.float32)
    p = dataclasses.replace(presets.preset("kvscout_default", D), skip_layers=1)
    shape = kvscout.DecodeShape(num_seqs=1, num_kv_heads=H, num_q_heads=H * G, head_dim=D,
                                d_model=DM, max_tokens=T, scale=0.125, num_layers=L)
    cal = presets.calibrate(p, shape, kvscout.RopeConfig(D), q, k)
    w_q = (r.standard_normal((H * G * D, DM)) / 6).astype(np.float32)
    keys = r.standard_normal((70, H, D)).astype(np.float32)
    ids, pos = np.zeros(70, np.int32), np.arange(70, dtype=np.int32)
    lens = np.array([70], np.int32)
    x = r.standard_normal((1, DM)).astype(np.float32)
    a = presets.policy_for_layer(p, shape, cal, 2, w_q)
    b = kvscout.InfiniGenPolicy(shape, cal.plans[2], w_q, correction_plans=cal.correction_plans[2],
                                key_bits=2, aggregation="max_logit", query_aggregation="sum_prob")
    for pol in (a, b):
        pol.append(keys, ids, pos)
    sa, sb = a.score(x, lens, lens), b.score(x, lens, lens)
    assert np.array_equal(sa[..., :70], sb[..., :70])
    la, lb = a.score_query(q[2, :1], lens), b.score_query(q[2, :1], lens)
    assert np.array_equal(la[..., :70], lb[..., :70])
    bud = presets.budgets(p, shape, 0.5, cal.layer_shares(p, 0.5))
    si, sc = kvscout.topk_select(sa, lens, **bud.selector_args(2))
    ai, ac = kvscout.correction_select(la, lens, si, sc, **bud.correction_args(2))
    assert ac[0].min() > 0  # the correction added rows
    assert (sc[0] + ac[0] == math.ceil(bud.total[2] * 70 - 1e-9)).all()


def test_edited_presets_are_checked():
    import dataclasses

    d = presets.preset("kvscout_default", 64)
    shape = kvscout.DecodeShape(num_seqs=1, num_kv_heads=1, num_q_heads=1, head_dim=64,
                                max_tokens=256, num_layers=4)
    for field, value, message in (("key_bits", 3, "key_bits = 3, expected 0, 2, 4 or 8"),
                                  ("correction_share", 1.5, "correction_share = 1.5"),
                                  ("r", 0, "r = 0, expected a whole number in"),
                                  ("keep", kvscout.KeepSet(2**30, 2**30),
                                   r"sinks = .* expected a whole number in \[0, 1073741823\]"),
                                  ("mode", "skew", "mode 'skew', expected one of")):
        with pytest.raises(ValueError, match=message):
            presets.budgets(dataclasses.replace(d, **{field: value}), shape, 0.1)
