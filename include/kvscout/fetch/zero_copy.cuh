#pragma once
// Zero-copy gather executor: a kernel reads the selected K and V rows straight from mapped pinned
// host memory (the source's base pointers are the device aliases) and writes them to the device
// destination laid out as core/selection.hpp says. The selection stays on the device, so a step
// needs no host round trip and can be captured in a CUDA graph.
//
//   using layout = kvscout::contiguous_layout<kvscout::half, 128, kvscout::hnd>;
//   kvscout::zero_copy_config cfg{.shape = shape, .capacity = 512};
//   kvscout::zero_copy_executor_cuda<layout> fetch(cfg);   // workspace_bytes(cfg) == 0
//   // layout metadata (seq_lens, page tables) must be device-readable (device or mapped memory)
//   auto c = fetch.submit({dev_layout, k_alias, v_alias}, device_selection, device_destination,
//                         {stream, d_status});
//   cudaStreamWaitEvent(compute, c.event(), 0);       // or c.wait()
//
// A grid of at most config.max_blocks blocks (default 8: the SMs the gather may take from
// compute) strides over items of (sequence, kv_head, 128 selected entries); rows are copied as
// 16-byte vectors, `unroll` (4) loads in flight per thread.
//
// submit() validates on the host what the host knows: shapes, sizes, null pointers, 16-byte
// alignment of the bases and row sizes. It does not call layout.validate() (the metadata may be
// device memory): validate the layout once on a host copy when its metadata changes. On the
// device a count outside [0, capacity] is clamped, and a token outside [0, seq_len(s)), a row
// outside the source span or a row not 16-byte aligned is skipped (its destination slot left as
// it was); each raises a bit in exec.status. Ascending order is not checked. Nothing is read or
// written out of bounds whatever the device data holds, as long as the spans' sizes are right.
//
// Row cache: submit(src, sel, dst, cache, exec) copies a selected token device to device from the
// rows a previous submit of the same layer left (row_cache_view) where the cached selection holds
// it; the others cross the link. A cache.row_map entry outside [-1, num_seqs) is treated as -1
// (bad_seq_id); a cached count outside [0, capacity] as 0 (bad_count). The cached buffers must
// not overlap the destination (keep two sets per layer and alternate them by step).
//
// Completion: an event recorded on exec.stream after the kernel; valid until the next submit().

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kvscout/core/detail/launch.cuh"
#include "kvscout/core/device_status.hpp"
#include "kvscout/core/event_completion.hpp"
#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/fetch/concepts.hpp"
#include "kvscout/fetch/detail/cuda_fetch_checks.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/kivi.hpp"
#include "kvscout/kv/paged.hpp"

namespace kvscout {
namespace detail {

// 128 rows of 256-byte K and V rows are 64 KB, four copy passes of 256 threads x 4 vectors per
// resolve (whose dependent loads hold nothing in flight), so a few blocks keep the link busy.
inline constexpr int zero_copy_rows_per_item = 128;
inline constexpr int zero_copy_unroll = 4;
inline constexpr std::size_t zero_copy_skip = ~std::size_t{0};  // offset marker: row skipped

template <class L>
struct zero_copy_params {
  L layout;
  const std::byte* k_src;  // device alias of the (mapped) K base
  const std::byte* v_src;
  std::size_t k_src_bytes;
  std::size_t v_src_bytes;
  const std::int32_t* indices;  // [num_seqs, num_kv_heads, capacity]
  const std::int32_t* counts;   // [num_seqs, num_kv_heads]
  std::byte* k_dst;             // [num_seqs, num_kv_heads, capacity, k_row_bytes]
  std::byte* v_dst;
  int num_kv_heads;
  int capacity;
  int chunks_per_pair;  // ceil(capacity / rows_per_item)
  long long items;      // pairs * chunks_per_pair
  int* status;
  const std::int32_t* cached_indices;  // [num_seqs, num_kv_heads, capacity]
  const std::int32_t* cached_counts;   // [num_seqs, num_kv_heads]
  const std::byte* cached_k;           // [num_seqs, num_kv_heads, capacity, k_row_bytes]
  const std::byte* cached_v;
  unsigned long long* hits;            // optional: rows served from the cache
  const std::int32_t* cached_row_map;  // [num_seqs] batch row -> cached row (-1: none), or null
  int num_seqs;
};

KVSCOUT_HOST_DEVICE int find_sorted(const std::int32_t* row, int n, int t) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (row[mid] < t) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && row[lo] == t ? lo : -1;
}

// Where row t of pair (s, h) comes from: the row cache where it holds t (cached), the source
// otherwise; both offsets zero_copy_skip where the row is skipped (an index out of range, a row
// outside the source or misaligned, reported in the status word).
struct zero_copy_row_source {
  std::size_t k;
  std::size_t v;
  bool cached;
};

template <class L>
__device__ __forceinline__ zero_copy_row_source zero_copy_source_of(const zero_copy_params<L>& p,
                                                                    int s, int h, int t,
                                                                    std::size_t kb,
                                                                    std::size_t vb) {
  constexpr std::size_t V = fetch_vector_bytes;
  const L& l = p.layout;
  constexpr std::size_t skip = zero_copy_skip;
  int cs = s;
  if (p.cached_row_map != nullptr) {
    cs = p.cached_row_map[s];
    if (cs < -1 || cs >= p.num_seqs) {
      raise_device_status(p.status, device_status::bad_seq_id);
      cs = -1;
    }
  }
  if (p.cached_indices != nullptr && cs >= 0 && t >= 0 && t < l.seq_len(s)) {
    const long long cpair = static_cast<long long>(cs) * p.num_kv_heads + h;
    int nc = p.cached_counts[cpair];
    if (nc < 0 || nc > p.capacity) {
      raise_device_status(p.status, device_status::bad_count);
      nc = 0;
    }
    const std::size_t row0 = static_cast<std::size_t>(cpair) * p.capacity;
    const int j = find_sorted(p.cached_indices + row0, nc, t);
    if (j >= 0) {
      if (p.hits != nullptr) atomicAdd(p.hits, 1ull);
      return {(row0 + static_cast<std::size_t>(j)) * kb, (row0 + static_cast<std::size_t>(j)) * vb,
              true};
    }
  }
  if (t < 0 || t >= l.seq_len(s)) {
    raise_device_status(p.status, device_status::bad_index);
    return {skip, skip, false};
  }
  const std::size_t k = l.k_offset(s, t, h), v = l.v_offset(s, t, h);
  if (k > p.k_src_bytes || kb > p.k_src_bytes - k || v > p.v_src_bytes || vb > p.v_src_bytes - v) {
    raise_device_status(p.status, device_status::out_of_bounds);
    return {skip, skip, false};
  }
  if ((k | v) % V != 0) {
    raise_device_status(p.status, device_status::misaligned);
    return {skip, skip, false};
  }
  return {k, v, false};
}

template <class L>
__global__ void zero_copy_gather_kernel(const __grid_constant__ zero_copy_params<L> p) {
  constexpr int R = zero_copy_rows_per_item;
  constexpr int U = zero_copy_unroll;
  constexpr std::size_t V = fetch_vector_bytes;
  __shared__ std::size_t k_off[R];
  __shared__ std::size_t v_off[R];
  __shared__ bool cached[R];  // row r comes from the row cache (offsets into cached_k / cached_v)
  const L& l = p.layout;
  const std::size_t kb = l.k_row_bytes(), vb = l.v_row_bytes();
  const int nk = static_cast<int>(kb / V), nv = static_cast<int>(vb / V);
  const int per_row = nk + nv;
  for (long long item = blockIdx.x; item < p.items; item += gridDim.x) {
    const long long pair = item / p.chunks_per_pair;
    const int first = static_cast<int>(item - pair * p.chunks_per_pair) * R;
    // Every thread reads the same count, so the skip below is uniform across the block.
    int n = p.counts[pair];
    if (n < 0 || n > p.capacity) {
      if (threadIdx.x == 0 && first == 0) raise_device_status(p.status, device_status::bad_count);
      n = n < 0 ? 0 : p.capacity;
    }
    const int rows = n - first < R ? n - first : R;
    if (rows <= 0) continue;
    const int s = static_cast<int>(pair / p.num_kv_heads);
    const int h = static_cast<int>(pair - static_cast<long long>(s) * p.num_kv_heads);
    for (int r = static_cast<int>(threadIdx.x); r < rows; r += static_cast<int>(blockDim.x)) {
      const std::size_t slot = static_cast<std::size_t>(pair) * p.capacity + first + r;
      const zero_copy_row_source src = zero_copy_source_of(p, s, h, p.indices[slot], kb, vb);
      k_off[r] = src.k;
      v_off[r] = src.v;
      cached[r] = src.cached;
    }
    __syncthreads();
    const std::size_t slot0 = static_cast<std::size_t>(pair) * p.capacity + first;
    std::byte* const kd = p.k_dst + slot0 * kb;
    std::byte* const vd = p.v_dst + slot0 * vb;
    const int total = rows * per_row;
    for (int base = threadIdx.x; base < total; base += U * blockDim.x) {
      uint4 val[U];
      std::byte* to[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        to[u] = nullptr;
        const int j = base + u * static_cast<int>(blockDim.x);
        if (j < total) {
          const int r = j / per_row;
          const int c = j - r * per_row;
          const bool is_k = c < nk;
          const std::size_t off = is_k ? k_off[r] : v_off[r];
          if (off != zero_copy_skip) {
            const std::byte* kbase = cached[r] ? p.cached_k : p.k_src;
            const std::byte* vbase = cached[r] ? p.cached_v : p.v_src;
            const std::byte* from = is_k ? kbase + off + c * V : vbase + off + (c - nk) * V;
            to[u] = is_k ? kd + r * kb + c * V : vd + r * vb + (c - nk) * V;
            val[u] = *reinterpret_cast<const uint4*>(from);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (to[u] != nullptr) *reinterpret_cast<uint4*>(to[u]) = val[u];
      }
    }
    __syncthreads();  // k_off / v_off are rewritten by the next item
  }
}

}  // namespace detail

struct row_cache_view {
  selection_view<device_space> selection;
  gather_destination<device_space> rows;
  unsigned long long* hits = nullptr;  // optional device counter: rows served from the cache
  /// [num_seqs], where batch rows changed sequence since: for each batch row, the row of
  /// `selection` that holds its sequence, or -1 for none; empty: row s is cached row s.
  device_span<const std::int32_t> row_map = {};
};

template <kv_layout Layout>
class zero_copy_executor_cuda {
 public:
  static_assert(detail::layout_passes_to_kernels<Layout>());
  using layout_type = Layout;
  using config_type = zero_copy_config;
  using source_type = kv_view<Layout, device_space>;
  using selection_type = selection_view<device_space>;
  using destination_type = gather_destination<device_space>;
  using completion_type = event_completion;
  using exec_type = cuda_exec;

  static constexpr std::size_t workspace_alignment = 1;
  [[nodiscard]] static std::size_t workspace_bytes(const config_type& cfg) {
    detail::check_zero_copy_config(cfg);
    return 0;
  }

  explicit zero_copy_executor_cuda(const config_type& cfg, device_span<std::byte> workspace = {})
      : cfg_(cfg) {
    (void)workspace;
    detail::check_zero_copy_config(cfg);
    if (cfg_.max_blocks == 0) cfg_.max_blocks = detail::zero_copy_default_blocks;
  }

  [[nodiscard]] const config_type& configuration() const noexcept { return cfg_; }
  [[nodiscard]] cudaEvent_t event() const noexcept { return event_.get(); }

  completion_type submit(const source_type& src, const selection_type& sel,
                         const destination_type& dst, const exec_type& exec) {
    return launch(src, sel, dst, nullptr, exec);
  }

  completion_type submit(const source_type& src, const selection_type& sel,
                         const destination_type& dst, const row_cache_view& cache,
                         const exec_type& exec) {
    return launch(src, sel, dst, &cache, exec);
  }

 private:
  completion_type launch(const source_type& src, const selection_type& sel,
                         const destination_type& dst, const row_cache_view* cache,
                         const exec_type& exec) {
    detail::check_fetch_views(cfg_.shape.num_seqs, cfg_.shape.num_kv_heads, cfg_.capacity, src, sel,
                              dst,
                              /*vector_aligned=*/true);
    if (cache != nullptr) check_cache(src.layout, *cache, dst);
    const long long pairs = static_cast<long long>(cfg_.shape.num_seqs) * cfg_.shape.num_kv_heads;
    const int chunks = (cfg_.capacity + detail::zero_copy_rows_per_item - 1) /
                       detail::zero_copy_rows_per_item;
    const long long items = pairs * chunks;
    if (items > 0) {
      detail::zero_copy_params<Layout> p{src.layout,
                                         src.k.data(),
                                         src.v.data(),
                                         src.k.size(),
                                         src.v.size(),
                                         sel.indices.data(),
                                         sel.counts.data(),
                                         dst.k.data(),
                                         dst.v.data(),
                                         cfg_.shape.num_kv_heads,
                                         cfg_.capacity,
                                         chunks,
                                         items,
                                         exec.status,
                                         cache ? cache->selection.indices.data() : nullptr,
                                         cache ? cache->selection.counts.data() : nullptr,
                                         cache ? cache->rows.k.data() : nullptr,
                                         cache ? cache->rows.v.data() : nullptr,
                                         cache ? cache->hits : nullptr,
                                         cache && !cache->row_map.empty() ? cache->row_map.data()
                                                                          : nullptr,
                                         cfg_.shape.num_seqs};
      const long long grid = items < cfg_.max_blocks ? items : cfg_.max_blocks;
      detail::launch(detail::zero_copy_gather_kernel<Layout>, static_cast<unsigned>(grid),
                     static_cast<unsigned>(cfg_.threads_per_block), 0, exec.stream, p);
      KVSCOUT_CUDA_CHECK(cudaGetLastError());
    }
    event_.record(exec.stream);
    return completion_type{event_.get()};
  }

  void check_cache(const Layout& l, const row_cache_view& c, const destination_type& dst) const {
    const auto& cs = c.selection;
    KVSCOUT_EXPECTS(cs.num_seqs == cfg_.shape.num_seqs &&
                        cs.num_kv_heads == cfg_.shape.num_kv_heads && cs.capacity == cfg_.capacity,
                    "row cache selection shape [", cs.num_seqs, ", ", cs.num_kv_heads, ", ",
                    cs.capacity, "] differs from the executor's [", cfg_.shape.num_seqs, ", ",
                    cfg_.shape.num_kv_heads, ", ", cfg_.capacity, "]");
    const std::size_t pairs =
        static_cast<std::size_t>(cfg_.shape.num_seqs) * cfg_.shape.num_kv_heads;
    const std::size_t slots = pairs * static_cast<std::size_t>(cfg_.capacity);
    KVSCOUT_EXPECTS((cs.indices.data() != nullptr && cs.counts.data() != nullptr) || slots == 0,
                    "row cache selection indices or counts is null");
    KVSCOUT_EXPECTS(cs.indices.size() >= slots && cs.counts.size() >= pairs,
                    "row cache selection holds ", cs.indices.size(), " indices / ",
                    cs.counts.size(), " counts, expected ", slots, " / ", pairs);
    KVSCOUT_EXPECTS(
        c.row_map.empty() || (c.row_map.data() != nullptr &&
                              c.row_map.size() >= static_cast<std::size_t>(cfg_.shape.num_seqs)),
        "row cache row_map holds ", c.row_map.size(),
        " entries, expected num_seqs = ", cfg_.shape.num_seqs, " (or none)");
    const std::size_t k_need = slots * l.k_row_bytes(), v_need = slots * l.v_row_bytes();
    KVSCOUT_EXPECTS(c.rows.k.size() >= k_need && c.rows.v.size() >= v_need, "row cache rows hold ",
                    c.rows.k.size(), " / ", c.rows.v.size(), " bytes (K / V), expected ", k_need,
                    " / ", v_need);
    KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(c.rows.k.data()) % detail::fetch_vector_bytes == 0 &&
                        reinterpret_cast<std::uintptr_t>(c.rows.v.data()) % detail::fetch_vector_bytes == 0,
                    "row cache rows must be ", detail::fetch_vector_bytes, "-byte aligned");
    auto overlap = [](const std::byte* a, std::size_t na, const std::byte* b, std::size_t nb) {
      const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
      return na > 0 && nb > 0 && x < y + nb && y < x + na;
    };
    KVSCOUT_EXPECTS(!overlap(c.rows.k.data(), k_need, dst.k.data(), k_need) &&
                        !overlap(c.rows.v.data(), v_need, dst.v.data(), v_need) &&
                        !overlap(c.rows.k.data(), k_need, dst.v.data(), v_need) &&
                        !overlap(c.rows.v.data(), v_need, dst.k.data(), k_need),
                    "the row cache's rows overlap the destination: keep two buffer sets per "
                    "layer and alternate them");
  }

  config_type cfg_;
  cuda_event event_;
};

static_assert(prefetch_executor<zero_copy_executor_cuda<contiguous_layout<half, 128, hnd>>>);
static_assert(prefetch_executor<
              zero_copy_executor_cuda<paged_layout<half, 128, nhd, flashinfer_page_table, 16>>>);
static_assert(prefetch_executor<zero_copy_executor_cuda<kivi_layout<half, 128, 2>>>);
static_assert(device_step_executor<zero_copy_executor_cuda<contiguous_layout<half, 128, hnd>>>);

}  // namespace kvscout
