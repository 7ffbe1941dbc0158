#pragma once
// The definition of calibrate_skew (skew/calibrate.hpp). Needs Eigen.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kvscout/core/error.hpp"
#include "kvscout/core/rope.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/skew/detail/eigen.hpp"
#include "kvscout/skew/calibrate.hpp"
#include "kvscout/skew/plan.hpp"

namespace kvscout {

namespace detail {

/// Indices 0..n-1 by score, largest first; ties keep the lower index first, on every machine.
inline std::vector<int> rank_by_score(const std::vector<double>& score) {
  std::vector<int> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return score[a] > score[b]; });
  return idx;
}

/// The first `count` distinct entries of q_rank[0], k_rank[0], q_rank[1], k_rank[1], ...
/// (or of q_rank alone when k_rank is empty), sorted ascending.
inline std::vector<int> pick_top(const std::vector<int>& q_rank, const std::vector<int>& k_rank,
                                 int count) {
  std::vector<char> taken(q_rank.size(), 0);
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(count));
  const auto take = [&](int c) {
    if (static_cast<int>(out.size()) < count && !taken[c]) {
      taken[c] = 1;
      out.push_back(c);
    }
  };
  for (std::size_t t = 0; t < q_rank.size() && static_cast<int>(out.size()) < count; ++t) {
    take(q_rank[t]);
    if (!k_rank.empty()) take(k_rank[t]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

using row_major_f = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Checks calibrate_skew's arguments and the samples; the plan's mode, head_dim, RoPE and r.
inline skew_plan calibration_plan(host_span<const float> q_samples,
                                  host_span<const float> k_samples, int n, int group, int head_dim,
                                  const skew_options& opts) {
  KVSCOUT_EXPECTS(n > 0, "need at least one sample, got n = ", n);
  KVSCOUT_EXPECTS(group > 0, "GQA group size must be positive, got group = ", group);
  KVSCOUT_EXPECTS(head_dim > 0, "head_dim must be positive, got ", head_dim);
  const rope_mode mode = opts.mode;
  KVSCOUT_EXPECTS(mode == rope_mode::post_rope_skew || mode == rope_mode::rope_planes ||
                      mode == rope_mode::pre_rope_folded,
                  "unsupported rope_mode ", static_cast<int>(mode),
                  "; supported: post_rope_skew, rope_planes, pre_rope_folded");

  const std::size_t D = static_cast<std::size_t>(head_dim);
  const std::size_t rows = static_cast<std::size_t>(n) * static_cast<std::size_t>(group);
  KVSCOUT_EXPECTS(rows <= SIZE_MAX / D, "n * group * head_dim overflows size_t (n = ", n,
                  ", group = ", group, ", head_dim = ", head_dim, ")");
  KVSCOUT_EXPECTS(q_samples.size() == rows * D, "q_samples has ", q_samples.size(),
                  " elements, expected n * group * head_dim = ", n, " * ", group, " * ", head_dim,
                  " = ", rows * D);
  KVSCOUT_EXPECTS(k_samples.size() == static_cast<std::size_t>(n) * D, "k_samples has ",
                  k_samples.size(), " elements, expected n * head_dim = ", n, " * ", head_dim,
                  " = ", static_cast<std::size_t>(n) * D);

  skew_plan plan;
  plan.mode = mode;
  plan.head_dim = head_dim;
  plan.rope = opts.rope;
  if (plan.rope.head_dim == 0) plan.rope.head_dim = head_dim;
  if (mode != rope_mode::pre_rope_folded) {
    KVSCOUT_EXPECTS(head_dim % 2 == 0, "RoPE needs an even head_dim, got ", head_dim,
                    " for mode ", to_string(mode));
    KVSCOUT_EXPECTS(plan.rope.head_dim == head_dim, "opts.rope.head_dim = ", opts.rope.head_dim,
                    " differs from head_dim = ", head_dim);
    KVSCOUT_EXPECTS(std::isfinite(plan.rope.theta) && plan.rope.theta > 0.f,
                    "RoPE theta must be positive and finite, got ", plan.rope.theta);
  }

  const int r = opts.r == 0 ? detail::default_partial_dim(head_dim) : opts.r;
  KVSCOUT_EXPECTS(r > 0, "partial dimension r must be positive (0 = default), got r = ", opts.r);
  KVSCOUT_EXPECTS(r <= head_dim, "partial dimension r = ", r, " exceeds head_dim = ", head_dim);
  KVSCOUT_EXPECTS(mode != rope_mode::rope_planes || r % 2 == 0,
                  "rope_planes selects whole planes, so r must be even, got r = ", r);
  plan.r = r;

  for (std::size_t i = 0; i < q_samples.size(); ++i) {
    KVSCOUT_EXPECTS(std::isfinite(q_samples[i]), "q_samples holds ", q_samples[i],
                    " at sample ", i / (D * group), ", head ", (i / D) % group, ", channel ",
                    i % D);
  }
  for (std::size_t i = 0; i < k_samples.size(); ++i) {
    KVSCOUT_EXPECTS(std::isfinite(k_samples[i]), "k_samples holds ", k_samples[i],
                    " at sample ", i / D, ", channel ", i % D);
  }

  return plan;
}

/// rope_planes: the r / 2 planes of largest summed norm (RoPE-invariant, so the ranking holds at
/// every position), over the queries and, where asked, the keys too.
inline skew_plan planes_from_samples(const skew_plan& plan, host_span<const float> q_samples,
                                     host_span<const float> k_samples, int n, int group,
                                     const skew_options& opts) {
  const std::size_t D = static_cast<std::size_t>(plan.head_dim);
  const std::size_t rows = static_cast<std::size_t>(n) * static_cast<std::size_t>(group);
  const int head_dim = plan.head_dim, r = plan.r;
  const int P = head_dim / 2;
  const auto plane_scores = [&](const float* x, std::size_t count) {
    std::vector<double> s(static_cast<std::size_t>(P), 0.0);
    for (std::size_t row = 0; row < count; ++row) {
      const float* v = x + row * D;
      for (int j = 0; j < P; ++j) {
        const detail::rope_plane p = detail::rope_plane_channels(plan.rope, j);
        const double a = v[p.a], b = v[p.b];
        s[j] += std::sqrt(a * a + b * b);
      }
    }
    return s;
  };
  const std::vector<int> q_rank = detail::rank_by_score(plane_scores(q_samples.data(), rows));
  const std::vector<int> k_rank =
      opts.union_with_keys
          ? detail::rank_by_score(plane_scores(k_samples.data(), static_cast<std::size_t>(n)))
          : std::vector<int>{};
  return rope_planes_plan(plan.rope, detail::pick_top(q_rank, k_rank, r / 2));
}

/// The skew modes: A = V of the query samples' SVD (columns signed so their largest entry is
/// positive), and the r channels of largest summed |Q V| (and |K V|, where asked).
inline skew_plan skew_from_samples(skew_plan plan, host_span<const float> q_samples,
                                   host_span<const float> k_samples, int n, int group,
                                   const skew_options& opts) {
  const std::size_t D = static_cast<std::size_t>(plan.head_dim);
  const std::size_t rows = static_cast<std::size_t>(n) * static_cast<std::size_t>(group);
  const int head_dim = plan.head_dim, r = plan.r;
  // Skew modes: only V is needed, never U (which would be [n * g]^2).
  const Eigen::MatrixXd Q =
      Eigen::Map<const detail::row_major_f>(q_samples.data(), static_cast<Eigen::Index>(rows),
                                            head_dim)
          .cast<double>();
  Eigen::BDCSVD<Eigen::MatrixXd> svd(Q, Eigen::ComputeFullV);
  KVSCOUT_EXPECTS(svd.info() == Eigen::Success, "SVD of the query samples did not converge (n = ",
                  n, ", group = ", group, ", head_dim = ", head_dim, ")");
  Eigen::MatrixXd V = svd.matrixV();  // [D, D], orthogonal
  for (Eigen::Index j = 0; j < V.cols(); ++j) {
    Eigen::Index at = 0;
    V.col(j).cwiseAbs().maxCoeff(&at);
    if (V(at, j) < 0) V.col(j) = -V.col(j);
  }

  const auto column_abs_sums = [&](const Eigen::MatrixXd& X) {
    const Eigen::VectorXd s = (X * V).cwiseAbs().colwise().sum().transpose();
    return std::vector<double>(s.data(), s.data() + s.size());
  };
  const std::vector<int> q_rank = detail::rank_by_score(column_abs_sums(Q));
  std::vector<int> k_rank;
  if (opts.union_with_keys) {
    const Eigen::MatrixXd K =
        Eigen::Map<const detail::row_major_f>(k_samples.data(), n, head_dim).cast<double>();
    k_rank = detail::rank_by_score(column_abs_sums(K));
  }
  plan.channels = detail::pick_top(q_rank, k_rank, r);

  plan.A.resize(D * D);
  for (std::size_t d = 0; d < D; ++d)
    for (std::size_t j = 0; j < D; ++j)
      plan.A[d * D + j] =
          static_cast<float>(V(static_cast<Eigen::Index>(d), static_cast<Eigen::Index>(j)));
  return plan;
}

}  // namespace detail

KVSCOUT_CALIBRATION_INLINE skew_plan calibrate_skew(host_span<const float> q_samples,
                                                    host_span<const float> k_samples, int n,
                                                    int group, int head_dim,
                                                    const skew_options& opts) {
  const skew_plan plan = detail::calibration_plan(q_samples, k_samples, n, group, head_dim, opts);
  if (plan.mode == rope_mode::rope_planes)
    return detail::planes_from_samples(plan, q_samples, k_samples, n, group, opts);
  return detail::skew_from_samples(plan, q_samples, k_samples, n, group, opts);
}

}  // namespace kvscout
