#pragma once
// The speculation_policy concept: something that scores every cached token of layer i, per
// (sequence, kv head), so that a selector (select/) can choose which rows to fetch.
//
//   P::needs_query            false: scores are known before layer i runs, so the fetch can
//                             overlap layer i-1. true: the policy needs layer i's own query (the
//                             oracle, Quest) and runs at the start of layer i.
//   p.score(layer, ctx, out, x)  writes out.scores [num_seqs, num_kv_heads, stride] for t <
//                             seq_len, and where out.row_max is given each row's maximum (a
//                             selector's hint); x: host_exec, last as cuda_exec is on the device
//                             (every library policy defaults it)
// Every policy checks its inputs and throws kvscout::error before it writes a score, so bad input
// leaves out.scores as it was. Optional hooks the pipeline calls:
//   p.append(layer, s, t, k_pre_rope, k_post_rope)  a token's keys ([num_kv_heads, head_dim])
//                                                   entered sequence s's cache at position t
//   p.observe(layer, ctx, rows, probs, stride, has_current)  (h2o) attention probabilities of the
//                                                   rows attended and, when has_current, of the
//                                                   current token
//
// Score scale: logits are q.k * scale (the attention's own), so a threshold alpha is in logit
// units, as in InfiniGen.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kvscout/core/detail/checked_size.hpp"
#include "kvscout/core/detail/host_vec.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

/// The device context (score/device_context.hpp) differs: a host-known length bound, no query.
template <class Space>
struct score_context;

template <>
struct score_context<host_space> {
  host_span<const float> x;            // [num_seqs, d_model] layer i-1's normalised input
  host_span<const float> q;            // [num_seqs, num_q_heads, head_dim] layer i's query
  host_span<const int32_t> positions;  // [num_seqs] position of the token being decoded (RoPE)
  host_span<const int32_t> seq_lens;   // [num_seqs] cached tokens to score
  /// [num_seqs] where batch row s keeps its state (the policy's sequence index). Empty: row s is
  /// sequence s. Any order; distinct, below the policy's sequence count (score() checks).
  host_span<const int32_t> seq_ids = {};
};

namespace detail {
inline int seq_of(const score_context<host_space>& ctx, int s) {
  return ctx.seq_ids.empty() ? s : ctx.seq_ids[s];
}
}  // namespace detail

/// How the scores of the query heads of one GQA group become one score per KV head.
///   max_logit  the largest logit of the group (a token matters if any head attends to it)
///   sum_prob   the sum over the group of each head's softmax probability (attention mass)
enum class gqa_aggregation { max_logit, mean_logit, sum_prob };

template <class P>
concept speculation_policy = requires(P& p, int layer, const score_context<host_space>& ctx,
                                      const score_buffer<host_space>& out, const host_exec& x) {
  { P::needs_query } -> std::convertible_to<bool>;
  p.score(layer, ctx, out, x);
};

namespace detail {
/// Positive sizes, and a state of num_layers x num_seqs x num_kv_heads x max_tokens x `per_token`
/// floats whose size fits in size_t.
inline void check_policy_sizes(const char* policy, int num_layers, int num_seqs, int num_kv_heads,
                               int max_tokens, std::size_t per_token = 1) {
  KVSCOUT_EXPECTS(num_layers > 0 && num_seqs > 0 && num_kv_heads > 0 && max_tokens > 0, policy,
                  " needs positive sizes, got layers ", num_layers, ", seqs ", num_seqs,
                  ", kv heads ", num_kv_heads, ", max_tokens ", max_tokens);
  checked_size("the policy's state in bytes (layers x seqs x kv heads x max_tokens x bytes per "
               "token)", num_layers, num_seqs, num_kv_heads, max_tokens, per_token * sizeof(float));
}
inline void check_gqa(int num_q_heads, int num_kv_heads) {
  KVSCOUT_EXPECTS(num_q_heads >= 1 && num_kv_heads >= 1 && num_q_heads % num_kv_heads == 0,
                  "num_q_heads = ", num_q_heads, " must be a positive multiple of num_kv_heads = ",
                  num_kv_heads);
}
inline void check_aggregation(gqa_aggregation a, const char* field) {
  KVSCOUT_EXPECTS(a == gqa_aggregation::max_logit || a == gqa_aggregation::mean_logit ||
                      a == gqa_aggregation::sum_prob,
                  field, " = ", static_cast<int>(a),
                  " is no gqa_aggregation; expected max_logit, mean_logit or sum_prob");
}
inline void check_scale(float scale) {
  KVSCOUT_EXPECTS(std::isfinite(scale) && scale > 0.f, "scale must be positive and finite, got ",
                  scale);
}

/// Up to this many sequences, check_seq_ids finds repeats with a stack bitmap; beyond, by pairs.
inline constexpr int seq_id_bitmap_max = 4096;

/// ctx.seq_ids, when given: num_seqs entries, each in [0, max_seqs), no two equal (two rows of one
/// sequence would add its attention mass twice). Allocates nothing.
inline void check_seq_ids(const score_context<host_space>& ctx, int num_seqs, int max_seqs,
                          const char* holder = "the policy's") {
  if (ctx.seq_ids.empty()) return;
  KVSCOUT_EXPECTS(ctx.seq_ids.size() >= static_cast<std::size_t>(num_seqs), "seq_ids holds ",
                  ctx.seq_ids.size(), " entries, expected num_seqs = ", num_seqs, " (or none)");
  const bool bitmap = max_seqs <= seq_id_bitmap_max;
  std::uint64_t seen[seq_id_bitmap_max / 64];
  if (bitmap)
    for (int w = 0; w < (max_seqs + 63) / 64; ++w) seen[w] = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const int id = ctx.seq_ids[s];
    KVSCOUT_EXPECTS(id >= 0 && id < max_seqs, "seq_ids[", s, "] = ", id,
                    " is outside [0, ", holder, " num_seqs = ", max_seqs, ")");
    const auto earlier = [&] {
      const std::int32_t* ids = ctx.seq_ids.data();
      return static_cast<int>(std::find(ids, ids + s, id) - ids);
    };
    int u = s;  // the earlier row holding id; s if none
    if (bitmap) {
      const std::uint64_t bit = std::uint64_t{1} << (id % 64);
      if ((seen[id / 64] & bit) != 0) [[unlikely]] u = earlier();
      seen[id / 64] |= bit;
    } else {
      u = earlier();
    }
    if (u < s) [[unlikely]]
      KVSCOUT_FAIL("seq_ids[", u, "] and seq_ids[", s, "] are both ", id,
                   ": a sequence may fill one batch row");
  }
}

/// The checks every policy's score() makes before it writes a score. A policy with per-sequence
/// state passes how many sequences and tokens per sequence it holds, so that no score buffer or
/// seq_lens past them reads past it. `holder` names whose state the limits are.
inline void check_score_buffer(const score_buffer<host_space>& out,
                               const score_context<host_space>& ctx, int num_kv_heads,
                               int max_seqs = std::numeric_limits<int>::max(),
                               int max_tokens = std::numeric_limits<int>::max(),
                               const char* holder = "the policy's") {
  KVSCOUT_EXPECTS(out.num_seqs >= 0 && out.stride >= 0, "score buffer num_seqs = ", out.num_seqs,
                  " and stride = ", out.stride, " must be non-negative");
  KVSCOUT_EXPECTS(out.num_kv_heads == num_kv_heads, "score buffer has ", out.num_kv_heads,
                  " kv heads, the policy ", num_kv_heads);
  KVSCOUT_EXPECTS(out.num_seqs <= max_seqs, "score buffer num_seqs = ", out.num_seqs,
                  " exceeds ", holder, " num_seqs = ", max_seqs);
  KVSCOUT_EXPECTS(ctx.seq_lens.size() >= static_cast<std::size_t>(out.num_seqs), "seq_lens holds ",
                  ctx.seq_lens.size(), " entries, expected num_seqs = ", out.num_seqs);
  const std::size_t need = static_cast<std::size_t>(out.num_seqs) * out.num_kv_heads *
                           static_cast<std::size_t>(out.stride);
  KVSCOUT_EXPECTS(out.scores.size() >= need, "score buffer holds ", out.scores.size(),
                  " floats, expected [", out.num_seqs, ", ", out.num_kv_heads, ", ", out.stride,
                  "]");
  KVSCOUT_EXPECTS(out.scores.data() != nullptr || need == 0, "score buffer is null");
  const std::size_t rows = static_cast<std::size_t>(out.num_seqs) * out.num_kv_heads;
  KVSCOUT_EXPECTS(out.row_max.empty() || out.row_max.size() >= rows, "score buffer row_max holds ",
                  out.row_max.size(), " floats, expected none or [", out.num_seqs, ", ",
                  out.num_kv_heads, "]");
  KVSCOUT_EXPECTS(out.row_max.empty() || out.row_max.data() != nullptr,
                  "score buffer row_max is null");
  check_seq_ids(ctx, out.num_seqs, max_seqs, holder);
  for (int s = 0; s < out.num_seqs; ++s) {
    KVSCOUT_EXPECTS(ctx.seq_lens[s] >= 0 && ctx.seq_lens[s] <= out.stride, "seq_lens[", s, "] = ",
                    ctx.seq_lens[s], " is outside [0, stride = ", out.stride, "]");
    KVSCOUT_EXPECTS(ctx.seq_lens[s] <= max_tokens, "seq_lens[", s, "] = ", ctx.seq_lens[s],
                    " exceeds ", holder, " max_tokens = ", max_tokens);
  }
}

/// Where out.row_max is given, writes each row's maximum, read back from the scores. Call after the
/// scores are written.
inline void write_row_max(const score_buffer<host_space>& out,
                          const score_context<host_space>& ctx) {
  if (out.row_max.empty()) return;
  for (int s = 0; s < out.num_seqs; ++s)
    for (int h = 0; h < out.num_kv_heads; ++h)
      out.row_max[static_cast<std::size_t>(s) * out.num_kv_heads + h] =
          max_non_nan(out.row(s, h), ctx.seq_lens[s]);
}
}  // namespace detail

}  // namespace kvscout
