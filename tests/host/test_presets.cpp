// The named speculation presets (presets.hpp): their values, and that they build what they say
// (a calibration in their mode and partial dimension, a selector with their rule).

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <type_traits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvscout/calibrate.hpp"
#include "kvscout/presets.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/select/threshold.hpp"
#include "kvscout/select/topk.hpp"
#include "kvscout/skew/calibrate.hpp"
#include "kvscout/skew/plan.hpp"

namespace {

using kvscout::gqa_aggregation;
using kvscout::rope_mode;
using kvscout::threshold_rule;
using kvscout::presets::selector_kind;

}  // namespace

TEST_CASE("infinigen_paper: InfiniGen's reference configuration", "[presets]") {
  const auto p = kvscout::presets::infinigen_paper(128);
  CHECK(std::string(p.name) == "infinigen_paper");
  CHECK(std::string(p.label).find("InfiniGen (paper)") == 0);
  CHECK(p.mode == rope_mode::post_rope_skew);
  CHECK(p.partial_ratio == 0.2);
  CHECK(p.r == 25);  // int(128 * 0.2), as the reference truncates
  CHECK_FALSE(p.union_with_keys);
  CHECK(p.aggregation == gqa_aggregation::max_logit);
  CHECK(p.selector == selector_kind::threshold);
  CHECK(p.rule == threshold_rule::infinigen_mean);
  CHECK(p.alpha == 4.f);
  CHECK(p.keep.sinks == 0);
  CHECK(p.keep.recent == 0);
  CHECK(p.skip_layers == 2);
  CHECK(kvscout::presets::infinigen_paper_budget == 0.2);

  CHECK(kvscout::presets::infinigen_paper(64).r == 12);
  CHECK_FALSE(kvscout::presets::infinigen_paper(64).query_aggregation.has_value());  // no correction step
  CHECK(kvscout::presets::infinigen_paper(256).r == 51);
  CHECK(kvscout::presets::infinigen_paper(4).r == 1);  // at least one channel
  CHECK_THROWS_AS(kvscout::presets::infinigen_paper(0), kvscout::error);
}

TEST_CASE("kvscout_speculation_only: RoPE planes, top-k, not InfiniGen's rule", "[presets]") {
  const auto p = kvscout::presets::kvscout_speculation_only(64);
  CHECK(std::string(p.name) == "kvscout_speculation_only");
  CHECK(std::string(p.label) == "kvscout speculation only: RoPE planes");
  CHECK(p.mode == rope_mode::rope_planes);
  CHECK(p.partial_ratio == 0.5);
  CHECK(p.r == 32);  // the harness's choice on head_dim 64
  CHECK_FALSE(p.union_with_keys);
  CHECK(p.aggregation == gqa_aggregation::max_logit);
  REQUIRE(p.query_aggregation.has_value());
  CHECK(*p.query_aggregation == gqa_aggregation::sum_prob);  // the correction step's ranking
  CHECK(p.selector == selector_kind::topk);
  CHECK(p.rule != threshold_rule::infinigen_mean);
  CHECK(p.keep.sinks == 4);
  CHECK(p.keep.recent == 16);
  CHECK(p.skip_layers == 2);
  CHECK(p.correction_share == 0);  // speculation alone
  CHECK(p.key_bits == 0);
  CHECK_FALSE(p.layer_rule.has_value());
  CHECK(p.policy_config({.head_dim = 64}).correction_r == 0);

  CHECK(kvscout::presets::kvscout_default(128).r == 64);
  CHECK(kvscout::presets::kvscout_default(6).r == 2);  // whole planes
  CHECK(kvscout::presets::kvscout_default(2).r == 2);
  CHECK_THROWS_AS(kvscout::presets::kvscout_default(63), kvscout::error);
  CHECK(std::string(kvscout::to_string(selector_kind::topk)) == "topk");
  CHECK(std::string(kvscout::to_string(selector_kind::threshold)) == "threshold");
}

TEST_CASE("kvscout_default: the speculation plus a correction, layer shares and 2-bit keys",
          "[presets]") {
  const auto p = kvscout::presets::kvscout_default(64);
  const auto spec = kvscout::presets::kvscout_speculation_only(64);
  CHECK(std::string(p.name) == "kvscout_default");
  CHECK(p.mode == spec.mode);
  CHECK(p.r == spec.r);
  CHECK(p.aggregation == spec.aggregation);
  CHECK(p.query_aggregation == spec.query_aggregation);
  CHECK(p.keep.sinks == 4);
  CHECK(p.keep.recent == 16);
  CHECK(p.correction_share == 0.25);  // the harness's --correct-share 0.25
  CHECK(p.correction_r == 64);        // --late-r 64
  CHECK(p.key_bits == 2);             // --rank-bits 2 --library-keys
  REQUIRE(p.layer_rule.has_value());
  CHECK(*p.layer_rule == kvscout::layer_budget_rule::coverage);  // --layer-rule coverage
  CHECK(p.layer_floor == 0.5);                                   // --layer-floor 0.5
  CHECK(p.layer_bins == 400);
  static_assert(std::is_same_v<kvscout::presets::partial_keys_t<2>, kvscout::quantized_keys<2>>);
  static_assert(std::is_same_v<kvscout::presets::partial_keys_t<0>, float>);
  const kvscout::infinigen_config c = p.policy_config({.head_dim = 64});
  CHECK(c.r == 32);
  CHECK(c.correction_r == 64);
  CHECK(c.mode == rope_mode::rope_planes);
  CHECK(c.late_aggregation() == gqa_aggregation::sum_prob);
  // A quarter of the budget to the correction; in all, the budget.
  CHECK(p.speculated_share(0.1) == 0.1 * 0.75);
  CHECK(std::abs(p.total_share(0.1, 1.5) - 0.15) < 1e-15);
}

TEST_CASE("budgets(): each layer's shares, and capacities that hold every length's rows",
          "[presets][budgets]") {
  const auto p = kvscout::presets::kvscout_default(64);
  const kvscout::decode_shape shape{.num_layers = 5,
                                    .num_seqs = 1,
                                    .num_kv_heads = 1,
                                    .num_q_heads = 1,
                                    .head_dim = 64,
                                    .max_tokens = 2000};
  const std::vector<double> shares{1, 1, 0.5, 1.3, 1.2};
  for (const double budget : {0.01, 0.05, 0.1, 0.2, 0.5}) {
    CAPTURE(budget);
    const auto b = kvscout::presets::budgets(p, shape, budget, shares);
    REQUIRE(b.speculated.size() == 5);
    CHECK(b.speculated[0] == 0);  // dense layers
    CHECK(b.total[1] == 0);
    int most = 0, most_extra = 0;
    for (int l = 2; l < 5; ++l) {
      CHECK(b.speculated[static_cast<std::size_t>(l)] ==
            budget * 0.75 * shares[static_cast<std::size_t>(l)]);
      const auto sc = b.selector_config(shape, l);
      CHECK(sc.budget_share == b.speculated[static_cast<std::size_t>(l)]);
      CHECK(sc.capacity == b.capacity);
      CHECK(sc.keep.sinks == 4);
      for (int len = 0; len <= shape.max_tokens; ++len) {
        const int spec = std::min(
            len, std::max(20, static_cast<int>(std::ceil(
                                  b.speculated[static_cast<std::size_t>(l)] * len - 1e-9))));
        const int total = std::min(
            len, static_cast<int>(std::ceil(b.total[static_cast<std::size_t>(l)] * len - 1e-9)));
        most = std::max(most, spec);
        most_extra = std::max(most_extra, total - spec);
      }
    }
    CHECK(b.capacity >= most);
    CHECK(b.capacity <= most + 1);
    CHECK(b.correction_capacity >= most_extra);
    CHECK(b.correction_capacity <= b.capacity);
    CHECK(b.correction_shares() == b.total);
  }
  // Without a correction step: no correction capacity, no shares for the pipeline.
  const auto alone =
      kvscout::presets::budgets(kvscout::presets::kvscout_speculation_only(64), shape, 0.1);
  CHECK(alone.correction_capacity == 0);
  CHECK(alone.correction_shares().empty());
  CHECK(alone.speculated[4] == 0.1);
  CHECK(alone.capacity == 200);
  CHECK_THROWS_WITH(kvscout::presets::budgets(p, shape, 0.0),
                    Catch::Contains("budget = 0: expected a share"));
  CHECK_THROWS_WITH(kvscout::presets::budgets(p, shape, 0.1, {1, 1}),
                    Catch::Contains("got 2 layer shares, expected none or one per layer (5)"));
  CHECK_THROWS_WITH(kvscout::presets::budgets(p, shape, 0.8, shares),
                    Catch::Contains("layer 3: budget 0.8 x layer share 1.3"));
  CHECK_THROWS_WITH(kvscout::presets::budgets(kvscout::presets::infinigen_paper(64), shape, 0.1),
                    Catch::Contains("infinigen_paper: budgets() sizes top-k selectors"));
  auto edited = p;  // a caller's edits, checked: shares of the budget and a keep-set that fits
  edited.correction_share = 1.5;
  CHECK_THROWS_WITH(kvscout::presets::budgets(edited, shape, 0.1),
                    Catch::Contains("correction_share = 1.5, expected a share of the budget in [0, 1)"));
  edited = p;
  edited.keep = {1 << 30, 1 << 30};
  CHECK_THROWS_WITH(kvscout::presets::budgets(edited, shape, 0.1),
                    Catch::Contains("expected sinks and recent in [0, 2^30)"));
}

TEST_CASE("layer_mass_curves: each layer's attention mass, as its definition computes it",
          "[presets][budgets]") {
  // Two layers (layer 0 skipped), two kv heads of a group of 2, head_dim 4, 64 tokens.
  constexpr int L = 2, H = 2, Hq = 4, D = 4, n = 64, bins = 8;
  const kvscout::decode_shape shape{
      .num_layers = L, .num_kv_heads = H, .num_q_heads = Hq, .head_dim = D};
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<std::vector<float>> q(L), k(L);
  for (int l = 0; l < L; ++l) {
    q[static_cast<std::size_t>(l)].resize(static_cast<std::size_t>(n) * Hq * D);
    k[static_cast<std::size_t>(l)].resize(static_cast<std::size_t>(n) * H * D);
    for (auto& v : q[static_cast<std::size_t>(l)]) v = 2.f * nd(rng);
    for (auto& v : k[static_cast<std::size_t>(l)]) v = nd(rng);
  }
  const std::vector<double> c = kvscout::layer_mass_curves(shape, q, k, n, bins, 1, 16);
  REQUIRE(c.size() == static_cast<std::size_t>(L) * bins);
  for (int b = 0; b < bins; ++b) CHECK(c[static_cast<std::size_t>(b)] == 0);  // layer 0 skipped
  // The reference, in double: positions 16, 32, 48 (every 16th from n / 8 = 8), per head.
  std::vector<double> want(bins, 0.0);
  int samples = 0;
  for (int t = 16; t < n; t += 16)
    for (int h = 0; h < H; ++h) {
      std::vector<double> mass(static_cast<std::size_t>(t), 0.0);
      for (int j = 0; j < 2; ++j) {
        const float* qv = &q[1][(static_cast<std::size_t>(t) * Hq + h * 2 + j) * D];
        std::vector<double> lg(static_cast<std::size_t>(t));
        for (int i = 0; i < t; ++i) {
          double d = 0;
          for (int x = 0; x < D; ++x)
            d += static_cast<double>(qv[x]) * k[1][(static_cast<std::size_t>(i) * H + h) * D + x];
          lg[static_cast<std::size_t>(i)] = d / 2.0;  // 1 / sqrt(4)
        }
        const double m = *std::max_element(lg.begin(), lg.end());
        double z = 0;
        for (double v : lg) z += std::exp(v - m);
        for (int i = 0; i < t; ++i)
          mass[static_cast<std::size_t>(i)] += std::exp(lg[static_cast<std::size_t>(i)] - m) / z;
      }
      std::sort(mass.begin(), mass.end(), std::greater<double>());
      for (int b = 0; b < bins; ++b) {
        const int top = static_cast<int>(std::ceil((b + 1) * static_cast<double>(t) / bins - 1e-9));
        double acc = 0;
        for (int i = 0; i < top; ++i) acc += mass[static_cast<std::size_t>(i)];
        want[static_cast<std::size_t>(b)] += acc / 2.0;  // the group's mass sums to 2
      }
      ++samples;
    }
  for (int b = 0; b < bins; ++b) {
    CAPTURE(b);
    CHECK(c[static_cast<std::size_t>(bins + b)] ==
          Approx(want[static_cast<std::size_t>(b)] / samples).epsilon(1e-5));
  }
  CHECK(c[static_cast<std::size_t>(2 * bins - 1)] == Approx(1.0).epsilon(1e-6));
  CHECK_THROWS_WITH(kvscout::layer_mass_curves(shape, q, k, n - 1, bins, 1),
                    Catch::Contains("layer_mass_curves: layer 1 has"));
  CHECK_THROWS_WITH(kvscout::layer_mass_curves(shape, {q[0]}, k, n, bins, 1),
                    Catch::Contains("got 1 query and 2 key sets"));
}

TEST_CASE("presets::calibrate: a preset's plans, correction plans and layer shares in one call",
          "[presets][budgets]") {
  constexpr int L = 4, H = 1, Hq = 2, D = 16, n = 128;
  const kvscout::decode_shape shape{
      .num_layers = L, .num_kv_heads = H, .num_q_heads = Hq, .head_dim = D};
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<std::vector<float>> q(L), k(L);
  for (int l = 0; l < L; ++l) {
    q[static_cast<std::size_t>(l)].resize(static_cast<std::size_t>(n) * Hq * D);
    k[static_cast<std::size_t>(l)].resize(static_cast<std::size_t>(n) * H * D);
    // Layer 3 attends sharply (large queries), layer 2 almost evenly (small ones).
    const float scale = l == 3 ? 4.f : 0.1f;
    for (std::size_t i = 0; i < q[static_cast<std::size_t>(l)].size(); ++i)
      q[static_cast<std::size_t>(l)][i] = scale * nd(rng) * (1.f + static_cast<float>(i % D) / 4.f);
    for (auto& v : k[static_cast<std::size_t>(l)]) v = nd(rng);
  }
  const kvscout::rope_config rope{D, 1e4f, kvscout::rope_style::split_half};
  const auto p = kvscout::presets::kvscout_default(D);
  const auto cal = kvscout::presets::calibrate(p, shape, rope, q, k, n);
  const auto plans = kvscout::calibrate_skew_layers(shape, q, k, n, p.skew(rope), 2);
  const auto wide = kvscout::calibrate_skew_layers(shape, q, k, n, p.correction_skew(rope), 2);
  REQUIRE(cal.plans.size() == L);
  CHECK(cal.plans[1].empty());
  for (int l = 2; l < L; ++l) {
    CHECK(cal.plans[static_cast<std::size_t>(l)][0].channels ==
          plans[static_cast<std::size_t>(l)][0].channels);
    CHECK(cal.correction_plans[static_cast<std::size_t>(l)][0].channels ==
          wide[static_cast<std::size_t>(l)][0].channels);
    CHECK(cal.correction_plans[static_cast<std::size_t>(l)][0].r == D);
  }
  CHECK(cal.mass_curves == kvscout::layer_mass_curves(shape, q, k, n, 400, 2));
  // The sharp layer needs fewer rows for the same coverage: it gets the smaller share.
  const std::vector<double> shares = cal.layer_shares(p, 0.1);
  REQUIRE(shares.size() == L);
  CHECK(shares[0] == 1.0);
  CHECK(shares[2] + shares[3] == Approx(2.0));
  CHECK(shares[3] < shares[2]);
  CHECK(shares[3] >= 0.5);  // the floor
  // Speculation alone: no correction plans, no shares.
  const auto alone = kvscout::presets::calibrate(kvscout::presets::kvscout_speculation_only(D),
                                                 shape, rope, q, k, n);
  CHECK(alone.correction_plans.empty());
  CHECK(alone.layer_shares(kvscout::presets::kvscout_speculation_only(D), 0.1).empty());
  CHECK_THROWS_WITH(
      kvscout::presets::calibrate(p, shape, {8, 1e4f, kvscout::rope_style::split_half}, q, k, n),
      Catch::Contains("rope.head_dim = 8, expected the shape's head_dim = 16"));
}

TEST_CASE("presets calibrate in their own mode and partial dimension", "[presets]") {
  constexpr int D = 64, g = 3, n = 96;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(static_cast<std::size_t>(n) * g * D), k(static_cast<std::size_t>(n) * D);
  for (auto& v : q) v = nd(rng);
  for (auto& v : k) v = nd(rng);
  const kvscout::rope_config rope{D, 1e5f, kvscout::rope_style::split_half};
  for (const auto& p : {kvscout::presets::infinigen_paper(D), kvscout::presets::kvscout_default(D)}) {
    const kvscout::skew_options o = p.skew(rope);
    CHECK(o.r == p.r);
    CHECK(o.mode == p.mode);
    CHECK(o.union_with_keys == p.union_with_keys);
    const kvscout::skew_plan plan =
        kvscout::calibrate_skew({q.data(), q.size()}, {k.data(), k.size()}, n, g, D, o);
    CHECK(plan.mode == p.mode);
    CHECK(plan.r == p.r);
    CHECK(static_cast<int>(plan.channels.size()) == p.r);
    CHECK(plan.planes.size() == (p.mode == rope_mode::rope_planes ? std::size_t(p.r / 2) : 0u));
  }
}

TEST_CASE("a preset's correction plans hold its speculation's channels: one cache at two widths",
          "[presets]") {
  CHECK(kvscout::presets::kvscout_default(64).correction_r == 64);  // every channel
  CHECK(kvscout::presets::kvscout_default(128).correction_channels() == 128);
  CHECK(kvscout::presets::infinigen_paper(64).correction_r == 0);  // the paper has no correction
  CHECK(kvscout::presets::infinigen_paper(64).correction_channels() == 12);

  constexpr int D = 64, g = 3, n = 96;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(static_cast<std::size_t>(n) * g * D), k(static_cast<std::size_t>(n) * D);
  // Channels of unequal scale, so the ranking is not a tie between near-equal magnitudes.
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = nd(rng) * (1.f + static_cast<float>(i % D) / 8.f);
  for (auto& v : k) v = nd(rng);
  const kvscout::rope_config rope{D, 1e5f, kvscout::rope_style::split_half};
  kvscout::presets::speculation_preset skewed = kvscout::presets::infinigen_paper(D);
  skewed.correction_r = 2 * skewed.r;  // a post-RoPE skew at two widths
  kvscout::presets::speculation_preset planes48 = kvscout::presets::kvscout_default(D);
  planes48.correction_r = 48;  // RoPE planes at two widths, neither of them every channel
  for (const auto& p : {kvscout::presets::kvscout_default(D), planes48, skewed}) {
    const kvscout::skew_options o = p.correction_skew(rope);
    CHECK(o.r == p.correction_channels());
    CHECK(o.mode == p.mode);
    const auto calibrate = [&](const kvscout::skew_options& opt) {
      return kvscout::calibrate_skew({q.data(), q.size()}, {k.data(), k.size()}, n, g, D, opt);
    };
    const kvscout::skew_plan narrow = calibrate(p.skew(rope)), wide = calibrate(o);
    REQUIRE(wide.r == p.correction_channels());
    // Nesting, from the plans themselves: the narrow plan's channels are among the wide one's,
    // with the same rotation (post_rope_skew).
    auto nc = narrow.channels, wc = wide.channels;
    std::sort(nc.begin(), nc.end());
    std::sort(wc.begin(), wc.end());
    CHECK(std::includes(wc.begin(), wc.end(), nc.begin(), nc.end()));
    CHECK(narrow.A == wide.A);
    // And the library's nesting check (what infinigen_policy_host's correction plans pass).
    CHECK_NOTHROW(kvscout::detail::nested_key_plan(narrow, wide, "preset"));
  }
  // A width below the speculation's is refused by that check.
  kvscout::presets::speculation_preset narrower = kvscout::presets::kvscout_default(D);
  narrower.correction_r = 16;
  const auto plan_at = [&](const kvscout::skew_options& opt) {
    return kvscout::calibrate_skew({q.data(), q.size()}, {k.data(), k.size()}, n, g, D, opt);
  };
  CHECK_THROWS_WITH(kvscout::detail::nested_key_plan(plan_at(narrower.skew(rope)),
                                                     plan_at(narrower.correction_skew(rope)), "preset"),
                    Catch::Contains("r = 16 is smaller than the speculation plan's r = 32"));
}

TEST_CASE("infinigen_paper's selector gives every head the mean count; kvscout_default's top-k the cap",
          "[presets]") {
  // Two kv heads of 40 tokens: head 0 has 2 tokens within alpha of its maximum, head 1 has 6; the
  // mean-count rule gives each (2 + 6) / 2 = 4, the top-k selector each the cap.
  constexpr int H = 2, T = 40, cap = 10;
  std::vector<float> scores(static_cast<std::size_t>(H) * T, -100.f);
  for (int t = 0; t < T; ++t) scores[static_cast<std::size_t>(t)] = -50.f - static_cast<float>(t);
  for (int t = 0; t < T; ++t) scores[static_cast<std::size_t>(T + t)] = -50.f - static_cast<float>(t);
  scores[5] = 10.f, scores[9] = 8.f;  // head 0: candidates 5, 9 (alpha 4: >= 6)
  for (int t : {1, 3, 11, 20, 30, 39}) scores[static_cast<std::size_t>(T + t)] = 10.f - 0.5f * static_cast<float>(t % 4);
  const std::int32_t len = T;
  const kvscout::score_view<kvscout::host_space> sv{{scores.data(), scores.size()}, {&len, 1}, 1, H, T};
  std::vector<std::int32_t> idx(static_cast<std::size_t>(H) * T), cnt(H);
  const kvscout::selection_buffers<kvscout::host_space> out{{idx.data(), idx.size()}, {cnt.data(), cnt.size()},
                                                            1, H, T};

  const auto paper = kvscout::presets::infinigen_paper(64);
  REQUIRE(paper.selector == selector_kind::threshold);
  const kvscout::threshold_selector_host::config tc{{.num_seqs = 1, .num_kv_heads = H,
                                                     .max_tokens = T}, T, paper.alpha, cap,
                                                    paper.rule, paper.keep};
  auto ws = kvscout::make_workspace<kvscout::threshold_selector_host>(tc);
  kvscout::threshold_selector_host thr(tc, ws.span());
  thr.select(sv, out);
  CHECK(cnt[0] == 4);
  CHECK(cnt[1] == 4);
  // Head 0 takes its two candidates and its next best two (tokens 0 and 1 at -50, -51).
  CHECK(std::vector<std::int32_t>(idx.begin(), idx.begin() + 4) == std::vector<std::int32_t>{0, 1, 5, 9});

  const auto mine = kvscout::presets::kvscout_default(64);
  REQUIRE(mine.selector == selector_kind::topk);
  const kvscout::topk_selector_host::config kc{{.num_seqs = 1, .num_kv_heads = H,
                                                .max_tokens = T},
                                               T, 24, mine.keep};
  auto kws = kvscout::make_workspace<kvscout::topk_selector_host>(kc);
  kvscout::topk_selector_host topk(kc, kws.span());
  topk.select(sv, out);
  CHECK(cnt[0] == 24);
  CHECK(cnt[1] == 24);
}
