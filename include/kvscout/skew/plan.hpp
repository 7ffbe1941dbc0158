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

namespace detail {
struct partial_query_shape {
  rope_mode mode = rope_mode::post_rope_skew;
  int d_model = 0;
  int head_dim = 0;
  int r = 0;
  rope_config rope{};

  [[nodiscard]] int rows() const noexcept {
    return mode == rope_mode::post_rope_skew ? head_dim : r;
  }
};

template <compute_element W = float>
struct partial_query_weights_view : detail::partial_query_shape {
  using weight_type = W;
  host_span<const W> weight;        // [rows(), d_model]
  host_span<const float> bias;      // [rows()]
  host_span<const float> rotation;  // post_rope_skew: [head_dim, r]
  host_span<const int> planes;      // rope_planes: [r / 2]
};

/// What partial_query needs for one query head, laid out for a GEMV over x[d_model].
template <compute_element W = float>
struct basic_partial_query_weights : detail::partial_query_shape {
  using weight_type = W;
  /// [rows(), d_model] row-major (out x in, like W_Q).
  ///   post_rope_skew:  the head's rows of W_Q.
  ///   rope_planes:     the selected rows of W_Q in channels order.
  ///   pre_rope_folded: (W_head^T A[:, S])^T, i.e. row i = sum_d A[d, S_i] W_head[d, :].
  std::vector<W> weight;
  std::vector<float> bias;
  std::vector<float> rotation;
  std::vector<int> planes;

  [[nodiscard]] detail::partial_query_weights_view<W> view() const noexcept {
    return {{static_cast<const detail::partial_query_shape&>(*this)},
            {weight.data(), weight.size()},
            {bias.data(), bias.size()},
            {rotation.data(), rotation.size()},
            {planes.data(), planes.size()}};
  }
};

/// The rows rounded once to W (to nearest even; exact where W_Q was already W, except for
/// pre_rope_folded). Bias, rotation and planes stay float.
template <compute_element W>
basic_partial_query_weights<W> weights_as(const basic_partial_query_weights<float>& w) {
  detail::basic_partial_query_weights<W> out;
  static_cast<detail::partial_query_shape&>(out) = w;
  out.weight.resize(w.weight.size());
  for (std::size_t i = 0; i < w.weight.size(); ++i) out.weight[i] = from_float<W>(w.weight[i]);
  out.bias = w.bias;
  out.rotation = w.rotation;
  out.planes = w.planes;
  return out;
}
}  // namespace detail

using partial_query_weights = detail::basic_partial_query_weights<float>;

namespace detail {
/// One query head's rows of W_Q and b_Q (b null where b_Q is empty), after checking the plan, the
/// sizes and that every value is finite.
template <compute_element In>
struct head_rows {
  const In* W;
  const In* b;
};
template <compute_element In>
head_rows<In> checked_head_rows(const skew_plan& plan, host_span<const In> W_Q,
                                host_span<const In> b_Q, int d_model, int q_head) {
  detail::check_plan(plan);
  const int D = plan.head_dim;
  KVSCOUT_EXPECTS(d_model > 0, "d_model must be positive, got ", d_model);
  const std::size_t head_elems = static_cast<std::size_t>(D) * d_model;
  KVSCOUT_EXPECTS(!W_Q.empty() && W_Q.size() % head_elems == 0, "W_Q has ", W_Q.size(),
                  " elements, expected a positive multiple of head_dim * d_model = ", D, " * ",
                  d_model, " = ", head_elems);
  const std::size_t num_q_heads = W_Q.size() / head_elems;
  KVSCOUT_EXPECTS(q_head >= 0 && static_cast<std::size_t>(q_head) < num_q_heads, "q_head ",
                  q_head, " out of range [0, ", num_q_heads, ")");
  KVSCOUT_EXPECTS(b_Q.empty() || b_Q.size() == num_q_heads * D, "b_Q has ", b_Q.size(),
                  " elements, expected 0 or num_q_heads * head_dim = ", num_q_heads * D);

  head_rows<In> out{W_Q.data() + static_cast<std::size_t>(q_head) * head_elems, nullptr};
  if (!b_Q.empty()) out.b = b_Q.data() + static_cast<std::size_t>(q_head) * D;
  const In *W = out.W, *b = out.b;
  for (std::size_t i = 0; i < head_elems; ++i) {
    KVSCOUT_EXPECTS(std::isfinite(to_float(W[i])), "W_Q of q_head ", q_head, " holds ",
                    to_float(W[i]), " at row ", i / d_model, ", column ", i % d_model);
  }
  for (int d = 0; b != nullptr && d < D; ++d) {
    KVSCOUT_EXPECTS(std::isfinite(to_float(b[d])), "b_Q of q_head ", q_head, " holds ",
                    to_float(b[d]), " at ", d);
  }
  return out;
}

template <compute_element In>
partial_query_weights make_partial_query_weights_from(const skew_plan& plan,
                                                      host_span<const In> W_Q,
                                                      host_span<const In> b_Q, int d_model,
                                                      int q_head) {
  const head_rows<In> hr = checked_head_rows(plan, W_Q, b_Q, d_model, q_head);
  const In *W = hr.W, *b = hr.b;
  const int D = plan.head_dim;
  const int r = plan.r;
  const std::size_t head_elems = static_cast<std::size_t>(D) * d_model;
  const auto bias_at = [&](int d) {
    return b == nullptr ? 0.0 : static_cast<double>(to_float(b[d]));
  };
  const auto widen = [](const In* src, std::size_t n, float* dst) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
  };

  partial_query_weights w;
  w.mode = plan.mode;
  w.d_model = d_model;
  w.head_dim = D;
  w.r = r;
  w.rope = plan.rope;
  switch (plan.mode) {
    case rope_mode::post_rope_skew: {
      w.weight.resize(head_elems);
      widen(W, head_elems, w.weight.data());
      w.bias.resize(static_cast<std::size_t>(D));
      for (int d = 0; d < D; ++d) w.bias[d] = static_cast<float>(bias_at(d));
      w.rotation.resize(static_cast<std::size_t>(D) * r);
      for (int d = 0; d < D; ++d)
        for (int i = 0; i < r; ++i)
          w.rotation[static_cast<std::size_t>(d) * r + i] =
              plan.A[static_cast<std::size_t>(d) * D + plan.channels[i]];
      break;
    }
    case rope_mode::rope_planes: {
      w.weight.resize(static_cast<std::size_t>(r) * d_model);
      w.bias.resize(static_cast<std::size_t>(r));
      for (int i = 0; i < r; ++i) {
        const int c = plan.channels[i];
        widen(W + static_cast<std::size_t>(c) * d_model, static_cast<std::size_t>(d_model),
              w.weight.data() + static_cast<std::size_t>(i) * d_model);
        w.bias[i] = static_cast<float>(bias_at(c));
      }
      w.planes = plan.planes;
      break;
    }
    case rope_mode::pre_rope_folded: {
      w.weight.resize(static_cast<std::size_t>(r) * d_model);
      w.bias.resize(static_cast<std::size_t>(r));
      std::vector<double> acc(static_cast<std::size_t>(d_model));
      for (int i = 0; i < r; ++i) {
        const int c = plan.channels[i];
        std::fill(acc.begin(), acc.end(), 0.0);
        double bacc = 0.0;
        for (int d = 0; d < D; ++d) {
          const double a = plan.A[static_cast<std::size_t>(d) * D + c];
          const In* row = W + static_cast<std::size_t>(d) * d_model;
          for (int j = 0; j < d_model; ++j) acc[j] += a * to_float(row[j]);
          bacc += a * bias_at(d);
        }
        for (int j = 0; j < d_model; ++j)
          w.weight[static_cast<std::size_t>(i) * d_model + j] = static_cast<float>(acc[j]);
        w.bias[i] = static_cast<float>(bacc);
      }
      break;
    }
    default:
      KVSCOUT_FAIL("unsupported rope_mode ", static_cast<int>(plan.mode),
                   "; supported: post_rope_skew, rope_planes, pre_rope_folded");
  }
  return w;
}
}  // namespace detail

/// W_Q [num_q_heads * head_dim, d_model] row-major (out x in, as PyTorch / GGUF store it); b_Q
/// [num_q_heads * head_dim] or empty. The plan must be the one of the kv head serving q_head
/// (q_head / group under GQA). W_Q and b_Q may be float, half or bfloat16 (widened exactly); the
/// weights built are float.
inline partial_query_weights make_partial_query_weights(const skew_plan& plan,
                                                        host_span<const float> W_Q,
                                                        host_span<const float> b_Q, int d_model,
                                                        int q_head) {
  return detail::make_partial_query_weights_from(plan, W_Q, b_Q, d_model, q_head);
}
template <compute_element In>
  requires(!std::is_same_v<In, float>)
partial_query_weights make_partial_query_weights(const skew_plan& plan, host_span<const In> W_Q,
                                                 host_span<const In> b_Q, int d_model,
                                                 int q_head) {
  return detail::make_partial_query_weights_from(plan, W_Q, b_Q, d_model, q_head);
}

namespace detail {

/// post_rope_skew_element for every i < r, in the same order, the r sums vectorised over i. Host
/// only.
inline void post_rope_skew_row(const float* y, const rope_config& rope, const float* cs,
                               const float* sn, const float* rotation, int head_dim, int r,
                               float* out) {
  for (int i = 0; i < r; ++i) out[i] = 0.f;
  for (int j = 0; j < head_dim / 2; ++j) {
    const detail::rope_plane p = detail::rope_plane_channels(rope, j);
    float qa = y[p.a];
    float qb = y[p.b];
    detail::rope_rotate(qa, qb, cs[j], sn[j]);
    const float* ra = rotation + static_cast<std::size_t>(p.a) * r;
    const float* rb = rotation + static_cast<std::size_t>(p.b) * r;
    for (int i = 0; i < r; ++i) out[i] += qa * ra[i] + qb * rb[i];
  }
}

}  // namespace detail

/// The partial queries of one query head for `count` sequences: q[v * ldq + i], i < r, from the
/// layer input x[v * ldx + :] (post-norm, d_model floats) at the position whose rotation rt[v]
/// holds (rt may be null for pre_rope_folded). Allocates nothing; float accumulation. The GEMV
/// reads the head's weights once per 4 sequences; each sequence gets the bits partial_query gives
/// it alone.
template <compute_element W>
void partial_queries(const detail::partial_query_weights_view<W>& w, const float* x,
                     std::size_t ldx, int count, const rope_table* rt, float* q, std::size_t ldq) {
  KVSCOUT_EXPECTS(count >= 0, "partial_queries: count must be >= 0, got ", count);
  if (count == 0) return;
  KVSCOUT_EXPECTS(x != nullptr && q != nullptr,
                  "partial_queries: null input or output pointer");
  KVSCOUT_EXPECTS(w.weight.size() == static_cast<std::size_t>(w.rows()) * w.d_model &&
                      w.bias.size() == static_cast<std::size_t>(w.rows()),
                  "partial_queries: inconsistent weights (rows ", w.rows(), ", d_model ",
                  w.d_model, ", weight ", w.weight.size(), ", bias ", w.bias.size(), ")");
  KVSCOUT_EXPECTS(count == 1 || (ldx >= static_cast<std::size_t>(w.d_model) &&
                                 ldq >= static_cast<std::size_t>(w.r)),
                  "partial_queries: strides ldx = ", ldx, " and ldq = ", ldq,
                  " must be at least d_model = ", w.d_model, " and r = ", w.r);
  if (w.mode != rope_mode::pre_rope_folded) {
    KVSCOUT_EXPECTS(rt != nullptr, "partial_queries: mode ", to_string(w.mode),
                    " needs one rope_table per sequence, got none");
    for (int v = 0; v < count; ++v)
      KVSCOUT_EXPECTS(rt[v].planes >= w.head_dim / 2, "partial_queries: rope_table ", v,
                      " holds ", rt[v].planes, " planes, expected head_dim / 2 = ", w.head_dim / 2);
  }
  const int n = w.d_model;
  const int r = w.r;
  const W* rows = w.weight.data();
  const float* bias = w.bias.data();
  switch (w.mode) {
    case rope_mode::post_rope_skew: {
      KVSCOUT_EXPECTS(w.rotation.size() == static_cast<std::size_t>(w.head_dim) * r,
                      "partial_queries: rotation has ", w.rotation.size(),
                      " elements, expected head_dim * r = ", w.head_dim * r);
      KVSCOUT_EXPECTS(w.head_dim <= 2 * rope_table::max_planes, "partial_queries: head_dim ",
                      w.head_dim, " exceeds ", 2 * rope_table::max_planes);
      // Stack scratch for up to `block` sequences' queries (head_dim <= 512).
      constexpr int block = 4;
      float y[block][2 * rope_table::max_planes];
      const int D = w.head_dim;
      for (int v0 = 0; v0 < count; v0 += block) {
        const int c = std::min(block, count - v0);
        detail::dot_rows_multi(rows, static_cast<std::size_t>(n), x + v0 * ldx, ldx, c, n, D, y[0],
                               2 * rope_table::max_planes);
        for (int v = 0; v < c; ++v) {
          for (int d = 0; d < D; ++d) y[v][d] += bias[d];
          detail::post_rope_skew_row(y[v], w.rope, rt[v0 + v].cs, rt[v0 + v].sn,
                                     w.rotation.data(), D, r, q + (v0 + v) * ldq);
        }
      }
      break;
    }
    case rope_mode::rope_planes:
    case rope_mode::pre_rope_folded: {
      const bool planes = w.mode == rope_mode::rope_planes;
      KVSCOUT_EXPECTS(!planes || w.planes.size() * 2 == static_cast<std::size_t>(r),
                      "partial_queries: ", w.planes.size(), " planes for r = ", r);
      detail::dot_rows_multi(rows, static_cast<std::size_t>(n), x, ldx, count, n, r, q, ldq);
      for (int v = 0; v < count; ++v) {
        float* qv = q + v * ldq;
        for (int i = 0; i < r; ++i) qv[i] += bias[i];
        if (!planes) continue;
        for (int i = 0; i < r / 2; ++i) {
          const int j = w.planes[static_cast<std::size_t>(i)];
          detail::rope_rotate(qv[2 * i], qv[2 * i + 1], rt[v].cs[j], rt[v].sn[j]);
        }
      }
      break;
    }
    default:
      KVSCOUT_FAIL("unsupported rope_mode ", static_cast<int>(w.mode),
                   "; supported: post_rope_skew, rope_planes, pre_rope_folded");
  }
}

template <compute_element W>
void partial_queries(const detail::basic_partial_query_weights<W>& w, const float* x,
                     std::size_t ldx, int count, const rope_table* rt, float* q, std::size_t ldq) {
  partial_queries(w.view(), x, ldx, count, rt, q, ldq);
}

template <compute_element W>
void partial_query(const detail::partial_query_weights_view<W>& w, const float* x,
                   const rope_table& rt, float* q_partial) {
  partial_queries(w, x, static_cast<std::size_t>(w.d_model), 1, &rt, q_partial,
                  static_cast<std::size_t>(w.r));
}
template <compute_element W>
void partial_query(const detail::basic_partial_query_weights<W>& w, const float* x,
                   const rope_table& rt, float* q_partial) {
  partial_query(w.view(), x, rt, q_partial);
}

template <compute_element W>
void partial_query(const detail::basic_partial_query_weights<W>& w, const float* x, int pos,
                   float* q_partial) {
  rope_table rt;
  if (w.mode != rope_mode::pre_rope_folded) rt.fill(w.rope, pos);
  partial_query(w, x, rt, q_partial);
}

}  // namespace kvscout
