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

/// Channel i of kv head h's partial key (or a query projected as a key) from x in shared memory.
KVSCOUT_DEVICE float project_channel(const float* x, const float* rotation, const std::int32_t* channels,
                                     rope_mode mode, int h, int i, int head_dim, int stride) {
  if (mode == rope_mode::rope_planes) return x[channels[static_cast<std::size_t>(h) * stride + i]];
  return skew_dot(x, rotation + static_cast<std::size_t>(h) * head_dim * stride + i, head_dim,
                  static_cast<std::size_t>(stride));
}

template <class View, class K>
struct key_append_params {
  const float* rotation;          // [H, D, r]
  const std::int32_t* channels;   // [H, r]
  View keys;
  const K* k;                     // [count, H, D]
  const std::int32_t* seq_ids;    // [count]
  const std::int32_t* token_ids;  // [count]
  int count;
  int num_kv_heads;
  int head_dim;
  int r;                          // channels cached per head (key_r)
  rope_mode mode;
  int* status;  // the device status word, or null

  __device__ void load_key(int m, int h, float* ks) const {
    const K* src = k + (static_cast<std::size_t>(m) * num_kv_heads + h) * head_dim;
    for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += blockDim.x) ks[d] = to_float(src[d]);
  }
  __device__ float project(const float* ks, int h, int i) const {
    return project_channel(ks, rotation, channels, mode, h, i, head_dim, r);
  }

  /// Quantised caches: whether entry n may be appended (the contract above quantise_groups); raises
  /// the status bits where not, if `report`.
  __device__ bool valid(int n, bool report) const {
    const int s = seq_ids[n], t = token_ids[n];
    if (s < 0 || s >= keys.num_seqs || t < 0 || t >= keys.max_tokens) {
      if (report) raise_device_status(status, device_status::bad_index);
      return false;
    }
    bool ok = true;
    if (n > 0 && seq_ids[n - 1] == s) ok = token_ids[n - 1] == t - 1;
    if (ok) {
      const int count_s = keys.counts[static_cast<std::size_t>(s) * keys.num_kv_heads];
      // t0 <= t keeps n0 <= n: a count past t (e.g. a restart at 0) names no entry after n.
      const auto starts_at = [&](int t0) {
        const int n0 = n - (t - t0);
        return t0 >= 0 && t0 <= t && n0 >= 0 && seq_ids[n0] == s && token_ids[n0] == t0 &&
               (n0 == 0 || seq_ids[n0 - 1] != s);
      };
      ok = starts_at(count_s) || starts_at(0);
    }
    if (!ok && report) raise_device_status(status, device_status::bad_order);
    return ok;
  }
};

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
  constexpr int U = 4;                                   // 16-byte loads in flight per lane
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int row = static_cast<int>(blockIdx.x) * spec_gemv_warps + static_cast<int>(threadIdx.x) / 32;
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
              const float* xp = x + j * static_cast<std::size_t>(p.d_model) +
                                static_cast<std::size_t>(bi) * V;
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
  const int i = static_cast<int>(blockIdx.z) * spec_finish_outputs + static_cast<int>(threadIdx.x) / L;
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

inline constexpr int spec_project_threads = 64;

/// score_query's partial queries: the layer's own query q [S, Hq, D] (after RoPE) projected as a
/// key is, times the scale, into p.q [S, Hq, key_r]. Grid (S, Hq).
template <class PkT>
__global__ void __launch_bounds__(spec_project_threads)
    project_true_query(const __grid_constant__ infinigen_params<PkT> p, const float* q) {
  __shared__ float qs[2 * rope_table::max_planes];
  const int s = static_cast<int>(blockIdx.x);
  const int qh = static_cast<int>(blockIdx.y);
  const int h = qh / p.group;
  const int D = p.head_dim;
  const float* src = q + (static_cast<std::size_t>(s) * p.num_q_heads + qh) * D;
  for (int d = static_cast<int>(threadIdx.x); d < D; d += blockDim.x) qs[d] = src[d];
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < p.r; i += blockDim.x) {
    const float v = project_channel(qs, p.rotation, p.channels, p.mode, h, i, D, p.key_r);
    p.q[(static_cast<std::size_t>(s) * p.num_q_heads + qh) * p.r + i] = v * p.scale;
  }
}

inline constexpr int spec_append_threads = 128;

template <class PkT, class K>
__global__ void __launch_bounds__(spec_append_threads)
    append_keys(const __grid_constant__ key_append_params<partial_key_view<PkT>, K> p) {
  __shared__ float ks[2 * rope_table::max_planes];
  const int n = static_cast<int>(blockIdx.x);
  const int h = static_cast<int>(blockIdx.y);
  const int s = p.seq_ids[n];
  const int t = p.token_ids[n];
  if (s < 0 || s >= p.keys.num_seqs || t < 0 || t >= p.keys.max_tokens) {
    if (h == 0 && threadIdx.x == 0) raise_device_status(p.status, device_status::bad_index);
    return;
  }
  p.load_key(n, h, ks);
  __syncthreads();
  PkT* dst = p.keys.data.data();
  for (int i = static_cast<int>(threadIdx.x); i < p.r; i += blockDim.x)
    dst[p.keys.offset(s, h, i, t)] = from_float<PkT>(p.project(ks, h, i));
}

// Quantised partial keys: three launches per append(): quantise_groups, stage_tail, count_tokens.
// Contract: per call, each sequence's tokens are one run of consecutive entries and positions,
// starting at the sequence's count (or at 0: a new sequence in the slot). An entry that breaks it
// is skipped and raises device_status::bad_order; positions or sequences out of range, bad_index; a
// non-finite partial key value is stored as 0 and raises bad_value (the host cache refuses it).

template <int Bits, int Group, class K>
using qk_append_params = key_append_params<detail::quantized_key_view<Bits, Group>, K>;

/// grid (count, H), dynamic shared memory r * Group floats. Where entry n completes its group, the
/// group is quantised into its tile as quantized_partial_key_cache::append does, and the staging
/// tile is cleared.
template <int Bits, int Group, class K>
__global__ void __launch_bounds__(spec_append_threads)
    quantise_groups(const __grid_constant__ qk_append_params<Bits, Group, K> p) {
  using view = detail::quantized_key_view<Bits, Group>;
  constexpr int LB = view::line_bytes;
  float* const x = dynamic_shared<float>();  // [r, Group]
  __shared__ float ks[2 * rope_table::max_planes];
  __shared__ int bad;
  const int n = static_cast<int>(blockIdx.x);
  const int h = static_cast<int>(blockIdx.y);
  if (!p.valid(n, false)) return;  // stage_tail reports it
  const int s = p.seq_ids[n], t = p.token_ids[n];
  if (t % Group != Group - 1) return;
  const int b = t / Group;
  const int r = p.r;
  const float* stage = p.keys.staging.data() + p.keys.staging_offset(s, h);
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  for (int j = 0; j < Group; ++j) {
    const int m = n - (Group - 1 - j);
    const bool in_batch =
        m >= 0 && p.seq_ids[m] == s && p.token_ids[m] == b * Group + j && p.valid(m, false);
    if (in_batch) {
      __syncthreads();  // ks is reused
      p.load_key(m, h, ks);
      __syncthreads();
    }
    for (int c = static_cast<int>(threadIdx.x); c < r; c += blockDim.x) {
      float v = in_batch ? p.project(ks, h, c) : stage[static_cast<std::size_t>(c) * Group + j];
      if (!isfinite(v)) {
        v = 0.f;
        bad = 1;
      }
      x[static_cast<std::size_t>(c) * Group + j] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && bad) raise_device_status(p.status, device_status::bad_value);
  float* mn = p.keys.tile_data.data() + p.keys.tile_offset(s, h, b);
  float* step = mn + r;
  std::uint8_t* codes = reinterpret_cast<std::uint8_t*>(step + r);
  for (int c = static_cast<int>(threadIdx.x); c < r; c += blockDim.x) {
    const float* xc = x + static_cast<std::size_t>(c) * Group;
    float lo = xc[0], hi = xc[0];
    for (int i = 1; i < Group; ++i) {
      lo = xc[i] < lo ? xc[i] : lo;
      hi = xc[i] > hi ? xc[i] : hi;
    }
    const float sc = static_cast<float>((static_cast<double>(hi) - lo) / view::levels);
    mn[c] = lo;
    step[c] = sc;
    std::uint8_t* line = codes + static_cast<std::size_t>(c) * LB;
    for (int bi = 0; bi < LB; ++bi) {
      unsigned byte = 0;
      if (sc != 0.f) {
        for (int plane = 0; plane * LB < Group; ++plane) {
          const int i = plane * LB + bi;
          double q = rint((static_cast<double>(xc[i]) - lo) / sc);
          q = q < 0 ? 0 : q > view::levels ? view::levels : q;
          byte |= static_cast<unsigned>(q) << (Bits * plane);
        }
      }
      line[bi] = static_cast<std::uint8_t>(byte);
    }
  }
  float* st = p.keys.staging.data() + p.keys.staging_offset(s, h);
  for (int e = static_cast<int>(threadIdx.x); e < r * Group; e += blockDim.x) st[e] = 0.f;
}

/// grid (count, H): a group this batch does not complete goes to the staging tile.
template <int Bits, int Group, class K>
__global__ void __launch_bounds__(spec_append_threads)
    stage_tail(const __grid_constant__ qk_append_params<Bits, Group, K> p) {
  __shared__ float ks[2 * rope_table::max_planes];
  const int n = static_cast<int>(blockIdx.x);
  const int h = static_cast<int>(blockIdx.y);
  if (!p.valid(n, h == 0 && threadIdx.x == 0)) return;
  const int s = p.seq_ids[n], t = p.token_ids[n];
  const int i = t % Group;
  const int last = n + (Group - 1 - i);  // the entry that would complete the group
  if (last < p.count && p.seq_ids[last] == s && p.token_ids[last] == t + (Group - 1 - i) &&
      p.valid(last, false))
    return;
  p.load_key(n, h, ks);
  __syncthreads();
  float* st = p.keys.staging.data() + p.keys.staging_offset(s, h);
  bool bad = false;
  for (int c = static_cast<int>(threadIdx.x); c < p.r; c += blockDim.x) {
    float v = p.project(ks, h, c);
    if (!isfinite(v)) {
      v = 0.f;
      bad = true;
    }
    st[static_cast<std::size_t>(c) * Group + i] = v;
  }
  if (bad) raise_device_status(p.status, device_status::bad_value);
}

/// grid (count), one thread: the last valid entry of each run sets its sequence's count.
template <int Bits, int Group, class K>
__global__ void count_tokens(const __grid_constant__ qk_append_params<Bits, Group, K> p) {
  const int n = static_cast<int>(blockIdx.x);
  if (threadIdx.x != 0 || !p.valid(n, false)) return;
  const int s = p.seq_ids[n], t = p.token_ids[n];
  if (n + 1 < p.count && p.seq_ids[n + 1] == s && p.token_ids[n + 1] == t + 1) return;
  for (int h = 0; h < p.num_kv_heads; ++h)
    p.keys.counts[static_cast<std::size_t>(s) * p.num_kv_heads + h] = t + 1;
}

}  // namespace kvscout::detail
