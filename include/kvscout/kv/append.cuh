#pragma once
// Appending the new token's K / V on the device, into buffers that may be mapped host memory
// (device aliases) or device memory.
//
//   kvscout::append_token_cuda(layout, k_cache, v_cache, k_new, v_new, d_positions,
//                              {stream, d_status});
//   kvscout::kivi_append_cuda(layout, device_buffers, d_seq_lens, k_new, v_new,
//                             {stream, d_status});
//
// k_new / v_new: [num_seqs, num_kv_heads, head_dim] device arrays of float or of the cache's
// element type T (float input is rounded to T first). fp8 caches pass the scales (kv_scales,
// before exec): float input is divided by them before rounding; input already in T is stored as
// given.
//
// KIVI codes, scales and zeros are bit-identical to kivi_append_host's: the same
// KVSCOUT_HOST_DEVICE functions in the same order, IEEE-rounded float operations (nvcc's default
// -prec-div=true) and round-to-nearest-even conversions. --use_fast_math would break this.
//
// Device checks: the position t must be a slot sequence s owns (checked before any page table
// entry is read), otherwise the sequence is skipped (bad_index); then a row outside the buffers
// (bad page id) is skipped (out_of_bounds), as is a row not 16-byte aligned (misaligned). A
// block table's new page id must be stored before the append (stale ids past the sequence's
// pages cannot be detected). KIVI: a full sequence or input that kivi_append_host rejects skips
// the whole sequence (bad_index / bad_value; length unchanged). Bits go to exec.status;
// host-known shapes and buffer sizes throw kvscout::error first. Enqueues on exec.stream only.
//
// Concurrency: an append must not race an in-flight fetch of the same rows; order them on streams
// (a quantised group's records become visible to fetches only when seq_lens grows, last).

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvscout/core/detail/launch.cuh"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/device_status.hpp"
#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/detail/append_checks.hpp"
#include "kvscout/kv/detail/append_room.hpp"
#include "kvscout/kv/detail/kivi_pack.hpp"
#include "kvscout/kv/kivi.hpp"
#include "kvscout/kv/page_table.hpp"
#include "kvscout/kv/paged.hpp"

namespace kvscout {
namespace detail {

inline constexpr int append_threads = 256;

template <class L, class In>
struct append_params {
  L layout;
  append_room<L> room;
  std::byte* k;
  std::byte* v;
  std::size_t k_bytes;
  std::size_t v_bytes;
  const In* k_new;  // [num_seqs, num_kv_heads, head_dim]
  const In* v_new;
  const std::int32_t* positions;  // [num_seqs] or null: seq_len(s)
  int* status;
  kv_scales scales;  // float input is divided by them
};

template <class L, class In>
__global__ void __launch_bounds__(append_threads)
    append_token_kernel(const __grid_constant__ append_params<L, In> p) {
  using T = typename L::element_type;
  constexpr int D = L::head_dim;
  constexpr int VW = detail::vec_width<T>;  // elements per 16-byte vector
  constexpr int nvec = D / VW;
  const L& l = p.layout;
  const int s = static_cast<int>(blockIdx.x);
  const int H = l.num_kv_heads();
  const int t = p.positions != nullptr ? p.positions[s] : l.seq_len(s);
  if (t < 0 || !p.room.owns(l, s, t)) {
    if (threadIdx.x == 0) raise_device_status(p.status, device_status::bad_index);
    return;
  }
  constexpr std::size_t row = sizeof(T) * D;
  for (int x = threadIdx.x; x < H * nvec; x += blockDim.x) {
    const int h = x / nvec, j = x - (x / nvec) * nvec;
    const std::size_t ko = l.k_offset(s, t, h), vo = l.v_offset(s, t, h);
    if (ko > p.k_bytes || row > p.k_bytes - ko || vo > p.v_bytes || row > p.v_bytes - vo) {
      if (j == 0) raise_device_status(p.status, device_status::out_of_bounds);
      continue;
    }
    if ((ko | vo) % 16 != 0) {
      if (j == 0) raise_device_status(p.status, device_status::misaligned);
      continue;
    }
    const std::size_t in = (static_cast<std::size_t>(s) * H + h) * D + static_cast<std::size_t>(j) * VW;
    alignas(16) T kt[VW];
    alignas(16) T vt[VW];
#pragma unroll
    for (int e = 0; e < VW; ++e) {
      if constexpr (std::is_same_v<In, T> && !std::is_same_v<In, float>) {
        kt[e] = p.k_new[in + e];
        vt[e] = p.v_new[in + e];
      } else {
        kt[e] = from_float<T>(to_float(p.k_new[in + e]) / p.scales.k);
        vt[e] = from_float<T>(to_float(p.v_new[in + e]) / p.scales.v);
      }
    }
    *reinterpret_cast<uint4*>(p.k + ko + j * 16) = *reinterpret_cast<const uint4*>(kt);
    *reinterpret_cast<uint4*>(p.v + vo + j * 16) = *reinterpret_cast<const uint4*>(vt);
  }
}

template <class L, class In>
struct kivi_append_params {
  L layout;
  std::byte* k_codes;
  std::byte* v_records;
  std::byte* k_params;
  std::byte* k_residual;
  std::byte* v_residual;
  std::int32_t* seq_lens;  // == layout.seq_lens(), device-readable and writable
  const In* k_new;         // [num_seqs, num_kv_heads, head_dim]
  const In* v_new;
  int* status;
};

template <class L>
inline constexpr std::size_t kivi_max_v_record_bytes =
    (L::v_code_bytes + 2 * static_cast<std::size_t>(L::head_dim) * sizeof(typename L::scale_type) +
     15) / 16 * 16;  // G = 1: one scale and zero per channel

// The value of token t of head h from its ring slot into its record (padding zero); `keep`: the
// slot then holds the dequantised row. One thread.
template <class L>
__device__ void kivi_append_value(const L& l, std::byte* v_records, std::byte* v_residual, int s,
                                  int t, int h, bool keep) {
  using T = typename L::element_type;
  using S = typename L::scale_type;
  constexpr int D = L::head_dim;
  constexpr int VBits = L::value_bits;
  constexpr std::size_t max_rec = kivi_max_v_record_bytes<L>;
  const int G = l.group();
  alignas(16) std::uint8_t rec[max_rec];
  for (std::size_t b = 0; b < max_rec; ++b) rec[b] = 0;
  T* xrow = reinterpret_cast<T*>(v_residual + l.residual_offset(s, t, h));
  S* scales = reinterpret_cast<S*>(rec + l.v_scales_offset());
  S* zeros = reinterpret_cast<S*>(rec + l.v_zeros_offset());
  kivi_quantize_value_row<VBits, S, T>(xrow, D, G, rec, scales, zeros);
  uint4* dst = reinterpret_cast<uint4*>(v_records + l.v_offset(s, t, h));
  for (int u = 0; u < static_cast<int>(l.v_row_bytes()) / 16; ++u)
    dst[u] = reinterpret_cast<const uint4*>(rec)[u];
  if (keep)
    for (int c = 0; c < D; ++c)
      xrow[c] = from_float<T>(kivi_dequantize(kivi_code<VBits>(rec, c), kivi_to_float(scales[c / G]),
                                              kivi_to_float(zeros[c / G])));
}

// The key block, when full: per (head, group, code byte), a thread computes its `per`
// channels' parameters, that byte of each record and those channels dequantised back into the
// ring: it touches only its own channels.
template <class L, class In>
__device__ void kivi_append_key_block(const kivi_append_params<L, In>& p, int s, int len,
                                      int next) {
  using T = typename L::element_type;
  using S = typename L::scale_type;
  constexpr int D = L::head_dim;
  constexpr int KBits = L::key_bits;
  constexpr int per = kivi_codes_per_byte<KBits>;
  constexpr int code_bytes = static_cast<int>(L::k_code_bytes);
  const L& l = p.layout;
  const int H = l.num_kv_heads();
  const int k0 = l.key_quantized_len_for(len), k1 = l.key_quantized_len_for(next);
  if (k1 <= k0) return;
  const int G = l.group();
  const int groups = (k1 - k0) / G;
  const int window = l.quantized_len_for(next);
  for (int x = threadIdx.x; x < H * groups * code_bytes; x += blockDim.x) {
    const int b = x % code_bytes, hg = x / code_bytes;
    const int h = hg / groups, q0 = k0 + (hg - h * groups) * G;
    S* scale = reinterpret_cast<S*>(p.k_params + l.k_params_offset(s, q0 / G, h));
    S* zero = scale + D;
    float sc[per], z[per];
#pragma unroll
    for (int k = 0; k < per; ++k) {
      const int c = b * per + k;
      float mn = to_float(reinterpret_cast<const T*>(p.k_residual + l.residual_offset(s, q0, h))[c]);
      float mx = mn;
      for (int i = 1; i < G; ++i) {
        const float v =
            to_float(reinterpret_cast<const T*>(p.k_residual + l.residual_offset(s, q0 + i, h))[c]);
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
      }
      const kivi_affine<S> a = kivi_make_affine<KBits, S>(mn, mx);
      scale[c] = a.scale;
      zero[c] = a.zero;
      sc[k] = kivi_to_float(a.scale);
      z[k] = kivi_to_float(a.zero);
    }
    for (int i = 0; i < G; ++i) {
      T* xrow = reinterpret_cast<T*>(p.k_residual + l.residual_offset(s, q0 + i, h));
      std::uint32_t byte = 0;
      std::uint32_t q[per];
#pragma unroll
      for (int k = 0; k < per; ++k) {
        q[k] = kivi_quantize<KBits>(to_float(xrow[b * per + k]), sc[k], z[k]);
        byte |= q[k] << (k * KBits);
      }
      reinterpret_cast<std::uint8_t*>(p.k_codes + l.k_offset(s, q0 + i, h))[b] =
          static_cast<std::uint8_t>(byte);
      if (q0 + i >= window) {
#pragma unroll
        for (int k = 0; k < per; ++k)
          xrow[b * per + k] = from_float<T>(kivi_dequantize(q[k], sc[k], z[k]));
      }
    }
  }
  const int k_pad = static_cast<int>(l.k_row_bytes()) - code_bytes;
  if (k_pad > 0) {
    const int n = k1 - k0;
    for (int x = threadIdx.x; x < H * n * k_pad; x += blockDim.x) {
      const int hi = x / k_pad, b = code_bytes + (x - hi * k_pad);
      const int h = hi / n, i = hi - (hi / n) * n;
      reinterpret_cast<std::uint8_t*>(p.k_codes + l.k_offset(s, k0 + i, h))[b] = 0;
    }
  }
}

template <class L, class In>
__global__ void __launch_bounds__(append_threads)
    kivi_append_kernel(const __grid_constant__ kivi_append_params<L, In> p) {
  using T = typename L::element_type;
  using S = typename L::scale_type;
  constexpr int D = L::head_dim;
  const L& l = p.layout;
  const int s = static_cast<int>(blockIdx.x);
  const int H = l.num_kv_heads();
  const int len = p.seq_lens[s];  // every thread reads the same value: the exits are uniform
  if (len < 0 || len >= l.capacity()) {
    if (threadIdx.x == 0) raise_device_status(p.status, device_status::bad_index);
    return;
  }
  const std::size_t in0 = static_cast<std::size_t>(s) * H * D;
  bool bad = false;
  for (int x = threadIdx.x; x < H * D; x += blockDim.x) {
    const float kf = to_float(detail::convert<T>(p.k_new[in0 + x]));
    const float vf = to_float(detail::convert<T>(p.v_new[in0 + x]));
    const float lim = kivi_append_limit<S>();
    bad |= !(isfinite(kf) && fabsf(kf) <= lim) || !(isfinite(vf) && fabsf(vf) <= lim);
  }
  if (__syncthreads_or(bad)) {
    if (threadIdx.x == 0) raise_device_status(p.status, device_status::bad_value);
    return;
  }
  const int next = len + 1;
  const int v0 = l.value_quantized_len_for(len), v1 = l.value_quantized_len_for(next);
  // (1) The value leaving the window (token len - R), before the new token takes its slot.
  if (v1 > v0 && v0 < len) {
    for (int h = threadIdx.x; h < H; h += blockDim.x)
      kivi_append_value(l, p.v_records, p.v_residual, s, v0, h, false);
    __syncthreads();
  }
  for (int x = threadIdx.x; x < H * D; x += blockDim.x) {
    const int h = x / D, c = x - (x / D) * D;
    const std::size_t off = l.residual_offset(s, len, h);
    reinterpret_cast<T*>(p.k_residual + off)[c] = detail::convert<T>(p.k_new[in0 + x]);
    reinterpret_cast<T*>(p.v_residual + off)[c] = detail::convert<T>(p.v_new[in0 + x]);
  }
  __syncthreads();
  // (3) R = 0: its value is quantised at once and stays in the window dequantised.
  if (v1 > v0 && v0 == len) {
    for (int h = threadIdx.x; h < H; h += blockDim.x)
      kivi_append_value(l, p.v_records, p.v_residual, s, len, h, true);
    __syncthreads();
  }
  kivi_append_key_block(p, s, len, next);
  __syncthreads();
  if (threadIdx.x == 0) p.seq_lens[s] = next;
}

}  // namespace detail

/// Writes the new token of every sequence at position positions[s] (device array; null:
/// layout.seq_len(s)) into a contiguous or paged layout; the caller updates lengths / page tables
/// afterwards (a new page must be in the table before). A position the sequence does not own skips
/// it (bad_index). In: float or the layout's element type (the spans must agree). scales: fp8
/// caches' K / V scales.
template <kv_layout L, class InSpan>
  requires(!kivi_quantized_layout<L>)
void append_token_cuda(const L& layout, device_span<std::byte> k, device_span<std::byte> v,
                       device_span<InSpan> k_new, device_span<InSpan> v_new,
                       const std::int32_t* positions, kv_scales scales, const cuda_exec& exec) {
  using T = typename L::element_type;
  static_assert(detail::layout_passes_to_kernels<L>());
  using In = std::remove_const_t<InSpan>;
  static_assert(detail::append_input_ok<In, T>,
                "kvscout::append_token_cuda: new K / V must be float or the cache's element type");
  detail::check_append_layout(layout, k.data(), v.data());
  detail::check_append_inputs(layout.num_seqs(), layout.num_kv_heads(), L::head_dim, k_new.size(),
                              k_new.data(), v_new.size(), v_new.data());
  detail::check_kv_scales(scales);
  if (layout.num_seqs() == 0) return;
  detail::append_params<L, In> p{layout,
                                 detail::append_room<L>::make(layout),
                                 k.data(),
                                 v.data(),
                                 k.size(),
                                 v.size(),
                                 k_new.data(),
                                 v_new.data(),
                                 positions,
                                 exec.status,
                                 scales};
  detail::launch(detail::append_token_kernel<L, In>, static_cast<unsigned>(layout.num_seqs()),
                 detail::append_threads, 0, exec.stream, p);
  KVSCOUT_CUDA_CHECK(cudaGetLastError());
}

template <kv_layout L, class InSpan>
  requires(!kivi_quantized_layout<L>)
void append_token_cuda(const L& layout, device_span<std::byte> k, device_span<std::byte> v,
                       device_span<InSpan> k_new, device_span<InSpan> v_new,
                       const std::int32_t* positions, const cuda_exec& exec) {
  append_token_cuda(layout, k, v, k_new, v_new, positions, kv_scales{}, exec);
}

/// Appends one token to every sequence of a KIVI cache on the device. seq_lens: the device array
/// the layout reads, incremented per sequence appended.
template <kivi_quantized_layout L, class InSpan>
void kivi_append_cuda(const L& layout, const kivi_buffers<device_space>& b,
                      std::int32_t* seq_lens, device_span<InSpan> k_new,
                      device_span<InSpan> v_new, const cuda_exec& exec) {
  using T = typename L::element_type;
  using In = std::remove_const_t<InSpan>;
  static_assert(detail::append_input_ok<In, T>,
                "kvscout::kivi_append_cuda: new K / V must be float or the cache's element type");
  detail::check_kivi_append(layout, b, seq_lens);
  detail::check_append_inputs(layout.num_seqs(), layout.num_kv_heads(), L::head_dim, k_new.size(),
                              k_new.data(), v_new.size(), v_new.data());
  if (layout.num_seqs() == 0) return;
  detail::kivi_append_params<L, In> p{layout,       b.k_codes.data(),    b.v_records.data(),
                                      b.k_params.data(), b.k_residual.data(), b.v_residual.data(),
                                      seq_lens,     k_new.data(),        v_new.data(),
                                      exec.status};
  detail::launch(detail::kivi_append_kernel<L, In>, static_cast<unsigned>(layout.num_seqs()),
                 detail::append_threads, 0, exec.stream, p);
  KVSCOUT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvscout
