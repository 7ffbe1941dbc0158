#pragma once
// Offline calibration of a skew plan for one (layer, kv head) from sample queries and keys
// (InfiniGen, OSDI'24). Needs Eigen (fp64 SVD); decode code includes only skew/plan.hpp.
//
// Skew modes (post_rope_skew, pre_rope_folded): stack the group's queries into Q [n * g, D],
// SVD Q = U S V^T, A = V (orthogonal, columns in descending singular value, each column's
// largest-magnitude entry made positive so the result is deterministic). S = the r columns of
// Q A with the largest sum over samples of |q'|. rope_planes: A = identity, S = the r / 2 RoPE
// planes with the largest sum over samples of the plane norm sqrt(q_a^2 + q_b^2); RoPE keeps plane
// norms, so RoPE'd and un-rotated samples choose the same planes.
// Everything is computed in double and rounded to float once, at the end.
//
// Which samples to pass: post_rope_skew wants RoPE'd queries and keys (each rotated at its own
// position), pre_rope_folded un-rotated ones (models without RoPE), rope_planes either.
//
//   // q [n, g, D]: the g query heads of kv head h at n sampled positions; k [n, D]: its keys.
//   kvscout::skew_options opt{.r = 0 /* default: D/4 up to a multiple of 8 */,
//                             .mode = kvscout::rope_mode::rope_planes, .rope = model_rope};
//   kvscout::skew_plan plan = kvscout::calibrate_skew(
//       {q.data(), q.size()}, {k.data(), k.size()}, n, g, D, opt);
//
// Separate compilation: the definition instantiates Eigen's SVD, about 36 s of compile time at
// -O2 (95 s under ASan + UBSan at -O1, 2-core machine) in every translation unit that includes
// this header. A program that calibrates from several translation units can compile it once:
// define KVSCOUT_SEPARATE_CALIBRATION in all of them (a target's compile definition), which
// leaves only the declaration here and needs no Eigen, and in exactly one of them also define
// KVSCOUT_CALIBRATION_IMPLEMENTATION before including this header. kvscout's own tests do so.

#include "kvscout/core/span.hpp"
#include "kvscout/skew/plan.hpp"

#if defined(KVSCOUT_SEPARATE_CALIBRATION)
#define KVSCOUT_CALIBRATION_INLINE
#else
#define KVSCOUT_CALIBRATION_INLINE inline
#endif

namespace kvscout {

/// Calibrates the skew plan of one (layer, kv head).
///   q_samples [n, group, head_dim]: the queries of the group's query heads at n samples
///             (group = num_q_heads / num_kv_heads; 1 without GQA);
///   k_samples [n, head_dim]:        the kv head's keys at n samples.
/// Throws kvscout::error on bad sizes, non-finite samples, or a bad opts.r (<0, > head_dim, odd for
/// rope_planes).
KVSCOUT_CALIBRATION_INLINE skew_plan calibrate_skew(host_span<const float> q_samples,
                                                    host_span<const float> k_samples, int n,
                                                    int group, int head_dim,
                                                    const skew_options& opts);

}  // namespace kvscout

#if !defined(KVSCOUT_SEPARATE_CALIBRATION) || defined(KVSCOUT_CALIBRATION_IMPLEMENTATION)
#include "kvscout/skew/detail/calibrate_impl.hpp"
#endif
