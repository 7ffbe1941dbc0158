// The named speculation presets (presets.hpp): their values, and that they build what they say
// (a calibration in their mode and partial dimension, a selector with their rule).

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

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

TEST_CASE("kvscout_default: RoPE planes, top-k, not InfiniGen's rule", "[presets]") {
  const auto p = kvscout::presets::kvscout_default(64);
  CHECK(std::string(p.name) == "kvscout_default");
  CHECK(std::string(p.label) == "kvscout default: RoPE planes");
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

  CHECK(kvscout::presets::kvscout_default(128).r == 64);
  CHECK(kvscout::presets::kvscout_default(6).r == 2);  // whole planes
  CHECK(kvscout::presets::kvscout_default(2).r == 2);
  CHECK_THROWS_AS(kvscout::presets::kvscout_default(63), kvscout::error);
  CHECK(std::string(kvscout::presets::to_string(selector_kind::topk)) == "topk");
  CHECK(std::string(kvscout::presets::to_string(selector_kind::threshold)) == "threshold");
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
