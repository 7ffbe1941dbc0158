#pragma once
// The device speculation's appends (score/infinigen.cuh): new keys projected into the partial key
// cache (float / half / bf16 keys: append_keys; quantised keys: quantise_groups, stage_tail,
// count_tokens), and score_query's projection of the layer's own query as a key.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kvscout/score/detail/infinigen_kernels.cuh"

namespace kvscout::detail {

/// Channel i of kv head h's partial key (or a query projected as a key) from x in shared memory.
KVSCOUT_DEVICE float project_channel(const float* x, const float* rotation,
                                     const std::int32_t* channels, rope_mode mode, int h, int i,
                                     int head_dim, int stride) {
  if (mode == rope_mode::rope_planes) return x[channels[static_cast<std::size_t>(h) * stride + i]];
  return skew_dot(x, rotation + static_cast<std::size_t>(h) * head_dim * stride + i, head_dim,
                  static_cast<std::size_t>(stride));
}

template <class View, class K>
struct key_append_params {
  const float* rotation;         // [H, D, r]
  const std::int32_t* channels;  // [H, r]
  View keys;
  const K* k;                     // [count, H, D]
  const std::int32_t* seq_ids;    // [count]
  const std::int32_t* token_ids;  // [count]
  int count;
  int num_kv_heads;
  int head_dim;
  int r;  // channels cached per head (key_r)
  rope_mode mode;
  int* status;  // the device status word, or null

  __device__ void load_key(int m, int h, float* ks) const {
    const K* src = k + (static_cast<std::size_t>(m) * num_kv_heads + h) * head_dim;
    for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += blockDim.x)
      ks[d] = to_float(src[d]);
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
