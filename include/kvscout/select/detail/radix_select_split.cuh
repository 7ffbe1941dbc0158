#pragma once
// Selection of long rows by several blocks per row (where rows are few and long). The same keys,
// digit plan, cut and output as the one-block kernels of radix_select.cuh, bit for bit: only who
// counts changes. Grid (chunks, rows) for every kernel; chunk c of a row holds its tokens
// [c * chunk_tokens, (c + 1) * chunk_tokens).
//
//   split_row_max     (threshold, per_head) each chunk's largest non-NaN score -> chunk_max
//   split_hist        one per radix pass: each chunk's histogram added to the row's global one;
//                     the row's last block to finish (an arrival counter) finds the digit, writes
//                     the row's state (or the final cut), then clears the histogram and counter
//   split_count       each chunk's (greater, equal) counts against the row's cut
//   split_scatter     each chunk's ordered compaction, at the offsets its earlier chunks' counts
//                     give; chunk 0 writes the keep-set's head, the last chunk its tail and count
// select() clears the histograms and counters before split_hist's first pass, so the workspace
// needs no initial contents. Every decision a block makes from a row's length is made alike by
// all its blocks.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/detail/launch.cuh"
#include "kvscout/select/detail/radix_select.cuh"

namespace kvscout::detail {

struct select_split_row {
  std::uint32_t prefix;  // the digits found so far
  std::uint32_t known;   // the bits they cover
  int kk;                // the wanted key's rank among the candidates that agree with prefix
  std::uint32_t lo;      // the candidates' key floor
  std::uint32_t cut_key; // the final cut (valid once done)
  int cut_ties;
  int done;              // the cut is final
  unsigned arrivals;     // blocks of the running split_hist that finished
};
static_assert(sizeof(select_split_row) == select_split_state_bytes);

struct split_select_params {
  select_params p;
  int chunks;
  int chunk_tokens;
  bool topk;                        // top-k (else threshold, per_head)
  select_split_row* state;          // [rows]
  std::uint32_t* hist;              // [rows, radix_buckets]
  unsigned long long* chunk_counts; // [rows, chunks] (equal << 32 | greater)
  float* chunk_max;                 // [rows, chunks]
};

struct split_row_shape {
  int len;
  detail::keep_range kr;
  int k;       // slots for chosen tokens outside the keep-set
  bool all;    // top-k: the whole row fits (taken, NaN included)
  bool select; // a cut is needed (k > 0 and the range between the keep-set's ends is not empty)
};

KVSCOUT_DEVICE split_row_shape split_shape(const split_select_params& sp, int row) {
  split_row_shape r{};
  r.len = sp.p.length(row / sp.p.num_kv_heads);
  const int budget = sp.p.budget_at(row, r.len);
  r.all = sp.topk && r.len <= budget;
  r.kr = detail::keep_bounds(sp.p.keep, r.len);
  r.k = budget - r.kr.size(r.len);
  r.select = !r.all && r.k > 0 && r.kr.tail_begin > r.kr.head_end;
  return r;
}

KVSCOUT_DEVICE void chunk_range(const split_select_params& sp, int c, int a, int b, int* lo_out,
                                int* hi_out) {
  const long long c0 = static_cast<long long>(c) * sp.chunk_tokens;
  const long long c1 = c0 + sp.chunk_tokens;
  *lo_out = static_cast<int>(c0 > a ? c0 : a);
  *hi_out = static_cast<int>(c1 < b ? c1 : b);
}

template <int Threads = select_block_threads>
__global__ void __launch_bounds__(Threads) split_row_max(const __grid_constant__ split_select_params sp) {
  __shared__ select_smem sm;
  const int row = static_cast<int>(blockIdx.y), c = static_cast<int>(blockIdx.x);
  const split_row_shape r = split_shape(sp, row);
  if (!r.select) return;
  int a = 0, b = 0;
  chunk_range(sp, c, 0, r.len, &a, &b);  // the keep-set counts toward the maximum
  const float* sc = sp.p.scores + static_cast<std::size_t>(row) * sp.p.stride;
  float m = -INFINITY;
  for (int i = a + static_cast<int>(threadIdx.x); i < b; i += Threads) m = fmaxf(m, sc[i]);
  m = select_smem::reduce_f_t(sm.temp.reduce_f).Reduce(m, max_op{});
  if (threadIdx.x == 0) sp.chunk_max[static_cast<std::size_t>(row) * sp.chunks + c] = m;
}

template <int Threads = select_block_threads>
__global__ void __launch_bounds__(Threads)
    split_hist(const __grid_constant__ split_select_params sp, int pass) {
  __shared__ select_smem sm;
  __shared__ int last;
  constexpr int top = 32;
  const int tid = static_cast<int>(threadIdx.x);
  const int row = static_cast<int>(blockIdx.y), c = static_cast<int>(blockIdx.x);
  const split_row_shape r = split_shape(sp, row);
  if (!r.select) return;
  select_split_row* st = sp.state + row;
  std::uint32_t lo = 1u, prefix = 0u, known = 0u;
  int kk = r.k;
  if (pass == 0) {
    if (!sp.topk) {  // the row's maximum from its chunks' (every block forms the same one)
      float m = -INFINITY;
      for (int i = 0; i < sp.chunks; ++i)
        m = fmaxf(m, sp.chunk_max[static_cast<std::size_t>(row) * sp.chunks + i]);
      lo = detail::score_key(detail::threshold_floor(m, sp.p.alpha));
    }
  } else {
    const volatile select_split_row* vs = st;
    if (vs->done) return;
    lo = vs->lo;
    prefix = vs->prefix;
    known = vs->known;
    kk = vs->kk;
  }
  const radix_digit d = radix_plan(top, pass, 0u);
  const int nb = 1 << d.bits;
  for (int i = tid; i < nb; i += Threads) sm.hist[i] = 0;
  __syncthreads();
  int a = 0, b = 0;
  chunk_range(sp, c, r.kr.head_end, r.kr.tail_begin, &a, &b);
  const float* sc = sp.p.scores + static_cast<std::size_t>(row) * sp.p.stride;
  for (int i = a + tid; i < b; i += Threads) {
    const std::uint32_t key = detail::score_key(sc[i]);
    if (key >= lo && (key & known) == prefix) atomicAdd(&sm.hist[d.of(key)], 1u);
  }
  __syncthreads();
  std::uint32_t* gh = sp.hist + static_cast<std::size_t>(row) * radix_buckets;
  for (int i = tid; i < nb; i += Threads)
    if (sm.hist[i] != 0u) atomicAdd(&gh[i], sm.hist[i]);
  // The last block of the row to arrive sees every block's counts (the fence orders each block's
  // adds before its arrival).
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(&st->arrivals, 1u) == static_cast<unsigned>(sp.chunks - 1) ? 1 : 0;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const volatile std::uint32_t* vgh = gh;
  int bucket = 0, rank = 0;
  const int total = block_find_bucket<Threads>(
      nb, kk, [&](int i) { return vgh[i]; }, sm, &bucket, &rank);
  for (int i = tid; i < nb; i += Threads) gh[i] = 0u;  // for the next pass
  if (tid == 0) {
    st->arrivals = 0u;
    st->lo = lo;
    if (pass == 0 && total <= kk) {  // every candidate fits: all are taken
      st->cut_key = lo - 1u;
      st->cut_ties = 0;
      st->done = 1;
    } else {
      const std::uint32_t np = prefix | (static_cast<std::uint32_t>(bucket) << d.shift);
      st->prefix = np;
      st->known = known | (static_cast<std::uint32_t>(nb - 1) << d.shift);
      st->kk = rank;
      if (pass + 1 == radix_passes(top)) {
        const radix_cut cut = radix_cut_at(np, rank);
        st->cut_key = cut.key;
        st->cut_ties = cut.ties;
        st->done = 1;
      } else {
        st->done = 0;
      }
    }
  }
}

template <int Threads = select_block_threads>
__global__ void __launch_bounds__(Threads) split_count(const __grid_constant__ split_select_params sp) {
  __shared__ select_smem sm;
  const int row = static_cast<int>(blockIdx.y), c = static_cast<int>(blockIdx.x);
  const split_row_shape r = split_shape(sp, row);
  if (!r.select) return;
  const select_split_row* st = sp.state + row;
  const std::uint32_t cut_key = st->cut_key;
  int a = 0, b = 0;
  chunk_range(sp, c, r.kr.head_end, r.kr.tail_begin, &a, &b);
  const float* sc = sp.p.scores + static_cast<std::size_t>(row) * sp.p.stride;
  long long gt = 0, eq = 0;
  for (int i = a + static_cast<int>(threadIdx.x); i < b; i += Threads) {
    const std::uint32_t key = detail::score_key(sc[i]);
    gt += key > cut_key ? 1 : 0;
    eq += key == cut_key ? 1 : 0;
  }
  gt = select_smem::reduce_ll_t(sm.temp.reduce_ll).Reduce(gt, sum_op{});
  __syncthreads();
  eq = select_smem::reduce_ll_t(sm.temp.reduce_ll).Reduce(eq, sum_op{});
  if (threadIdx.x == 0)
    sp.chunk_counts[static_cast<std::size_t>(row) * sp.chunks + c] =
        (static_cast<unsigned long long>(eq) << 32) | static_cast<unsigned long long>(gt);
}

template <int Threads = select_block_threads, int Items = select_items_per_thread>
__global__ void __launch_bounds__(Threads)
    split_scatter(const __grid_constant__ split_select_params sp) {
  __shared__ select_smem sm;
  const int tid = static_cast<int>(threadIdx.x);
  const int row = static_cast<int>(blockIdx.y), c = static_cast<int>(blockIdx.x);
  const split_row_shape r = split_shape(sp, row);
  std::int32_t* out = sp.p.indices + static_cast<std::size_t>(row) * sp.p.capacity;
  std::int32_t* count = sp.p.counts + row;
  if (r.all) {  // every token, in chunks
    int a = 0, b = 0;
    chunk_range(sp, c, 0, r.len, &a, &b);
    for (int t = a + tid; t < b; t += Threads) out[t] = t;
    if (c == 0 && tid == 0) *count = r.len;
    return;
  }
  const int a = r.kr.head_end, b = r.kr.tail_begin;
  int chosen = 0;
  if (r.select) {
    const select_split_row* st = sp.state + row;
    const radix_cut cut{st->cut_key, st->cut_ties};
    const unsigned long long* cc = sp.chunk_counts + static_cast<std::size_t>(row) * sp.chunks;
    unsigned long long gt_base = 0, eq_base = 0, gt_all = 0, eq_all = 0;
    for (int i = 0; i < sp.chunks; ++i) {
      const unsigned long long v = cc[i];
      if (i < c) {
        gt_base += v & 0xffffffffull;
        eq_base += v >> 32;
      }
      gt_all += v & 0xffffffffull;
      eq_all += v >> 32;
    }
    const unsigned long long ties = static_cast<unsigned long long>(cut.ties);
    chosen = static_cast<int>(gt_all + (eq_all < ties ? eq_all : ties));
    int ca = 0, cb = 0;
    chunk_range(sp, c, a, b, &ca, &cb);
    if (cb > ca) block_compact<Threads, Items>(sp.p.scores + static_cast<std::size_t>(row) * sp.p.stride,
                                              ca, cb, cut, out + a, sm, gt_base, eq_base);
  }
  if (c == 0)
    for (int t = tid; t < a; t += Threads) out[t] = t;
  if (c == sp.chunks - 1) {
    for (int t = b + tid; t < r.len; t += Threads) out[a + chosen + (t - b)] = t;
    if (tid == 0) *count = a + chosen + (r.len - b);
  }
}

/// opt.num_sms = 0: the device's SM count, asked here, at setup. One block per row where no device
/// could split such rows or there is no device.
inline select_split device_select_split(int num_seqs, int num_kv_heads, int stride,
                                        select_split_options opt) {
  if (max_select_chunks(stride, opt) <= 1) return {1, stride};
  if (opt.num_sms == 0) opt.num_sms = current_sm_count();
  if (opt.num_sms < 1) return {1, stride};
  return plan_select_split(static_cast<long long>(num_seqs) * num_kv_heads, stride, opt);
}

/// Clears the histograms and arrival counters, then enqueues the kernels in order.
inline void run_split_select(const split_select_params& sp, cudaStream_t stream) {
  const std::size_t rows = static_cast<std::size_t>(sp.p.num_seqs) * sp.p.num_kv_heads;
  KVSCOUT_CUDA_CHECK(cudaMemsetAsync(sp.state, 0, rows * sizeof(select_split_row), stream));
  KVSCOUT_CUDA_CHECK(cudaMemsetAsync(sp.hist, 0, rows * radix_buckets * sizeof(std::uint32_t), stream));
  const dim3 grid(static_cast<unsigned>(sp.chunks), static_cast<unsigned>(rows));
  if (!sp.topk) launch(split_row_max<>, grid, select_block_threads, 0, stream, sp);
  for (int pass = 0; pass < radix_passes(32); ++pass)
    launch(split_hist<>, grid, select_block_threads, 0, stream, sp, pass);
  launch(split_count<>, grid, select_block_threads, 0, stream, sp);
  launch(split_scatter<>, grid, select_block_threads, 0, stream, sp);
  KVSCOUT_CUDA_CHECK(cudaGetLastError());
}

inline split_select_params split_params_in(const select_params& p, select_split split, bool topk,
                                           std::byte* ws, int max_chunks) {
  const std::size_t rows = static_cast<std::size_t>(p.num_seqs) * p.num_kv_heads;
  split_select_params sp{};
  sp.p = p;
  sp.chunks = split.chunks;
  sp.chunk_tokens = split.chunk_tokens;
  sp.topk = topk;
  sp.hist = reinterpret_cast<std::uint32_t*>(ws);
  ws += rows * radix_buckets * sizeof(std::uint32_t);
  sp.state = reinterpret_cast<select_split_row*>(ws);
  ws += rows * sizeof(select_split_row);
  sp.chunk_counts = reinterpret_cast<unsigned long long*>(ws);
  ws += rows * static_cast<std::size_t>(max_chunks) * sizeof(unsigned long long);
  sp.chunk_max = reinterpret_cast<float*>(ws);
  return sp;
}

}  // namespace kvscout::detail
