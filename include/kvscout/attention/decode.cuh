#pragma once
// Sparse (and dense) decode attention on the device: one new query per (sequence, query head)
// against the rows of a device row source plus, optionally, the current token's K / V; GQA
// without expanding KV; online softmax in fp32. The device twin of decode_attention_host.
//
//   auto plan = kvscout::plan_decode_attention_cuda({.shape = shape,
//                                                    .max_rows = capacity});   // setup, once
//   kvscout::gathered_rows_cuda<kvscout::half, 128> rows(sel, k_rows, v_rows);
//   kvscout::decode_attention_cuda(
//       rows, kvscout::current_token<kvscout::half, kvscout::device_space>{k, v}, q, out,
//       {.num_q_heads = 32, .scale = 0.088f}, plan, workspace, {stream, d_status});
//
// Row sources: attention/rows.cuh. Element types float / half / bfloat16; head_dim a multiple of
// 32 up to 256. q and out are [num_seqs, num_q_heads, head_dim], float by default or any element
// type.
//
// Flash-decoding: blocks of 4 warps per (sequence, kv head, split), up to 8 query heads each; with
// more than one split a second kernel merges the softmax states. Nothing is allocated or
// synchronises the host. Host-known shapes and parameters are validated (kvscout::error); device
// data is checked in the kernel and reported through exec.status. Unlike the host version there is
// no per-row probability output.

#include <cuda_runtime.h>

#include <concepts>
#include <cstddef>
#include <type_traits>

#include "kvscout/core/detail/launch.cuh"
#include "kvscout/attention/decode.hpp"
#include "kvscout/attention/device_plan.hpp"
#include "kvscout/attention/detail/decode_device_checks.hpp"
#include "kvscout/attention/detail/decode_kernel.cuh"
#include "kvscout/attention/rows.cuh"
#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

namespace detail {
template <attention_rows_cuda Rows, kv_element T, class Q, class O, int G>
void launch_decode_attention(const decode_device_params<Rows, T, Q, O>& prm,
                             const decode_attention_plan& plan, cudaStream_t stream) {
  constexpr int W = decode_device_warps;
  const dim3 grid(static_cast<unsigned>(plan.num_seqs * plan.num_kv_heads),
                  static_cast<unsigned>(plan.splits), static_cast<unsigned>(plan.head_blocks));
  launch(decode_attention_kernel<Rows, T, Q, O, G, W>, grid, W * 32, 0, stream, prm);
}
}  // namespace detail

/// sh.num_sms = 0 asks the device for its SM count (once, here: build the plan at setup).
inline decode_attention_plan plan_decode_attention_cuda(decode_attention_config sh) {
  if (sh.num_sms == 0) sh.num_sms = detail::current_sm_count();
  KVSCOUT_EXPECTS(sh.num_sms >= 1, "no current CUDA device to plan for (pass num_sms)");
  return plan_decode_attention(sh);
}

/// Attention split by `plan` over `workspace` (at least plan.workspace_bytes(), 16-byte aligned,
/// device memory the call may overwrite; nothing when plan.splits == 1). q and out: float by
/// default or any element type; q is widened to float as read, out rounded once as written.
template <attention_rows_cuda Rows, kv_element T, class QSpan = const float, class O = float>
void decode_attention_cuda(const Rows& rows, const current_token<T, device_space>& cur,
                           device_span<QSpan> q, device_span<O> out,
                           const attention_params& p, const decode_attention_plan& plan,
                           device_span<std::byte> workspace, const cuda_exec& exec) {
  const cudaStream_t stream = exec.stream;
  using Q = std::remove_const_t<QSpan>;
  static_assert(compute_element<Q> && compute_element<O>,
                "kvscout::decode_attention_cuda: q and out must be float, half or bfloat16 "
                "(out not const)");
  constexpr int D = Rows::head_dim;
  static_assert(detail::decode_device_head_dim_ok<D>,
                "kvscout::decode_attention_cuda: head_dim must be a multiple of 32 in [32, 256]");
  const int S = rows.num_seqs();
  const int H = rows.num_kv_heads();
  detail::check_decode_cuda(S, H, D, p, q.size(), q.data(), out.size(), out.data(),
                            cur.present(), cur.k.size(), cur.v.size(),
                            cur.v.data() == nullptr);
  constexpr int E = detail::decode_lane_elems<typename Rows::element_type, D>;
  if (cur.present())
    detail::check_current_token_alignment(cur.k.data(), cur.v.data(),
                                          detail::row_part_alignment<T, E>);
  detail::check_decode_plan(plan, S, H, p.num_q_heads, D, workspace.size(), workspace.data());
  if (S == 0) return;
  const int g = p.num_q_heads / H;
  std::byte* ws = workspace.data();
  detail::decode_device_params<Rows, T, Q, O> prm{
      rows,
      cur.present() ? cur.k.data() : nullptr,
      cur.present() ? cur.v.data() : nullptr,
      q.data(),
      out.data(),
      p.num_q_heads,
      g,
      p.scale * p.k_scale,
      p.v_scale,
      exec.status,
      plan.splits,
      plan.rows_per_split,
      plan.splits > 1 ? reinterpret_cast<float2*>(ws) : nullptr,
      plan.splits > 1 ? reinterpret_cast<float*>(ws + plan.ml_bytes()) : nullptr};
  switch (plan.heads_per_block) {
    case 1: detail::launch_decode_attention<Rows, T, Q, O, 1>(prm, plan, stream); break;
    case 4: detail::launch_decode_attention<Rows, T, Q, O, 4>(prm, plan, stream); break;
    default: detail::launch_decode_attention<Rows, T, Q, O, 8>(prm, plan, stream); break;
  }
  KVSCOUT_CUDA_CHECK(cudaGetLastError());
  if (plan.splits > 1) {
    const detail::decode_merge_params<O> mp{prm.part_ml, prm.part_acc, out.data(), plan.splits, D,
                                            p.v_scale};
    detail::launch(detail::decode_attention_merge_kernel<O>,
                   dim3(static_cast<unsigned>(S * p.num_q_heads)), D, 0, stream, mp);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
  }
}

/// Without a plan: no workspace; fills the GPU only when num_seqs * num_kv_heads is a few times its
/// SM count.
template <attention_rows_cuda Rows, kv_element T, class QSpan = const float, class O = float>
void decode_attention_cuda(const Rows& rows, const current_token<T, device_space>& cur,
                           device_span<QSpan> q, device_span<O> out,
                           const attention_params& p, const cuda_exec& exec) {
  decode_attention_plan plan;
  plan.num_seqs = rows.num_seqs();
  plan.num_kv_heads = rows.num_kv_heads();
  plan.num_q_heads = p.num_q_heads;
  plan.head_dim = Rows::head_dim;
  if (plan.num_kv_heads >= 1 && p.num_q_heads >= 1) {
    const int g = p.num_q_heads / plan.num_kv_heads;
    plan.heads_per_block = g <= 1 ? 1 : (g <= 4 ? 4 : 8);
    plan.head_blocks = (g + plan.heads_per_block - 1) / plan.heads_per_block;
  }
  decode_attention_cuda(rows, cur, q, out, p, plan, {}, exec);
}

}  // namespace kvscout
