#pragma once
// The device decode attention kernels (facade: attention/decode.cuh). Flash-decoding:
//
// decode_attention_kernel: grid (num_seqs * num_kv_heads, splits, ceil(g / G)), Warps warps a
// block. A block owns one (sequence, kv head), the G query heads of its group that grid.z names
// (each K / V row read once for all of them) and one split of the pair's rows, the last split
// everything after its start. A row is read by LPR = head_dim / E lanes, so a warp reads
// RPW = 32 / LPR rows at once, U groups in flight (one for G = 8, whose accumulators leave no
// registers for a second). Every (warp, row slot) keeps its own online-softmax state per query
// head; a row's logit is the sum over its LPR lanes (butterfly shuffles: every lane of the row
// ends with the same bits). The row slots are merged by shuffles, the warps in shared memory.
// With more than one split the block writes (m, l, acc) to the workspace and
// decode_attention_merge_kernel merges the splits. Empty row sets give 0; NaN logits give NaN.

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvscout/attention/detail/decode_device_checks.hpp"
#include "kvscout/attention/rows.cuh"
#include "kvscout/core/detail/online_softmax.hpp"
#include "kvscout/core/dtype.hpp"

namespace kvscout::detail {

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
  int splits;          // blocks per (sequence, kv head, block of query heads)
  int rows_per_split;  // rows of every split but the last
  float2* part_ml;     // [num_seqs, num_q_heads, splits] (m, l); used when splits > 1
  float* part_acc;     // [num_seqs, num_q_heads, splits, head_dim]
};

// Row i of the pair's rows (the source's first n, then the current token): this lane's E channels
// of K and V. False where the source skips the row.
template <int E, class Rows, kv_element T, kv_element Q, kv_element O>
__device__ __forceinline__ bool decode_load_row(const decode_device_params<Rows, T, Q, O>& p, int s,
                                                int h, int n, int i, int c0, bool row_leader,
                                                float (&k)[E], float (&v)[E]) {
  if (i < n) {
    if (!p.rows.template load_k<E>(s, h, i, c0, k, row_leader ? p.status : nullptr)) return false;
    p.rows.template load_v<E>(s, h, i, c0, v);
    return true;
  }
  const std::size_t off =
      (static_cast<std::size_t>(s) * p.rows.num_kv_heads() + h) * Rows::head_dim + c0;
  load_row_part<T, E>(p.cur_k + off, k);
  load_row_part<T, E>(p.cur_v + off, v);
  return true;
}

// Pushes one row (this lane's E channels of K and V) into the online softmax of each of the gj
// query heads: the logit is the sum over the row's LPR lanes (butterfly shuffles, so every lane of
// the row holds the same bits). Every lane reaches every shuffle; a row not ok is not pushed.
template <int LPR, int G, int E>
__device__ __forceinline__ void decode_push_row(const float (&qr)[G][E], const float (&k)[E],
                                                const float (&v)[E], bool ok, int gj, float scale,
                                                float (&m)[G], float (&l)[G], float (&acc)[G][E]) {
#pragma unroll
  for (int j = 0; j < G; ++j) {
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) dot = fmaf(qr[j][e], k[e], dot);
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (ok && j < gj) {
      const softmax_factors<float> f = softmax_push(m[j], l[j], dot * scale);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[j][e] = fmaf(acc[j][e], f.f, f.w * v[e]);
    }
  }
}

// Merges a warp's row slots (lanes LPR apart) by shuffles, then writes the warp's state for the
// gj query heads of its group to shared memory.
template <int LPR, int G, int E, int Warps, int D>
__device__ __forceinline__ void decode_warp_to_shared(float (&m)[G], float (&l)[G],
                                                      float (&acc)[G][E], int gj, int warp,
                                                      int lane, int c0, float (&m_s)[Warps][G],
                                                      float (&l_s)[Warps][G],
                                                      float (&acc_s)[Warps][G][D]) {
#pragma unroll
  for (int o = LPR; o < 32; o <<= 1) {
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const float mb = __shfl_xor_sync(0xffffffffu, m[j], o);
      const float lb = __shfl_xor_sync(0xffffffffu, l[j], o);
      float ab[E];
#pragma unroll
      for (int e = 0; e < E; ++e) ab[e] = __shfl_xor_sync(0xffffffffu, acc[j][e], o);
      const softmax_factors<float> f = softmax_merge(m[j], l[j], mb, lb);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[j][e] = acc[j][e] * f.f + ab[e] * f.w;
    }
  }
  if (lane / LPR != 0) return;
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
}

// Merges the warps' states in shared memory: the output where the pair has one split, the split's
// (m, l, acc) in the workspace otherwise.
template <int G, int Warps, int D, class Rows, kv_element T, kv_element Q, kv_element O>
__device__ __forceinline__ void decode_merge_warps(const decode_device_params<Rows, T, Q, O>& p,
                                                   const float (&m_s)[Warps][G],
                                                   const float (&l_s)[Warps][G],
                                                   const float (&acc_s)[Warps][G][D], int gj,
                                                   std::size_t qh0, int split) {
  for (int x = threadIdx.x; x < gj * D; x += blockDim.x) {
    const int j = x / D, c = x - (x / D) * D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < Warps; ++w)
      if (l_s[w][j] != 0.f) M = fmaxf(M, m_s[w][j]);
    float L = 0.f, a = 0.f;
#pragma unroll
    for (int w = 0; w < Warps; ++w) {
      if (l_s[w][j] != 0.f) {  // an empty warp's accumulator is 0: skipping it changes nothing
        const float f = softmax_weight(m_s[w][j], l_s[w][j], M);
        L += l_s[w][j] * f;
        a += acc_s[w][j][c] * f;
      }
    }
    if (p.splits == 1) {
      p.out[(qh0 + j) * D + c] = from_float<O>(L == 0.f ? 0.f : a / L * p.v_scale);
    } else {
      const std::size_t at = (qh0 + j) * static_cast<std::size_t>(p.splits) + split;
      p.part_acc[at * D + c] = a;
      if (c == 0) p.part_ml[at] = make_float2(M, L);
    }
  }
}

template <class Rows, kv_element T, kv_element Q, kv_element O, int G, int Warps>
__global__ void __launch_bounds__(Warps * 32)
    decode_attention_kernel(const __grid_constant__ decode_device_params<Rows, T, Q, O> p) {
  constexpr int D = Rows::head_dim;
  constexpr int E = decode_lane_elems<typename Rows::element_type, D>;
  constexpr int LPR = D / E;     // lanes per row
  constexpr int RPW = 32 / LPR;  // rows a warp reads at once
  constexpr int U = G >= 8 ? 1 : 2;  // row groups in flight per warp (registers allowing)
  constexpr int step = Warps * RPW;
  static_assert(decode_device_head_dim_ok<D>, "kvscout: device decode attention needs head_dim a "
                                              "multiple of 32 in [32, 256]");
  __shared__ float m_s[Warps][G];
  __shared__ float l_s[Warps][G];
  __shared__ float acc_s[Warps][G][D];

  const int H = p.rows.num_kv_heads();
  const int pair = static_cast<int>(blockIdx.x);
  const int s = pair / H, h = pair - (pair / H) * H;
  const int split = static_cast<int>(blockIdx.y);
  const int j0 = static_cast<int>(blockIdx.z) * G;
  const int gj = p.group - j0 < G ? p.group - j0 : G;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int sub = lane / LPR;          // the warp's row slot this lane reads
  const int c0 = (lane % LPR) * E;     // its channels
  const bool row_leader = lane % LPR == 0;
  const std::size_t qh0 = static_cast<std::size_t>(s) * p.num_q_heads +
                          static_cast<std::size_t>(h) * p.group + j0;  // first query head row

  float qr[G][E];
#pragma unroll
  for (int j = 0; j < G; ++j)
#pragma unroll
    for (int e = 0; e < E; ++e) qr[j][e] = j < gj ? to_float(p.q[(qh0 + j) * D + c0 + e]) : 0.f;

  const int n = p.rows.rows(s, h, split == 0 && threadIdx.x == 0 ? p.status : nullptr);
  const bool has_cur = p.cur_k != nullptr;
  const int total = n + (has_cur ? 1 : 0);
  const int r0 = split * p.rows_per_split;
  const int r1 = split == p.splits - 1 ? total
                                       : (total < r0 + p.rows_per_split ? total
                                                                        : r0 + p.rows_per_split);

  float m[G], l[G], acc[G][E];
#pragma unroll
  for (int j = 0; j < G; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[j][e] = 0.f;
  }

  // `base` is warp-uniform, so every lane reaches every shuffle; rows past r1 or skipped by the
  // source are not pushed.
  for (int base = r0 + warp * RPW; base < r1; base += step * U) {
    float k[U][E], v[U][E];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + u * step + sub;
      ok[u] = i < r1 && decode_load_row(p, s, h, n, i, c0, row_leader, k[u], v[u]);
      if (!ok[u]) {
#pragma unroll
        for (int e = 0; e < E; ++e) k[u][e] = v[u][e] = 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) decode_push_row<LPR>(qr, k[u], v[u], ok[u], gj, p.scale, m, l, acc);
  }

  decode_warp_to_shared<LPR>(m, l, acc, gj, warp, lane, c0, m_s, l_s, acc_s);
  __syncthreads();

  decode_merge_warps(p, m_s, l_s, acc_s, gj, qh0, split);
}

template <kv_element O>
struct decode_merge_params {
  const float2* part_ml;  // [rows, splits]
  const float* part_acc;  // [rows, splits, head_dim]
  O* out;                 // [rows, head_dim]
  int splits;
  int head_dim;
  float v_scale;
};

template <kv_element O>
__global__ void __launch_bounds__(256)
    decode_attention_merge_kernel(const __grid_constant__ decode_merge_params<O> p) {
  const std::size_t row = blockIdx.x;
  const float2* ml = p.part_ml + row * p.splits;
  float M = -INFINITY;
  for (int b = 0; b < p.splits; ++b)
    if (ml[b].y != 0.f) M = fmaxf(M, ml[b].x);
  for (int c = threadIdx.x; c < p.head_dim; c += blockDim.x) {
    const float* acc = p.part_acc + row * p.splits * p.head_dim + c;
    float L = 0.f, a = 0.f;
#pragma unroll 4
    for (int b = 0; b < p.splits; ++b) {
      const float2 st = ml[b];
      if (st.y != 0.f) {  // an empty split's accumulator is not read
        const float f = softmax_weight(st.x, st.y, M);
        L += st.y * f;
        a += acc[static_cast<std::size_t>(b) * p.head_dim] * f;
      }
    }
    p.out[row * p.head_dim + c] = from_float<O>(L == 0.f ? 0.f : a / L * p.v_scale);
  }
}

}  // namespace kvscout::detail
