#pragma once
// The device decode attention kernel (facade: attention/decode.cuh).
//
// Launch shape: grid (num_seqs * num_kv_heads, ceil(g / 8)), g = num_q_heads / num_kv_heads;
// block = Warps (4) warps. A block owns one (sequence, kv head) and up to 8 of its g query heads
// (GQA: each K / V row is read once per block and used by all of them). Split-K inside the block:
// warp w takes rows w, w + Warps, ...; each warp keeps its own online-softmax state (running max
// m, sum l, accumulator acc, fp32) per query head, lane `lane` holding head_dim / 32 channels.
// A row's logit is the warp's butterfly sum (every lane ends with the same bits), so the
// softmax branches are warp-uniform. The warps' states are combined in shared memory:
//   M = max_w m_w,  L = sum_w l_w e^(m_w - M),  out = sum_w acc_w e^(m_w - M) / L.
// The update per row is the host's fp64 form (attention/decode.hpp, Acc = double): x > m: f = e^(m - x), l = l f + 1,
// acc = acc f + v, m = x; else w = e^(x - m), l += w, acc += w v. Empty row sets give 0.

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvscout/attention/detail/decode_device_checks.hpp"
#include "kvscout/attention/detail/device_rows.cuh"
#include "kvscout/core/dtype.hpp"

namespace kvscout::detail {

inline constexpr int decode_device_warps = 4;

template <class Rows, kv_element T, kv_element Q = float, kv_element O = float>
struct decode_device_params {
  Rows rows;
  const T* cur_k;  // [num_seqs, num_kv_heads, head_dim] or null
  const T* cur_v;
  const Q* q;      // [num_seqs, num_q_heads, head_dim]
  O* out;          // [num_seqs, num_q_heads, head_dim]
  int num_q_heads;
  int group;  // g = num_q_heads / num_kv_heads
  float scale;    // the logit scale, k_scale folded in
  float v_scale;  // the output's
  int* status;
};

template <class Rows, kv_element T, kv_element Q, kv_element O, int Warps>
__global__ void __launch_bounds__(Warps * 32)
    decode_attention_kernel(const __grid_constant__ decode_device_params<Rows, T, Q, O> p) {
  constexpr int D = Rows::head_dim;
  constexpr int E = D / 32;
  constexpr int G = decode_device_max_group;
  static_assert(decode_device_head_dim_ok<D>, "kvscout: device decode attention needs head_dim a "
                                              "multiple of 32 in [32, 256]");
  __shared__ float q_s[G][D];
  __shared__ float m_s[Warps][G];
  __shared__ float l_s[Warps][G];
  __shared__ float acc_s[Warps][G][D];

  const int H = p.rows.num_kv_heads();
  const int pair = static_cast<int>(blockIdx.x);
  const int s = pair / H, h = pair - (pair / H) * H;
  const int j0 = static_cast<int>(blockIdx.y) * G;
  const int gj = p.group - j0 < G ? p.group - j0 : G;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::size_t qh0 = static_cast<std::size_t>(s) * p.num_q_heads +
                          static_cast<std::size_t>(h) * p.group + j0;  // first query head row

  for (int x = threadIdx.x; x < gj * D; x += blockDim.x)
    q_s[x / D][x % D] = to_float(p.q[qh0 * D + x]);
  __syncthreads();

  const int n = p.rows.rows(s, h, warp == 0 && lane == 0 ? p.status : nullptr);
  const bool has_cur = p.cur_k != nullptr;
  const int total = n + (has_cur ? 1 : 0);
  const int c0 = lane * E;

  float m[G], l[G], acc[G][E];
#pragma unroll
  for (int j = 0; j < G; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[j][e] = 0.f;
  }

  for (int i = warp; i < total; i += Warps) {
    float k[E], v[E];
    if (i < n) {
      // Warp-uniform: every lane reads the same index and length.
      if (!p.rows.template load_k<E>(s, h, i, c0, k, lane == 0 ? p.status : nullptr)) continue;
      p.rows.template load_v<E>(s, h, i, c0, v);
    } else {
      const std::size_t off = (static_cast<std::size_t>(s) * H + h) * D + c0;
      load_row_part<T, E>(p.cur_k + off, k);
      load_row_part<T, E>(p.cur_v + off, v);
    }
#pragma unroll
    for (int j = 0; j < G; ++j) {
      if (j < gj) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) dot += q_s[j][c0 + e] * k[e];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        const float x = dot * p.scale;
        if (x > m[j]) {
          const float f = expf(m[j] - x);  // 0 on the first row (m = -inf)
          l[j] = l[j] * f + 1.f;
#pragma unroll
          for (int e = 0; e < E; ++e) acc[j][e] = acc[j][e] * f + v[e];
          m[j] = x;
        } else {
          const float w = expf(x - m[j]);
          l[j] += w;
#pragma unroll
          for (int e = 0; e < E; ++e) acc[j][e] += w * v[e];
        }
      }
    }
  }

#pragma unroll
  for (int j = 0; j < G; ++j) {
    if (j < gj) {
      if (lane == 0) {
        m_s[warp][j] = m[j];
        l_s[warp][j] = l[j];
      }
#pragma unroll
      for (int e = 0; e < E; ++e) acc_s[warp][j][c0 + e] = acc[j][e];
    }
  }
  __syncthreads();

  for (int x = threadIdx.x; x < gj * D; x += blockDim.x) {
    const int j = x / D, c = x - (x / D) * D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < Warps; ++w) M = fmaxf(M, m_s[w][j]);
    float o = 0.f;
    if (M != -INFINITY) {
      float L = 0.f, a = 0.f;
#pragma unroll
      for (int w = 0; w < Warps; ++w) {
        if (m_s[w][j] != -INFINITY) {
          const float f = expf(m_s[w][j] - M);
          L += l_s[w][j] * f;
          a += acc_s[w][j][c] * f;
        }
      }
      o = a / L * p.v_scale;
    }
    p.out[(qh0 + j) * D + c] = from_float<O>(o);
  }
}

}  // namespace kvscout::detail
