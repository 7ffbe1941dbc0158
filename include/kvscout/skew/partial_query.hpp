#pragma once
// The partial query (skew/plan.hpp): the rows of W_Q a plan keeps, laid out for a GEMV over the
// layer's input (partial_query_weights, make_partial_query_weights), and the partial query of a
// token, rotated at its position and skewed (partial_query, partial_queries). Host only; the
// device computes the same sums in the same order (score/detail/infinigen_kernels.cuh).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/rope.hpp"
#include "kvscout/core/simd.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/skew/plan.hpp"

namespace kvscout {

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
  KVSCOUT_EXPECTS(q_head >= 0 && static_cast<std::size_t>(q_head) < num_q_heads, "q_head ", q_head,
                  " out of range [0, ", num_q_heads, ")");
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
requires(!std::is_same_v<In, float>) partial_query_weights
    make_partial_query_weights(const skew_plan& plan, host_span<const In> W_Q,
                               host_span<const In> b_Q, int d_model, int q_head) {
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
  KVSCOUT_EXPECTS(x != nullptr && q != nullptr, "partial_queries: null input or output pointer");
  KVSCOUT_EXPECTS(w.weight.size() == static_cast<std::size_t>(w.rows()) * w.d_model &&
                      w.bias.size() == static_cast<std::size_t>(w.rows()),
                  "partial_queries: inconsistent weights (rows ", w.rows(), ", d_model ", w.d_model,
                  ", weight ", w.weight.size(), ", bias ", w.bias.size(), ")");
  KVSCOUT_EXPECTS(count == 1 || (ldx >= static_cast<std::size_t>(w.d_model) &&
                                 ldq >= static_cast<std::size_t>(w.r)),
                  "partial_queries: strides ldx = ", ldx, " and ldq = ", ldq,
                  " must be at least d_model = ", w.d_model, " and r = ", w.r);
  if (w.mode != rope_mode::pre_rope_folded) {
    KVSCOUT_EXPECTS(rt != nullptr, "partial_queries: mode ", to_string(w.mode),
                    " needs one rope_table per sequence, got none");
    for (int v = 0; v < count; ++v)
      KVSCOUT_EXPECTS(rt[v].planes >= w.head_dim / 2, "partial_queries: rope_table ", v, " holds ",
                      rt[v].planes, " planes, expected head_dim / 2 = ", w.head_dim / 2);
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
          detail::post_rope_skew_row(y[v], w.rope, rt[v0 + v].cs, rt[v0 + v].sn, w.rotation.data(),
                                     D, r, q + (v0 + v) * ldq);
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
