#pragma once
// Device selection kernels (select/topk.cuh, select/threshold.cuh): one thread block selects one
// (sequence, kv_head) row, with the host selectors' semantics exactly: the same keys (score_key),
// digit plan (radix_plan) and cut (radix_cut), so the device writes the host's indices, ties
// included.
//
// Per row, for candidate tokens [a, b), keys >= lo (lo >= 1 excludes NaN, whose key is 0), k slots:
//   1. radix select (block_radix_cut): three passes (digits of 11, 11 and 10 bits, most
//      significant first), each a shared-memory histogram of the keys that agree with the prefix
//      so far, then a block-wide scan over the buckets from the top for the k-th largest key.
//      If pass 0 counts no more than k keys, all are taken (cut = lo - 1).
//   2. ordered compaction (block_compact): one block-wide scan of packed (ties, greater) counts
//      per tile; a taken token goes to greater_before + min(ties_before, cut.ties), so the indices
//      come out ascending.
// The keep-set's head [0, a) and tail [b, len) are written around the chosen tokens.
// The kernels are templates so that the header can be included by any number of translation units.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kvscout/core/device_status.hpp"
#include "kvscout/select/concepts.hpp"
#include "kvscout/select/detail/device_config.hpp"
#include "kvscout/select/detail/radix_select.hpp"

namespace kvscout::detail {

struct select_params {
  const float* scores;           // [num_seqs, num_kv_heads, stride]
  const std::int32_t* seq_lens;  // [num_seqs]
  std::int32_t* indices;         // [num_seqs, num_kv_heads, capacity]
  std::int32_t* counts;          // [num_seqs, num_kv_heads]
  std::int32_t* row_counts;      // [num_seqs, num_kv_heads] infinigen_mean's candidate counts
  int num_seqs;
  int num_kv_heads;
  int stride;
  int capacity;
  int budget;  // the most rows a row selects (both selectors' config.budget)
  double budget_share;              // config.budget_share: row_budget()
  const std::int32_t* row_budgets;  // [rows] or null: a budget per row (the correction's)
  float alpha;
  keep_set keep;
  int* status;  // the device status word, or null

  /// seq_lens[s] clamped to [0, stride]: a bad length never reads past a row; it raises
  /// device_status::bad_length (once per block).
  __device__ __forceinline__ int length(int s) const {
    const int n = seq_lens[s];
    if (n >= 0 && n <= stride) return n;
    if (threadIdx.x == 0) raise_device_status(status, device_status::bad_length);
    return n < 0 ? 0 : stride;
  }
  /// The budget of `row` at length len.
  __device__ __forceinline__ int budget_at(int row, int len) const {
    return row_budgets != nullptr ? row_budgets[row]
                                  : detail::row_budget(budget, budget_share, keep, len);
  }
};

template <int Threads, int Items>
struct select_shared {
  static_assert(radix_buckets % Threads == 0, "each thread owns whole buckets");
  using load_t = cub::BlockLoad<float, Threads, Items, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  using scan64_t = cub::BlockScan<unsigned long long, Threads>;
  using scan32_t = cub::BlockScan<int, Threads>;
  using reduce_f_t = cub::BlockReduce<float, Threads>;
  using reduce_ll_t = cub::BlockReduce<long long, Threads>;
  union {
    typename load_t::TempStorage load;
    typename scan64_t::TempStorage scan64;
    typename scan32_t::TempStorage scan32;
    typename reduce_f_t::TempStorage reduce_f;
    typename reduce_ll_t::TempStorage reduce_ll;
  } temp;
  std::uint32_t hist[radix_buckets];
  int found_bucket;
  int found_k;
  float broadcast_f;
  long long broadcast_ll;
};

using select_smem = select_shared<select_block_threads, select_items_per_thread>;

struct max_op {
  KVSCOUT_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); }  // NaN ignored
};
struct sum_op {
  KVSCOUT_DEVICE long long operator()(long long a, long long b) const { return a + b; }
};

template <int Threads>
KVSCOUT_DEVICE float block_row_max(const float* row, int n, select_smem& sm) {
  float m = -INFINITY;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += Threads) m = fmaxf(m, row[i]);
  const float total = select_smem::reduce_f_t(sm.temp.reduce_f).Reduce(m, max_op{});
  if (threadIdx.x == 0) sm.broadcast_f = total;
  __syncthreads();
  const float r = sm.broadcast_f;
  __syncthreads();  // temp and broadcast are reused
  return r;
}

template <int Threads>
KVSCOUT_DEVICE long long block_count_at_least(const float* row, int a, int b, float bound,
                                              select_smem& sm) {
  long long c = 0;
  for (int i = a + static_cast<int>(threadIdx.x); i < b; i += Threads) c += row[i] >= bound ? 1 : 0;
  const long long total = select_smem::reduce_ll_t(sm.temp.reduce_ll).Reduce(c, sum_op{});
  if (threadIdx.x == 0) sm.broadcast_ll = total;
  __syncthreads();
  const long long r = sm.broadcast_ll;
  __syncthreads();
  return r;
}

/// One pass's decision from its histogram: the bucket holding the kk-th largest key, walking the nb
/// buckets from the top. Returns the keys counted in all (every thread); where that is more than
/// kk, *bucket and *rank (the wanted key's rank inside the bucket) are set in every thread.
template <int Threads, class Count>
KVSCOUT_DEVICE int block_find_bucket(int nb, int kk, Count&& count, select_smem& sm, int* bucket,
                                     int* rank) {
  constexpr int per_thread = radix_buckets / Threads;
  const int tid = static_cast<int>(threadIdx.x);
  int cnt[per_thread];
  int sum = 0;
#pragma unroll
  for (int q = 0; q < per_thread; ++q) {
    const int b = nb - 1 - (tid * per_thread + q);
    cnt[q] = b >= 0 ? static_cast<int>(count(b)) : 0;
    sum += cnt[q];
  }
  int above = 0, total = 0;
  select_smem::scan32_t(sm.temp.scan32).ExclusiveSum(sum, above, total);
  int run = above;
#pragma unroll
  for (int q = 0; q < per_thread; ++q) {
    if (run < kk && run + cnt[q] >= kk) {
      sm.found_bucket = nb - 1 - (tid * per_thread + q);
      sm.found_k = kk - run;
    }
    run += cnt[q];
  }
  __syncthreads();
  *bucket = sm.found_bucket;
  *rank = sm.found_k;
  __syncthreads();  // found_* and temp are rewritten by the next pass
  return total;
}

/// The cut that takes the best k (k >= 1) of the keys >= lo (lo >= 1) of row[a, b), ties to the
/// lowest index. Every thread returns the same cut.
template <int Threads>
KVSCOUT_DEVICE radix_cut block_radix_cut(const float* row, int a, int b, std::uint32_t lo, int k,
                                         select_smem& sm) {
  constexpr int top = 32;  // every bit of a key may differ
  const int tid = static_cast<int>(threadIdx.x);
  std::uint32_t prefix = 0;   // the digits found so far
  std::uint32_t known = 0;    // the bits they cover
  int kk = k;                 // rank of the wanted key among those that agree with prefix
  for (int pass = 0; pass < radix_passes(top); ++pass) {
    const radix_digit d = radix_plan(top, pass, 0u);
    const int nb = 1 << d.bits;
    for (int i = tid; i < nb; i += Threads) sm.hist[i] = 0;
    __syncthreads();
    for (int i = a + tid; i < b; i += Threads) {
      const std::uint32_t key = detail::score_key(row[i]);
      if (key >= lo && (key & known) == prefix) atomicAdd(&sm.hist[d.of(key)], 1u);
    }
    __syncthreads();
    int bucket = 0, rank = 0;
    const int total = block_find_bucket<Threads>(
        nb, kk, [&](int i) { return sm.hist[i]; }, sm, &bucket, &rank);
    // Pass 0 counts every candidate: no more than k of them, and all are taken.
    if (pass == 0 && total <= kk) return radix_cut{lo - 1u, 0};
    prefix |= static_cast<std::uint32_t>(bucket) << d.shift;
    known |= static_cast<std::uint32_t>(nb - 1) << d.shift;
    kk = rank;
  }
  return radix_cut_at(prefix, kk);
}

/// Writes the tokens of row[a, b) that `cut` takes, ascending, to out[0, count); returns count (in
/// every thread). gt_base / eq_base: the keys above / equal to the cut before row[a] (a split row's
/// earlier chunks).
template <int Threads, int Items>
KVSCOUT_DEVICE int block_compact(const float* row, int a, int b, radix_cut cut, std::int32_t* out,
                                 select_smem& sm, unsigned long long gt_base = 0,
                                 unsigned long long eq_base = 0) {
  constexpr int tile = Threads * Items;
  const int tid = static_cast<int>(threadIdx.x);
  const unsigned long long ties = static_cast<unsigned long long>(cut.ties);
  for (int t0 = a; t0 < b; t0 += tile) {
    const int valid = b - t0 < tile ? b - t0 : tile;
    float v[Items];
    // Past the range: NaN, key 0, never taken.
    select_smem::load_t(sm.temp.load).Load(row + t0, v, valid, __int_as_float(0x7fc00000));
    __syncthreads();
    std::uint32_t key[Items];
    unsigned gt = 0, eq = 0;
#pragma unroll
    for (int q = 0; q < Items; ++q) {
      key[q] = detail::score_key(v[q]);
      gt += key[q] > cut.key ? 1u : 0u;
      eq += key[q] == cut.key ? 1u : 0u;
    }
    const unsigned long long packed = (static_cast<unsigned long long>(eq) << 32) | gt;
    unsigned long long before = 0, total = 0;
    select_smem::scan64_t(sm.temp.scan64).ExclusiveSum(packed, before, total);
    __syncthreads();
    unsigned long long g_before = gt_base + (before & 0xffffffffull);
    unsigned long long e_before = eq_base + (before >> 32);
#pragma unroll
    for (int q = 0; q < Items; ++q) {
      const bool is_gt = key[q] > cut.key;
      const bool is_eq = key[q] == cut.key;
      if (is_gt || (is_eq && e_before < ties)) {
        out[g_before + (e_before < ties ? e_before : ties)] = t0 + tid * Items + q;
      }
      g_before += is_gt ? 1u : 0u;
      e_before += is_eq ? 1u : 0u;
    }
    gt_base += total & 0xffffffffull;
    eq_base += total >> 32;
  }
  return static_cast<int>(gt_base + (eq_base < ties ? eq_base : ties));
}

/// The keep-set around the best k of [a, b) with keys >= lo. Writes out[0, count) and counts[row].
template <int Threads, int Items>
KVSCOUT_DEVICE void emit_row(const float* row, int len, detail::keep_range kr, std::uint32_t lo,
                             int k, std::int32_t* out, std::int32_t* count, select_smem& sm) {
  const int tid = static_cast<int>(threadIdx.x);
  const int a = kr.head_end;
  const int b = kr.tail_begin;
  for (int t = tid; t < a; t += Threads) out[t] = t;
  int chosen = 0;
  if (k > 0 && b > a) {
    const radix_cut cut = block_radix_cut<Threads>(row, a, b, lo, k, sm);
    chosen = block_compact<Threads, Items>(row, a, b, cut, out + a, sm);
  }
  for (int t = b + tid; t < len; t += Threads) out[a + chosen + (t - b)] = t;
  if (tid == 0) *count = a + chosen + (len - b);
}

template <int Threads = select_block_threads>
__global__ void __launch_bounds__(Threads)
    topk_rows(const __grid_constant__ select_params p) {
  static_assert(Threads == select_block_threads, "select_smem is sized for select_block_threads");
  __shared__ select_smem sm;
  const int row = static_cast<int>(blockIdx.x);
  const int s = row / p.num_kv_heads;
  const int len = p.length(s);
  const float* sc = p.scores + static_cast<std::size_t>(row) * p.stride;
  std::int32_t* out = p.indices + static_cast<std::size_t>(row) * p.capacity;
  const int budget = p.budget_at(row, len);
  if (len <= budget) {
    for (int t = static_cast<int>(threadIdx.x); t < len; t += select_block_threads) out[t] = t;
    if (threadIdx.x == 0) p.counts[row] = len;
    return;
  }
  const detail::keep_range kr = detail::keep_bounds(p.keep, len);
  emit_row<select_block_threads, select_items_per_thread>(sc, len, kr, 1u, budget - kr.size(len),
                                                          out, p.counts + row, sm);
}

/// Threshold, per_head: the keep-set and the best budget - |keep| of the tokens outside it with
/// score >= threshold_floor(row max, alpha).
template <int Threads = select_block_threads>
__global__ void __launch_bounds__(Threads)
    threshold_rows(const __grid_constant__ select_params p) {
  static_assert(Threads == select_block_threads, "select_smem is sized for select_block_threads");
  __shared__ select_smem sm;
  const int row = static_cast<int>(blockIdx.x);
  const int s = row / p.num_kv_heads;
  const int len = p.length(s);
  const float* sc = p.scores + static_cast<std::size_t>(row) * p.stride;
  const detail::keep_range kr = detail::keep_bounds(p.keep, len);
  const int k = p.budget_at(row, len) - kr.size(len);
  std::uint32_t lo = 1u;
  if (k > 0 && kr.tail_begin > kr.head_end) {
    lo = detail::score_key(
        detail::threshold_floor(block_row_max<select_block_threads>(sc, len, sm), p.alpha));
  }
  emit_row<select_block_threads, select_items_per_thread>(
      sc, len, kr, lo, k, p.indices + static_cast<std::size_t>(row) * p.capacity, p.counts + row, sm);
}

/// Threshold, infinigen_mean, pass 1: every row's candidate count; -1 for an empty row (not in the
/// mean).
template <int Threads = select_block_threads>
__global__ void __launch_bounds__(Threads)
    threshold_mean_counts(const __grid_constant__ select_params p) {
  static_assert(Threads == select_block_threads, "select_smem is sized for select_block_threads");
  __shared__ select_smem sm;
  const int row = static_cast<int>(blockIdx.x);
  const int s = row / p.num_kv_heads;
  const int len = p.length(s);
  if (len == 0) {
    if (threadIdx.x == 0) p.row_counts[row] = -1;
    return;
  }
  const float* sc = p.scores + static_cast<std::size_t>(row) * p.stride;
  const detail::keep_range kr = detail::keep_bounds(p.keep, len);
  const float floor =
      detail::threshold_floor(block_row_max<select_block_threads>(sc, len, sm), p.alpha);
  const long long c = block_count_at_least<select_block_threads>(sc, kr.head_end, kr.tail_begin, floor, sm);
  if (threadIdx.x == 0) p.row_counts[row] = static_cast<std::int32_t>(c);
}

/// Threshold, infinigen_mean, pass 2: n = floor(mean of the non-empty rows' counts), summed by
/// every block (rows are few); every row takes the keep-set and its best min(n, slots) others.
template <int Threads = select_block_threads>
__global__ void __launch_bounds__(Threads)
    threshold_mean_rows(const __grid_constant__ select_params p) {
  static_assert(Threads == select_block_threads, "select_smem is sized for select_block_threads");
  __shared__ select_smem sm;
  const int rows = p.num_seqs * p.num_kv_heads;
  long long total = 0, nonempty = 0;
  for (int i = static_cast<int>(threadIdx.x); i < rows; i += select_block_threads) {
    const int c = p.row_counts[i];
    total += c >= 0 ? c : 0;
    nonempty += c >= 0 ? 1 : 0;
  }
  total = select_smem::reduce_ll_t(sm.temp.reduce_ll).Reduce(total, sum_op{});
  if (threadIdx.x == 0) sm.broadcast_ll = total;
  __syncthreads();
  total = sm.broadcast_ll;
  __syncthreads();
  nonempty = select_smem::reduce_ll_t(sm.temp.reduce_ll).Reduce(nonempty, sum_op{});
  if (threadIdx.x == 0) sm.broadcast_ll = nonempty;
  __syncthreads();
  nonempty = sm.broadcast_ll;
  __syncthreads();
  const long long mean = nonempty > 0 ? total / nonempty : 0;

  const int row = static_cast<int>(blockIdx.x);
  const int s = row / p.num_kv_heads;
  const int len = p.length(s);
  const float* sc = p.scores + static_cast<std::size_t>(row) * p.stride;
  const detail::keep_range kr = detail::keep_bounds(p.keep, len);
  const int slots = p.budget_at(row, len) - kr.size(len);
  const int k = mean < slots ? static_cast<int>(mean) : slots;
  emit_row<select_block_threads, select_items_per_thread>(
      sc, len, kr, 1u, k, p.indices + static_cast<std::size_t>(row) * p.capacity, p.counts + row, sm);
}

}  // namespace kvscout::detail
