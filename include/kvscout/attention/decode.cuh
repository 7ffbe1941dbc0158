#pragma once
// Sparse (and dense) decode attention on the device: one new query per (sequence, query head)
// against the rows of a device row source plus, optionally, the current token's K / V; GQA
// without expanding KV; online softmax in fp32. The device twin of decode_attention_host
// (attention/decode.hpp), matched to float tolerance by tests/cuda/test_attention_device.cu.
//
//   // after a zero-copy fetch into `dst` (gather_destination<device_space>) for `sel`:
//   kvscout::gathered_rows_device<kvscout::half, 128> rows(sel, k_rows, v_rows);
//   kvscout::decode_attention_device(rows, kvscout::device_current_token<kvscout::half>{k, v},
//                                    q, out, {.num_q_heads = 32, .scale = 0.088f}, stream);
//
// Row sources (attention/detail/device_rows.cuh):
//   gathered_rows_device<T, D>      the fetched T rows (sparse attention)
//   kivi_gathered_rows_device<L>    the fetched KIVI records dequantised as read, then the
//                                   resident residual window (mirrors kivi_gathered_rows)
//   layout_rows_device<L>           every token of a device-resident cache (dense anchor)
// Element types float / half / bfloat16; head_dim a multiple of 32 up to 256 (64 / 128 / 256),
// static from the row source. q and out are [num_seqs, num_q_heads, head_dim], float by default
// or any of the element types (an fp16 / bf16 engine passes its own query and output buffers).
//
// Launch: one block of 4 warps per (sequence, kv head, group of up to 8 query heads), split-K
// over the warps, combined in shared memory (detail/decode_kernel.cuh). Nothing is allocated and
// nothing synchronises the host; the call only enqueues on `stream`. Host-known shapes and
// parameters are validated (kvscout::error naming the value); device data is checked in the
// kernel (counts clamped, bad KIVI indices skipped, rows outside a dense cache's buffers
// skipped), reported through the optional device status word (backend/cuda/device_status.hpp).
// Unlike the host version there is no per-row probability output.

#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#include "kvscout/core/detail/launch.cuh"
#include "kvscout/attention/decode.hpp"
#include "kvscout/attention/detail/decode_device_checks.hpp"
#include "kvscout/attention/detail/decode_kernel.cuh"
#include "kvscout/attention/detail/device_rows.cuh"
#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

/// A row source decode_attention_device reads: copied by value into the kernel, shapes on the
/// host, and the three device calls the kernel makes, with E = head_dim / 32 elements per lane
/// (contract in attention/detail/device_rows.cuh: rows() returns a count the source trusts or
/// has clamped, load_k() returns false for a row to skip, load_v() only after load_k() returned
/// true). An engine's own row source (its quantised or paged format read in place) models this
/// to reuse the kernel. (head_dim is checked first, so the per-lane array type below is only
/// formed for types that have one.)
template <class R>
concept device_attention_rows =
    std::copyable<R> &&
    requires {
      typename R::element_type;
      { R::head_dim } -> std::convertible_to<int>;
    } &&
    requires(const R& r, int s, int h, int i, int c0, int* status,
             float (&part)[R::head_dim / 32]) {
      { r.num_seqs() } -> std::same_as<int>;
      { r.num_kv_heads() } -> std::same_as<int>;
      { r.rows(s, h, status) } -> std::same_as<int>;
      { r.template load_k<R::head_dim / 32>(s, h, i, c0, part, status) } -> std::same_as<bool>;
      r.template load_v<R::head_dim / 32>(s, h, i, c0, part);
    };

/// q and out: float by default (braced {ptr, size} arguments mean float), or any element type,
/// deduced from the spans (device_span<const half> or device_span<half> for q, device_span<half>
/// for out, ...). The query is widened to float as it is read and the output rounded once as it
/// is written.
template <device_attention_rows Rows, kv_element T, class QSpan = const float, class O = float>
void decode_attention_device(const Rows& rows, const device_current_token<T>& cur,
                             device_span<QSpan> q, device_span<O> out,
                             const attention_params& p, cudaStream_t stream,
                             int* device_status = nullptr) {
  using Q = std::remove_const_t<QSpan>;
  static_assert(compute_element<Q> && compute_element<O>,
                "kvscout::decode_attention_device: q and out must be float, half or bfloat16 "
                "(out not const)");
  constexpr int D = Rows::head_dim;
  static_assert(detail::decode_device_head_dim_ok<D>,
                "kvscout::decode_attention_device: head_dim must be a multiple of 32 in [32, 256]");
  const int S = rows.num_seqs();
  const int H = rows.num_kv_heads();
  detail::check_decode_device(S, H, D, p, q.size(), q.data(), out.size(), out.data(),
                              cur.present(), cur.k.size(), cur.v.size(),
                              cur.v.data() == nullptr);
  if (cur.present())
    detail::check_current_token_alignment(cur.k.data(), cur.v.data(),
                                          detail::row_part_alignment<T, D / 32>);
  if (S == 0) return;
  const int g = p.num_q_heads / H;
  constexpr int G = detail::decode_device_max_group;
  constexpr int W = detail::decode_device_warps;
  detail::decode_device_params<Rows, T, Q, O> prm{rows,
                                            cur.present() ? cur.k.data() : nullptr,
                                            cur.present() ? cur.v.data() : nullptr,
                                            q.data(),
                                            out.data(),
                                            p.num_q_heads,
                                            g,
                                            p.scale * p.k_scale,
                                            p.v_scale,
                                            device_status};
  const dim3 grid(static_cast<unsigned>(S * H), static_cast<unsigned>((g + G - 1) / G));
  detail::launch(detail::decode_attention_kernel<Rows, T, Q, O, W>, grid, W * 32, 0, stream, prm);
  KVSCOUT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvscout
