#pragma once
// Kernels of the device speculation (score/infinigen.cuh). Every per-element formula is a
// KVSCOUT_HOST_DEVICE function the host path calls too.
//
// Launch shapes (T = spec_block_threads = 128; docs/cuda_speculation.md):
//   partial_query_gemv  grid ceil(Hq * rows / 8), block 256: one warp per row of W, 16-byte loads,
//                       4 in flight per lane; sequences in chunks of 8, so W is read once per 8
//   partial_query_finish grid (num_seqs, Hq, ceil(r / 4)), block 64: 16 threads share each output
//                       element's dot over head_dim
//   score_group         grid (chunks, H, S), block T: 1024 tokens per block, 8 consecutive tokens
//                       per thread; the group's partial queries in shared memory
//   softmax_stats,      (sum_prob) as score_group: per block and query head the softmax (max, sum),
//   score_sum_prob      then the row's block stats merged and sum_j exp(z_j - m_j) / l_j written
//   append_keys         grid (count, H), block 128: one thread per element
// The partial query's kernels: infinigen_query_kernels.cuh; the appends':
// infinigen_append_kernels.cuh.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cub/block/block_reduce.cuh>

#include "kvscout/core/device_status.hpp"
#include "kvscout/core/detail/launch.cuh"
#include "kvscout/core/detail/load_row_part.cuh"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/rope.hpp"
#include "kvscout/skew/plan.hpp"
#include "kvscout/score/detail/aggregate.hpp"
#include "kvscout/score/infinigen_device.hpp"

namespace kvscout::detail {

template <class PkT>
struct infinigen_params {
  // [Hq, rows, d_model] of WT, which only partial_query_gemv reads (so the scoring kernels are not
  // instantiated once per weight type).
  const void* weights;
  const float* bias;        // [Hq, rows]
  const float* rotation;    // [H, D, key_r]
  const std::int32_t* channels;  // [H, key_r]
  const std::int32_t* planes;    // [H, r / 2] the speculation's
  float* y;                 // [S, Hq, rows]
  float* q;                 // [S, Hq, r]
  float2* stats;            // [S, H, max_chunks, g]
  detail::device_key_view<PkT> keys;
  const float* x;                 // [S, d_model]
  const std::int32_t* positions;  // [S]
  const std::int32_t* seq_lens;   // [S]
  const std::int32_t* seq_ids;    // [S] each row's sequence in keys, or null (row s: sequence s)
  float* scores;                  // [S, H, stride]
  int num_seqs;
  int num_kv_heads;
  int num_q_heads;
  int group;
  int head_dim;
  int d_model;
  int r;      // the channels this launch scores: the speculation's, or key_r for score_query
  int key_r;  // the cache's channels (keys.r), the rotation's and channels' row length
  int rows;
  int stride;
  int max_len;     // clamp bound: min(max_seq_len, stride, max_tokens)
  int max_chunks;  // stats entries per row
  rope_config rope;
  rope_mode mode;
  gqa_aggregation aggregation;
  float scale;
  int* status;  // the device status word, or null

  /// seq_lens[s] clamped to [0, max_len]: bad lengths never read or write out of bounds; they raise
  /// device_status::bad_length (once per block).
  __device__ __forceinline__ int length(int s) const {
    const int n = seq_lens[s];
    if (n >= 0 && n <= max_len) return n;
    if (threadIdx.x == 0) raise_device_status(status, device_status::bad_length);
    return n < 0 ? 0 : max_len;
  }
  /// keys' sequence for batch row s, or -1 for an id outside [0, keys.num_seqs) (raises
  /// device_status::bad_seq_id, once per block).
  __device__ __forceinline__ int seq(int s) const {
    if (seq_ids == nullptr) return s;
    const int c = seq_ids[s];
    if (c >= 0 && c < keys.num_seqs) return c;
    if (threadIdx.x == 0) raise_device_status(status, device_status::bad_seq_id);
    return -1;
  }
};

template <int Threads, int PerThread>
__device__ __forceinline__ void score_bad_seq(float* row, int t0, int len) {
  for (int k = 0; k < PerThread; ++k) {
    const int t = t0 + k * Threads + static_cast<int>(threadIdx.x);
    if (t >= len) break;
    row[t] = -INFINITY;
  }
}

// A reader gives channel ch of N consecutive tokens t .. t + N - 1 as floats: load<N>(ch, v).

template <class PkT>
struct key_reader {
  static constexpr int B = partial_key_view<PkT>::block_tokens;
  const PkT* pk;  // channel 0 of token t
  template <int N>
  KVSCOUT_DEVICE void load(int ch, float (&v)[N]) const {
    load_row_part<PkT, N>(pk + static_cast<std::size_t>(ch) * B, v);
  }
  KVSCOUT_DEVICE float one(int ch) const { return to_float(pk[static_cast<std::size_t>(ch) * B]); }
};
template <class PkT>
KVSCOUT_DEVICE key_reader<PkT> reader_at(const partial_key_view<PkT>& k, int s, int h, int t) {
  return {k.data.data() + k.offset(s, h, 0, t)};
}

/// Quantised partial keys: a complete group's codes, min + step * code; the newest group's exact
/// staging values; 0 past the tokens appended (as the host cache's dequantized()).
template <int Bits, int Group>
struct quantized_key_reader {
  using view = detail::quantized_key_view<Bits, Group>;
  static constexpr int LB = view::line_bytes;
  const float* mn = nullptr;              // min [R], then step [R]; null if not quantised
  const std::uint8_t* codes = nullptr;    // the tile's codes [R, LB]
  const float* stage = nullptr;           // staging tile + i; null if neither
  int r = 0;
  int i = 0;                              // t's index in its group
  template <int N>
  KVSCOUT_DEVICE void load(int ch, float (&v)[N]) const {
    if (mn != nullptr) {
      const float lo = mn[ch], st = mn[r + ch];
      const std::uint8_t* line = codes + static_cast<std::size_t>(ch) * LB;
      if constexpr (N == 8 && LB % 8 == 0) {
        // i is a multiple of 8: tokens i .. i + 7 are bytes i % LB .. + 7 of plane i / LB.
        const uint2 w = *reinterpret_cast<const uint2*>(line + i % LB);
        const int shift = Bits * (i / LB);
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const unsigned byte = ((u < 4 ? w.x : w.y) >> (8 * (u % 4))) & 0xffu;
          v[u] = lo + st * static_cast<float>((byte >> shift) & view::levels);
        }
      } else {
#pragma unroll
        for (int u = 0; u < N; ++u) {
          const int ii = i + u;
          const unsigned code = (static_cast<unsigned>(line[ii % LB]) >> (Bits * (ii / LB))) & view::levels;
          v[u] = lo + st * static_cast<float>(code);
        }
      }
    } else if (stage != nullptr) {
#pragma unroll
      for (int u = 0; u < N; ++u) v[u] = stage[static_cast<std::size_t>(ch) * Group + u];
    } else {
#pragma unroll
      for (int u = 0; u < N; ++u) v[u] = 0.f;
    }
  }
  KVSCOUT_DEVICE float one(int ch) const {
    float v[1];
    load<1>(ch, v);
    return v[0];
  }
};
template <int Bits, int Group>
KVSCOUT_DEVICE quantized_key_reader<Bits, Group> reader_at(
    const detail::quantized_key_view<Bits, Group>& k, int s, int h, int t) {
  quantized_key_reader<Bits, Group> rd;
  rd.r = k.r;
  rd.i = t % Group;
  int n = k.counts[static_cast<std::size_t>(s) * k.num_kv_heads + h];
  n = n < 0 ? 0 : n > k.max_tokens ? k.max_tokens : n;
  const int b = t / Group, complete = n / Group;
  if (b < complete) {
    const float* base = k.tile_data.data() + k.tile_offset(s, h, b);
    rd.mn = base;
    rd.codes = reinterpret_cast<const std::uint8_t*>(base + 2 * static_cast<std::size_t>(k.r));
  } else if (b == complete) {
    rd.stage = k.staging.data() + k.staging_offset(s, h) + rd.i;
  }
  return rd;
}

/// The logits of query heads [j0, j0 + GC) of the group (those < g) for the token `rd` reads.
template <int GC, bool Exact, class Reader>
KVSCOUT_DEVICE void group_logits(const Reader& rd, const float* qs, int r, int j0, int g,
                                 float (&acc)[GC]) {
#pragma unroll
  for (int jj = 0; jj < GC; ++jj) acc[jj] = 0.f;
  for (int c = 0; c < r; ++c) {
    const float v = rd.one(c);
#pragma unroll
    for (int jj = 0; jj < GC; ++jj) {
      if (Exact || j0 + jj < g) acc[jj] += qs[(j0 + jj) * r + c] * v;
    }
  }
}

template <class PkT>
KVSCOUT_DEVICE void load_group(const infinigen_params<PkT>& p, int s, int h, float* qs) {
  const int n = p.group * p.r;
  const float* src = p.q + (static_cast<std::size_t>(s) * p.num_q_heads +
                            static_cast<std::size_t>(h) * p.group) * p.r;
  for (int e = static_cast<int>(threadIdx.x); e < n; e += blockDim.x) qs[e] = src[e];
}

/// max_logit / mean_logit: max (folded as the host's score_tiles does) or mean (sum in head order
/// times 1 / g; the host scores the mean query: equal up to rounding order). G == 0: any group
/// size, 8 heads at a time.
template <class PkT, int G>
__global__ void __launch_bounds__(spec_block_threads)
    score_group(const __grid_constant__ infinigen_params<PkT> p) {
  float* const qs = dynamic_shared<float>();  // [g, r]
  constexpr int GC = G > 0 ? G : 8;
  const int s = static_cast<int>(blockIdx.z);
  const int h = static_cast<int>(blockIdx.y);
  const int len = p.length(s);
  const int t0 = static_cast<int>(blockIdx.x) * spec_tokens_per_block;
  if (t0 >= len) {  // the whole block
    if (t0 == 0) (void)p.seq(s);  // an empty row's bad id is reported too
    return;
  }
  float* row = p.scores + (static_cast<std::size_t>(s) * p.num_kv_heads + h) * p.stride;
  const int c = p.seq(s);
  if (c < 0) {
    score_bad_seq<spec_block_threads, spec_tokens_per_thread>(row, t0, len);
    return;
  }
  load_group(p, s, h, qs);
  __syncthreads();
  constexpr int TPT = spec_tokens_per_thread;
  constexpr int B = detail::device_key_view<PkT>::block_tokens;
  static_assert(B % TPT == 0 && spec_tokens_per_block == TPT * spec_block_threads);
  const int t = t0 + TPT * static_cast<int>(threadIdx.x);
  if (t >= len) return;  // no barrier follows
  const int g = G > 0 ? G : p.group;
  const bool use_max = p.aggregation == gqa_aggregation::max_logit;
  const float inv_g = 1.f / static_cast<float>(g);
  // Tokens past len lie in the same tile, inside the cache: read, not written.
  const auto rd = reader_at(p.keys, c, h, t);
  float a[TPT];
  for (int j0 = 0; j0 < g; j0 += GC) {
    float acc[TPT][GC];
#pragma unroll
    for (int u = 0; u < TPT; ++u)
#pragma unroll
      for (int jj = 0; jj < GC; ++jj) acc[u][jj] = 0.f;
    for (int ch = 0; ch < p.r; ++ch) {
      float v[TPT];
      rd.template load<TPT>(ch, v);
#pragma unroll
      for (int jj = 0; jj < GC; ++jj) {
        if (G > 0 || j0 + jj < g) {
          const float q = qs[(j0 + jj) * p.r + ch];
#pragma unroll
          for (int u = 0; u < TPT; ++u) acc[u][jj] += q * v[u];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < TPT; ++u) {
#pragma unroll
      for (int jj = 0; jj < GC; ++jj) {
        const int j = j0 + jj;
        if (G > 0 || j < g) {
          if (j == 0) {
            a[u] = acc[u][jj];
          } else {
            a[u] = use_max ? (a[u] > acc[u][jj] ? a[u] : acc[u][jj]) : a[u] + acc[u][jj];
          }
        }
      }
    }
  }
#pragma unroll
  for (int u = 0; u < TPT; ++u)
    if (t + u < len) row[t + u] = use_max ? a[u] : a[u] * inv_g;
}

struct softmax_stats_merge {
  KVSCOUT_DEVICE float2 operator()(const float2& a, const float2& b) const {
    float m = a.x, l = a.y;
    softmax_merge<float>(m, l, b.x, b.y);
    return make_float2(m, l);
  }
};

/// sum_prob, pass 1: per block and query head j, (max, sum of exp) to stats[s, h, blockIdx.x, j].
template <class PkT, int G>
__global__ void __launch_bounds__(spec_block_threads)
    softmax_stats(const __grid_constant__ infinigen_params<PkT> p) {
  float* const qs = dynamic_shared<float>();  // [g, r]
  using reduce = cub::BlockReduce<float2, spec_block_threads>;
  __shared__ typename reduce::TempStorage temp;
  constexpr int GC = G > 0 ? G : 8;
  const int s = static_cast<int>(blockIdx.z);
  const int h = static_cast<int>(blockIdx.y);
  const int len = p.length(s);
  const int t0 = static_cast<int>(blockIdx.x) * spec_tokens_per_block;
  if (t0 >= len) return;
  const int c = p.seq(s);
  if (c < 0) return;  // score_sum_prob scores the row -inf
  load_group(p, s, h, qs);
  __syncthreads();
  const int g = G > 0 ? G : p.group;
  float2* out = p.stats + ((static_cast<std::size_t>(s) * p.num_kv_heads + h) * p.max_chunks +
                           blockIdx.x) * static_cast<std::size_t>(g);
  for (int j0 = 0; j0 < g; j0 += GC) {
    float m[GC], l[GC];
#pragma unroll
    for (int jj = 0; jj < GC; ++jj) m[jj] = -INFINITY, l[jj] = 0.f;
    for (int k = 0; k < spec_tokens_per_thread; ++k) {
      const int t = t0 + k * spec_block_threads + static_cast<int>(threadIdx.x);
      if (t >= len) break;
      float acc[GC];
      group_logits<GC, (G > 0)>(reader_at(p.keys, c, h, t), qs, p.r, j0, g, acc);
#pragma unroll
      for (int jj = 0; jj < GC; ++jj) softmax_push<float>(m[jj], l[jj], acc[jj]);
    }
    for (int jj = 0; jj < GC && j0 + jj < g; ++jj) {
      const float2 total = reduce(temp).Reduce(make_float2(m[jj], l[jj]), softmax_stats_merge{});
      if (threadIdx.x == 0) out[j0 + jj] = total;
      __syncthreads();  // temp is reused by the next reduction
    }
  }
}

/// sum_prob, pass 2: merges the row's block statistics, then score = sum over the group of
/// exp(z_j - m_j) / l_j.
template <class PkT, int G>
__global__ void __launch_bounds__(spec_block_threads)
    score_sum_prob(const __grid_constant__ infinigen_params<PkT> p) {
  float* const qs = dynamic_shared<float>();  // [g, r], then m [g], l [g]
  constexpr int GC = G > 0 ? G : 8;
  const int s = static_cast<int>(blockIdx.z);
  const int h = static_cast<int>(blockIdx.y);
  const int len = p.length(s);
  const int t0 = static_cast<int>(blockIdx.x) * spec_tokens_per_block;
  if (t0 >= len) {
    if (t0 == 0) (void)p.seq(s);  // an empty row's bad id is reported too
    return;
  }
  float* row = p.scores + (static_cast<std::size_t>(s) * p.num_kv_heads + h) * p.stride;
  const int c = p.seq(s);
  if (c < 0) {
    score_bad_seq<spec_block_threads, spec_tokens_per_thread>(row, t0, len);
    return;
  }
  const int g = G > 0 ? G : p.group;
  float* ms = qs + g * p.r;
  float* ls = ms + g;
  load_group(p, s, h, qs);
  const int blocks = (len + spec_tokens_per_block - 1) / spec_tokens_per_block;
  const float2* st = p.stats + (static_cast<std::size_t>(s) * p.num_kv_heads + h) *
                                   p.max_chunks * static_cast<std::size_t>(g);
  for (int j = static_cast<int>(threadIdx.x); j < g; j += blockDim.x) {
    float m = -INFINITY, l = 0.f;
    for (int b = 0; b < blocks; ++b) {
      const float2 v = st[static_cast<std::size_t>(b) * g + j];
      softmax_merge<float>(m, l, v.x, v.y);
    }
    ms[j] = m;
    ls[j] = l;
  }
  __syncthreads();
  for (int k = 0; k < spec_tokens_per_thread; ++k) {
    const int t = t0 + k * spec_block_threads + static_cast<int>(threadIdx.x);
    if (t >= len) break;
    const auto rd = reader_at(p.keys, c, h, t);
    float a = 0.f;
    for (int j0 = 0; j0 < g; j0 += GC) {
      float acc[GC];
      group_logits<GC, (G > 0)>(rd, qs, p.r, j0, g, acc);
#pragma unroll
      for (int jj = 0; jj < GC; ++jj) {
        const int j = j0 + jj;
        if (G > 0 || j < g) a += softmax_share<float>(acc[jj], ms[j], ls[j]);
      }
    }
    row[t] = a;
  }
}

}  // namespace kvscout::detail
