#pragma once
// Input checks shared by the host and the CUDA selectors. Host-compilable, so the checks of the
// device facades are tested without a GPU.

#include <cstddef>
#include <type_traits>

#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/select/concepts.hpp"

namespace kvscout::detail {

/// `budget_name` is the config field that holds the budget.
inline void check_selector_config(int num_seqs, int num_kv_heads, int max_tokens, int capacity,
                                  const char* budget_name, int budget, keep_set keep,
                                  double budget_share = 0) {
  KVSCOUT_EXPECTS(budget_share >= 0 && budget_share <= 1, "budget_share = ", budget_share,
                  ": expected a share of the cached rows in [0, 1] (0: a fixed ", budget_name,
                  ")");
  KVSCOUT_EXPECTS(num_seqs >= 0, "num_seqs must be non-negative, got ", num_seqs);
  KVSCOUT_EXPECTS(num_kv_heads > 0, "num_kv_heads must be positive, got ", num_kv_heads);
  KVSCOUT_EXPECTS(max_tokens >= 0, "max_tokens must be non-negative, got ", max_tokens);
  KVSCOUT_EXPECTS(capacity >= 0, "capacity must be non-negative, got ", capacity);
  KVSCOUT_EXPECTS(keep.sinks >= 0, "keep.sinks must be non-negative, got ", keep.sinks);
  KVSCOUT_EXPECTS(keep.recent >= 0, "keep.recent must be non-negative, got ", keep.recent);
  KVSCOUT_EXPECTS(budget >= 1, budget_name, " must be at least 1, got ", budget);
  KVSCOUT_EXPECTS(budget <= capacity, budget_name, " ", budget,
                  " is larger than the destination capacity ", capacity,
                  " (tokens per (sequence, kv_head) the selection buffers hold)");
  KVSCOUT_EXPECTS(static_cast<long long>(keep.sinks) + keep.recent <= budget, budget_name, " ",
                  budget, " is smaller than the keep-set it includes: sinks ", keep.sinks,
                  " + recent ", keep.recent);
}

/// Before anything is written: every size and pointer, and, in host memory only, every sequence
/// length (device selectors clamp the lengths they read instead).
template <class Space>
void check_selector_views(int num_seqs, int num_kv_heads, int stride, int capacity,
                          const score_view<Space>& scores, const selection_buffers<Space>& out) {
  KVSCOUT_EXPECTS(
      scores.num_seqs == num_seqs && scores.num_kv_heads == num_kv_heads && scores.stride == stride,
      "score view shape [num_seqs, num_kv_heads, stride] = [", scores.num_seqs, ", ",
      scores.num_kv_heads, ", ", scores.stride, "] differs from the config's [num_seqs, ",
      "num_kv_heads, max_tokens] = [", num_seqs, ", ", num_kv_heads, ", ", stride, "]");
  KVSCOUT_EXPECTS(
      out.num_seqs == num_seqs && out.num_kv_heads == num_kv_heads && out.capacity == capacity,
      "selection buffers shape [num_seqs, num_kv_heads, capacity] = [", out.num_seqs, ", ",
      out.num_kv_heads, ", ", out.capacity, "] differs from the config's [", num_seqs, ", ",
      num_kv_heads, ", ", capacity, "]");
  const std::size_t rows = static_cast<std::size_t>(num_seqs) * num_kv_heads;
  const std::size_t score_need = rows * static_cast<std::size_t>(stride);
  const std::size_t index_need = rows * static_cast<std::size_t>(capacity);
  const std::size_t seqs = static_cast<std::size_t>(num_seqs);
  KVSCOUT_EXPECTS(scores.scores.data() != nullptr || score_need == 0, "scores is null");
  KVSCOUT_EXPECTS(scores.scores.size() >= score_need, "scores holds ", scores.scores.size(),
                  " floats, expected at least num_seqs * num_kv_heads * stride = ", score_need);
  KVSCOUT_EXPECTS(scores.row_max.empty() || scores.row_max.size() >= rows, "row_max holds ",
                  scores.row_max.size(), " floats, expected none or at least num_seqs * ",
                  "num_kv_heads = ", rows);
  KVSCOUT_EXPECTS(scores.row_max.empty() || scores.row_max.data() != nullptr, "row_max is null");
  KVSCOUT_EXPECTS(scores.seq_lens.data() != nullptr || seqs == 0, "seq_lens is null");
  KVSCOUT_EXPECTS(scores.seq_lens.size() >= seqs, "seq_lens holds ", scores.seq_lens.size(),
                  " entries, expected at least num_seqs = ", seqs);
  KVSCOUT_EXPECTS(out.indices.data() != nullptr || index_need == 0, "selection indices is null");
  KVSCOUT_EXPECTS(out.indices.size() >= index_need, "selection indices holds ", out.indices.size(),
                  " entries, expected at least num_seqs * num_kv_heads * ",
                  "capacity = ", index_need);
  KVSCOUT_EXPECTS(out.counts.data() != nullptr || rows == 0, "selection counts is null");
  KVSCOUT_EXPECTS(out.counts.size() >= rows, "selection counts holds ", out.counts.size(),
                  " entries, expected at least num_seqs * num_kv_heads = ", rows);
  if constexpr (std::is_same_v<Space, host_space>) {
    for (int s = 0; s < num_seqs; ++s) {
      const int len = scores.seq_lens[static_cast<std::size_t>(s)];
      KVSCOUT_EXPECTS(len >= 0 && len <= stride, "seq_lens[", s, "] = ", len,
                      " is outside [0, max_tokens = ", stride, "]");
    }
  }
}

}  // namespace kvscout::detail
