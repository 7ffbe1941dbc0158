#pragma once
// Metrics for judging a selection (accuracy harness, tests).

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

/// probs[0..n): non-negative weights of one (sequence, kv head)'s cached tokens; selected:
/// ascending token indices. Returns sum over selected / sum over all (1 when the total is 0).
inline double attention_mass_recall(const float* probs, int n, const int32_t* selected, int count) {
  KVSCOUT_EXPECTS(n >= 0 && count >= 0, "attention_mass_recall: n = ", n, " and count = ", count,
                  " must be non-negative");
  KVSCOUT_EXPECTS((probs != nullptr || n == 0) && (selected != nullptr || count == 0),
                  "attention_mass_recall: null probs or selection");
  double total = 0, kept = 0;
  for (int t = 0; t < n; ++t) {
    KVSCOUT_EXPECTS(probs[t] >= 0.f && std::isfinite(probs[t]), "attention_mass_recall: weight ",
                    probs[t], " of token ", t, " is not a finite non-negative value");
    total += probs[t];
  }
  for (int i = 0; i < count; ++i) {
    KVSCOUT_EXPECTS(selected[i] >= 0 && selected[i] < n, "selected token ", selected[i],
                    " is out of range [0, ", n, ")");
    KVSCOUT_EXPECTS(i == 0 || selected[i - 1] < selected[i],
                    "selected tokens must be strictly ascending: ", selected[i - 1], " then ",
                    selected[i], " (entries ", i - 1, ", ", i, ")");
    kept += probs[selected[i]];
  }
  return total > 0 ? kept / total : 1.0;
}

namespace detail {
inline void check_ascending(const int32_t* a, int n, const char* what) {
  KVSCOUT_EXPECTS(n >= 0 && (a != nullptr || n == 0), what, ": ", n, " entries at ",
                  static_cast<const void*>(a));
  for (int i = 1; i < n; ++i)
    KVSCOUT_EXPECTS(a[i - 1] < a[i], what, " must be strictly ascending: ", a[i - 1], " then ",
                    a[i], " (entries ", i - 1, ", ", i, ")");
}

inline int common_count(const int32_t* a, int na, const int32_t* b, int nb) {
  detail::check_ascending(a, na, "common_count: list a");
  detail::check_ascending(b, nb, "common_count: list b");
  return detail::common_count_sorted(a, na, b, nb);
}
}  // namespace detail

inline double overlap(const int32_t* a, int na, const int32_t* b, int nb) {
  return nb > 0 ? static_cast<double>(detail::common_count(a, na, b, nb)) / nb : 1.0;
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
  KVSCOUT_EXPECTS(sel.num_seqs >= 0 && sel.num_kv_heads >= 0, "bytes_fetched: selection shape [",
                  sel.num_seqs, ", ", sel.num_kv_heads, "] is negative");
  const std::size_t pairs = static_cast<std::size_t>(sel.num_seqs) * sel.num_kv_heads;
  KVSCOUT_EXPECTS(sel.counts.size() >= pairs, "bytes_fetched: counts holds ", sel.counts.size(),
                  " entries, expected num_seqs * num_kv_heads = ", pairs);
  std::size_t rows = 0;
  for (std::size_t r = 0; r < pairs; ++r) {
    KVSCOUT_EXPECTS(sel.counts[r] >= 0 && sel.counts[r] <= sel.capacity, "bytes_fetched: count ",
                    sel.counts[r], " of row ", r, " is outside [0, capacity = ", sel.capacity, "]");
    rows += static_cast<std::size_t>(sel.counts[r]);
  }
  return rows * (k_row_bytes + v_row_bytes);
}

}  // namespace kvscout
