#pragma once
// Fixtures shared by the policy tests (test_policies.cpp, test_policy_errors.cpp,
// test_policy_batching.cpp): a float cache, calibrated and identity plans, score buffers, and
// the poisoned buffers and row sources the error tests use.

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kvscout/core/simd.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/skew/calibrate.hpp"
#include "kvscout/score/h2o.hpp"
#include "kvscout/score/infinigen.hpp"
#include "kvscout/score/oracle.hpp"
#include "kvscout/score/quest.hpp"
#include "kvscout/score/streaming.hpp"

namespace policy_test {

constexpr int D = 64;
using layout = kvscout::contiguous_layout<float, D, kvscout::hnd>;

struct cache_fixture {
  int S = 2, H = 2, g, Hq, cap = 80;
  std::vector<int32_t> lens{80, 33};
  std::vector<float> k, v, q;
  layout l;
  explicit cache_fixture(int group, std::uint32_t seed) : g(group), Hq(2 * group) {
    l = layout::padded(H, cap, lens.data(), S);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    k.resize(static_cast<std::size_t>(S) * H * cap * D);
    v.resize(k.size());
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    q.resize(static_cast<std::size_t>(S) * Hq * D);
    for (auto& x : q) x = nd(rng);
  }
  kvscout::kv_view<layout, kvscout::host_space> view() const {
    return {l, kvscout::as_bytes(kvscout::host_span<const float>(k.data(), k.size())),
            kvscout::as_bytes(kvscout::host_span<const float>(v.data(), v.size()))};
  }
  const float* key(int s, int h, int t) const { return &k[l.k_offset(s, t, h) / sizeof(float)]; }
  double logit(int s, int qh, int t, float scale) const {
    double d = 0;
    for (int c = 0; c < D; ++c) d += static_cast<double>(q[(static_cast<std::size_t>(s) * Hq + qh) * D + c]) * key(s, qh / g, t)[c];
    return d * scale;
  }
};

// One calibrated plan per kv head from the same query / key samples (200 of each), in `mode`.
inline std::vector<kvscout::skew_plan> calibrated_plans(const std::vector<float>& qs,
                                                 const std::vector<float>& ks, int H, int g, int r,
                                                 kvscout::rope_mode mode,
                                                 const kvscout::rope_config& rope) {
  std::vector<kvscout::skew_plan> plans;
  for (int h = 0; h < H; ++h)
    plans.push_back(kvscout::calibrate_skew({qs.data(), qs.size()}, {ks.data(), ks.size()}, 200,
                                            g, D, {r, false, mode, rope}));
  return plans;
}

inline kvscout::score_buffer<kvscout::host_space> buffer_for(std::vector<float>& scores, int S, int H, int stride) {
  scores.assign(static_cast<std::size_t>(S) * H * stride, std::numeric_limits<float>::quiet_NaN());
  return {{scores.data(), scores.size()}, S, H, stride};
}

// score() of `layer` with row_max given writes the scores it writes without (`without`, from the
// same context), and each row's largest non-NaN score (-inf for an empty row).
template <class P>
void require_row_max(P& p, int layer, const kvscout::score_context<kvscout::host_space>& ctx,
                     const kvscout::score_buffer<kvscout::host_space>& without) {
  std::vector<float> scores;
  auto out = buffer_for(scores, without.num_seqs, without.num_kv_heads, without.stride);
  std::vector<float> top(static_cast<std::size_t>(out.num_seqs) * out.num_kv_heads, 12345.f);
  out.row_max = {top.data(), top.size()};
  p.score(layer, ctx, out);
  for (int b = 0; b < out.num_seqs; ++b)
    for (int h = 0; h < out.num_kv_heads; ++h) {
      CAPTURE(b, h, ctx.seq_lens[b]);
      float want = -std::numeric_limits<float>::infinity();
      for (int t = 0; t < ctx.seq_lens[b]; ++t) {
        const float x = out.row(b, h)[t];
        REQUIRE(std::bit_cast<std::uint32_t>(x) ==
                std::bit_cast<std::uint32_t>(without.row(b, h)[t]));
        if (!std::isnan(x)) want = std::max(want, x);
      }
      REQUIRE(top[static_cast<std::size_t>(b) * out.num_kv_heads + h] == want);
    }
}

// A valid identity plan in rope_planes mode: the first r/2 planes.
inline kvscout::skew_plan identity_planes(int r) {
  std::vector<int> planes(r / 2);
  std::iota(planes.begin(), planes.end(), 0);
  return kvscout::rope_planes_plan({D, 10000.f, kvscout::rope_style::split_half}, std::move(planes));
}

// Scores a rejected call must leave as they were.
constexpr float poison = -7.25f;

inline kvscout::score_buffer<kvscout::host_space> poisoned(std::vector<float>& scores, int S, int H, int stride) {
  scores.assign(static_cast<std::size_t>(S) * H * stride, poison);
  return {{scores.data(), scores.size()}, S, H, stride};
}

inline bool untouched(const std::vector<float>& scores) {
  return std::all_of(scores.begin(), scores.end(), [](float x) { return x == poison; });
}

// A row source with any token positions, also ones no selection would hold.
struct token_rows {
  static constexpr int head_dim = D;
  std::vector<int32_t> tokens;  // [seqs, heads, n]
  int seqs = 1, heads = 1, n = 0;
  int num_seqs() const { return seqs; }
  int num_kv_heads() const { return heads; }
  int rows(int, int) const { return n; }
  int token(int s, int h, int i) const {
    return tokens[(static_cast<std::size_t>(s) * heads + h) * n + i];
  }
  void load_k(int, int, int, float*) const {}
  void load_v(int, int, int, float*) const {}
};
static_assert(kvscout::attention_rows<token_rows>);

}  // namespace policy_test
