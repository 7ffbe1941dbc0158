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

}  // namespace kvscout

#if !defined(KVSCOUT_SEPARATE_CALIBRATION) || defined(KVSCOUT_CALIBRATION_IMPLEMENTATION)
#include "kvscout/skew/detail/calibrate_impl.hpp"
#endif
