#pragma once
// Aggregation of a GQA group's logits into one score per token (spec/concepts.hpp).

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kvscout/core/config.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/spec/concepts.hpp"

namespace kvscout::detail {

inline constexpr int max_group = 64;  // query heads per KV head the host policies support

// Online softmax statistics of one query head over tokens: the running maximum m and the sum l
// of exp(z - m). Written once for the host (double) and the device (float) sum_prob.

/// exp in the precision of T.
template <class T>
KVSCOUT_HOST_DEVICE T softmax_exp(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return expf(x);
  } else {
    return exp(x);
  }
}

/// Adds logit z to the statistics (m, l); start from m = -inf, l = 0.
template <class T>
KVSCOUT_HOST_DEVICE void softmax_push(T& m, T& l, T z) {
  if (z > m) {
    l = l * softmax_exp<T>(m - z) + T(1);
    m = z;
  } else {
    l += softmax_exp<T>(z - m);
  }
}

/// Merges the statistics (m2, l2) of other tokens into (m, l). Either side may be empty
/// (m = -inf, l = 0).
template <class T>
KVSCOUT_HOST_DEVICE void softmax_merge(T& m, T& l, T m2, T l2) {
  if (l2 == T(0)) return;
  if (l == T(0)) {
    m = m2;
    l = l2;
  } else if (m2 > m) {
    l = l * softmax_exp<T>(m - m2) + l2;
    m = m2;
  } else {
    l += l2 * softmax_exp<T>(m2 - m);
  }
}

/// A token's share exp(z - m) / l of the attention mass of one head.
template <class T>
KVSCOUT_HOST_DEVICE T softmax_share(T z, T m, T l) {
  return softmax_exp<T>(z - m) / l;
}

/// Writes row[t] for t < n. logits(t, float* out) fills out[0..g) with the group's logits of
/// token t. sum_prob evaluates the logits twice (max and normaliser first, then the mass).
template <class LogitsFn>
void aggregate_scores(int n, int g, gqa_aggregation agg, float* row, LogitsFn&& logits) {
  KVSCOUT_EXPECTS(g >= 1 && g <= max_group, "GQA group of ", g, " query heads is outside [1, ",
                  max_group, "]");
  float z[max_group];
  if (agg != gqa_aggregation::sum_prob) {
    for (int t = 0; t < n; ++t) {
      logits(t, z);
      float a = z[0];
      if (agg == gqa_aggregation::max_logit) {
        for (int j = 1; j < g; ++j) a = std::max(a, z[j]);
      } else {
        for (int j = 1; j < g; ++j) a += z[j];
        a /= static_cast<float>(g);
      }
      row[t] = a;
    }
    return;
  }
  double m[max_group], l[max_group];
  for (int j = 0; j < g; ++j) m[j] = -std::numeric_limits<double>::infinity(), l[j] = 0;
  for (int t = 0; t < n; ++t) {
    logits(t, z);
    for (int j = 0; j < g; ++j) softmax_push<double>(m[j], l[j], z[j]);
  }
  for (int t = 0; t < n; ++t) {
    logits(t, z);
    double a = 0;
    for (int j = 0; j < g; ++j) a += softmax_share<double>(z[j], m[j], l[j]);
    row[t] = static_cast<float>(a);
  }
}

}  // namespace kvscout::detail
