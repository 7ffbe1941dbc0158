"""threshold_select (threshold_selector_host) from Python against its two rules restated in NumPy
(select/threshold.hpp): kvscout's per_head and InfiniGen's infinigen_mean; refusals. Seeded."""

import math

import numpy as np
import pytest

import kvscout


def keep_set(n, keep):
    head = min(keep.sinks, n)
    tail = max(head, n - keep.recent)
    return list(range(head)) + list(range(tail, n))


def best(scores, tokens, k):
    """The k best tokens by score, ties to the lower index, NaN never."""
    c = [t for t in tokens if not np.isnan(scores[t])]
    c.sort(key=lambda t: (-scores[t], t))
    return c[:max(k, 0)]


def threshold_reference(scores, lens, alpha, budget, keep, rule):
    S, H, _ = scores.shape
    rows, counts = {}, []
    for s in range(S):
        n = int(lens[s])
        for h in range(H):
            x = scores[s, h, :n]
            kept = keep_set(n, keep)
            finite = x[~np.isnan(x)]
            m = finite.max() if len(finite) else -np.inf
            floor = np.float32(m) - np.float32(alpha)
            others = [t for t in range(n) if t not in set(kept)]
            cand = [t for t in others if not np.isnan(x[t]) and x[t] >= floor]
            rows[s, h] = (x, kept, others, cand)
            if n > 0:
                counts.append(len(cand))
    mean_n = math.floor(sum(counts) / len(counts)) if counts else 0
    out = {}
    for (s, h), (x, kept, others, cand) in rows.items():
        k = budget - len(kept)
        if rule == "per_head":
            chosen = best(x, cand, k) if len(cand) > k else cand
        else:
            chosen = best(x, others, min(mean_n, k))
        out[s, h] = sorted(kept + chosen)
    return out


@pytest.mark.parametrize("rule", ["per_head", "infinigen_mean"])
@pytest.mark.parametrize("alpha", [0.5, 2.0])
def test_threshold_matches_its_rules(rule, alpha):
    r = np.random.default_rng(7)
    S, H, T = 3, 4, 260
    scores = (np.round(r.standard_normal((S, H, T)) * 4) / 4).astype(np.float32)  # ties
    scores[0, 1, 50:60] = np.nan
    scores[1, 2, 100] = 9.0  # one row with a far maximum
    lens = np.array([260, 131, 0], np.int32)
    keep = kvscout.KeepSet(4, 16)
    idx, cnt = kvscout.threshold_select(scores, lens, alpha, 60, keep, rule=rule)
    want = threshold_reference(scores, lens, alpha, 60, keep, rule)
    for (s, h), rows in want.items():
        assert cnt[s, h] == len(rows), (s, h)
        assert idx[s, h, :cnt[s, h]].tolist() == rows, (s, h)
    assert len(set(cnt[:2].ravel().tolist())) > 1 or rule == "infinigen_mean"


def test_threshold_refuses_bad_configurations():
    scores = np.zeros((1, 1, 8), np.float32)
    lens = np.array([8], np.int32)
    with pytest.raises(ValueError, match="rule 'mean', expected one of"):
        kvscout.threshold_select(scores, lens, 1.0, 4, rule="mean")
    with pytest.raises(ValueError, match="alpha must be a non-negative number, got -1"):
        kvscout.threshold_select(scores, lens, -1.0, 4)
    with pytest.raises(ValueError, match="budget 4 is smaller than the keep-set it includes"):
        kvscout.threshold_select(scores, lens, 1.0, 4, kvscout.KeepSet(4, 4))
    with pytest.raises(TypeError, match="scores: dtype float64, expected float32"):
        kvscout.threshold_select(scores.astype(np.float64), lens, 1.0, 4)
