#pragma once
// What a device speculation policy reads and writes for one decode step of one layer, and the
// checks of a score() call that every device policy shares. Host-compilable, tested without a GPU.

#include <cstddef>
#include <cstdint>

#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

template <class Space>
struct score_context;

template <>
struct score_context<device_space> {
  device_span<const float> x;            // [num_seqs, d_model] layer i-1's normalised input
  device_span<const int32_t> positions;  // [num_seqs] position of the decoded token (RoPE)
  device_span<const int32_t> seq_lens;   // [num_seqs] cached tokens to score
  /// A host-known bound on every seq_lens[s]: it sizes the grid. Lengths above it (or above the
  /// cache or the stride) are clamped on the device; max_seq_len = 0 launches nothing.
  int max_seq_len = 0;
  /// [num_seqs] the sequence of the policy's state that batch row s reads, or empty: row s is
  /// sequence s. An id outside the policy's sequences raises device_status::bad_seq_id and its row
  /// is scored -inf.
  device_span<const int32_t> seq_ids = {};
};

namespace detail {

/// The checks that hold for every policy; policies check what they hold themselves (sequences,
/// cache length, inputs) before calling this.
inline void check_device_score_call(int num_kv_heads, const score_context<device_space>& ctx,
                                    const score_buffer<device_space>& out) {
  KVSCOUT_EXPECTS(out.num_seqs >= 1, "score buffer num_seqs = ", out.num_seqs,
                  ", expected at least 1");
  KVSCOUT_EXPECTS(out.num_kv_heads == num_kv_heads, "score buffer has ", out.num_kv_heads,
                  " kv heads, the config ", num_kv_heads);
  KVSCOUT_EXPECTS(ctx.max_seq_len >= 0, "max_seq_len = ", ctx.max_seq_len,
                  ", expected a non-negative bound");
  KVSCOUT_EXPECTS(ctx.max_seq_len <= out.stride, "max_seq_len = ", ctx.max_seq_len,
                  " exceeds the score buffer's stride ", out.stride);
  const std::size_t s = static_cast<std::size_t>(out.num_seqs);
  const std::size_t score_need = s * static_cast<std::size_t>(num_kv_heads) *
                                 static_cast<std::size_t>(out.stride);
  KVSCOUT_EXPECTS(out.scores.size() >= score_need, "score buffer holds ", out.scores.size(),
                  " floats, expected num_seqs * num_kv_heads * stride = ", score_need);
  KVSCOUT_EXPECTS(out.scores.data() != nullptr || score_need == 0, "score buffer is null");
  KVSCOUT_EXPECTS(out.row_max.empty(), "score buffer row_max holds ", out.row_max.size(),
                  " floats: the device policies do not write row maxima yet, expected none");
  KVSCOUT_EXPECTS(ctx.seq_lens.size() >= s && ctx.seq_lens.data() != nullptr, "seq_lens holds ",
                  ctx.seq_lens.size(), " entries, expected num_seqs = ", s);
  KVSCOUT_EXPECTS(ctx.seq_ids.empty() || (ctx.seq_ids.size() >= s && ctx.seq_ids.data() != nullptr),
                  "seq_ids holds ", ctx.seq_ids.size(), " entries, expected num_seqs = ", s,
                  " (or none)");
}

}  // namespace detail
}  // namespace kvscout
