// The host side of the CUDA facades, tested without a GPU: every check the device speculator and
// the device selectors make before a launch (score/infinigen_device.hpp,
// select/detail/device_config.hpp), the workspace layout, the device partial key cache's index
// math (the host cache's layout, element for element), and the shared softmax statistics.
// Device pointers here are never dereferenced: the checks only look at sizes and addresses.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kvscout/cache/partial_key_cache.hpp"
#include "kvscout/select/detail/device_config.hpp"
#include "kvscout/score/detail/aggregate.hpp"
#include "kvscout/score/device_concepts.hpp"
#include "kvscout/score/infinigen_device.hpp"
#include "kvscout/score/streaming.hpp"

namespace {

using kvscout::device_span;
using kvscout::gqa_aggregation;
using kvscout::rope_mode;

// The device policies' concepts, on a policy of declarations alone: score() makes a device
// speculation policy, score_query() a query-scoring one; a host policy is neither.
struct declared_device_policy {
  void score(const kvscout::score_context<kvscout::device_space>&,
             const kvscout::score_buffer<kvscout::device_space>&, const kvscout::cuda_exec&) {}
  void score_query(device_span<const float>, const kvscout::score_context<kvscout::device_space>&,
                   const kvscout::score_buffer<kvscout::device_space>&, const kvscout::cuda_exec&) {}
};
static_assert(kvscout::speculation_policy_cuda<declared_device_policy>);
static_assert(kvscout::query_scoring_policy_cuda<declared_device_policy>);
static_assert(!kvscout::speculation_policy_cuda<kvscout::streaming_policy_host>);

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kvscout::error& e) {
    return e.what();
  }
  return "(no error)";
}

kvscout::infinigen_config good_config() {
  return {.shape = {.num_seqs = 2, .num_kv_heads = 4, .num_q_heads = 16, .head_dim = 128,
                    .d_model = 512, .max_tokens = 4096, .scale = 0.0883883f},
          .r = 32, .mode = rope_mode::post_rope_skew, .aggregation = gqa_aggregation::sum_prob};
}

/// A fake device address (never dereferenced), 256-byte aligned.
template <class T>
T* fake(std::size_t offset = 0) {
  return reinterpret_cast<T*>(std::uintptr_t{1} << 20 | offset);
}

kvscout::skew_plan identity_plan(int D, int r, rope_mode mode) {
  const kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  if (mode == rope_mode::rope_planes) {
    std::vector<int> planes(static_cast<std::size_t>(r / 2));
    std::iota(planes.begin(), planes.end(), 0);
    return kvscout::rope_planes_plan(rope, std::move(planes));
  }
  kvscout::skew_plan p;
  p.mode = mode;
  p.head_dim = D;
  p.r = r;
  p.rope = rope;
  p.A.assign(static_cast<std::size_t>(D) * D, 0.f);
  for (int d = 0; d < D; ++d) p.A[static_cast<std::size_t>(d) * D + d] = 1.f;
  p.channels.resize(static_cast<std::size_t>(r));
  std::iota(p.channels.begin(), p.channels.end(), 0);
  return p;
}

}  // namespace

TEST_CASE("infinigen_cuda config checks name the bad value", "[cuda_facades][spec]") {
  REQUIRE_NOTHROW(kvscout::detail::check_infinigen_cuda_config(good_config()));
  auto c = good_config();
  c.shape.num_q_heads = 18;
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_cuda_config(c); }),
             Catch::Contains("num_q_heads = 18"));
  c = good_config();
  c.r = 129;
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_cuda_config(c); }),
             Catch::Contains("r = 129"));
  c = good_config();
  c.mode = rope_mode::rope_planes;
  c.r = 31;
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_cuda_config(c); }),
             Catch::Contains("even r"));
  c = good_config();
  c.shape.scale = -1.f;
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_cuda_config(c); }),
             Catch::Contains("-1"));
  c = good_config();
  c.shape.head_dim = 1024;
  c.r = 32;
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_cuda_config(c); }),
             Catch::Contains("1024"));
  c = good_config();
  c.shape.num_kv_heads = 1;
  c.shape.num_q_heads = 64;
  c.r = 128;  // 64 * 128 floats = 32 KiB: fits
  REQUIRE_NOTHROW(kvscout::detail::check_infinigen_cuda_config(c));
  c.shape.num_q_heads = 65;
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_cuda_config(c); }),
             Catch::Contains("65"));
  c = good_config();
  c.aggregation = static_cast<gqa_aggregation>(7);
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_cuda_config(c); }),
             Catch::Contains("aggregation = 7 is no gqa_aggregation"));
  c = good_config();
  c.query_aggregation = static_cast<gqa_aggregation>(5);  // the correction step's own
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_cuda_config(c); }),
             Catch::Contains("query_aggregation = 5 is no gqa_aggregation"));
  c = good_config();
  c.shape.num_seqs = 70000;
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_cuda_config(c); }),
             Catch::Contains("70000"));
  // The correction's channels: 0 (r), or in [r, head_dim]; whole planes for rope_planes.
  c = good_config();
  c.correction_r = 16;
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_cuda_config(c); }),
             Catch::Contains("correction_r = 16 must be 0 (r) or in [r = 32, head_dim = 128]"));
  c.correction_r = 129;
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_cuda_config(c); }),
             Catch::Contains("correction_r = 129"));
  c.mode = rope_mode::rope_planes;
  c.correction_r = 63;
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_cuda_config(c); }),
             Catch::Contains("even correction_r (whole planes), got 63"));
  c.correction_r = 64;
  REQUIRE_NOTHROW(kvscout::detail::check_infinigen_cuda_config(c));
  CHECK(c.key_r() == 64);
  c.shape.num_kv_heads = 1;
  c.shape.num_q_heads = 64;
  c.correction_r = 128;  // the group's partial queries at the correction's width: 64 * 128 floats fit
  REQUIRE_NOTHROW(kvscout::detail::check_infinigen_cuda_config(c));
  c.shape.head_dim = 256;
  c.correction_r = 136;  // 64 * 136 floats: over 32 KiB
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_cuda_config(c); }),
             Catch::Contains("(g = 64, r = 136: 34816 bytes) exceed"));
}

TEST_CASE("infinigen_cuda layout with correction_r: the cache, rotation, channels and queries at its width",
          "[cuda_facades][spec]") {
  auto c = good_config();
  const auto narrow = kvscout::detail::infinigen_cuda_layout_of<kvscout::half>(c);
  c.correction_r = 64;
  const auto wide = kvscout::detail::infinigen_cuda_layout_of<kvscout::half>(c);
  CHECK(wide.rows == narrow.rows);  // the speculation's GEMV is the narrow one's
  CHECK(wide.key_elements == 2 * narrow.key_elements);
  CHECK(wide.channels - wide.rotation >= sizeof(float) * 4 * 128 * 64);
  CHECK(wide.planes - wide.channels >= sizeof(std::int32_t) * 4 * 64);
  CHECK(wide.stats - wide.q >= sizeof(float) * 2 * 16 * 64);
  CHECK(wide.total - wide.keys >= sizeof(kvscout::half) * wide.key_elements);
  // Setup checks: correction plans need the config's correction_r, and it needs them.
  std::vector<kvscout::skew_plan> plans(4, identity_plan(128, 32, rope_mode::post_rope_skew));
  std::vector<kvscout::skew_plan> wide_plans(4, identity_plan(128, 64, rope_mode::post_rope_skew));
  std::vector<float> w(static_cast<std::size_t>(16) * 128 * 512, 0.5f);
  const kvscout::host_span<const float> ws{w.data(), w.size()};
  REQUIRE_NOTHROW(kvscout::detail::check_infinigen_plans(c, plans, ws, {}, &wide_plans));
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_plans(c, plans, ws, {}); }),
             Catch::Contains("correction_r = 64 needs correction plans"));
  wide_plans.pop_back();
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_plans(c, plans, ws, {}, &wide_plans); }),
             Catch::Contains("got 3 correction plans, expected one per kv head (4)"));
  c.correction_r = 0;
  wide_plans.push_back(wide_plans.back());
  CHECK_THAT(error_of([&] { kvscout::detail::check_infinigen_plans(c, plans, ws, {}, &wide_plans); }),
             Catch::Contains("correction_r is 0"));
}

TEST_CASE("infinigen_cuda workspace layout: aligned, disjoint, sized per mode", "[cuda_facades][spec]") {
  for (rope_mode mode : {rope_mode::post_rope_skew, rope_mode::rope_planes, rope_mode::pre_rope_folded}) {
    for (gqa_aggregation agg : {gqa_aggregation::max_logit, gqa_aggregation::sum_prob}) {
      auto c = good_config();
      c.mode = mode;
      c.aggregation = agg;
      CAPTURE(static_cast<int>(mode), static_cast<int>(agg));
      const auto l = kvscout::detail::infinigen_cuda_layout_of<kvscout::half>(c);
      CHECK(l.rows == (mode == rope_mode::post_rope_skew ? 128 : 32));
      CHECK(l.chunks == 4);  // 4096 tokens / 1024 per block
      const std::size_t offsets[] = {l.weights, l.bias, l.rotation, l.channels, l.planes,
                                     l.y,       l.q,    l.stats,    l.keys,     l.total};
      for (std::size_t i = 0; i < std::size(offsets); ++i) {
        CHECK(offsets[i] % 256 == 0);
        if (i > 0) CHECK(offsets[i] >= offsets[i - 1]);
      }
      const std::size_t Hq = 16;
      CHECK(l.bias - l.weights >= sizeof(float) * Hq * l.rows * 512);
      CHECK(l.total - l.keys >= sizeof(kvscout::half) * l.key_elements);
      // Half keys: 32 tokens per 64-byte line; 4096 tokens = 128 tiles.
      CHECK(l.key_elements == std::size_t{2} * 4 * 128 * 32 * 32);
      if (agg == gqa_aggregation::sum_prob) {
        CHECK(l.keys - l.stats >= 2 * sizeof(float) * 2 * 4 * 4 * 4);
      } else {
        CHECK(l.keys == l.stats);
      }
      if (mode == rope_mode::rope_planes) {
        CHECK(l.channels == l.rotation);
      } else {
        CHECK(l.channels - l.rotation >= sizeof(float) * 4 * 128 * 32);
      }
    }
  }
}

TEMPLATE_TEST_CASE("partial_key_view addresses the host partial_key_cache's layout",
                   "[cuda_facades][spec]", float, kvscout::half) {
  const int S = 2, H = 3, r = 5, max_tokens = 70;
  kvscout::partial_key_cache<TestType> cache(S, H, r, max_tokens);
  std::vector<float> pk(r);
  for (int s = 0; s < S; ++s)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < max_tokens; ++t) {
        for (int c = 0; c < r; ++c) pk[c] = static_cast<float>(((s * H + h) * r + c) * 100 + t);
        cache.append(s, h, t, pk.data());
      }
  const std::size_t n = kvscout::partial_key_view<TestType>::elements_for(S, H, r, max_tokens);
  CHECK(n * sizeof(TestType) == cache.bytes());
  const kvscout::partial_key_view<const TestType, kvscout::host_space> view{
      {cache.tile(0, 0, 0), n}, S, H, r, max_tokens};
  CHECK(view.tiles() == cache.tiles());
  int bad = 0;
  for (int s = 0; s < S; ++s)
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < r; ++c)
        for (int t = 0; t < max_tokens; ++t)
          bad += kvscout::to_float(view.data[view.offset(s, h, c, t)]) !=
                 kvscout::to_float(cache.at(s, h, c, t));
  CHECK(bad == 0);
}

TEST_CASE("infinigen_cuda setup and call checks name the bad value", "[cuda_facades][spec]") {
  auto c = good_config();
  c.shape.num_kv_heads = 2;
  c.shape.num_q_heads = 4;
  c.shape.head_dim = 64;
  c.shape.d_model = 32;
  c.r = 16;
  std::vector<kvscout::skew_plan> plans(2, identity_plan(64, 16, rope_mode::post_rope_skew));
  std::vector<float> w(4 * 64 * 32, 0.5f), b;
  using kvscout::detail::check_infinigen_plans;
  REQUIRE_NOTHROW(check_infinigen_plans(c, plans, {w.data(), w.size()}, {}));
  CHECK_THAT(error_of([&] { check_infinigen_plans(c, {plans[0]}, {w.data(), w.size()}, {}); }),
             Catch::Contains("got 1 skew plans"));
  CHECK_THAT(error_of([&] { check_infinigen_plans(c, plans, {w.data(), 10}, {}); }),
             Catch::Contains("W_Q holds 10"));
  b.assign(7, 0.f);
  CHECK_THAT(error_of([&] { check_infinigen_plans(c, plans, {w.data(), w.size()}, {b.data(), 7}); }),
             Catch::Contains("b_Q holds 7"));
  auto other = plans;
  other[1] = identity_plan(64, 8, rope_mode::post_rope_skew);
  CHECK_THAT(error_of([&] { check_infinigen_plans(c, other, {w.data(), w.size()}, {}); }),
             Catch::Contains("r = 8"));
  other = plans;
  other[1] = identity_plan(64, 16, rope_mode::rope_planes);
  CHECK_THAT(error_of([&] { check_infinigen_plans(c, other, {w.data(), w.size()}, {}); }),
             Catch::Contains("rope_planes"));

  // score(): S = 2, stride 100, bound 90.
  const kvscout::score_context<kvscout::device_space> ctx{{fake<const float>(), 2 * 32},
                                         {fake<const int32_t>(), 2},
                                         {fake<const int32_t>(), 2},
                                         90};
  const kvscout::score_buffer<kvscout::device_space> out{{fake<float>(), 2 * 2 * 100}, 2, 2, 100};
  using kvscout::detail::check_infinigen_cuda_score;
  REQUIRE_NOTHROW(check_infinigen_cuda_score(c, ctx, out));
  auto x = ctx;
  x.max_seq_len = 101;
  CHECK_THAT(error_of([&] { check_infinigen_cuda_score(c, x, out); }), Catch::Contains("max_seq_len = 101"));
  x = ctx;
  x.max_seq_len = 5000;
  CHECK_THAT(error_of([&] { check_infinigen_cuda_score(c, x, out); }), Catch::Contains("max_tokens = 4096"));
  x = ctx;
  x.x = {fake<const float>(), 63};
  CHECK_THAT(error_of([&] { check_infinigen_cuda_score(c, x, out); }), Catch::Contains("x holds 63"));
  x = ctx;
  x.seq_lens = {fake<const int32_t>(), 1};
  CHECK_THAT(error_of([&] { check_infinigen_cuda_score(c, x, out); }), Catch::Contains("seq_lens holds 1"));
  x = ctx;
  x.positions = {nullptr, 2};
  CHECK_THAT(error_of([&] { check_infinigen_cuda_score(c, x, out); }), Catch::Contains("positions"));
  auto o = out;
  o.num_seqs = 3;
  CHECK_THAT(error_of([&] { check_infinigen_cuda_score(c, ctx, o); }), Catch::Contains("num_seqs = 3"));
  o = out;
  o.scores = {fake<float>(), 399};
  CHECK_THAT(error_of([&] { check_infinigen_cuda_score(c, ctx, o); }), Catch::Contains("holds 399"));

  // append()
  using kvscout::detail::check_infinigen_cuda_append;
  const device_span<const float> keys(fake<const float>(), 3 * 2 * 64);
  const device_span<const int32_t> ids(fake<const int32_t>(), 3);
  const auto append_check = [&](int count) {
    check_infinigen_cuda_append(c, keys.size(), keys.data() != nullptr, ids, ids, count);
  };
  REQUIRE_NOTHROW(append_check(3));
  CHECK_THAT(error_of([&] { append_check(4); }),
             Catch::Contains("keys holds 384 elements, expected count * num_kv_heads * head_dim = 512"));
  CHECK_THAT(error_of([&] { append_check(-1); }), Catch::Contains("-1"));
  CHECK_THAT(error_of([&] { check_infinigen_cuda_append(c, 384, false, ids, ids, 3); }),
             Catch::Contains("keys holds 384 elements"));

  // The workspace.
  using kvscout::detail::check_infinigen_cuda_workspace;
  REQUIRE_NOTHROW(check_infinigen_cuda_workspace({fake<std::byte>(), 1000}, 1000));
  CHECK_THAT(error_of([&] { check_infinigen_cuda_workspace({fake<std::byte>(), 999}, 1000); }),
             Catch::Contains("workspace holds 999"));
  CHECK_THAT(error_of([&] { check_infinigen_cuda_workspace({fake<std::byte>(4), 1000}, 1000); }),
             Catch::Contains("256-byte aligned"));
}

TEST_CASE("device selector checks name the bad value", "[cuda_facades][select]") {
  using kvscout::threshold_rule;
  using kvscout::detail::threshold_cuda_workspace_bytes;
  using kvscout::detail::topk_cuda_workspace_bytes;
  CHECK(topk_cuda_workspace_bytes({{.num_seqs = 2, .num_kv_heads = 4, .max_tokens = 100}, 10, 10,
                                   {2, 2}}) == 0);
  CHECK(threshold_cuda_workspace_bytes({{.num_seqs = 2, .num_kv_heads = 4,
                                         .max_tokens = 100}, 10,
                                        1.f, 10, threshold_rule::per_head, {}}) == 0);
  CHECK(threshold_cuda_workspace_bytes({{.num_seqs = 2, .num_kv_heads = 4,
                                         .max_tokens = 100}, 10,
                                        1.f, 10, threshold_rule::infinigen_mean, {}}) ==
        2 * 4 * sizeof(std::int32_t));
  CHECK_THAT(error_of([] { (void)topk_cuda_workspace_bytes({{.num_seqs = 1, .num_kv_heads = 1,
                                                            .max_tokens = 100}, 10, 11, {}}); }),
             Catch::Contains("budget 11"));
  CHECK_THAT(error_of([] { (void)topk_cuda_workspace_bytes({{.num_seqs = 1, .num_kv_heads = 0,
                                                            .max_tokens = 100}, 10, 5, {}}); }),
             Catch::Contains("num_kv_heads must be positive, got 0"));
  CHECK_THAT(error_of([] {
               (void)threshold_cuda_workspace_bytes({{.num_seqs = 1, .num_kv_heads = 1,
                                                      .max_tokens = 100}, 10, NAN, 10,
                                                     threshold_rule::per_head, {}});
             }),
             Catch::Contains("alpha"));
  CHECK_THAT(error_of([] {
               (void)threshold_cuda_workspace_bytes({{.num_seqs = 1, .num_kv_heads = 1,
                                                      .max_tokens = 100}, 10, 1.f, 10,
                                                     static_cast<threshold_rule>(5), {}});
             }),
             Catch::Contains("threshold_rule(5)"));
  CHECK_THAT(error_of([] { (void)topk_cuda_workspace_bytes({{.num_seqs = 70000,
                                                            .num_kv_heads = 70000,
                                                            .max_tokens = 100}, 10, 10, {}}); }),
             Catch::Contains("4900000000"));

  // Device views: sizes and pointers are checked, lengths (device memory) are not read.
  using kvscout::device_space;
  const kvscout::score_view<device_space> scores{{fake<const float>(), 2 * 4 * 100},
                                                 {fake<const int32_t>(), 2}, 2, 4, 100};
  const kvscout::selection_buffers<device_space> out{{fake<int32_t>(), 2 * 4 * 10},
                                                     {fake<int32_t>(), 2 * 4}, 2, 4, 10};
  using kvscout::detail::check_selector_views;
  REQUIRE_NOTHROW(check_selector_views(2, 4, 100, 10, scores, out));
  auto s = scores;
  s.scores = {fake<const float>(), 799};
  CHECK_THAT(error_of([&] { check_selector_views(2, 4, 100, 10, s, out); }), Catch::Contains("scores holds 799"));
  s = scores;
  s.stride = 99;
  CHECK_THAT(error_of([&] { check_selector_views(2, 4, 100, 10, s, out); }), Catch::Contains("99"));
  auto o = out;
  o.counts = {nullptr, 8};
  CHECK_THAT(error_of([&] { check_selector_views(2, 4, 100, 10, scores, o); }), Catch::Contains("counts is null"));
  using kvscout::detail::check_device_workspace;
  CHECK_THAT(error_of([] { check_device_workspace({nullptr, 0}, 8); }), Catch::Contains("workspace holds 0"));
  REQUIRE_NOTHROW(check_device_workspace({nullptr, 0}, 0));
}

TEST_CASE("softmax statistics merge as if pushed in one pass", "[cuda_facades][spec]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> z(1000);
  for (auto& v : z) v = nd(rng);
  float m = -INFINITY, l = 0.f;
  for (float v : z) kvscout::detail::softmax_push<float>(m, l, v);
  // The same tokens in 7 blocks, merged (an empty block included).
  float mm = -INFINITY, ll = 0.f;
  for (int b = 0; b < 8; ++b) {
    float bm = -INFINITY, bl = 0.f;
    for (int t = b * 143; t < std::min(1000, (b + 1) * 143); ++t) kvscout::detail::softmax_push<float>(bm, bl, z[t]);
    kvscout::detail::softmax_merge<float>(mm, ll, bm, bl);
  }
  kvscout::detail::softmax_merge<float>(mm, ll, -INFINITY, 0.f);
  CHECK(mm == m);
  CHECK(ll == Approx(l).epsilon(1e-5));
  double mass = 0;
  for (float v : z) mass += kvscout::detail::softmax_share<float>(v, mm, ll);
  CHECK(mass == Approx(1.0).epsilon(1e-4));
}
