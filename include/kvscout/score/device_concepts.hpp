#pragma once
// The speculation_policy_cuda concept: what the CUDA pipeline's stages need of a speculation
// policy (pipeline/cuda_stages.cuh), so that an engine's own GPU policy plugs in beside
// kvscout's infinigen_policy_cuda (score/infinigen.cuh) and streaming_policy_cuda
// (score/streaming.cuh).
//
//   p.score(ctx, out, exec)     enqueues, on exec.stream only, the work that writes out.scores
//                               [num_seqs, num_kv_heads, stride] for t < seq_lens[s] (read on the
//                               device, clamped to [0, ctx.max_seq_len] and reported in
//                               exec.status); larger scores are kept first by the selectors
//                               (select/concepts.hpp). exec: a cuda_exec (core/exec.hpp), the
//                               call's own stream and device status word.
//
// One policy object serves one layer, or several: the stages hold a pointer per layer and may
// repeat one. Beyond the signature (the compiler cannot check it), score() keeps the per-step
// contract (docs/architecture.md): detail::check_device_score_call holds the host checks every
// policy shares; lengths outside [0, max_seq_len] are clamped and raise device_status::bad_length
// (detail::raise_device_status, core/device_status.hpp).
// Per-token state (InfiniGen's partial keys) is the policy's own business: the stages do not
// append; the engine does, on the compute stream, as for its KV cache.
//
// query_scoring_policy_cuda: a policy that also scores the layer's own query, for the
// correction step (p.score_query(q, ctx, out, exec); q [num_seqs, num_q_heads, head_dim] floats
// on the device; ctx.x and ctx.positions unread): infinigen_policy_cuda.

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
