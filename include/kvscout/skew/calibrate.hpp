#pragma once
// Offline calibration of a skew plan for one (layer, kv head) from sample queries and keys
// (InfiniGen, OSDI'24). Needs Eigen (fp64 SVD); decode code includes only skew/plan.hpp.
//
// Skew modes (post_rope_skew, pre_rope_folded): stack the group's queries into Q [n * g, D],
// SVD Q = U S V^T, A = V (columns in descending singular value, each column's largest-magnitude
// entry made positive so the result is deterministic). S = the r columns of Q A with the largest
// sum over samples of |q'|. rope_planes: A = identity, S = the r / 2 RoPE planes with the largest
// sum of plane norms; RoPE keeps plane norms, so RoPE'd and un-rotated samples choose the same.
// Computed in double, rounded to float once. post_rope_skew wants RoPE'd samples (each rotated
// at its own position), pre_rope_folded un-rotated ones, rope_planes either.
//
//   kvscout::skew_plan plan = kvscout::calibrate_skew(
//       {q.data(), q.size()}, {k.data(), k.size()}, n, g, D, opt);
//
// Eigen's SVD is slow to compile. A program that calibrates from several translation units can
// compile it once: define KVSCOUT_SEPARATE_CALIBRATION in all of them, which leaves only the
// declaration here and needs no Eigen, and in exactly one also define
// KVSCOUT_CALIBRATION_IMPLEMENTATION before including this header.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kvscout/core/error.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/skew/plan.hpp"

#if defined(KVSCOUT_SEPARATE_CALIBRATION)
#define KVSCOUT_CALIBRATION_INLINE
#else
#define KVSCOUT_CALIBRATION_INLINE inline
#endif

namespace kvscout {

///   q_samples [n, group, head_dim]: the queries of the group's query heads at n samples;
///   k_samples [n, head_dim]:        the kv head's keys at n samples.
/// Throws kvscout::error on bad sizes, non-finite samples, or a bad opts.r.
KVSCOUT_CALIBRATION_INLINE skew_plan calibrate_skew(host_span<const float> q_samples,
                                                    host_span<const float> k_samples, int n,
                                                    int group, int head_dim,
                                                    const skew_options& opts);

/// Every layer's plans in one call, from samples as a model produces them: per layer l,
///   q_samples[l] [n, num_q_heads, head_dim], k_samples[l] [n, num_kv_heads, head_dim]
/// (token-major, every head), with shape's num_layers, num_kv_heads, num_q_heads and head_dim.
/// Returns plans[layer][kv head], empty below first_layer (layers that attend densely).
///
///   const auto plans = kvscout::calibrate_skew_layers(shape, qs, ks, n, preset.skew(rope), 2);
inline std::vector<std::vector<skew_plan>> calibrate_skew_layers(
    const decode_shape& shape, const std::vector<std::vector<float>>& q_samples,
    const std::vector<std::vector<float>>& k_samples, int n, const skew_options& opts,
    int first_layer = 0) {
  const int L = shape.num_layers, H = shape.num_kv_heads, Hq = shape.num_q_heads,
            D = shape.head_dim;
  KVSCOUT_EXPECTS(L > 0 && H > 0 && D > 0 && Hq > 0 && Hq % H == 0,
                  "calibrate_skew_layers: shape [num_layers ", L, ", num_kv_heads ", H,
                  ", num_q_heads ", Hq, ", head_dim ", D,
                  "] must be positive with num_q_heads a multiple of num_kv_heads");
  KVSCOUT_EXPECTS(n > 0, "calibrate_skew_layers: n must be positive, got ", n);
  KVSCOUT_EXPECTS(first_layer >= 0 && first_layer <= L,
                  "calibrate_skew_layers: first_layer = ", first_layer,
                  " is outside [0, num_layers = ", L, "]");
  KVSCOUT_EXPECTS(q_samples.size() == static_cast<std::size_t>(L) &&
                      k_samples.size() == static_cast<std::size_t>(L),
                  "calibrate_skew_layers: got ", q_samples.size(), " query and ", k_samples.size(),
                  " key sample sets, expected one per layer (num_layers = ", L, ")");
  const int g = Hq / H;
  const std::size_t un = static_cast<std::size_t>(n), ud = static_cast<std::size_t>(D);
  std::vector<std::vector<skew_plan>> plans(static_cast<std::size_t>(L));
  std::vector<float> q(un * static_cast<std::size_t>(g) * ud), k(un * ud);
  for (int l = first_layer; l < L; ++l) {
    const auto& qs = q_samples[static_cast<std::size_t>(l)];
    const auto& ks = k_samples[static_cast<std::size_t>(l)];
    KVSCOUT_EXPECTS(qs.size() == un * static_cast<std::size_t>(Hq) * ud &&
                        ks.size() == un * static_cast<std::size_t>(H) * ud,
                    "calibrate_skew_layers: layer ", l, " has ", qs.size(), " query and ",
                    ks.size(), " key floats, expected n * num_q_heads * head_dim = ",
                    un * static_cast<std::size_t>(Hq) * ud,
                    " and n * num_kv_heads * head_dim = ", un * static_cast<std::size_t>(H) * ud);
    for (int h = 0; h < H; ++h) {
      for (std::size_t t = 0; t < un; ++t) {  // the group's queries and the head's key, per token
        std::copy_n(
            qs.data() + (t * static_cast<std::size_t>(Hq) + static_cast<std::size_t>(h) * g) * ud,
            static_cast<std::size_t>(g) * ud, q.data() + t * static_cast<std::size_t>(g) * ud);
        std::copy_n(
            ks.data() + (t * static_cast<std::size_t>(H) + static_cast<std::size_t>(h)) * ud, ud,
            k.data() + t * ud);
      }
      plans[static_cast<std::size_t>(l)].push_back(
          calibrate_skew({q.data(), q.size()}, {k.data(), k.size()}, n, g, D, opts));
    }
  }
  return plans;
}

}  // namespace kvscout

#if !defined(KVSCOUT_SEPARATE_CALIBRATION) || defined(KVSCOUT_CALIBRATION_IMPLEMENTATION)
#include "kvscout/skew/detail/calibrate_impl.hpp"
#endif
