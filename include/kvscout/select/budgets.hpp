#pragma once
// Per-layer budgets that follow the attention (kvscout's). The same share of rows keeps 99 % of one
// layer's attention mass and 80 % of another's; from mass curves measured once (at prefill, or on
// a calibration text), the rows moved per step are re-divided among the layers at no extra bytes.
//
//   // curves: [L, bins]; q, k: per layer, n tokens of post-RoPE queries and keys
//   std::vector<double> curves = kvscout::layer_mass_curves(shape, q, k, n, bins, /*first=*/2);
//   kvscout::layer_budget_shares({curves.data(), curves.size()}, L, bins, /*first_layer=*/2,
//                                /*budget=*/0.10, kvscout::layer_budget_rule::coverage, shares);
//   // layer l's selector: budget * shares[l] of its cached rows (mean of shares = 1)
//
// A mass curve's entry b is the share of an attention row's mass that its best
// ceil((b + 1) / bins * n) of n rows hold. layer_budget_shares first gives each layer min_share of
// its even share, then hands out the rest of round(budget * bins) steps of 1 / bins per layer from
// first_layer on, one at a time:
//   coverage  to the layer whose curve is lowest at its current share
//   mass      to the layer whose curve rises most over the next step
// The shares from first_layer on average exactly 1 (1 below first_layer). Set-up code; inputs are
// checked first.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <ostream>
#include <vector>

#include "kvscout/core/error.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

enum class layer_budget_rule : int {
  coverage = 0,  // the same share of each layer's attention mass, as high as the rows allow
  mass = 1,      // the most attention mass over all layers
};

inline std::ostream& operator<<(std::ostream& os, layer_budget_rule r) {
  switch (r) {
    case layer_budget_rule::coverage:
      return os << "coverage";
    case layer_budget_rule::mass:
      return os << "mass";
  }
  return os << "layer_budget_rule(" << static_cast<int>(r) << ")";
}

namespace detail {
/// mass holds the row's n non-negative weights (they need not sum to 1); scratch at least n floats.
/// A row of zero total mass adds nothing.
inline void add_mass_curve(host_span<const float> mass, host_span<float> scratch, host_span<double> curve) {
  const std::size_t n = mass.size(), bins = curve.size();
  KVSCOUT_EXPECTS(bins > 0, "curve has no bins");
  KVSCOUT_EXPECTS(scratch.size() >= n, "scratch holds ", scratch.size(), " floats, expected at least ",
                  "the row's ", n);
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    KVSCOUT_EXPECTS(mass[i] >= 0 && std::isfinite(mass[i]), "mass[", i, "] = ", mass[i],
                    ": expected a finite non-negative weight");
    total += mass[i];
  }
  if (total <= 0) return;
  std::copy(mass.begin(), mass.end(), scratch.begin());
  std::sort(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(n), std::greater<float>());
  double acc = 0;
  std::size_t k = 0;
  for (std::size_t b = 1; b <= bins; ++b) {
    const auto upto = static_cast<std::size_t>(std::ceil(static_cast<double>(b) * static_cast<double>(n) /
                                                         static_cast<double>(bins) - 1e-9));
    for (; k < upto && k < n; ++k) acc += scratch[k];
    curve[b - 1] += acc / total;
  }
}
}  // namespace detail

/// curves: [num_layers, bins] mean mass curves (in [0, 1], non-decreasing along a layer); out:
/// num_layers shares.
inline void layer_budget_shares(host_span<const double> curves, int num_layers, int bins, int first_layer,
                                double budget, layer_budget_rule rule, host_span<double> out,
                                double min_share = 0) {
  KVSCOUT_EXPECTS(num_layers > 0, "num_layers must be positive, got ", num_layers);
  KVSCOUT_EXPECTS(bins > 0, "bins must be positive, got ", bins);
  KVSCOUT_EXPECTS(first_layer >= 0 && first_layer < num_layers, "first_layer = ", first_layer,
                  " is outside [0, num_layers = ", num_layers, ")");
  KVSCOUT_EXPECTS(budget > 0 && budget <= 1, "budget = ", budget, ": expected a share of the rows in (0, 1]");
  KVSCOUT_EXPECTS(rule == layer_budget_rule::coverage || rule == layer_budget_rule::mass, "rule = ", rule,
                  ": expected layer_budget_rule::coverage or layer_budget_rule::mass");
  KVSCOUT_EXPECTS(min_share >= 0 && min_share <= 1, "min_share = ", min_share,
                  ": expected a share of the budget in [0, 1]");
  const std::size_t L = static_cast<std::size_t>(num_layers), B = static_cast<std::size_t>(bins);
  KVSCOUT_EXPECTS(curves.size() >= L * B, "curves holds ", curves.size(), " values, expected num_layers * bins = ",
                  L * B);
  KVSCOUT_EXPECTS(out.size() >= L, "out holds ", out.size(), " values, expected num_layers = ", L);
  for (std::size_t l = static_cast<std::size_t>(first_layer); l < L; ++l)
    for (std::size_t b = 0; b < B; ++b) {
      const double v = curves[l * B + b], prev = b > 0 ? curves[l * B + b - 1] : 0.0;
      KVSCOUT_EXPECTS(v >= 0 && v <= 1 + 1e-6 && v >= prev - 1e-9, "curves[", l, ", ", b, "] = ", v,
                      ": expected a value in [0, 1], not below the bin before (", prev, ")");
    }
  // The curve at u steps is curves[l, u - 1] (0 at none).
  const long long per = std::llround(budget * bins);
  KVSCOUT_EXPECTS(per >= 1, "budget * bins = ", budget * bins, " (budget ", budget, ", bins ", bins,
                  ") must round to at least 1 step per layer");
  const auto floor_steps = static_cast<long long>(std::ceil(min_share * static_cast<double>(per) - 1e-9));
  for (std::size_t l = 0; l < L; ++l) out[l] = static_cast<double>(floor_steps);
  const auto at = [&](std::size_t l, double u) {
    return u <= 0 ? 0.0 : curves[l * B + static_cast<std::size_t>(u) - 1];
  };
  const std::size_t layers = L - static_cast<std::size_t>(first_layer);
  const long long steps = (per - floor_steps) * static_cast<long long>(layers);
  for (long long k = 0; k < steps; ++k) {
    std::size_t best = L;
    double key = 0;
    for (std::size_t l = static_cast<std::size_t>(first_layer); l < L; ++l) {
      const double u = out[l];
      if (u >= bins) continue;
      const double v = rule == layer_budget_rule::mass ? at(l, u + 1) - at(l, u) : -at(l, u);
      if (best == L || v > key) best = l, key = v;
    }
    if (best == L) break;
    out[best] += 1;
  }
  for (std::size_t l = 0; l < L; ++l)
    out[l] = l < static_cast<std::size_t>(first_layer) ? 1.0 : out[l] / static_cast<double>(per);
}

/// Every layer's mean mass curve ([num_layers, bins]; 0 below first_layer) from a calibration
/// text's queries and keys as attention sees them (after RoPE), laid out as
/// calibrate_skew_layers takes them: q[l] [n, num_q_heads, head_dim], k[l] [n, num_kv_heads,
/// head_dim]. At every `every`-th position t in [max(1, n / 8), n), each KV head adds the mass of
/// its query group over the t earlier tokens: the sum over the group of softmax(scale q_t . k_j),
/// j < t (scale 0: 1 / sqrt(head_dim)).
inline std::vector<double> layer_mass_curves(const decode_shape& shape,
                                             const std::vector<std::vector<float>>& q,
                                             const std::vector<std::vector<float>>& k, int n,
                                             int bins, int first_layer = 0, int every = 16) {
  const int L = shape.num_layers, H = shape.num_kv_heads, Hq = shape.num_q_heads,
            D = shape.head_dim;
  KVSCOUT_EXPECTS(L > 0 && H > 0 && D > 0 && Hq > 0 && Hq % H == 0,
                  "layer_mass_curves: shape [num_layers ", L, ", num_kv_heads ", H,
                  ", num_q_heads ", Hq, ", head_dim ", D,
                  "] must be positive with num_q_heads a multiple of num_kv_heads");
  KVSCOUT_EXPECTS(n >= 2 && bins > 0 && every > 0, "layer_mass_curves: n = ", n, ", bins = ", bins,
                  ", every = ", every, ": expected n >= 2 and positive bins and every");
  KVSCOUT_EXPECTS(first_layer >= 0 && first_layer <= L,
                  "layer_mass_curves: first_layer = ", first_layer,
                  " is outside [0, num_layers = ", L, "]");
  KVSCOUT_EXPECTS(
      q.size() == static_cast<std::size_t>(L) && k.size() == static_cast<std::size_t>(L),
      "layer_mass_curves: got ", q.size(), " query and ", k.size(),
      " key sets, expected one per layer (num_layers = ", L, ")");
  const std::size_t un = static_cast<std::size_t>(n), ud = static_cast<std::size_t>(D),
                    B = static_cast<std::size_t>(bins);
  const int g = Hq / H;
  const float scale = shape.scale > 0 ? shape.scale : 1.f / std::sqrt(static_cast<float>(D));
  std::vector<double> curves(static_cast<std::size_t>(L) * B, 0.0);
  std::vector<float> mass(un), logits(un), scratch(un);
  for (int l = first_layer; l < L; ++l) {
    const auto& ql = q[static_cast<std::size_t>(l)];
    const auto& kl = k[static_cast<std::size_t>(l)];
    KVSCOUT_EXPECTS(ql.size() == un * static_cast<std::size_t>(Hq) * ud &&
                        kl.size() == un * static_cast<std::size_t>(H) * ud,
                    "layer_mass_curves: layer ", l, " has ", ql.size(), " query and ", kl.size(),
                    " key floats, expected n * num_q_heads * head_dim = ",
                    un * static_cast<std::size_t>(Hq) * ud,
                    " and n * num_kv_heads * head_dim = ", un * static_cast<std::size_t>(H) * ud);
    long long samples = 0;
    for (int t = std::max(1, n / 8); t < n; ++t) {
      if (t % every != 0) continue;
      const std::size_t ut = static_cast<std::size_t>(t);
      for (int h = 0; h < H; ++h) {
        std::fill(mass.begin(), mass.begin() + t, 0.f);
        for (int j = 0; j < g; ++j) {
          const float* qv =
              ql.data() +
              (ut * static_cast<std::size_t>(Hq) + static_cast<std::size_t>(h * g + j)) * ud;
          float m = -INFINITY;
          for (std::size_t i = 0; i < ut; ++i) {
            const float* kv =
                kl.data() + (i * static_cast<std::size_t>(H) + static_cast<std::size_t>(h)) * ud;
            float dot = 0;
            for (std::size_t c = 0; c < ud; ++c) dot += qv[c] * kv[c];
            logits[i] = dot * scale;
            m = std::max(m, logits[i]);
          }
          double z = 0;
          for (std::size_t i = 0; i < ut; ++i) z += std::exp(static_cast<double>(logits[i] - m));
          for (std::size_t i = 0; i < ut; ++i)
            mass[i] += static_cast<float>(std::exp(static_cast<double>(logits[i] - m)) / z);
        }
        detail::add_mass_curve({mass.data(), ut}, {scratch.data(), scratch.size()},
                               {curves.data() + static_cast<std::size_t>(l) * B, B});
        ++samples;
      }
    }
    for (std::size_t b = 0; b < B && samples > 0; ++b)
      curves[static_cast<std::size_t>(l) * B + b] /= static_cast<double>(samples);
  }
  return curves;
}

}  // namespace kvscout
