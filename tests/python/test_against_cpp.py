"""Each bound part against the C++ host backend, bit for bit, on the same inputs: the C++ driver
tests/python/cpp_reference.cpp (built by the test build as kvscout_py_reference) runs the parts
directly and writes inputs and outputs as .npy; here the package runs on those inputs.

The driver is found through KVSCOUT_PY_REFERENCE (scripts/test.sh sets it) or in build/tests/;
without it these tests skip, except under CI, where that is a failure."""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import kvscout
from kvscout import presets


def _driver():
    env = os.environ.get("KVSCOUT_PY_REFERENCE")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "build" / "tests" / "kvscout_py_reference"


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    exe = _driver()
    if not exe.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"the C++ reference driver {exe} is missing (build kvscout_py_reference)")
        pytest.skip(f"the C++ reference driver {exe} is not built (ninja kvscout_py_reference)")
    out = tmp_path_factory.mktemp("cpp_reference")
    subprocess.run([str(exe), str(out)], check=True, capture_output=True)

    def load(case, name):
        return np.load(out / case / f"{name}.npy")

    return load


def same_rows(idx, cnt, want_idx, want_cnt):
    """Counts equal and, per row, the first count indices equal (past them nothing is written)."""
    assert np.array_equal(cnt, want_cnt)
    for s, h in np.ndindex(*cnt.shape):
        c = cnt[s, h]
        assert np.array_equal(idx[s, h, :c], want_idx[s, h, :c]), (s, h)


def test_topk(ref):
    scores, lens = ref("topk", "scores"), ref("topk", "seq_lens")
    idx, cnt = kvscout.topk_select(scores, lens, 40, kvscout.KeepSet(4, 16), capacity=48)
    same_rows(idx, cnt, ref("topk", "indices"), ref("topk", "counts"))
    scores = ref("topk_share", "scores")
    idx, cnt = kvscout.topk_select(scores, lens, 48, kvscout.KeepSet(4, 16), budget_share=0.1)
    same_rows(idx, cnt, ref("topk_share", "indices"), ref("topk_share", "counts"))
    assert len(set(ref("topk_share", "counts").ravel())) > 1  # the share gives each length its own


@pytest.mark.parametrize("rule", ["per_head", "infinigen_mean"])
def test_threshold(ref, rule):
    c = f"threshold_{rule}"
    idx, cnt = kvscout.threshold_select(ref("topk", "scores"), ref("topk", "seq_lens"), 0.75, 48,
                                        kvscout.KeepSet(4, 16), rule=rule)
    same_rows(idx, cnt, ref(c, "indices"), ref(c, "counts"))


def test_correction(ref):
    lens = ref("topk", "seq_lens")
    idx, cnt = kvscout.correction_select(ref("correction", "scores"), lens, ref("topk", "indices"),
                                         ref("topk", "counts"), 24, total_share=0.2)
    same_rows(idx, cnt, ref("correction", "indices"), ref("correction", "counts"))
    assert cnt.min() > 0


def rows_equal(got, want, cnt):
    for s, h in np.ndindex(*cnt.shape):
        c = cnt[s, h]
        assert np.array_equal(got[s, h, :c].view(np.uint8), want[s, h, :c].view(np.uint8)), (s, h)


@pytest.mark.parametrize("case,layout", [("gather_hnd", "hnd"), ("gather_nhd", "nhd")])
def test_gather(ref, case, layout):
    lens, idx, cnt = ref("topk", "seq_lens"), ref("topk", "indices"), ref("topk", "counts")
    kr, vr = kvscout.gather(ref(case, "k"), ref(case, "v"), lens, idx, cnt, layout)
    rows_equal(kr, ref(case, "k_rows"), cnt)
    rows_equal(vr, ref(case, "v_rows"), cnt)


@pytest.mark.parametrize("case,layout", [("gather_block_table", "nhd"), ("gather_indptr", "hnd")])
def test_gather_paged(ref, case, layout):
    lens, idx, cnt = ref("topk", "seq_lens"), ref("topk", "indices"), ref("topk", "counts")
    if case == "gather_block_table":
        tables = dict(block_table=ref(case, "block_table"), seq_lens=lens)
    else:
        tables = dict(indptr=ref(case, "indptr"), page_ids=ref(case, "page_ids"),
                      last_page_len=ref(case, "last_page_len"))
    kr, vr = kvscout.gather_paged(ref(case, "k"), ref(case, "v"), idx, cnt, layout, **tables)
    rows_equal(kr, ref(case, "k_rows"), cnt)
    rows_equal(vr, ref(case, "v_rows"), cnt)


def test_attention(ref):
    c = "attention"
    out = kvscout.decode_attention(ref(c, "k_rows"), ref(c, "v_rows"), ref("topk", "indices"),
                                   ref("topk", "counts"), ref(c, "q"), 0.125,
                                   k_cur=ref(c, "k_cur"), v_cur=ref(c, "v_cur"))
    assert np.array_equal(out.view(np.uint32), ref(c, "out").view(np.uint32))


def policy_shape():
    return kvscout.DecodeShape(num_seqs=2, num_kv_heads=3, num_q_heads=6, head_dim=64, d_model=48,
                               max_tokens=300, scale=0.125)


def scores_equal(got, want, lens):
    for s, n in enumerate(lens):
        assert np.array_equal(got[s, :, :n].view(np.uint32), want[s, :, :n].view(np.uint32)), s


def test_policy_2bit_rope_planes(ref):
    c = "policy_2bit"
    rope = kvscout.RopeConfig(64)
    pol = kvscout.InfiniGenPolicy(
        policy_shape(), kvscout.rope_planes_plans(rope, ref(c, "planes")), ref(c, "w_q"),
        correction_plans=kvscout.rope_planes_plans(rope, ref(c, "correction_planes")), key_bits=2,
        aggregation="max_logit", query_aggregation="sum_prob")
    pol.append(ref(c, "keys"), ref(c, "seq_ids"), ref(c, "token_ids"))
    lens = ref(c, "seq_lens")
    scores_equal(pol.score(ref(c, "x"), ref(c, "positions"), lens), ref(c, "scores"), lens)
    scores_equal(pol.score_query(ref(c, "q"), lens), ref(c, "late"), lens)


def test_policy_float_skew(ref):
    c = "policy_skew"
    plans = kvscout.SkewPlans(mode="post_rope_skew", r=16, rope=kvscout.RopeConfig(64),
                              A=ref(c, "A"), channels=ref(c, "channels"))
    pol = kvscout.InfiniGenPolicy(policy_shape(), plans, ref(c, "w_q"))
    pol.append(ref(c, "keys"), ref(c, "seq_ids"), ref(c, "token_ids"))
    lens = ref(c, "seq_lens")
    scores_equal(pol.score(ref(c, "x"), ref(c, "positions"), lens), ref(c, "scores"), lens)


def test_budgets(ref):
    shape = kvscout.DecodeShape(num_seqs=1, num_kv_heads=3, num_q_heads=9, head_dim=64,
                                max_tokens=4096, num_layers=6)
    b = presets.budgets(presets.preset("kvscout_default", 64), shape, 0.1,
                        ref("budgets", "layer_shares"))
    assert np.array_equal(b.speculated, ref("budgets", "speculated"))
    assert np.array_equal(b.total, ref("budgets", "total"))
    assert [b.capacity, b.correction_capacity] == ref("budgets", "capacities").tolist()


def test_kivi(ref):
    c = "kivi"
    cache = kvscout.KIVICache(2, 3, 320, 64, 4, dtype=np.float16, group=32, residual=64)
    for s, chunks in enumerate(([37, 100, 1, 150], [5, 200, 6])):
        k, v = ref(c, f"k{s}"), ref(c, f"v{s}")
        at = 0
        for n in chunks:
            cache.append(s, k[at:at + n], v[at:at + n])
            at += n
    assert np.array_equal(cache.seq_lens, ref(c, "seq_lens"))
    for name in ("k_codes", "v_records", "k_params", "k_residual", "v_residual"):
        assert np.array_equal(getattr(cache, name), ref(c, name).view(np.uint8)), name
    idx, cnt = ref(c, "indices"), ref(c, "counts")
    kr, vr = cache.gather(idx, cnt)
    rows_equal(kr, ref(c, "k_rows").view(np.uint8), cnt)  # past a row's count nothing is written
    rows_equal(vr, ref(c, "v_rows").view(np.uint8), cnt)
    out = cache.attend(kr, vr, idx, cnt, ref(c, "q"), 0.125, k_cur=ref(c, "k_cur"),
                       v_cur=ref(c, "v_cur"))
    assert np.array_equal(out.view(np.uint32), ref(c, "out").view(np.uint32))


def baseline_shape():
    return kvscout.DecodeShape(num_seqs=2, num_kv_heads=3, num_q_heads=6, head_dim=64,
                               max_tokens=300, scale=0.125, num_layers=1)


def test_baselines(ref):
    lens, shape = ref("topk", "seq_lens"), baseline_shape()
    scores_equal(kvscout.StreamingPolicy(shape, 4).score(lens), ref("streaming", "scores"), lens)
    k = ref("oracle", "k")
    got = kvscout.OraclePolicy(shape, "sum_prob").score(ref("oracle", "q"), lens,
                                                        kvscout.KVView(k, k.copy()))
    scores_equal(got, ref("oracle", "scores"), lens)
    quest = kvscout.QuestPolicy(shape, page_size=16)
    keys = ref("quest", "keys")
    for s, n in enumerate(lens):
        quest.append(0, keys[s, :n], np.full(n, s, np.int32), np.arange(n, dtype=np.int32))
    scores_equal(quest.score(0, ref("oracle", "q"), lens), ref("quest", "scores"), lens)
    h2o = kvscout.H2OPolicy(shape)
    h2o.observe(0, ref("topk", "indices"), ref("topk", "counts"), ref("h2o", "probs"), lens)
    scores_equal(h2o.score(0, lens), ref("h2o", "scores"), lens)
