// Quantised partial keys (issue 32): quantized_partial_key_cache against an fp64 reference of its
// definition (cache/quantized_partial_key_cache.hpp), its refusals, and infinigen_policy over it
// (quantized_keys<Bits>) against an fp64 reference computed from the cache's dequantised keys.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kvscout/cache/partial_key_store.hpp"

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
  static_assert(!kvscout::supported_key_quantization(3, 32) && !kvscout::supported_key_quantization(4, 24));
  static_assert(!kvscout::partial_key_format<kvscout::quantized_keys<3>> &&
                !kvscout::partial_key_format<kvscout::quantized_keys<4, 48>>);
}
