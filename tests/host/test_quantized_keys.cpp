// Quantised partial keys (issue 32): quantized_partial_key_cache against an fp64 reference of its
// definition (cache/quantized_partial_key_cache.hpp), its refusals, and infinigen_policy_host over it
// (quantized_keys<Bits>) against an fp64 reference computed from the cache's dequantised keys.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kvscout/cache/partial_key_store.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/skew/calibrate.hpp"
#include "kvscout/score/infinigen.hpp"
#include "model_slice.hpp"

namespace {

// Seeded keys [n, r]: channel 0 constant (1.25), the others normal with a per-channel offset and
// spread (never all zeros).
std::vector<float> make_keys(int n, int r, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> k(static_cast<std::size_t>(n) * r);
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < r; ++c)
      k[static_cast<std::size_t>(t) * r + c] =
          c == 0 ? 1.25f : 0.3f * static_cast<float>(c) - 1.f + (0.5f + 0.1f * static_cast<float>(c)) * nd(rng);
  return k;
}

// The definition in fp64: min, step and codes of channel c of group b.
struct group_ref {
  float mn, step;
  std::vector<int> codes;
};
group_ref reference_group(const std::vector<float>& k, int r, int G, int bits, int b, int c) {
  const int levels = (1 << bits) - 1;
  double lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < G; ++i) {
    const double x = k[static_cast<std::size_t>(b * G + i) * r + c];
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  group_ref g{static_cast<float>(lo), static_cast<float>((hi - lo) / levels), {}};
  for (int i = 0; i < G; ++i) {
    const double x = k[static_cast<std::size_t>(b * G + i) * r + c];
    const double q = g.step == 0.f ? 0.0 : std::nearbyint((x - lo) / static_cast<double>(g.step));
    g.codes.push_back(static_cast<int>(std::clamp(q, 0.0, static_cast<double>(levels))));
  }
  return g;
}

constexpr int D = 64;
const float nan_f = std::numeric_limits<float>::quiet_NaN();

// The model slice of tests/host/model_slice.hpp, its keys with per-channel offsets.
struct slice : kvtest::model_slice {
  slice(int seqs, int heads, int group, int tokens, std::uint32_t seed)
      : model_slice(seqs, heads, group, tokens, seed, keys::channel_offsets) {}
};
static_assert(slice::D == D);

}  // namespace

TEMPLATE_TEST_CASE("quantized_partial_key_cache holds its definition", "[cache][quantized]",
                   (kvscout::quantized_partial_key_cache<2>), (kvscout::quantized_partial_key_cache<4>),
                   (kvscout::quantized_partial_key_cache<8>), (kvscout::quantized_partial_key_cache<4, 16>),
                   (kvscout::quantized_partial_key_cache<2, 64>)) {
  using C = TestType;
  constexpr int G = C::group_tokens, bits = C::bits;
  for (const int r : {1, 7, 16})
    for (const int max_tokens : {2 * G, 3 * G + 5, G - 1}) {
      CAPTURE(bits, G, r, max_tokens);
      const int S = 2, H = 2;
      C cache(S, H, r, max_tokens);
      REQUIRE(cache.tiles() == (max_tokens + G - 1) / G);
      REQUIRE(cache.tile_floats() % 16 == 0);
      REQUIRE(cache.tile_floats() * 4 >= static_cast<std::size_t>(r) * (8 + G * bits / 8));
      REQUIRE(cache.bytes() >= static_cast<std::size_t>(S) * H * cache.tiles() * cache.tile_floats() * 4);
      std::vector<std::vector<float>> keys;
      for (int sh = 0; sh < S * H; ++sh) keys.push_back(make_keys(max_tokens, r, 100u + static_cast<unsigned>(sh * 7 + r)));
      // Append in order, checking the whole (s, h) after every token of a few stopping points.
      for (int t = 0; t < max_tokens; ++t) {
        for (int s = 0; s < S; ++s)
          for (int h = 0; h < H; ++h)
            cache.append(s, h, t, &keys[static_cast<std::size_t>(s * H + h)][static_cast<std::size_t>(t) * r]);
        const int n = t + 1;
        if (!(n % G == 0 || n % G == 1 || n % G == G - 1 || n == max_tokens)) continue;
        for (int s = 0; s < S; ++s)
          for (int h = 0; h < H; ++h) {
            const auto& k = keys[static_cast<std::size_t>(s * H + h)];
            REQUIRE(cache.appended(s, h) == n);
            REQUIRE(cache.complete_groups(s, h) == n / G);
            for (int b = 0; b < n / G; ++b)
              for (int c = 0; c < r; ++c) {
                CAPTURE(s, h, b, c);
                const group_ref ref = reference_group(k, r, G, bits, b, c);
                REQUIRE(cache.group_min(s, h, b)[c] == ref.mn);
                REQUIRE(cache.group_step(s, h, b)[c] == ref.step);
                if (c == 0) REQUIRE(ref.step == 0.f);  // the constant channel
                for (int i = 0; i < G; ++i) {
                  const int t2 = b * G + i;
                  CAPTURE(t2);
                  REQUIRE(cache.code(s, h, c, t2) == ref.codes[static_cast<std::size_t>(i)]);
                  const double x = k[static_cast<std::size_t>(t2) * r + c];
                  const double want = static_cast<double>(ref.mn) + static_cast<double>(ref.step) * ref.codes[static_cast<std::size_t>(i)];
                  const float got = cache.dequantized(s, h, c, t2);
                  REQUIRE(std::fabs(got - want) <= 1e-6 * (std::fabs(want) + 1.0));
                  // Round to nearest: within half a step of the key (and exact for a constant channel).
                  REQUIRE(std::fabs(static_cast<double>(got) - x) <= 0.5 * ref.step * (1 + 1e-5) + 1e-6 * std::fabs(x));
                  if (c == 0) REQUIRE(got == 1.25f);
                }
              }
            // The incomplete group: exact; past the appended tokens: 0.
            for (int t2 = n / G * G; t2 < std::min(max_tokens, n / G * G + G); ++t2)
              for (int c = 0; c < r; ++c) {
                CAPTURE(s, h, t2, c);
                REQUIRE(cache.dequantized(s, h, c, t2) ==
                        (t2 < n ? k[static_cast<std::size_t>(t2) * r + c] : 0.f));
              }
            for (int t2 = n / G * G + G; t2 < max_tokens; ++t2) REQUIRE(cache.dequantized(s, h, r - 1, t2) == 0.f);
          }
      }
      REQUIRE(cache.bytes_for(max_tokens) ==
              static_cast<std::size_t>(S) * H *
                  (static_cast<std::size_t>(max_tokens / G) * cache.tile_floats() * 4 +
                   (max_tokens % G ? static_cast<std::size_t>(r) * G * 4 : 0)));
    }
}

TEST_CASE("quantized_partial_key_cache refuses what it cannot hold, writing nothing",
          "[cache][quantized][errors]") {
  using Catch::Contains;
  constexpr int r = 5, G = 32;
  kvscout::quantized_partial_key_cache<4> cache(2, 3, r, 40);
  const auto k = make_keys(40, r, 9u);
  for (int t = 0; t < 33; ++t) cache.append(1, 2, t, &k[static_cast<std::size_t>(t) * r]);
  std::vector<float> bad(k.begin() + 33 * r, k.begin() + 34 * r);
  const auto unchanged = [&] {
    REQUIRE(cache.appended(1, 2) == 33);
    REQUIRE(cache.appended(0, 0) == 0);
    for (int c = 0; c < r; ++c) {
      REQUIRE(cache.dequantized(1, 2, c, 32) == k[static_cast<std::size_t>(32) * r + c]);
      REQUIRE(cache.dequantized(1, 2, c, 33) == 0.f);
    }
  };
  REQUIRE_THROWS_WITH(cache.append(1, 2, 34, bad.data()),
                      Contains("sequence 1, kv_head 2 got token 34, expected token 33"));
  REQUIRE_THROWS_WITH(cache.append(1, 2, 32, bad.data()),
                      Contains("sequence 1, kv_head 2 got token 32, expected token 33"));
  REQUIRE_THROWS_WITH(cache.append(0, 0, 1, bad.data()),
                      Contains("sequence 0, kv_head 0 got token 1, expected token 0"));
  REQUIRE_THROWS_WITH(cache.append(1, 2, 40, bad.data()), Contains("token 40 is out of range [0, max_tokens = 40)"));
  REQUIRE_THROWS_WITH(cache.append(1, 2, -1, bad.data()), Contains("token -1 is out of range"));
  REQUIRE_THROWS_WITH(cache.append(2, 0, 0, bad.data()), Contains("sequence 2 is out of range [0, 2)"));
  REQUIRE_THROWS_WITH(cache.append(-1, 0, 0, bad.data()), Contains("sequence -1 is out of range"));
  REQUIRE_THROWS_WITH(cache.append(0, 3, 0, bad.data()), Contains("kv_head 3 is out of range [0, 3)"));
  REQUIRE_THROWS_WITH(cache.append(1, 2, 33, nullptr), Contains("partial key of token 33 is null"));
  unchanged();
  for (const float v : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()}) {
    auto poisoned = bad;
    poisoned[3] = v;
    CAPTURE(v);
    REQUIRE_THROWS_WITH(cache.append(1, 2, 33, poisoned.data()),
                        Contains("partial key value") && Contains("of token 33, channel 3 (sequence 1, kv_head 2) is not finite"));
    unchanged();
  }
  REQUIRE_THROWS_WITH(kvscout::quantized_partial_key_cache<2>(1, 1, 0, 10), Contains("positive sizes"));
  REQUIRE_THROWS_WITH(kvscout::quantized_partial_key_cache<2>(1 << 20, 1 << 10, 64, 1 << 30),
                      Contains("does not fit") || Contains("overflows size_t"));
  // The group still completes after the refusals.
  for (int t = 33; t < 40; ++t) cache.append(1, 2, t, &k[static_cast<std::size_t>(t) * r]);
  REQUIRE(cache.complete_groups(1, 2) == 1);
  REQUIRE(G == kvscout::quantized_partial_key_cache<4>::group_tokens);
  // Unsupported Bits or G are compile-time errors (tests/compile_fail/quantized_keys_bad_bits.cpp).
  static_assert(!kvscout::detail::supported_key_quantization(3, 32) &&
                !kvscout::detail::supported_key_quantization(4, 24));
  static_assert(!kvscout::partial_key_format<kvscout::quantized_keys<3>> &&
                !kvscout::partial_key_format<kvscout::quantized_keys<4, 48>>);
}

// score() and score_query() of infinigen_policy_host<quantized_keys<Bits>> against fp64 of their
// definition over the cache's own dequantised keys: logit = scale * (q A)[S] . k^[t], the group
// folded by the aggregation; and, in rope_planes mode (the projection a gather of channels), a
// float policy fed keys whose selected channels hold the dequantised values (the same scores
// up to float rounding).
TEMPLATE_TEST_CASE("infinigen_policy_host over quantised partial keys scores the dequantised keys",
                   "[spec][infinigen][quantized]", kvscout::quantized_keys<4>, kvscout::quantized_keys<2>,
                   (kvscout::quantized_keys<2, 16>), (kvscout::quantized_keys<8, 64>)) {
  using kvscout::gqa_aggregation;
  using P = kvscout::infinigen_policy_host<TestType>;
  static_assert(kvscout::speculation_policy<kvscout::policy_layers<P>> && P::quantized);
  constexpr int max_tokens = 96, scored = 100;  // scored: the score rows' stride
  for (const auto mode : {kvscout::rope_mode::post_rope_skew, kvscout::rope_mode::rope_planes})
    for (const int g : {1, 3})
      for (const auto agg : {gqa_aggregation::max_logit, gqa_aggregation::mean_logit, gqa_aggregation::sum_prob}) {
        const int r = mode == kvscout::rope_mode::rope_planes ? 32 : 17;
        CAPTURE(TestType::bits, TestType::group, kvscout::to_string(mode), g, r, static_cast<int>(agg));
        slice m(2, 2, g, 70, 31u + static_cast<unsigned>(g * 10 + r));
        const auto plans = m.plans(r, mode, 5u + static_cast<unsigned>(r));
        kvscout::infinigen_config pc{.shape = {.num_layers = 1,
                                               .num_seqs = m.S,
                                               .num_kv_heads = m.H,
                                               .num_q_heads = m.Hq,
                                               .head_dim = D,
                                               .d_model = m.d_model,
                                               .max_tokens = max_tokens,
                                               .scale = 0.125f},
                                     .aggregation = agg};
        pc.query_aggregation = agg;
        auto p = P::layers(pc, {plans}, {{m.wq.data(), m.wq.size()}}, {{m.bq.data(), m.bq.size()}});
        for (int s = 0; s < m.S; ++s)
          for (int t = 0; t < m.n; ++t) p.append(0, s, t, m.key_pre(s, t), m.key_post(s, t));
        const auto& keys = p[0].keys();
        constexpr int G = TestType::group;
        REQUIRE(keys.complete_groups(0, 0) == m.n / G);  // G = 32: 64 tokens quantised, 6 staged
        // Sequence 1 ends inside its second quantised group: rows stop at seq_len.
        std::vector<int32_t> lens{m.n, m.n - 9}, pos{m.pos, m.pos};
        std::vector<float> late, early;
        const auto lb = kvtest::nan_score_buffer(late, m.S, m.H, scored);
        const auto eb = kvtest::nan_score_buffer(early, m.S, m.H, scored);
        std::vector<float> late_max(static_cast<std::size_t>(m.S * m.H), nan_f);
        const kvscout::score_buffer<kvscout::host_space> lbm{lb.scores, lb.num_seqs, lb.num_kv_heads, lb.stride,
                                        {late_max.data(), late_max.size()}};
        const kvscout::score_context<kvscout::host_space> ctx{{m.x.data(), m.x.size()}, {m.q.data(), m.q.size()},
                                        {pos.data(), 2}, {lens.data(), 2}};
        p.score_query(0, ctx, lbm);
        p.score(0, ctx, eb);
        for (int s = 0; s < m.S; ++s)
          for (int h = 0; h < m.H; ++h) {
            const auto& pl = plans[static_cast<std::size_t>(h)];
            const int n = lens[static_cast<std::size_t>(s)];
            // fp64 logits [g, n] and a bound on their rounding (sum of |terms|).
            std::vector<double> z(static_cast<std::size_t>(g) * n), mag(static_cast<std::size_t>(n));
            for (int j = 0; j < g; ++j) {
              const float* qv = &m.q[(static_cast<std::size_t>(s) * m.Hq + h * g + j) * D];
              std::vector<double> qp(static_cast<std::size_t>(r));
              for (int i = 0; i < r; ++i) {
                const int ch = pl.channels[static_cast<std::size_t>(i)];
                double qa = 0;
                for (int e = 0; e < D; ++e)
                  qa += qv[e] * (mode == kvscout::rope_mode::rope_planes ? (e == ch ? 1.0 : 0.0)
                                                                         : static_cast<double>(pl.A[static_cast<std::size_t>(e) * D + ch]));
                qp[static_cast<std::size_t>(i)] = qa * 0.125;
              }
              for (int t = 0; t < n; ++t) {
                double d = 0, a = 0;
                for (int i = 0; i < r; ++i) {
                  const double k = keys.dequantized(s, h, i, t);
                  const double lo = t / G < keys.complete_groups(s, h) ? keys.group_min(s, h, t / G)[i] : 0.0;
                  d += qp[static_cast<std::size_t>(i)] * k;
                  a += std::fabs(qp[static_cast<std::size_t>(i)]) * (std::fabs(k) + 2 * std::fabs(lo));
                }
                z[static_cast<std::size_t>(j) * n + t] = d;
                mag[static_cast<std::size_t>(t)] = std::max(mag[static_cast<std::size_t>(t)], a);
              }
            }
            const std::vector<double> want = kvtest::aggregate_fp64(z, g, n, agg);
            float top = -INFINITY;
            for (int t = 0; t < scored; ++t) {
              CAPTURE(s, h, t);
              if (t >= n) {
                REQUIRE(std::isnan(lb.row(s, h)[t]));
                REQUIRE(std::isnan(eb.row(s, h)[t]));
                continue;
              }
              const double w = want[static_cast<std::size_t>(t)];
              // sum_prob: probabilities (a logit error e moves one by about e times itself).
              const double tol = agg == gqa_aggregation::sum_prob ? 1e-5 + 1e-4 * w
                                                                  : 1e-5 * mag[static_cast<std::size_t>(t)] + 1e-6;
              REQUIRE(std::fabs(lb.row(s, h)[t] - w) <= tol);
              // score() predicts this very query from x: the same up to the GEMV's rounding.
              REQUIRE(std::fabs(eb.row(s, h)[t] - w) <= 20 * tol + 1e-4);
              top = std::max(top, lb.row(s, h)[t]);
            }
            REQUIRE(late_max[static_cast<std::size_t>(s * m.H + h)] == top);
          }
        if (mode != kvscout::rope_mode::rope_planes) continue;
        // The float policy fed the dequantised keys in the selected channels.
        auto f = kvscout::infinigen_policy_host<>::layers(pc, {plans}, {{m.wq.data(), m.wq.size()}}, {{m.bq.data(), m.bq.size()}});
        for (int s = 0; s < m.S; ++s)
          for (int t = 0; t < m.n; ++t) {
            std::vector<float> k(m.key_post(s, t), m.key_post(s, t) + m.H * D);
            for (int h = 0; h < m.H; ++h)
              for (int i = 0; i < r; ++i)
                k[static_cast<std::size_t>(h * D + plans[static_cast<std::size_t>(h)].channels[static_cast<std::size_t>(i)])] =
                    keys.dequantized(s, h, i, t);
            f.append(0, s, t, m.key_pre(s, t), k.data());
          }
        std::vector<float> fl;
        const auto fb = kvtest::nan_score_buffer(fl, m.S, m.H, scored);
        f.score_query(0, ctx, fb);
        for (int s = 0; s < m.S; ++s)
          for (int h = 0; h < m.H; ++h)
            for (int t = 0; t < lens[static_cast<std::size_t>(s)]; ++t) {
              CAPTURE(s, h, t);
              REQUIRE(lb.row(s, h)[t] == Approx(fb.row(s, h)[t]).margin(1e-4).epsilon(1e-4));
            }
      }
}

TEST_CASE("infinigen_policy_host over quantised keys refuses an append whole", "[spec][infinigen][quantized][errors]") {
  using P = kvscout::infinigen_policy_host<kvscout::quantized_keys<4>, kvscout::half>;
  slice m(1, 2, 2, 40, 3u);
  const auto plans = m.plans(16, kvscout::rope_mode::rope_planes, 4u);
  const kvscout::infinigen_config pc{{.num_layers = 1, .num_seqs = 1, .num_kv_heads = m.H,
                                     .num_q_heads = m.Hq, .head_dim = D, .d_model = m.d_model,
                                     .max_tokens = 40, .scale = 0.125f}};
  // The quantised cache's scratch adds a group's [g, head_dim] floats (qw_).
  kvscout::infinigen_config one = pc;
  one.r = 16;
  one.mode = kvscout::rope_mode::rope_planes;
  using mem = kvscout::detail::infinigen_host_memory<kvscout::quantized_keys<4>, kvscout::half>;
  using float_mem = kvscout::detail::infinigen_host_memory<float, kvscout::half>;
  REQUIRE(mem::scratch_bytes(one) == float_mem::scratch_bytes(one) + sizeof(float) * 2 * D);
  std::vector<kvscout::half> wh(m.wq.size());
  for (std::size_t i = 0; i < wh.size(); ++i) wh[i] = kvscout::from_float<kvscout::half>(m.wq[i]);
  auto p = P::layers(pc, {plans},
                     std::vector<kvscout::host_span<const kvscout::half>>{{wh.data(), wh.size()}},
                     std::vector<kvscout::host_span<const kvscout::half>>{{}});
  for (int t = 0; t < 5; ++t) p.append(0, 0, t, m.key_pre(0, t), m.key_post(0, t));
  REQUIRE_THROWS_WITH(p.append(0, 0, 7, m.key_pre(0, 7), m.key_post(0, 7)),
                      Catch::Contains("sequence 0, kv_head 0 got token 7, expected token 5"));
  // A NaN in kv head 1's selected channel: refused before head 0 is written.
  float* k = m.key_post(0, 5);
  k[D + plans[1].channels[3]] = nan_f;
  REQUIRE_THROWS_WITH(p.append(0, 0, 5, m.key_pre(0, 5), k),
                      Catch::Contains("of token 5, channel 3 (sequence 0, kv_head 1) is not finite"));
  REQUIRE(p[0].keys().appended(0, 0) == 5);
  REQUIRE(p[0].keys().appended(0, 1) == 5);
}
