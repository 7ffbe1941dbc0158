#pragma once
// A skew plan: how one (layer, kv head) turns a query and a key into the short partial vectors
// whose dot product approximates the attention score (InfiniGen, OSDI'24). Built offline by
// calibrate_skew (needs Eigen); this header needs no Eigen.
//
// The plan holds an orthogonal D x D matrix A and a channel set S of r columns. Because A is
// orthogonal, (q A) . (k A) = q . k exactly; skewing concentrates the query's energy in few
// columns, so the partial dot product over S approximates the score:
//     score(q, k) ~= sum_{i < r} q~[i] * pk[i],   q~ = (q A)[S],  pk = (k A)[S].
// Partial queries and keys are unscaled; whoever scores them multiplies by 1/sqrt(head_dim).
//
// RoPE models need the partial query rotated at the decoded position. Three modes:
//   post_rope_skew   A from RoPE'd samples. q~ = RoPE_pos(W_head x + b) A[:, S]: the head's full
//                    query projection is computed, rotated, then skewed. pk = RoPE_t(k) A[:, S].
//   rope_planes      A = identity; S = whole RoPE planes (pairs of channels) with the largest
//                    norm, r = 2 * planes. Only those r rows of W_Q are computed, then rotated
//                    plane by plane; the partial score is exactly those planes' share of q . k.
//   pre_rope_folded  for models without RoPE: A folded into the weights, q~ = x . (W_head^T A_S)
//                    + (b A)[S]; pk = k A[:, S] with the un-rotated key.
//

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/rope.hpp"
#include "kvscout/core/simd.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

enum class rope_mode : int { post_rope_skew = 0, rope_planes = 1, pre_rope_folded = 2 };

inline const char* to_string(rope_mode m) noexcept {
  switch (m) {
    case rope_mode::post_rope_skew: return "post_rope_skew";
    case rope_mode::rope_planes: return "rope_planes";
    case rope_mode::pre_rope_folded: return "pre_rope_folded";
  }
  return "unknown rope_mode";
}

struct skew_options {
  /// Partial dimension; 0 = default_partial_dim(head_dim). In [1, head_dim]; even for rope_planes.
  int r = 0;
  /// Also rank columns (planes) by the keys' magnitude and mix those in. S keeps exactly r
  /// channels: the first r distinct entries of q_1, k_1, q_2, k_2, ..., where q_t / k_t is the
  /// column ranked t-th by sum |q'| / sum |k'| over the samples.
  bool union_with_keys = false;
  rope_mode mode = rope_mode::post_rope_skew;
  rope_config rope{};
};

namespace detail {
/// head_dim / 4 rounded up to a multiple of 8 (one 16-byte vector of halves), at most head_dim.
inline int default_partial_dim(int head_dim) {
  KVSCOUT_EXPECTS(head_dim > 0, "head_dim must be positive, got ", head_dim);
  const int quarter = (head_dim + 3) / 4;
  const int r = (quarter + 7) / 8 * 8;
  return r < head_dim ? r : head_dim;
}
}  // namespace detail

struct skew_plan {
  rope_mode mode = rope_mode::post_rope_skew;
  int head_dim = 0;
  int r = 0;
  rope_config rope{};
  /// [head_dim, head_dim] row-major, orthogonal; q' = q A. Identity for rope_planes.
  std::vector<float> A;
  /// [r]: element i of a partial vector is channel channels[i] of q A. Ascending, except
  /// rope_planes: plane by plane (a_0, b_0, a_1, b_1, ...), the layout apply_rope_planes expects.
  std::vector<int> channels;
  std::vector<int> planes;
};

/// The rope_planes plan that keeps the given RoPE planes (A = identity), for an engine that picks
/// planes its own way. planes must be strictly ascending, in [0, head_dim / 2), and at least one.
inline skew_plan rope_planes_plan(const rope_config& rope, std::vector<int> planes) {
  const int D = rope.head_dim;
  KVSCOUT_EXPECTS(D >= 2 && D % 2 == 0, "rope_planes_plan: head_dim must be a positive even number, got ",
                  D);
  KVSCOUT_EXPECTS(!planes.empty(), "rope_planes_plan: no planes given");
  KVSCOUT_EXPECTS(std::isfinite(rope.theta) && rope.theta > 0.f,
                  "rope_planes_plan: rope theta must be positive and finite, got ", rope.theta);
  for (std::size_t i = 0; i < planes.size(); ++i) {
    KVSCOUT_EXPECTS(planes[i] >= 0 && planes[i] < D / 2, "rope_planes_plan: plane ", planes[i],
                    " (entry ", i, ") is outside [0, ", D / 2, ")");
    KVSCOUT_EXPECTS(i == 0 || planes[i - 1] < planes[i], "rope_planes_plan: planes must be strictly ascending: ",
                    planes[i - 1], " then ", planes[i]);
  }
  skew_plan plan;
  plan.mode = rope_mode::rope_planes;
  plan.head_dim = D;
  plan.r = 2 * static_cast<int>(planes.size());
  plan.rope = rope;
  plan.A.assign(static_cast<std::size_t>(D) * D, 0.f);
  for (int d = 0; d < D; ++d) plan.A[static_cast<std::size_t>(d) * D + d] = 1.f;
  plan.channels.reserve(static_cast<std::size_t>(plan.r));
  for (int j : planes) {
    const detail::rope_plane p = detail::rope_plane_channels(rope, j);
    plan.channels.push_back(p.a);
    plan.channels.push_back(p.b);
  }
  plan.planes = std::move(planes);
  return plan;
}

namespace detail {

inline void check_plan(const skew_plan& p) {
  KVSCOUT_EXPECTS(p.head_dim > 0, "skew_plan head_dim must be positive, got ", p.head_dim);
  KVSCOUT_EXPECTS(p.r >= 1 && p.r <= p.head_dim, "skew_plan r = ", p.r,
                  " must be in [1, head_dim = ", p.head_dim, "]");
  KVSCOUT_EXPECTS(p.A.size() == static_cast<std::size_t>(p.head_dim) * p.head_dim,
                  "skew_plan A has ", p.A.size(), " elements, expected head_dim^2 = ",
                  static_cast<std::size_t>(p.head_dim) * p.head_dim);
  KVSCOUT_EXPECTS(p.channels.size() == static_cast<std::size_t>(p.r), "skew_plan has ",
                  p.channels.size(), " channels, expected r = ", p.r);
  for (std::size_t i = 0; i < p.channels.size(); ++i) {
    KVSCOUT_EXPECTS(p.channels[i] >= 0 && p.channels[i] < p.head_dim, "skew_plan channel ",
                    p.channels[i], " (entry ", i, ") is outside [0, head_dim = ", p.head_dim, ")");
  }
  if (p.mode == rope_mode::rope_planes) {
    KVSCOUT_EXPECTS(p.r % 2 == 0 && p.planes.size() == static_cast<std::size_t>(p.r / 2),
                    "rope_planes skew_plan has ", p.planes.size(), " planes for r = ", p.r,
                    ", expected r / 2");
    for (std::size_t i = 0; i < p.planes.size(); ++i) {
      KVSCOUT_EXPECTS(p.planes[i] >= 0 && p.planes[i] < p.head_dim / 2, "skew_plan plane ",
                      p.planes[i], " (entry ", i, ") is outside [0, head_dim / 2 = ",
                      p.head_dim / 2, ")");
    }
  }
  if (p.mode != rope_mode::pre_rope_folded) {
    KVSCOUT_EXPECTS(p.head_dim % 2 == 0, "RoPE needs an even head_dim, got ", p.head_dim,
                    " for mode ", to_string(p.mode));
    KVSCOUT_EXPECTS(p.rope.head_dim == p.head_dim, "skew_plan rope.head_dim = ", p.rope.head_dim,
                    " differs from head_dim = ", p.head_dim);
    KVSCOUT_EXPECTS(std::isfinite(p.rope.theta) && p.rope.theta > 0.f,
                    "skew_plan rope theta must be positive and finite, got ", p.rope.theta);
  }
}

/// sum_d k[d] * a[d * stride] over d = 0 .. n - 1, ascending, float accumulation. Shared by
/// project_key and the device append; the device rounds every product and sum on its own (no FMA
/// contraction), so it matches a host build that does not contract either (the default x86-64).
KVSCOUT_HOST_DEVICE float skew_dot(const float* k, const float* a, int n, std::size_t stride) {
  float acc = 0.f;
  for (int d = 0; d < n; ++d) {
#if KVSCOUT_DEVICE_PASS
    acc = __fadd_rn(acc, __fmul_rn(k[d], a[static_cast<std::size_t>(d) * stride]));
#else
    acc += k[d] * a[static_cast<std::size_t>(d) * stride];
#endif
  }
  return acc;
}

/// Element i of a post_rope_skew partial query from the head's projected, unrotated query
/// y[head_dim]; rotation = A[:, S], [head_dim, r] row-major. The device computes one element per
/// thread; post_rope_skew_row computes whole rows with the same sums in the same order.
KVSCOUT_HOST_DEVICE float post_rope_skew_element(const float* y, const rope_config& rope,
                                                 const float* cs, const float* sn,
                                                 const float* rotation, int head_dim, int r,
                                                 int i) {
  float acc = 0.f;
  for (int j = 0; j < head_dim / 2; ++j) {
    const detail::rope_plane p = detail::rope_plane_channels(rope, j);
    float qa = y[p.a];
    float qb = y[p.b];
    detail::rope_rotate(qa, qb, cs[j], sn[j]);
    acc += qa * rotation[static_cast<std::size_t>(p.a) * r + i] +
           qb * rotation[static_cast<std::size_t>(p.b) * r + i];
  }
  return acc;
}

/// The plan a partial key cache is projected with when a narrow plan (the speculation's) reads the
/// first narrow.r channels and a wide one (the correction's) reads all: `wide` with narrow's
/// channels first, in narrow's order. Both plans must have passed check_plan; `where` names them in
/// errors. Refused: modes, head dims, RoPE or rotations A that differ, narrow.r > wide.r, a channel
/// of narrow's that wide lacks. The result's planes are not ascending: it projects keys and queries
/// only, never builds partial query weights.
inline skew_plan nested_key_plan(const skew_plan& narrow, const skew_plan& wide,
                                 const std::string& where) {
  KVSCOUT_EXPECTS(narrow.mode == wide.mode, where, ": the correction plan's mode ",
                  to_string(wide.mode), " differs from the speculation plan's ",
                  to_string(narrow.mode));
  KVSCOUT_EXPECTS(narrow.head_dim == wide.head_dim, where, ": the correction plan's head_dim ",
                  wide.head_dim, " differs from the speculation plan's ", narrow.head_dim);
  KVSCOUT_EXPECTS(narrow.r <= wide.r, where, ": the correction plan's r = ", wide.r,
                  " is smaller than the speculation plan's r = ", narrow.r,
                  "; the correction reads at least the speculation's channels");
  KVSCOUT_EXPECTS(narrow.mode == rope_mode::pre_rope_folded ||
                      (narrow.rope.theta == wide.rope.theta && narrow.rope.style == wide.rope.style),
                  where, ": the correction plan's RoPE (theta ", wide.rope.theta,
                  ") differs from the speculation plan's (theta ", narrow.rope.theta, ")");
  if (narrow.mode != rope_mode::rope_planes) {
    for (std::size_t i = 0; i < narrow.A.size(); ++i)
      KVSCOUT_EXPECTS(narrow.A[i] == wide.A[i], where,
                      ": the correction plan's rotation A differs from the speculation plan's (at "
                      "element ", i, ": ", wide.A[i], " against ", narrow.A[i],
                      "); one cache holds one projection, so both plans need the same A");
  }
  skew_plan out = wide;
  out.channels.clear();
  std::vector<char> taken(static_cast<std::size_t>(wide.head_dim), 0);
  for (int c : narrow.channels) {
    const bool found = std::find(wide.channels.begin(), wide.channels.end(), c) != wide.channels.end();
    KVSCOUT_EXPECTS(found, where, ": the speculation plan's channel ", c,
                    " is not among the correction plan's ", wide.r, " channels");
    out.channels.push_back(c);
    taken[static_cast<std::size_t>(c)] = 1;
  }
  for (int c : wide.channels)
    if (!taken[static_cast<std::size_t>(c)]) out.channels.push_back(c);
  if (wide.mode == rope_mode::rope_planes) {
    out.planes = narrow.planes;
    for (int j : wide.planes)
      if (std::find(narrow.planes.begin(), narrow.planes.end(), j) == narrow.planes.end())
        out.planes.push_back(j);
  }
  return out;
}

}  // namespace detail

/// pk[i] = (k A)[channels[i]]. post_rope_skew and rope_planes take the key RoPE'd at its own
/// position; pre_rope_folded the un-rotated key. Allocates nothing. Checks the plan (O(r)); callers
/// that checked it once use detail::project_key_checked_plan per token.
inline void project_key(const skew_plan& plan, const float* k, float* pk);

namespace detail {
inline void project_key_checked_plan(const skew_plan& plan, const float* k, float* pk) {
  const int D = plan.head_dim;
  const int r = plan.r;
  const int* ch = plan.channels.data();
  if (plan.mode == rope_mode::rope_planes) {
    for (int i = 0; i < r; ++i) pk[i] = k[ch[i]];
    return;
  }
  const float* A = plan.A.data();
  for (int i = 0; i < r; ++i) pk[i] = skew_dot(k, A + ch[i], D, static_cast<std::size_t>(D));
}
}  // namespace detail

inline void project_key(const skew_plan& plan, const float* k, float* pk) {
  KVSCOUT_EXPECTS(k != nullptr && pk != nullptr, "project_key: null key or output pointer");
  detail::check_plan(plan);
  detail::project_key_checked_plan(plan, k, pk);
}

}  // namespace kvscout
