#pragma once
// Metrics for judging a selection (accuracy harness, tests).
//
//   attention_mass_recall  share of the true attention mass that the selected rows carry
//   overlap                share of a reference set (the oracle's top-k) that a selection found
//   relative_error         ||out - ref|| / ||ref|| in fp64, e.g. sparse against dense attention
//   bytes_fetched          bytes a selection moves across the link (K + V rows)
//   common_count           |a ∩ b| of two ascending index lists (rows a step re-selects: what a
//                          device row cache would not fetch again)

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

/// probs[0..n): the true attention probabilities of the cached tokens of one (sequence, kv head)
/// (any non-negative weights; e.g. summed over the GQA group). selected: ascending token indices.
/// Returns sum over selected / sum over all (1 when the total is 0).
inline double attention_mass_recall(const float* probs, int n, const int32_t* selected, int count) {
  double total = 0, kept = 0;
  for (int t = 0; t < n; ++t) total += probs[t];
  for (int i = 0; i < count; ++i) {
    KVSCOUT_EXPECTS(selected[i] >= 0 && selected[i] < n, "selected token ", selected[i],
                    " is out of range [0, ", n, ")");
    kept += probs[selected[i]];
  }
  return total > 0 ? kept / total : 1.0;
}

/// |a ∩ b| for ascending index lists.
inline int common_count(const int32_t* a, int na, const int32_t* b, int nb) {
  int i = 0, j = 0, both = 0;
  while (i < na && j < nb) {
    if (a[i] == b[j]) ++both, ++i, ++j;
    else if (a[i] < b[j]) ++i;
    else ++j;
  }
  return both;
}

/// |a ∩ b| / |b| for ascending index lists (1 when b is empty).
inline double overlap(const int32_t* a, int na, const int32_t* b, int nb) {
  return nb > 0 ? static_cast<double>(common_count(a, na, b, nb)) / nb : 1.0;
}

inline double relative_error(host_span<const float> out, host_span<const float> ref) {
  KVSCOUT_EXPECTS(out.size() == ref.size(), "relative_error: sizes differ (", out.size(), " vs ",
                  ref.size(), ")");
  double num = 0, den = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline std::size_t bytes_fetched(const selection_view<host_space>& sel, std::size_t k_row_bytes,
                                 std::size_t v_row_bytes) {
  std::size_t rows = 0;
  for (std::size_t r = 0; r < static_cast<std::size_t>(sel.num_seqs) * sel.num_kv_heads; ++r)
    rows += static_cast<std::size_t>(sel.counts[r]);
  return rows * (k_row_bytes + v_row_bytes);
}

}  // namespace kvscout
