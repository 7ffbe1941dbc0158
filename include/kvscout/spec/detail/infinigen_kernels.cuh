#pragma once
// Kernels of the device speculation (spec/infinigen.cuh). Every per-element formula is a
// KVSCOUT_HOST_DEVICE function the host path calls too: skew_dot (key projection),
// post_rope_skew_element and rope_rotate (partial query), rope_cos_sin (RoPE table),
// softmax_push / softmax_merge / softmax_share (sum_prob), to_float / from_float (partial keys).
//
// Launch shapes (T = spec_block_threads = 256):
//   partial_query_gemv  grid ceil(Hq * rows / 8), block T: one warp per row of W (coalesced over
//                       d_model), every sequence of the batch in chunks of 8 (W is read once
//                       per 8 sequences); y = W x + b
//   partial_query_finish grid num_seqs, block T: the RoPE table of the sequence's position in
//                       shared memory, then one thread per (query head, element): q = scale *
//                       partial_query element (rotation, plane rotation or copy)
//   score_group         grid (chunks, H, S), block T: 1024 tokens per block, one token per thread
//                       at a time; the group's partial queries in shared memory, the group's
//                       logits in registers (G static for common group sizes, chunks of 8
//                       query heads otherwise), folded to max / mean
//   softmax_stats       (sum_prob) as score_group, per block and query head the softmax (max, sum)
//                       of its tokens, block-reduced into the stats workspace
//   score_sum_prob      (sum_prob) as score_group; first merges the stats of every block of its
//                       row, then writes sum_j exp(z_j - m_j) / l_j
//   append_keys         grid (count, H), block 128: the key in shared memory, one thread per
//                       partial element; skew_dot with A[:, S] (or a gather for rope_planes)

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cub/block/block_reduce.cuh>

#include "kvscout/backend/cuda/device_status.hpp"
#include "kvscout/core/detail/launch.cuh"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/rope.hpp"
#include "kvscout/skew/plan.hpp"
#include "kvscout/spec/detail/aggregate.hpp"
#include "kvscout/spec/infinigen_device.hpp"

namespace kvscout::detail {

/// Everything the speculation kernels read, built on the host once per launch.
template <class PkT>
struct infinigen_params {
  // setup-time data (workspace)
  // [Hq, rows, d_model] of the speculator's weight type WT, which only partial_query_gemv<.., WT>
  // reads (so the scoring kernels are not instantiated once per weight type).
  const void* weights;
  const float* bias;        // [Hq, rows]
  const float* rotation;    // [H, D, r]
  const std::int32_t* channels;  // [H, r]
  const std::int32_t* planes;    // [H, r / 2]
  float* y;                 // [S, Hq, rows]
  float* q;                 // [S, Hq, r]
  float2* stats;            // [S, H, max_chunks, g]
  partial_key_view<PkT> keys;
  // per call
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
  int r;
  int rows;
  int stride;
  int max_len;     // clamp bound: min(max_seq_len, stride, max_tokens)
  int max_chunks;  // stats entries per row
  rope_config rope;
  rope_mode mode;
  gqa_aggregation aggregation;
  float scale;
  int* status;  // the device status word, or null

  /// seq_lens[s] clamped to [0, max_len]: bad lengths on the device never read or write out of
  /// bounds; they raise device_status::bad_length (once per block).
  __device__ __forceinline__ int length(int s) const {
    const int n = seq_lens[s];
    if (n >= 0 && n <= max_len) return n;
    if (threadIdx.x == 0) raise_device_status(status, device_status::bad_length);
    return n < 0 ? 0 : max_len;
  }
  /// The sequence of `keys` that batch row s reads, or -1 for an id outside [0, keys.num_seqs)
  /// (raises device_status::bad_seq_id, once per block).
  __device__ __forceinline__ int seq(int s) const {
    if (seq_ids == nullptr) return s;
    const int c = seq_ids[s];
    if (c >= 0 && c < keys.num_seqs) return c;
    if (threadIdx.x == 0) raise_device_status(status, device_status::bad_seq_id);
    return -1;
  }
};

/// A row whose sequence id is bad: -inf for the block's tokens below len (nothing was read).
template <int Threads, int PerThread>
__device__ __forceinline__ void score_bad_seq(float* row, int t0, int len) {
  for (int k = 0; k < PerThread; ++k) {
    const int t = t0 + k * Threads + static_cast<int>(threadIdx.x);
    if (t >= len) break;
    row[t] = -INFINITY;
  }
}

/// Everything append_keys reads.
template <class PkT, class K = float>
struct pk_append_params {
  const float* rotation;          // [H, D, r]
  const std::int32_t* channels;   // [H, r]
  partial_key_view<PkT> keys;
  const K* k;                     // [count, H, D]
  const std::int32_t* seq_ids;    // [count]
  const std::int32_t* token_ids;  // [count]
  int num_kv_heads;
  int head_dim;
  int r;
  rope_mode mode;
  int* status;  // the device status word, or null
};

KVSCOUT_DEVICE float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- partial query ---------------------------------------------------------------------------

template <class PkT, class WT>
__global__ void __launch_bounds__(spec_block_threads)
    partial_query_gemv(const __grid_constant__ infinigen_params<PkT> p) {
  constexpr int seq_chunk = 8;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int row = static_cast<int>(blockIdx.x) * spec_gemv_warps + static_cast<int>(threadIdx.x) / 32;
  const int total_rows = p.num_q_heads * p.rows;
  if (row >= total_rows) return;  // whole warps leave; no block-wide synchronisation follows
  const WT* w = static_cast<const WT*>(p.weights) + static_cast<std::size_t>(row) * p.d_model;
  for (int s0 = 0; s0 < p.num_seqs; s0 += seq_chunk) {
    const int ns = p.num_seqs - s0 < seq_chunk ? p.num_seqs - s0 : seq_chunk;
    float acc[seq_chunk];
#pragma unroll
    for (int j = 0; j < seq_chunk; ++j) acc[j] = 0.f;
    for (int d = lane; d < p.d_model; d += 32) {
      const float wv = to_float(w[d]);
#pragma unroll
      for (int j = 0; j < seq_chunk; ++j) {
        if (j < ns) acc[j] += wv * p.x[static_cast<std::size_t>(s0 + j) * p.d_model + d];
      }
    }
#pragma unroll
    for (int j = 0; j < seq_chunk; ++j) acc[j] = warp_sum(acc[j]);
    if (lane == 0) {
      for (int j = 0; j < ns; ++j)
        p.y[static_cast<std::size_t>(s0 + j) * total_rows + row] = acc[j] + p.bias[row];
    }
  }
}

template <class PkT>
__global__ void __launch_bounds__(spec_block_threads)
    partial_query_finish(const __grid_constant__ infinigen_params<PkT> p) {
  __shared__ float cs[rope_table::max_planes];
  __shared__ float sn[rope_table::max_planes];
  const int s = static_cast<int>(blockIdx.x);
  if (p.mode != rope_mode::pre_rope_folded) {
    const int pos = p.positions[s];
    const int planes = p.head_dim / 2;
    for (int j = static_cast<int>(threadIdx.x); j < planes; j += blockDim.x)
      rope_cos_sin(p.rope, j, pos, cs[j], sn[j]);
  }
  __syncthreads();
  const int r = p.r;
  for (int e = static_cast<int>(threadIdx.x); e < p.num_q_heads * r; e += blockDim.x) {
    const int qh = e / r;
    const int i = e % r;
    const int h = qh / p.group;
    const float* y = p.y + (static_cast<std::size_t>(s) * p.num_q_heads + qh) * p.rows;
    float v;
    if (p.mode == rope_mode::post_rope_skew) {
      v = post_rope_skew_element(y, p.rope, cs, sn,
                                 p.rotation + static_cast<std::size_t>(h) * p.head_dim * r,
                                 p.head_dim, r, i);
    } else if (p.mode == rope_mode::rope_planes) {
      const int pair = i / 2;
      const int j = p.planes[static_cast<std::size_t>(h) * (r / 2) + pair];
      float qa = y[2 * pair];
      float qb = y[2 * pair + 1];
      rope_rotate(qa, qb, cs[j], sn[j]);
      v = (i & 1) ? qb : qa;
    } else {
      v = y[i];
    }
    p.q[(static_cast<std::size_t>(s) * p.num_q_heads + qh) * r + i] = v * p.scale;
  }
}

// ---- scoring ---------------------------------------------------------------------------------

/// The logits of query heads [j0, j0 + GC) of the group (those < g) for the token whose channel
/// 0 is at pk (channel c at pk[c * block_tokens]); qs = the group's [g, r] partial queries.
template <int GC, bool Exact, class PkT>
KVSCOUT_DEVICE void group_logits(const PkT* pk, const float* qs, int r, int j0, int g,
                                 float (&acc)[GC]) {
  constexpr int B = partial_key_view<PkT>::block_tokens;
#pragma unroll
  for (int jj = 0; jj < GC; ++jj) acc[jj] = 0.f;
  for (int c = 0; c < r; ++c) {
    const float v = to_float(pk[static_cast<std::size_t>(c) * B]);
#pragma unroll
    for (int jj = 0; jj < GC; ++jj) {
      if (Exact || j0 + jj < g) acc[jj] += qs[(j0 + jj) * r + c] * v;
    }
  }
}

/// Loads the group's scaled partial queries [g, r] of (s, h) into shared memory.
template <class PkT>
KVSCOUT_DEVICE void load_group(const infinigen_params<PkT>& p, int s, int h, float* qs) {
  const int n = p.group * p.r;
  const float* src = p.q + (static_cast<std::size_t>(s) * p.num_q_heads +
                            static_cast<std::size_t>(h) * p.group) * p.r;
  for (int e = static_cast<int>(threadIdx.x); e < n; e += blockDim.x) qs[e] = src[e];
}

/// max_logit / mean_logit: score = max or mean over the group (max: a > z ? a : z, as the host's
/// score_tiles folds; mean: sum in head order, times 1 / g, where the host scores the group's mean
/// query instead: the same value up to the order of rounding, inside the GPU test's tolerance).
/// G > 0: the group size, static; G == 0: any group size, 8 heads at a time.
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
  const int g = G > 0 ? G : p.group;
  const bool use_max = p.aggregation == gqa_aggregation::max_logit;
  const float inv_g = 1.f / static_cast<float>(g);
  for (int k = 0; k < spec_tokens_per_thread; ++k) {
    const int t = t0 + k * spec_block_threads + static_cast<int>(threadIdx.x);
    if (t >= len) break;
    const PkT* pk = p.keys.data.data() + p.keys.offset(c, h, 0, t);
    float a = 0.f;
    for (int j0 = 0; j0 < g; j0 += GC) {
      float acc[GC];
      group_logits<GC, (G > 0)>(pk, qs, p.r, j0, g, acc);
#pragma unroll
      for (int jj = 0; jj < GC; ++jj) {
        const int j = j0 + jj;
        if (G > 0 || j < g) {
          if (j == 0) {
            a = acc[jj];
          } else {
            a = use_max ? (a > acc[jj] ? a : acc[jj]) : a + acc[jj];
          }
        }
      }
    }
    row[t] = use_max ? a : a * inv_g;
  }
}

struct softmax_stats_merge {
  KVSCOUT_DEVICE float2 operator()(const float2& a, const float2& b) const {
    float m = a.x, l = a.y;
    softmax_merge<float>(m, l, b.x, b.y);
    return make_float2(m, l);
  }
};

/// sum_prob, pass 1: per block and query head of the group, the softmax statistics (max, sum of
/// exp) of the block's tokens, to stats[s, h, blockIdx.x, j].
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
      const PkT* pk = p.keys.data.data() + p.keys.offset(c, h, 0, t);
      float acc[GC];
      group_logits<GC, (G > 0)>(pk, qs, p.r, j0, g, acc);
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

/// sum_prob, pass 2: merges the statistics of every block of the row (the row's length decides
/// how many), then score = sum over the group of exp(z_j - m_j) / l_j.
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
    const PkT* pk = p.keys.data.data() + p.keys.offset(c, h, 0, t);
    float a = 0.f;
    for (int j0 = 0; j0 < g; j0 += GC) {
      float acc[GC];
      group_logits<GC, (G > 0)>(pk, qs, p.r, j0, g, acc);
#pragma unroll
      for (int jj = 0; jj < GC; ++jj) {
        const int j = j0 + jj;
        if (G > 0 || j < g) a += softmax_share<float>(acc[jj], ms[j], ls[j]);
      }
    }
    row[t] = a;
  }
}

// ---- append ----------------------------------------------------------------------------------

inline constexpr int spec_append_threads = 128;

template <class PkT, class K>
__global__ void __launch_bounds__(spec_append_threads)
    append_keys(const __grid_constant__ pk_append_params<PkT, K> p) {
  __shared__ float ks[2 * rope_table::max_planes];
  const int n = static_cast<int>(blockIdx.x);
  const int h = static_cast<int>(blockIdx.y);
  const int s = p.seq_ids[n];
  const int t = p.token_ids[n];
  // Bad pairs on the device are skipped (nothing written), never out of bounds, and reported.
  if (s < 0 || s >= p.keys.num_seqs || t < 0 || t >= p.keys.max_tokens) {
    if (h == 0 && threadIdx.x == 0) raise_device_status(p.status, device_status::bad_index);
    return;
  }
  const int D = p.head_dim;
  const K* k = p.k + (static_cast<std::size_t>(n) * p.num_kv_heads + h) * D;
  for (int d = static_cast<int>(threadIdx.x); d < D; d += blockDim.x) ks[d] = to_float(k[d]);
  __syncthreads();
  PkT* dst = p.keys.data.data();
  for (int i = static_cast<int>(threadIdx.x); i < p.r; i += blockDim.x) {
    float v;
    if (p.mode == rope_mode::rope_planes) {
      v = ks[p.channels[static_cast<std::size_t>(h) * p.r + i]];  // A = I: a gather, as project_key
    } else {
      v = skew_dot(ks, p.rotation + static_cast<std::size_t>(h) * D * p.r + i, D,
                   static_cast<std::size_t>(p.r));
    }
    dst[p.keys.offset(s, h, i, t)] = from_float<PkT>(v);
  }
}

}  // namespace kvscout::detail
