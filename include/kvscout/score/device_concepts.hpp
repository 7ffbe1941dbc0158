#pragma once
// The speculation_policy_cuda concept: what the CUDA pipeline's stages need of a speculation
// policy, so that an engine's own GPU policy plugs in beside kvscout's.
//
//   p.score(ctx, out, exec)     enqueues, on exec.stream only, the work that writes out.scores
//                               [num_seqs, num_kv_heads, stride] for t < seq_lens[s] (clamped to
//                               [0, ctx.max_seq_len], device_status::bad_length)
//
// One policy object serves one layer, or several. detail::check_device_score_call holds the host
// checks every policy shares. Per-token state (InfiniGen's partial keys) is the policy's own
// business: the stages do not append; the engine does, on the compute stream.
//
// query_scoring_policy_cuda: a policy that also scores the layer's own query, for the correction
// step (p.score_query(q, ctx, out, exec); q [num_seqs, num_q_heads, head_dim] floats on the
// device).

#include <concepts>

#include "kvscout/core/exec.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/score/device_context.hpp"

namespace kvscout {

template <class P>
concept speculation_policy_cuda =
    requires(P& p, const score_context<device_space>& ctx, const score_buffer<device_space>& out,
             const cuda_exec& exec) {
      p.score(ctx, out, exec);
    };

template <class P>
concept query_scoring_policy_cuda =
    speculation_policy_cuda<P> &&
    requires(P& p, device_span<const float> q, const score_context<device_space>& ctx,
             const score_buffer<device_space>& out, const cuda_exec& exec) {
      p.score_query(q, ctx, out, exec);
    };

}  // namespace kvscout
