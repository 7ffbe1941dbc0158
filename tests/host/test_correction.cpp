// The correction step (issue 32, part 1): infinigen_policy_host::score_query against its definition,
// and correction_selector_host against a brute-force reference of its own semantics.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "kvscout/core/workspace.hpp"
#include "kvscout/score/infinigen.hpp"
#include "kvscout/score/infinigen_query_scores.hpp"
#include "kvscout/select/correction.hpp"
#include "kvscout/skew/calibrate.hpp"
#include "model_slice.hpp"

namespace {

constexpr int D = 64;
const float nan_f = std::numeric_limits<float>::quiet_NaN();

using slice = kvtest::model_slice;  // tests/host/model_slice.hpp
static_assert(slice::D == D);

}  // namespace

TEST_CASE("score_query is the layer's own query, projected as a key, against the partial keys",
          "[spec][infinigen][correction]") {
  for (const auto mode : {kvscout::rope_mode::post_rope_skew, kvscout::rope_mode::rope_planes})
    for (const int g : {1, 3})
      for (const int r : {16, D}) {
        CAPTURE(kvscout::to_string(mode), g, r);
        const slice m(2, 2, g, 70, 31u + static_cast<unsigned>(g * 10 + r));
        const auto plans = m.plans(r, mode, 5u + static_cast<unsigned>(r));
        const kvscout::infinigen_config pc{.shape = {.num_layers = 1,
                                                     .num_seqs = m.S,
                                                     .num_kv_heads = m.H,
                                                     .num_q_heads = m.Hq,
                                                     .head_dim = D,
                                                     .d_model = m.d_model,
                                                     .max_tokens = 96,
                                                     .scale = 0.125f},
                                           .aggregation = kvscout::gqa_aggregation::max_logit};
        auto p = kvscout::infinigen_policy_host<>::layers(pc, {plans}, {{m.wq.data(), m.wq.size()}},
                                           {{m.bq.data(), m.bq.size()}});
        for (int s = 0; s < m.S; ++s)
          for (int t = 0; t < m.n; ++t) p.append(0, s, t, m.key_pre(s, t), m.key_post(s, t));
        // Sequence 1 is shorter: its tail past seq_len is not written.
        std::vector<int32_t> lens{m.n, m.n - 9}, pos{m.pos, m.pos};
        std::vector<float> late, early;
        const auto lb = kvtest::nan_score_buffer(late, m.S, m.H, 96);
        const auto eb = kvtest::nan_score_buffer(early, m.S, m.H, 96);
        const kvscout::score_context<kvscout::host_space> ctx{{m.x.data(), m.x.size()}, {m.q.data(), m.q.size()},
                                        {pos.data(), 2}, {lens.data(), 2}};
        p.score_query(0, ctx, lb);
        p.score(0, ctx, eb);
        for (int s = 0; s < m.S; ++s)
          for (int h = 0; h < m.H; ++h) {
            const auto& pl = plans[static_cast<std::size_t>(h)];
            for (int t = 0; t < 96; ++t) {
              CAPTURE(s, h, t);
              if (t >= lens[static_cast<std::size_t>(s)]) {
                REQUIRE(std::isnan(lb.row(s, h)[t]));
                continue;
              }
              // fp64: (q A)[S] . (k A)[S] * scale, the largest of the group, from the model's own
              // query and key (not the policy's stored partial keys).
              double want = -INFINITY;
              for (int j = 0; j < g; ++j) {
                const float* qv = &m.q[(static_cast<std::size_t>(s) * m.Hq + h * g + j) * D];
                const float* kv = m.key_post(s, t) + static_cast<std::size_t>(h) * D;
                double d = 0;
                for (int i = 0; i < r; ++i) {
                  const int ch = pl.channels[static_cast<std::size_t>(i)];
                  double qa = 0, ka = 0;
                  for (int e = 0; e < D; ++e) {
                    const double a = mode == kvscout::rope_mode::rope_planes ? (e == ch ? 1.0 : 0.0)
                                                                             : pl.A[static_cast<std::size_t>(e) * D + ch];
                    qa += qv[e] * a;
                    ka += kv[e] * a;
                  }
                  d += qa * ka;
                }
                want = std::max(want, d * 0.125);
              }
              REQUIRE(lb.row(s, h)[t] == Approx(want).margin(2e-4).epsilon(1e-4));
              // The speculation from x predicts this very query (the same layer's W_Q): the
              // late and early scores agree to rounding.
              REQUIRE(eb.row(s, h)[t] == Approx(lb.row(s, h)[t]).margin(2e-4).epsilon(1e-4));
            }
          }
        // A batch row names its sequence by seq_ids: row 0 scores sequence 1 with row 0's query.
        std::vector<int32_t> ids{1, 0}, lens2{m.n - 9, m.n};
        std::vector<float> swapped;
        const auto sb = kvtest::nan_score_buffer(swapped, m.S, m.H, 96);
        std::vector<float> q2(m.q.size());
        std::copy(m.q.begin() + m.Hq * D, m.q.end(), q2.begin());
        std::copy(m.q.begin(), m.q.begin() + m.Hq * D, q2.begin() + m.Hq * D);
        p.score_query(0, {{}, {q2.data(), q2.size()}, {pos.data(), 2}, {lens2.data(), 2}, {ids.data(), 2}}, sb);
        for (int h = 0; h < m.H; ++h)
          for (int t = 0; t < m.n - 9; ++t) REQUIRE(sb.row(0, h)[t] == lb.row(1, h)[t]);
      }
}

TEST_CASE("score_query refuses what it cannot score", "[spec][infinigen][correction][errors]") {
  const slice m(1, 2, 2, 20, 3u);
  const auto folded = m.plans(16, kvscout::rope_mode::pre_rope_folded, 4u);
  const auto planes = m.plans(16, kvscout::rope_mode::rope_planes, 4u);
  const kvscout::infinigen_config pc{{.num_layers = 3, .num_seqs = 1, .num_kv_heads = m.H,
                                     .num_q_heads = m.Hq, .head_dim = D, .d_model = m.d_model,
                                     .max_tokens = 32, .scale = 0.125f}};
  auto p = kvscout::infinigen_policy_host<>::layers(pc, {{}, folded, planes},
                                     {{}, {m.wq.data(), m.wq.size()}, {m.wq.data(), m.wq.size()}},
                                     {{}, {}, {}});
  std::vector<int32_t> lens{m.n}, pos{m.pos};
  std::vector<float> scores;
  const auto out = kvtest::nan_score_buffer(scores, 1, m.H, 32);
  const kvscout::score_context<kvscout::host_space> ctx{{}, {m.q.data(), m.q.size()}, {pos.data(), 1}, {lens.data(), 1}};
  REQUIRE_THROWS_WITH(p.score_query(0, ctx, out), Catch::Contains("layer 0 has no policy (not speculated"));
  REQUIRE_THROWS_WITH(p.score_query(1, ctx, out), Catch::Contains("pre_rope_folded"));
  const kvscout::score_context<kvscout::host_space> short_q{{}, {m.q.data(), m.q.size() - 1}, {pos.data(), 1}, {lens.data(), 1}};
  REQUIRE_THROWS_WITH(p.score_query(2, short_q, out), Catch::Contains("q holds 255 floats, expected [1, 4, 64]"));
  std::vector<int32_t> long_len{33};
  REQUIRE_THROWS_WITH(p.score_query(2, {{}, {m.q.data(), m.q.size()}, {pos.data(), 1}, {long_len.data(), 1}}, out),
                      Catch::Contains("seq_lens[0] = 33"));
  // Nothing was written by the refusals.
  for (float v : scores) REQUIRE(std::isnan(v));
  // The adaptor is a late policy.
  static_assert(kvscout::infinigen_query_scores_host<
                kvscout::policy_layers<kvscout::infinigen_policy_host<>>>::needs_query);
}

TEST_CASE("score_query aggregates the group by query_aggregation, score() by aggregation",
          "[spec][infinigen][correction]") {
  using kvscout::gqa_aggregation;
  const slice m(2, 2, 3, 70, 77u);
  const auto plans = m.plans(32, kvscout::rope_mode::rope_planes, 9u);
  std::vector<int32_t> lens{m.n, m.n - 5}, pos{m.pos, m.pos};
  const kvscout::score_context<kvscout::host_space> ctx{{m.x.data(), m.x.size()}, {m.q.data(), m.q.size()},
                                  {pos.data(), 2}, {lens.data(), 2}};
  // Scores of score() and score_query() of a policy with these aggregations.
  const auto run = [&](gqa_aggregation spec, std::optional<gqa_aggregation> late) {
    kvscout::infinigen_config pc{.shape = {.num_layers = 1, .num_seqs = m.S, .num_kv_heads = m.H,
                                 .num_q_heads = m.Hq, .head_dim = D, .d_model = m.d_model,
                                 .max_tokens = 96, .scale = 0.125f},
                                 .aggregation = spec};
    pc.query_aggregation = late;
    auto p = kvscout::infinigen_policy_host<>::layers(pc, {plans}, {{m.wq.data(), m.wq.size()}},
                                  {{m.bq.data(), m.bq.size()}});
    for (int s = 0; s < m.S; ++s)
      for (int t = 0; t < m.n; ++t) p.append(0, s, t, m.key_pre(s, t), m.key_post(s, t));
    std::vector<float> early, late_scores;
    p.score(0, ctx, kvtest::nan_score_buffer(early, m.S, m.H, 96));
    p.score_query(0, ctx, kvtest::nan_score_buffer(late_scores, m.S, m.H, 96));
    return std::make_pair(early, late_scores);
  };
  const auto mixed = run(gqa_aggregation::max_logit, gqa_aggregation::sum_prob);
  const auto max_only = run(gqa_aggregation::max_logit, std::nullopt);
  const auto sum_only = run(gqa_aggregation::sum_prob, std::nullopt);
  // The speculation keeps its own aggregation; the late ranking takes query_aggregation's, bit
  // for bit what a policy of that aggregation computes.
  REQUIRE(std::memcmp(mixed.first.data(), max_only.first.data(), sizeof(float) * mixed.first.size()) == 0);
  REQUIRE(std::memcmp(mixed.second.data(), sum_only.second.data(), sizeof(float) * mixed.second.size()) == 0);
  // And it is the group's attention mass over the partial logits (fp64 from the max_logit
  // policy's definition: with g = 3 the max and the sum of probabilities rank differently).
  const auto plain = run(gqa_aggregation::max_logit, gqa_aggregation::max_logit);
  REQUIRE(std::memcmp(plain.second.data(), max_only.second.data(), sizeof(float) * plain.second.size()) == 0);
  bool differs = false;
  for (int s = 0; s < m.S; ++s)
    for (int h = 0; h < m.H; ++h) {
      const int n = lens[static_cast<std::size_t>(s)];
      std::vector<std::vector<double>> logit(3, std::vector<double>(static_cast<std::size_t>(n)));
      const auto& pl = plans[static_cast<std::size_t>(h)];
      for (int j = 0; j < 3; ++j)
        for (int t = 0; t < n; ++t) {
          const float* qv = &m.q[(static_cast<std::size_t>(s) * m.Hq + h * 3 + j) * D];
          const float* kv = m.key_post(s, t) + static_cast<std::size_t>(h) * D;
          double d = 0;
          for (int i = 0; i < 32; ++i) {
            const int ch = pl.channels[static_cast<std::size_t>(i)];
            d += static_cast<double>(qv[ch]) * kv[ch];
          }
          logit[static_cast<std::size_t>(j)][static_cast<std::size_t>(t)] = d * 0.125;
        }
      std::vector<double> mass(static_cast<std::size_t>(n), 0.0);
      for (const auto& row : logit) {
        const double mx = *std::max_element(row.begin(), row.end());
        double z = 0;
        for (double v : row) z += std::exp(v - mx);
        for (int t = 0; t < n; ++t) mass[static_cast<std::size_t>(t)] += std::exp(row[static_cast<std::size_t>(t)] - mx) / z;
      }
      const float* got = mixed.second.data() + (static_cast<std::size_t>(s) * m.H + h) * 96;
      const float* max_row = max_only.second.data() + (static_cast<std::size_t>(s) * m.H + h) * 96;
      for (int t = 0; t < n; ++t) {
        CAPTURE(s, h, t);
        REQUIRE(got[t] == Approx(mass[static_cast<std::size_t>(t)]).margin(1e-6).epsilon(1e-4));
        differs = differs || got[t] != max_row[t];
      }
    }
  REQUIRE(differs);
  // A value that is no aggregation is refused by its field's name.
  kvscout::infinigen_config bad{{.num_layers = 1, .num_seqs = m.S, .num_kv_heads = m.H,
                                .num_q_heads = m.Hq, .head_dim = D, .d_model = m.d_model,
                                .max_tokens = 96, .scale = 0.125f}};
  bad.query_aggregation = static_cast<gqa_aggregation>(7);
  REQUIRE_THROWS_WITH(kvscout::infinigen_policy_host<>::workspace_bytes(bad),
                      Catch::Contains("query_aggregation = 7 is no gqa_aggregation"));
  bad.query_aggregation.reset();
  bad.aggregation = static_cast<gqa_aggregation>(-1);
  REQUIRE_THROWS_WITH(kvscout::infinigen_policy_host<>::workspace_bytes(bad),
                      Catch::Contains("aggregation = -1 is no gqa_aggregation"));
}

namespace {

// The selector's semantics, written out: the rows not speculated; all of them where they are no
// more than `extra`, else the `extra` best by late score (NaN never, ties to the lower index).
std::vector<int32_t> reference_added(const std::vector<float>& row, int len, int extra,
                                     const std::vector<int32_t>& spec) {
  std::vector<int32_t> rest;
  for (int t = 0; t < len; ++t)
    if (!std::binary_search(spec.begin(), spec.end(), t)) rest.push_back(t);
  if (static_cast<int>(rest.size()) <= extra) return rest;
  std::vector<int32_t> ranked;
  for (int t : rest)
    if (!std::isnan(row[static_cast<std::size_t>(t)])) ranked.push_back(t);
  std::stable_sort(ranked.begin(), ranked.end(), [&](int a, int b) {
    return row[static_cast<std::size_t>(a)] > row[static_cast<std::size_t>(b)];
  });
  if (static_cast<int>(ranked.size()) > extra) ranked.resize(static_cast<std::size_t>(extra));
  std::sort(ranked.begin(), ranked.end());
  return ranked;
}

}  // namespace

TEST_CASE("the correction adds the best rows by late score that the speculation did not select",
          "[select][correction]") {
  std::mt19937 rng(2024);
  const int S = 3, H = 2, stride = 700, cap = 64;
  const double shares[] = {0.0, 0.05, 0.3, 0.9, 1.0};  // total_share: 0 is a fixed `extra`
  for (int trial = 0; trial < 60; ++trial) {
    const int extra = 1 + static_cast<int>(rng() % cap);
    const double total_share = shares[trial % 5];
    CAPTURE(trial, extra, total_share);
    std::vector<int32_t> lens(S);
    for (auto& l : lens) l = static_cast<int>(rng() % (stride + 1));
    lens[0] = std::min(lens[0], extra + 5);  // a row with few unspeculated rows
    // Scores: coarse values (ties), some NaN, some infinities.
    std::vector<float> scores(static_cast<std::size_t>(S) * H * stride, 0.f);
    for (auto& v : scores) {
      const auto u = rng() % 100;
      v = u < 3 ? nan_f : u < 5 ? -INFINITY : u < 6 ? INFINITY : static_cast<float>(rng() % 40) * 0.25f - 3.f;
    }
    // Speculated rows: a random ascending subset of [0, len), at most spec_cap.
    const int spec_cap = 80;
    std::vector<int32_t> sp_idx(static_cast<std::size_t>(S) * H * spec_cap, -1), sp_cnt(static_cast<std::size_t>(S) * H);
    std::vector<std::vector<int32_t>> spec(static_cast<std::size_t>(S) * H);
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h) {
        auto& v = spec[static_cast<std::size_t>(s) * H + h];
        for (int t = 0; t < lens[static_cast<std::size_t>(s)] && static_cast<int>(v.size()) < spec_cap; ++t)
          if (rng() % 3 == 0) v.push_back(t);
        std::copy(v.begin(), v.end(), sp_idx.begin() + (static_cast<std::size_t>(s) * H + h) * spec_cap);
        sp_cnt[static_cast<std::size_t>(s) * H + h] = static_cast<int>(v.size());
      }
    const kvscout::correction_selector_host::config cfg{
        .shape = {.num_seqs = S, .num_kv_heads = H, .max_tokens = stride},
        .capacity = cap,
        .extra = extra,
        .total_share = total_share};
    auto ws = kvscout::make_workspace<kvscout::correction_selector_host>(cfg);
    kvscout::correction_selector_host corr(cfg, ws.span());
    std::vector<int32_t> idx(static_cast<std::size_t>(S) * H * cap, -7), cnt(static_cast<std::size_t>(S) * H, -7);
    const std::vector<float> before = scores;
    corr.select({{scores.data(), scores.size()}, {lens.data(), lens.size()}, S, H, stride},
                {{sp_idx.data(), sp_idx.size()}, {sp_cnt.data(), sp_cnt.size()}, S, H, spec_cap},
                {{idx.data(), idx.size()}, {cnt.data(), cnt.size()}, S, H, cap});
    REQUIRE(std::memcmp(before.data(), scores.data(), scores.size() * sizeof(float)) == 0);  // input kept
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h) {
        CAPTURE(s, h, lens[static_cast<std::size_t>(s)]);
        const std::size_t rr = static_cast<std::size_t>(s) * H + h;
        const std::vector<float> row(scores.begin() + static_cast<std::ptrdiff_t>(rr * stride),
                                     scores.begin() + static_cast<std::ptrdiff_t>((rr + 1) * stride));
        // With a total share, the row is topped up to ceil(share * len) rows in all.
        const int len = lens[static_cast<std::size_t>(s)], ns = static_cast<int>(spec[rr].size());
        const int total = std::min(len, static_cast<int>(std::ceil(total_share * len - 1e-9)));
        const int e = total_share > 0 ? std::clamp(total - ns, 0, extra) : extra;
        CAPTURE(e);
        const auto want = reference_added(row, len, e, spec[rr]);
        const std::vector<int32_t> got(idx.begin() + static_cast<std::ptrdiff_t>(rr * cap),
                                       idx.begin() + static_cast<std::ptrdiff_t>(rr * cap + cnt[rr]));
        REQUIRE(got == want);
        REQUIRE(cnt[rr] <= extra);
      }
  }
}

TEST_CASE("the correction adds nothing the speculation already holds, and holds its extra cap",
          "[select][correction]") {
  // Scores rank token t at 1000 - t.
  constexpr int stride = 100;
  std::vector<float> scores(stride);
  for (int t = 0; t < stride; ++t) scores[static_cast<std::size_t>(t)] = 1000.f - static_cast<float>(t);
  std::vector<int32_t> lens{stride};
  const auto run = [&](std::vector<int32_t> spec, int extra, int len = 100) {
    lens[0] = len;
    const kvscout::correction_selector_host::config cfg{{.num_seqs = 1, .num_kv_heads = 1,
                                                        .max_tokens = stride}, 8, extra};
    auto ws = kvscout::make_workspace<kvscout::correction_selector_host>(cfg);
    kvscout::correction_selector_host corr(cfg, ws.span());
    std::vector<int32_t> cnt{static_cast<int32_t>(spec.size())}, idx(8), n(1);
    spec.resize(std::max<std::size_t>(spec.size(), 1));
    corr.select({{scores.data(), scores.size()}, {lens.data(), 1}, 1, 1, stride},
                {{spec.data(), spec.size()}, {cnt.data(), 1}, 1, 1, static_cast<int>(spec.size())},
                {{idx.data(), idx.size()}, {n.data(), 1}, 1, 1, 8});
    return std::vector<int32_t>(idx.begin(), idx.begin() + n[0]);
  };
  REQUIRE(run({1, 3, 50, 60}, 6) == std::vector<int32_t>{0, 2, 4, 5, 6, 7});  // the best 6 misses
  REQUIRE(run({1, 3, 50, 60}, 3) == std::vector<int32_t>{0, 2, 4});
  REQUIRE(run({0, 1, 2, 3, 4, 5, 6, 7}, 2) == std::vector<int32_t>{8, 9});
  REQUIRE(run({0, 2, 4}, 4, 6) == std::vector<int32_t>{1, 3, 5});  // all that is left
  REQUIRE(run({0, 1, 2, 3, 4, 5}, 4, 6).empty());                   // nothing left
}

TEST_CASE("the correction refuses a malformed speculated selection and config",
          "[select][correction][errors]") {
  const int stride = 50;
  std::vector<float> scores(stride, 1.f);
  std::vector<int32_t> lens{40}, idx(8), n(1);
  const kvscout::correction_selector_host::config cfg{{.num_seqs = 1, .num_kv_heads = 1,
                                                      .max_tokens = stride}, 8, 4};
  auto ws = kvscout::make_workspace<kvscout::correction_selector_host>(cfg);
  kvscout::correction_selector_host corr(cfg, ws.span());
  const auto run = [&](std::vector<int32_t> spec, int count) {
    std::vector<int32_t> cnt{count};
    corr.select({{scores.data(), scores.size()}, {lens.data(), 1}, 1, 1, stride},
                {{spec.data(), spec.size()}, {cnt.data(), 1}, 1, 1, static_cast<int>(spec.size())},
                {{idx.data(), idx.size()}, {n.data(), 1}, 1, 1, 8});
  };
  n[0] = -3;
  REQUIRE_THROWS_WITH(run({3, 2, 9}, 3), Catch::Contains("speculated index 2 at (seq 0, kv head 0, slot 1)"));
  REQUIRE_THROWS_WITH(run({3, 40}, 2), Catch::Contains("speculated index 40") && Catch::Contains("seq_len = 40"));
  REQUIRE_THROWS_WITH(run({-1}, 1), Catch::Contains("speculated index -1"));
  REQUIRE_THROWS_WITH(run({1, 2}, 3), Catch::Contains("speculated count of (seq 0, kv head 0) = 3"));
  REQUIRE(n[0] == -3);  // nothing written
  REQUIRE_THROWS_WITH(kvscout::correction_selector_host::workspace_bytes({{.num_seqs = 1,
                                                                          .num_kv_heads = 1,
                                                                          .max_tokens = stride}, 8,
                                                                          9}),
                      Catch::Contains("extra = 9 must be in [1, capacity = 8]"));
  REQUIRE_THROWS_WITH(kvscout::correction_selector_host::workspace_bytes({{.num_seqs = 1,
                                                                          .num_kv_heads = 1,
                                                                          .max_tokens = stride}, 8,
                                                                          0}),
                      Catch::Contains("extra = 0 must be in [1, capacity = 8]"));
  for (const double bad : {-0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(bad);
    REQUIRE_THROWS_WITH(kvscout::correction_selector_host::workspace_bytes(
                            {.shape = {.num_seqs = 1, .num_kv_heads = 1, .max_tokens = stride},
                             .capacity = 8,
                             .extra = 4,
                             .total_share = bad}),
                        Catch::Contains("total_share = ") &&
                            Catch::Contains("expected a share of the cached rows in [0, 1]"));
  }
}

TEST_CASE("the host policy checks the config's r, mode and correction_r against its plans",
          "[spec][infinigen][errors]") {
  const slice m(2, 2, 1, 40, 77u);
  const auto plans = m.plans(16, kvscout::rope_mode::rope_planes, 5u);
  const auto wide = m.plans(32, kvscout::rope_mode::rope_planes, 5u);
  const auto build = [&](int r, kvscout::rope_mode mode, int correction_r) {
    const kvscout::infinigen_config pc{.shape = {.num_layers = 1,
                                                 .num_seqs = m.S,
                                                 .num_kv_heads = m.H,
                                                 .num_q_heads = m.Hq,
                                                 .head_dim = D,
                                                 .d_model = m.d_model,
                                                 .max_tokens = 64,
                                                 .scale = 0.125f},
                                       .r = r,
                                       .mode = mode,
                                       .correction_r = correction_r};
    auto p = kvscout::infinigen_policy_host<>::layers(pc, {plans}, {wide}, {{m.wq.data(), m.wq.size()}},
                                       {{m.bq.data(), m.bq.size()}});
  };
  const auto planes = kvscout::rope_mode::rope_planes;
  CHECK_NOTHROW(build(0, kvscout::rope_mode::post_rope_skew, 0));  // 0: the plans' own
  CHECK_NOTHROW(build(16, planes, 32));
  using Catch::Contains;
  CHECK_THROWS_WITH(
      build(12, planes, 0),
      Contains("layer 0's plans have r = 16 and mode rope_planes, the config r = 12"));
  CHECK_THROWS_WITH(build(16, kvscout::rope_mode::post_rope_skew, 0),
                    Contains("the config r = 16 and mode post_rope_skew"));
  CHECK_THROWS_WITH(
      build(16, planes, 24),
      Contains("layer 0's correction plans have r = 32, the config correction_r = 24"));
}
