#pragma once
// The vocabulary between selectors (which write a selection) and prefetch executors (which move
// what it names): per (sequence, kv_head), ascending token indices and a count, in caller-owned
// buffers, plus the contiguous destination the executors fill.
//
//   indices  [num_seqs, num_kv_heads, capacity]  int32, the first counts[s, h] of a row are used,
//                                                strictly ascending, each in [0, seq_len(s))
//   counts   [num_seqs, num_kv_heads]            int32, in [0, capacity]
//
// Destination rows: the K row of the i-th selected token of (s, h) lands at byte
//   ((s * num_kv_heads + h) * capacity + i) * k_row_bytes
// of the K destination, and likewise for V; sparse attention reads that layout.

#include <cstddef>
#include <cstdint>

#include "kvscout/core/config.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

template <class Space>
struct selection_view {
  span<const int32_t, Space> indices;  // [num_seqs, num_kv_heads, capacity]
  span<const int32_t, Space> counts;   // [num_seqs, num_kv_heads]
  int num_seqs = 0;
  int num_kv_heads = 0;
  int capacity = 0;

  KVSCOUT_HOST_DEVICE std::size_t row(int s, int h) const {
    return static_cast<std::size_t>(s) * num_kv_heads + h;
  }
};

template <class Space>
struct selection_buffers {
  span<int32_t, Space> indices;  // [num_seqs, num_kv_heads, capacity]
  span<int32_t, Space> counts;   // [num_seqs, num_kv_heads]
  int num_seqs = 0;
  int num_kv_heads = 0;
  int capacity = 0;

  KVSCOUT_HOST_DEVICE selection_view<Space> view() const {
    return {indices, counts, num_seqs, num_kv_heads, capacity};
  }
};

/// Per-token scores: row (s, h) valid for t < seq_lens[s] (<= stride). Larger is more important;
/// NaN scores are never selected by score.
template <class Space>
struct score_view {
  span<const float, Space> scores;
  span<const int32_t, Space> seq_lens;  // [num_seqs]
  int num_seqs = 0;
  int num_kv_heads = 0;
  int stride = 0;
  /// Optional, [num_seqs, num_kv_heads]: each row's largest non-NaN score over t < seq_lens[s]
  /// (-inf where there is none), as the policy found it. A hint, never trusted: a selector that
  /// reads it checks it against its candidates, so the selection is the same with any hint or none.
  /// Empty: no hints; a NaN entry: none for that row.
  span<const float, Space> row_max{};

  KVSCOUT_HOST_DEVICE std::size_t row(int s, int h) const {
    return (static_cast<std::size_t>(s) * num_kv_heads + h) * static_cast<std::size_t>(stride);
  }
};

/// Where a speculation policy writes its scores: row (s, h) written for t < seq_lens[s].
template <class Space>
struct score_buffer {
  span<float, Space> scores;  // [num_seqs, num_kv_heads, stride]
  int num_seqs = 0;
  int num_kv_heads = 0;
  int stride = 0;
  /// Optional, [num_seqs, num_kv_heads]: where given, score() also writes each row's largest
  /// non-NaN score (score_view::row_max). Host policies write it; the device policies refuse a
  /// buffer that has one.
  span<float, Space> row_max{};

  KVSCOUT_HOST_DEVICE float* row(int s, int h) const {
    return scores.data() +
           (static_cast<std::size_t>(s) * num_kv_heads + h) * static_cast<std::size_t>(stride);
  }
  /// What a selector reads: these scores with the sequences' lengths, and their maxima if written.
  [[nodiscard]] score_view<Space> view(span<const std::int32_t, Space> seq_lens) const {
    return {span<const float, Space>(scores.data(), scores.size()), seq_lens, num_seqs,
            num_kv_heads, stride, span<const float, Space>(row_max.data(), row_max.size())};
  }
};

template <class Space>
struct gather_destination {
  span<std::byte, Space> k;  // [num_seqs, num_kv_heads, capacity, k_row_bytes]
  span<std::byte, Space> v;  // [num_seqs, num_kv_heads, capacity, v_row_bytes]
};

template <class Layout, class Space>
struct kv_view {
  Layout layout;
  span<const std::byte, Space> k;
  span<const std::byte, Space> v;
};

namespace detail {
/// |a ∩ b| for lists known to be strictly ascending.
inline int common_count_sorted(const int32_t* a, int na, const int32_t* b, int nb) {
  int i = 0, j = 0, both = 0;
  while (i < na && j < nb) {
    if (a[i] == b[j]) ++both, ++i, ++j;
    else if (a[i] < b[j]) ++i;
    else ++j;
  }
  return both;
}
}  // namespace detail

}  // namespace kvscout
