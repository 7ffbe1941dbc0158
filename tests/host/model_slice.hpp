#pragma once
// Test fixture: a slice of a RoPE model's layer for the speculation's tests (test_correction.cpp,
// test_quantized_keys.cpp): W_Q, b_Q, the input x of one step per sequence, keys of n tokens per
// sequence (pre- and post-RoPE), and the true queries (W_Q x + b, rotated at position pos), which
// score() predicts from x and score_query() is given. Head dim 64, d_model 96, all seeded. And the
// fp64 definition of a GQA group's score (aggregate_fp64).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kvscout/core/rope.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/score/concepts.hpp"
#include "kvscout/skew/calibrate.hpp"

namespace kvtest {

struct model_slice {
  static constexpr int D = 64;
  // How the pre-RoPE keys are drawn: normal, or normal plus 0.2 * (channel % 5) (channels of
  // different means, for the quantised keys' groups).
  enum class keys { normal, channel_offsets };

  int S, H, g, Hq, d_model, n, pos;
  kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  std::vector<float> wq, bq, x, kpre, kpost, q;  // [Hq, D, d_model], [Hq, D], [S, d_model],
                                                 // [S, n, H, D] twice, [S, Hq, D]

  model_slice(int seqs, int heads, int group, int tokens, std::uint32_t seed, keys k = keys::normal)
      : S(seqs), H(heads), g(group), Hq(heads * group), d_model(96), n(tokens), pos(tokens + 7) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    wq.resize(static_cast<std::size_t>(Hq) * D * d_model);
    bq.resize(static_cast<std::size_t>(Hq) * D);
    x.resize(static_cast<std::size_t>(S) * d_model);
    for (auto& w : wq) w = nd(rng) / 10.f;
    for (auto& w : bq) w = 0.1f * nd(rng);
    for (auto& w : x) w = nd(rng);
    kpre.resize(static_cast<std::size_t>(S) * n * H * D);
    if (k == keys::normal) {
      for (auto& w : kpre) w = nd(rng);
    } else {
      for (std::size_t i = 0; i < kpre.size(); ++i) kpre[i] = 0.2f * static_cast<float>(i % D % 5) + nd(rng);
    }
    kpost = kpre;
    for (int s = 0; s < S; ++s)
      for (int t = 0; t < n; ++t)
        for (int h = 0; h < H; ++h) kvscout::apply_rope(&kpost[((static_cast<std::size_t>(s) * n + t) * H + h) * D], t, rope);
    q.resize(static_cast<std::size_t>(S) * Hq * D);
    for (int s = 0; s < S; ++s)
      for (int qh = 0; qh < Hq; ++qh) {
        float* out = &q[(static_cast<std::size_t>(s) * Hq + qh) * D];
        for (int c = 0; c < D; ++c) {
          double a = bq[static_cast<std::size_t>(qh) * D + c];
          for (int i = 0; i < d_model; ++i)
            a += static_cast<double>(wq[(static_cast<std::size_t>(qh) * D + c) * d_model + i]) * x[static_cast<std::size_t>(s) * d_model + i];
          out[c] = static_cast<float>(a);
        }
        kvscout::apply_rope(out, pos, rope);
      }
  }
  const float* key_pre(int s, int t) const { return &kpre[(static_cast<std::size_t>(s) * n + t) * H * D]; }
  const float* key_post(int s, int t) const { return &kpost[(static_cast<std::size_t>(s) * n + t) * H * D]; }
  float* key_post(int s, int t) { return &kpost[(static_cast<std::size_t>(s) * n + t) * H * D]; }
  // Calibrated plans from random post-RoPE samples (any orthogonal A will do for the definition).
  std::vector<kvscout::skew_plan> plans(int r, kvscout::rope_mode mode, std::uint32_t seed) const {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> qs(static_cast<std::size_t>(200) * g * D), ks(static_cast<std::size_t>(200) * D);
    for (auto& v : qs) v = nd(rng);
    for (auto& v : ks) v = nd(rng);
    std::vector<kvscout::skew_plan> out;
    for (int h = 0; h < H; ++h)
      out.push_back(kvscout::calibrate_skew({qs.data(), qs.size()}, {ks.data(), ks.size()}, 200, g, D,
                                            {r, false, mode, rope}));
    return out;
  }
};

// The definition of a GQA group's score (score/concepts.hpp) in fp64, from the group's logits
// z [g, n]: max_logit the largest, mean_logit the mean, sum_prob the sum of each head's softmax.
inline std::vector<double> aggregate_fp64(const std::vector<double>& z, int g, int n,
                                          kvscout::gqa_aggregation agg) {
  std::vector<double> want(static_cast<std::size_t>(n));
  const auto at = [&](int j, int t) { return z[static_cast<std::size_t>(j) * n + t]; };
  if (agg == kvscout::gqa_aggregation::sum_prob) {
    for (int j = 0; j < g; ++j) {
      double mx = -INFINITY, l = 0;
      for (int t = 0; t < n; ++t) mx = std::max(mx, at(j, t));
      for (int t = 0; t < n; ++t) l += std::exp(at(j, t) - mx);
      for (int t = 0; t < n; ++t) want[static_cast<std::size_t>(t)] += std::exp(at(j, t) - mx) / l;
    }
    return want;
  }
  for (int t = 0; t < n; ++t) {
    double a = at(0, t);
    for (int j = 1; j < g; ++j)
      a = agg == kvscout::gqa_aggregation::max_logit ? std::max(a, at(j, t)) : a + at(j, t);
    want[static_cast<std::size_t>(t)] = agg == kvscout::gqa_aggregation::mean_logit ? a / g : a;
  }
  return want;
}

// A host score buffer [S, H, stride] over `scores`, every entry NaN first (unwritten ones show).
inline kvscout::score_buffer<kvscout::host_space> nan_score_buffer(std::vector<float>& scores, int S, int H,
                                                                   int stride) {
  scores.assign(static_cast<std::size_t>(S) * H * stride, std::numeric_limits<float>::quiet_NaN());
  return {{scores.data(), scores.size()}, S, H, stride};
}

}  // namespace kvtest
