#pragma once
// Aggregation of a GQA group's logits into one score per token (score/concepts.hpp).

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvscout/core/detail/online_softmax.hpp"
#include "kvscout/core/config.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/score/concepts.hpp"

namespace kvscout::detail {

inline constexpr int max_group = 64;  // query heads per KV head the host policies support

/// Writes row[t] for t < n. logits(t, float* out) fills out[0..g) with the group's logits of token
/// t. sum_prob evaluates the logits twice (max and normaliser first, then the mass).
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
