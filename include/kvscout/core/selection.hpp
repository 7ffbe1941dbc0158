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

/// What a selector writes: the same layout as selection_view, writable.
template <class Space>
struct selection_buffers {
  span<int32_t, Space> indices;  // [num_seqs, num_kv_heads, capacity]
  span<int32_t, Space> counts;   // [num_seqs, num_kv_heads]
  int num_seqs = 0;
  int num_kv_heads = 0;
  int capacity = 0;

  /// The read-only view an executor takes.
  KVSCOUT_HOST_DEVICE selection_view<Space> view() const {
    return {indices, counts, num_seqs, num_kv_heads, capacity};
  }
};

/// Per-token scores a speculation policy writes and a selector reads:
///   scores [num_seqs, num_kv_heads, stride], row (s, h) valid for t < seq_lens[s] (<= stride).
/// Larger is more important. NaN scores are never selected by score (see select/).
template <class Space>
struct score_view {
  span<const float, Space> scores;
  span<const int32_t, Space> seq_lens;  // [num_seqs]
  int num_seqs = 0;
  int num_kv_heads = 0;
  int stride = 0;
  /// Optional, [num_seqs, num_kv_heads]: each row's largest non-NaN score over t < seq_lens[s]
  /// (-inf where there is none), as the policy that wrote the scores found it while writing them
  /// (score_buffer::row_max). A hint, never trusted: a selector that reads it
  /// (threshold_selector_host's per_head rule) checks it against the candidates it collects and
  /// finds the maximum itself where it is wrong, so the selection is the same with any hint or
  /// none; a right one spares the selector its own pass for the maximum, a wrong one costs it
  /// more. Empty: no hints; a NaN entry: none for that row.
  span<const float, Space> row_max{};

  KVSCOUT_HOST_DEVICE std::size_t row(int s, int h) const {
    return (static_cast<std::size_t>(s) * num_kv_heads + h) * static_cast<std::size_t>(stride);
  }
};

/// Where a speculation policy writes its scores (score/), host or device memory by Space:
///   scores [num_seqs, num_kv_heads, stride], row (s, h) written for t < seq_lens[s].
/// view() is what a selector reads.
template <class Space>
struct score_buffer {
  span<float, Space> scores;  // [num_seqs, num_kv_heads, stride]
  int num_seqs = 0;
  int num_kv_heads = 0;
  int stride = 0;
  /// Optional, [num_seqs, num_kv_heads]: where given, score() also writes each row's largest
  /// non-NaN score over t < seq_lens[s] (-inf where there is none), the hint a selector reads as
  /// score_view::row_max. Host policies write it (infinigen_policy_host forms it in the scoring
  /// loop, from the scores in registers; the others with one more read of each row,
  /// detail::write_row_max); the device policies do not yet, and refuse a buffer that has one.
  span<float, Space> row_max{};

  /// Row (s, h): stride floats in Space's memory.
  KVSCOUT_HOST_DEVICE float* row(int s, int h) const {
    return scores.data() +
           (static_cast<std::size_t>(s) * num_kv_heads + h) * static_cast<std::size_t>(stride);
  }
  /// What a selector reads: these scores with the sequences' lengths (a policy writes
  /// t < seq_lens[s] of each row; the selector looks at no more), and their maxima if written.
  [[nodiscard]] score_view<Space> view(span<const std::int32_t, Space> seq_lens) const {
    return {span<const float, Space>(scores.data(), scores.size()), seq_lens, num_seqs,
            num_kv_heads, stride, span<const float, Space>(row_max.data(), row_max.size())};
  }
};

/// Where an executor writes the selected rows, in the order the selection lists them.
template <class Space>
struct gather_destination {
  span<std::byte, Space> k;  // [num_seqs, num_kv_heads, capacity, k_row_bytes]
  span<std::byte, Space> v;  // [num_seqs, num_kv_heads, capacity, v_row_bytes]
};

/// A KV source: a layout and the K / V base buffers it addresses.
template <class Layout, class Space>
struct kv_view {
  Layout layout;
  span<const std::byte, Space> k;
  span<const std::byte, Space> v;
};

namespace detail {
/// |a ∩ b| for lists known to be strictly ascending (a checked selection, step after step): the
/// rows two selections share (the host pipeline's reuse count, eval's overlap).
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
