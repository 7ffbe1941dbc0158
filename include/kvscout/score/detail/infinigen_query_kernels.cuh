#pragma once
// The device speculation's partial query (score/infinigen.cuh): partial_query_gemv, the rows of
// W_Q a plan keeps times each sequence's layer input, and partial_query_finish, rotated at the
// position and skewed (launch shapes: score/detail/infinigen_kernels.cuh).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kvscout/score/detail/infinigen_kernels.cuh"

namespace kvscout::detail {

KVSCOUT_DEVICE float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class PkT, class WT>
__global__ void __launch_bounds__(spec_gemv_threads)
    partial_query_gemv(const __grid_constant__ infinigen_params<PkT> p) {
  constexpr int seq_chunk = 8;
  constexpr int V = 16 / static_cast<int>(sizeof(WT));  // weights per 16-byte load
  static_assert(V % 4 == 0, "x is read as float4s beside each weight vector");
  constexpr int U = 4;  // 16-byte loads in flight per lane
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int row =
      static_cast<int>(blockIdx.x) * spec_gemv_warps + static_cast<int>(threadIdx.x) / 32;
  const int total_rows = p.num_q_heads * p.rows;
  if (row >= total_rows) return;  // whole warps leave; no block-wide synchronisation follows
  const WT* w = static_cast<const WT*>(p.weights) + static_cast<std::size_t>(row) * p.d_model;
  const bool vec = p.d_model % V == 0 && reinterpret_cast<std::uintptr_t>(p.weights) % 16 == 0;
  const int nvec = vec ? p.d_model / V : 0;
  // x as float4 loads where it allows: element loads would touch V times the cache lines per warp
  // instruction.
  const bool x_vec = reinterpret_cast<std::uintptr_t>(p.x) % 16 == 0 && p.d_model % 4 == 0;
  for (int s0 = 0; s0 < p.num_seqs; s0 += seq_chunk) {
    const int ns = p.num_seqs - s0 < seq_chunk ? p.num_seqs - s0 : seq_chunk;
    const float* x = p.x + static_cast<std::size_t>(s0) * p.d_model;
    float acc[seq_chunk];
#pragma unroll
    for (int j = 0; j < seq_chunk; ++j) acc[j] = 0.f;
    for (int b = lane; b < nvec; b += 32 * U) {
      uint4 raw[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (b + 32 * u < nvec) raw[u] = reinterpret_cast<const uint4*>(w)[b + 32 * u];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int bi = b + 32 * u;
        if (bi < nvec) {
          const WT* wv = reinterpret_cast<const WT*>(&raw[u]);
          float wf[V];
#pragma unroll
          for (int e = 0; e < V; ++e) wf[e] = to_float(wv[e]);
#pragma unroll
          for (int j = 0; j < seq_chunk; ++j) {
            if (j < ns) {
              const float* xp =
                  x + j * static_cast<std::size_t>(p.d_model) + static_cast<std::size_t>(bi) * V;
              float xv[V];
              if (x_vec) {
#pragma unroll
                for (int q4 = 0; q4 < V / 4; ++q4) {
                  const float4 f = reinterpret_cast<const float4*>(xp)[q4];
                  xv[4 * q4] = f.x;
                  xv[4 * q4 + 1] = f.y;
                  xv[4 * q4 + 2] = f.z;
                  xv[4 * q4 + 3] = f.w;
                }
              } else {
#pragma unroll
                for (int e = 0; e < V; ++e) xv[e] = xp[e];
              }
#pragma unroll
              for (int e = 0; e < V; ++e) acc[j] = fmaf(wf[e], xv[e], acc[j]);
            }
          }
        }
      }
    }
    for (int d = nvec * V + lane; d < p.d_model; d += 32) {
      const float wf = to_float(w[d]);
#pragma unroll
      for (int j = 0; j < seq_chunk; ++j)
        if (j < ns) acc[j] = fmaf(wf, x[j * static_cast<std::size_t>(p.d_model) + d], acc[j]);
    }
#pragma unroll
    for (int j = 0; j < seq_chunk; ++j) acc[j] = warp_sum(acc[j]);
    if (lane == 0) {
      for (int j = 0; j < ns; ++j)
        p.y[static_cast<std::size_t>(s0 + j) * total_rows + row] = acc[j] + p.bias[row];
    }
  }
}

/// A block turns one query head's GEMV rows y into spec_finish_outputs partial-query elements.
template <class PkT>
__global__ void __launch_bounds__(spec_finish_threads)
    partial_query_finish(const __grid_constant__ infinigen_params<PkT> p) {
  constexpr int L = spec_finish_lanes;
  __shared__ float cs[rope_table::max_planes];
  __shared__ float sn[rope_table::max_planes];
  __shared__ float yr[2 * rope_table::max_planes];  // the head's RoPE'd rows (post_rope_skew)
  const int s = static_cast<int>(blockIdx.x);
  const int qh = static_cast<int>(blockIdx.y);
  const int h = qh / p.group;
  const int planes = p.head_dim / 2;
  const float* y = p.y + (static_cast<std::size_t>(s) * p.num_q_heads + qh) * p.rows;
  if (p.mode != rope_mode::pre_rope_folded) {
    const int pos = p.positions[s];
    for (int j = static_cast<int>(threadIdx.x); j < planes; j += blockDim.x)
      detail::rope_cos_sin(p.rope, j, pos, cs[j], sn[j]);
  }
  __syncthreads();
  if (p.mode == rope_mode::post_rope_skew) {
    for (int j = static_cast<int>(threadIdx.x); j < planes; j += blockDim.x) {
      const detail::rope_plane pl = detail::rope_plane_channels(p.rope, j);
      float qa = y[pl.a];
      float qb = y[pl.b];
      detail::rope_rotate(qa, qb, cs[j], sn[j]);
      yr[pl.a] = qa;
      yr[pl.b] = qb;
    }
  }
  __syncthreads();
  const int r = p.r;
  const int i =
      static_cast<int>(blockIdx.z) * spec_finish_outputs + static_cast<int>(threadIdx.x) / L;
  const int part = static_cast<int>(threadIdx.x) % L;
  float v = 0.f;
  if (p.mode == rope_mode::post_rope_skew) {
    if (i < r) {
      const float* rot = p.rotation + static_cast<std::size_t>(h) * p.head_dim * p.key_r + i;
      for (int c = part; c < p.head_dim; c += L)
        v = fmaf(yr[c], rot[static_cast<std::size_t>(c) * p.key_r], v);
    }
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  } else if (i < r && part == 0) {
    if (p.mode == rope_mode::rope_planes) {
      const int pair = i / 2;
      const int j = p.planes[static_cast<std::size_t>(h) * (r / 2) + pair];
      float qa = y[2 * pair];
      float qb = y[2 * pair + 1];
      detail::rope_rotate(qa, qb, cs[j], sn[j]);
      v = (i & 1) ? qb : qa;
    } else {
      v = y[i];
    }
  }
  if (i < r && part == 0)
    p.q[(static_cast<std::size_t>(s) * p.num_q_heads + qh) * r + i] = v * p.scale;
}

}  // namespace kvscout::detail
