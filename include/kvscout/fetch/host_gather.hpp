#pragma once
// Host gather executor: copies the selected K and V rows from a host KV cache of any layout into
// a contiguous host destination (core/selection.hpp's layout), merging rows that are adjacent in
// both source and destination into one copy, optionally over several threads.
//
//   kvscout::host_gather_config cfg{.shape = shape, .capacity = 512, .threads = 2};
//   std::vector<std::byte> ws(kvscout::gather_executor_host<layout>::workspace_bytes(cfg));
//   kvscout::gather_executor_host<layout> gather(cfg, {ws.data(), ws.size()});
//   gather.submit(source, selection, destination).wait();   // exec: host_exec{}, defaulted
//
// submit() validates everything before it writes a byte (dimensions, buffer sizes, counts, every
// index in range and strictly ascending, no overlaps) and throws kvscout::error naming the bad
// value; it allocates nothing. It cannot see the layout's metadata (a page table): keep the
// destination off it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>

#include "kvscout/core/shape.hpp"
#include "kvscout/core/thread_pool.hpp"
#include "kvscout/core/config.hpp"
#include "kvscout/core/detail/x86_intrinsics.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/fetch/concepts.hpp"
#include "kvscout/fetch/detail/checks.hpp"
#include "kvscout/fetch/stores.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/paged.hpp"

namespace kvscout {

namespace detail {

/// Whether streaming (non-temporal) stores are compiled in: 64-byte ones with AVX-512, 16-byte ones
/// on any other x86-64, plain copies elsewhere.
inline constexpr bool gather_can_stream = KVSCOUT_HOST_SSE2 != 0;
#if KVSCOUT_HOST_AVX512
inline constexpr std::size_t gather_stream_width = 64;
#else
inline constexpr std::size_t gather_stream_width = 16;
#endif

/// With Streaming, by non-temporal stores where dst and n allow them (the caller fences once at the
/// end: stream_fence).
template <bool Streaming>
inline void copy_row_bytes(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
#if KVSCOUT_HOST_SSE2
  if constexpr (Streaming) {
    constexpr std::size_t w = gather_stream_width;
    if (reinterpret_cast<std::uintptr_t>(dst) % w == 0 && n % w == 0) {
#if KVSCOUT_HOST_AVX512
      using reg = __m512i;
      const auto load = [](const std::byte* p) { return _mm512_loadu_si512(p); };
      const auto store = [](std::byte* p, reg x) { _mm512_stream_si512(reinterpret_cast<reg*>(p), x); };
#else
      using reg = __m128i;
      const auto load = [](const std::byte* p) { return _mm_loadu_si128(reinterpret_cast<const reg*>(p)); };
      const auto store = [](std::byte* p, reg x) { _mm_stream_si128(reinterpret_cast<reg*>(p), x); };
#endif
      // Four loads, then four stores: a row's loads are all in flight before the first store waits.
      std::size_t o = 0;
      for (; o + 4 * w <= n; o += 4 * w) {
        const reg a = load(src + o), b = load(src + o + w), c = load(src + o + 2 * w),
                  d = load(src + o + 3 * w);
        store(dst + o, a);
        store(dst + o + w, b);
        store(dst + o + 2 * w, c);
        store(dst + o + 3 * w, d);
      }
      for (; o < n; o += w) store(dst + o, load(src + o));
      return;
    }
  }
#endif
  std::memcpy(dst, src, n);
}

template <bool Streaming>
inline void stream_fence() noexcept {
#if KVSCOUT_HOST_SSE2
  if constexpr (Streaming) _mm_sfence();
#endif
}

// Locality 1 (prefetcht2): the hint measured best.
inline void prefetch_bytes(const std::byte* p, std::size_t bytes) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  constexpr std::size_t line = 64;
  for (std::size_t o = 0; o < bytes; o += line) __builtin_prefetch(p + o, 0, 1);
  if (bytes % line != 0) __builtin_prefetch(p + bytes - 1, 0, 1);
#else
  (void)p, (void)bytes;
#endif
}

/// Copies the selected rows [first, last) of the flattened (sequence, kv_head, entry) order
/// (prefix[r]: selected rows before pair r), prefetching `dist` rows ahead. Entry i of pair r lands
/// at destination row r * capacity + i (Packed = false) or prefix[r] + i (Packed = true: back to
/// back, the staged executor's buffer). Arguments are by value: the copies write through std::byte
/// pointers, which may alias anything, so references would force reloads on every row.
template <bool Packed, bool Streaming = false, kv_layout Layout>
void gather_row_range(const Layout l, const std::byte* const kbase, const std::byte* const vbase,
                      const std::int32_t* const indices, const std::int64_t* const prefix,
                      const std::size_t pairs, const int heads, const std::size_t capacity,
                      const int dist, std::byte* const kdst, std::byte* const vdst,
                      const std::int64_t first, const std::int64_t last) noexcept {
  if (first >= last) return;
  const std::size_t kb = l.k_row_bytes();
  const std::size_t vb = l.v_row_bytes();
  std::size_t r =
      static_cast<std::size_t>(std::upper_bound(prefix, prefix + pairs + 1, first) - prefix) - 1;
  for (std::int64_t row = first; row < last; ++r) {
    const std::int64_t pair_end = std::min<std::int64_t>(prefix[r + 1], last);
    if (row >= pair_end) continue;
    const int s = static_cast<int>(r / static_cast<std::size_t>(heads));
    const int h = static_cast<int>(r % static_cast<std::size_t>(heads));
    const std::int32_t* idx = indices + r * capacity;
    const int i_end = static_cast<int>(pair_end - prefix[r]);
    int i = static_cast<int>(row - prefix[r]);
    const std::size_t dst0 = Packed ? static_cast<std::size_t>(prefix[r]) : r * capacity;
    while (i < i_end) {
      const int t = idx[i];
      if (dist > 0 && dist < i_end - i) {  // (i + dist overflows for a dist near INT_MAX)
        const int ahead = idx[i + dist];
        prefetch_bytes(kbase + l.k_offset(s, ahead, h), kb);
        prefetch_bytes(vbase + l.v_offset(s, ahead, h), vb);
      }
      // Runs of adjacent rows are merged into one memcpy; streaming copies row by row, which keeps
      // more rows' loads in flight.
      int run = 1;
      if constexpr (!Streaming) {
        const int max_run = l.contiguous_rows(s, t, h, i_end - i);
        while (run < max_run && idx[i + run] == t + run) ++run;
      }
      const std::size_t at = dst0 + static_cast<std::size_t>(i);
      copy_row_bytes<Streaming>(kdst + at * kb, kbase + l.k_offset(s, t, h),
                                static_cast<std::size_t>(run) * kb);
      copy_row_bytes<Streaming>(vdst + at * vb, vbase + l.v_offset(s, t, h),
                                static_cast<std::size_t>(run) * vb);
      i += run;
    }
    row = pair_end;
  }
  stream_fence<Streaming>();
}

inline bool gather_streams(gather_stores stores, std::size_t bytes) noexcept {
  if (!gather_can_stream) return false;
  return stores == gather_stores::streaming ||
         (stores == gather_stores::automatic && bytes >= detail::gather_streaming_bytes);
}

}  // namespace detail

struct host_gather_config {
  decode_shape shape{};   // num_seqs, num_kv_heads
  int capacity = 0;       // most rows selected per (sequence, kv_head)
  int threads = 1;        // copying threads, the caller included
  int prefetch_rows = 8;  // software prefetch distance in selected rows (0 turns it off)
  gather_stores stores = gather_stores::automatic;  // how the destination is written
};

template <kv_layout Layout>
class gather_executor_host {
 public:
  using layout_type = Layout;
  using config_type = host_gather_config;
  using source_type = kv_view<Layout, host_space>;
  using selection_type = selection_view<host_space>;
  using destination_type = gather_destination<host_space>;
  using completion_type = ready_completion;
  using exec_type = host_exec;

  /// Workspace: the running row count of every (sequence, kv_head), which splits the rows evenly
  /// between the threads.
  [[nodiscard]] static std::size_t workspace_bytes(const config_type& cfg) {
    check_config(cfg);
    return (static_cast<std::size_t>(cfg.shape.num_seqs) * cfg.shape.num_kv_heads + 1) *
           sizeof(std::int64_t);
  }
  static constexpr std::size_t workspace_alignment = alignof(std::int64_t);

  gather_executor_host(const config_type& cfg, host_span<std::byte> workspace) : cfg_(cfg) {
    const std::size_t need = workspace_bytes(cfg);
    KVSCOUT_EXPECTS(workspace.size() >= need, "workspace holds ", workspace.size(),
                    " bytes, expected at least workspace_bytes(config) = ", need);
    KVSCOUT_EXPECTS(workspace.data() != nullptr, "workspace is null");
    KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(workspace.data()) % workspace_alignment == 0,
                    "workspace must be ", workspace_alignment, "-byte aligned, got address ",
                    static_cast<const void*>(workspace.data()));
    prefix_ = reinterpret_cast<std::int64_t*>(workspace.data());
    pool_ = std::make_unique<thread_pool>(cfg.threads);
  }

  [[nodiscard]] const config_type& configuration() const noexcept { return cfg_; }
  /// The executor's threads (the caller's included), idle between submits: the host pipeline runs
  /// its attention on them too.
  [[nodiscard]] thread_pool& pool() noexcept { return *pool_; }

  completion_type submit(const source_type& src, const selection_type& sel,
                         const destination_type& dst, host_exec exec = {}) {
    (void)exec;
    const std::int64_t total = validate(src, sel, dst);
    if (total == 0) return {};
    const bool streaming = detail::gather_streams(
        cfg_.stores, static_cast<std::size_t>(total) *
                         (src.layout.k_row_bytes() + src.layout.v_row_bytes()));
    pool_->run([&](int part, int parts) noexcept {
      const std::int64_t first = total * part / parts;
      const std::int64_t last = total * (part + 1) / parts;
      if (streaming) {
        copy_rows<true>(src, sel, dst, first, last);
      } else {
        copy_rows<false>(src, sel, dst, first, last);
      }
    });
    return {};
  }

 private:
  static void check_config(const config_type& cfg) {
    KVSCOUT_EXPECTS(cfg.shape.num_seqs >= 0, "num_seqs must be non-negative, got ",
                    cfg.shape.num_seqs);
    KVSCOUT_EXPECTS(cfg.shape.num_kv_heads > 0, "num_kv_heads must be positive, got ",
                    cfg.shape.num_kv_heads);
    KVSCOUT_EXPECTS(cfg.capacity >= 0, "capacity must be non-negative, got ", cfg.capacity);
    KVSCOUT_EXPECTS(cfg.threads >= 1, "threads must be at least 1, got ", cfg.threads);
    KVSCOUT_EXPECTS(cfg.prefetch_rows >= 0, "prefetch_rows must be non-negative, got ",
                    cfg.prefetch_rows);
    KVSCOUT_EXPECTS(cfg.stores == gather_stores::automatic || cfg.stores == gather_stores::cached ||
                        cfg.stores == gather_stores::streaming,
                    "stores ", cfg.stores, " is not one of automatic, cached, streaming");
  }

  std::int64_t validate(const source_type& src, const selection_type& sel,
                        const destination_type& dst) {
    detail::check_fetch_views(cfg_.shape.num_seqs, cfg_.shape.num_kv_heads, cfg_.capacity, src, sel,
                              dst,
                              /*vector_aligned=*/false);
    // The workspace must be apart from everything the submit reads or writes.
    const std::size_t pairs = detail::fetch_pairs(cfg_.shape.num_seqs, cfg_.shape.num_kv_heads);
    const std::size_t slots = pairs * static_cast<std::size_t>(cfg_.capacity);
    using region = std::tuple<const char*, const void*, std::size_t>;
    for (const auto& [what, p, n] :
         {region{"the source K cache", src.k.data(), src.k.size()},
          region{"the source V cache", src.v.data(), src.v.size()},
          region{"the selection's indices", sel.indices.data(), slots * sizeof(std::int32_t)},
          region{"the selection's counts", sel.counts.data(), pairs * sizeof(std::int32_t)},
          region{"the destination K rows", dst.k.data(), slots * src.layout.k_row_bytes()},
          region{"the destination V rows", dst.v.data(), slots * src.layout.v_row_bytes()}}) {
      KVSCOUT_EXPECTS(!detail::bytes_overlap(prefix_, workspace_bytes(cfg_), p, n),
                      "the workspace (", workspace_bytes(cfg_), " bytes at ",
                      static_cast<const void*>(prefix_), ") overlaps ", what, " (", n,
                      " bytes at ", p, ")");
    }
    return detail::check_host_selection(src, sel, prefix_);
  }

  template <bool Streaming>
  void copy_rows(const source_type& src, const selection_type& sel, const destination_type& dst,
                 std::int64_t first, std::int64_t last) const noexcept {
    detail::gather_row_range<false, Streaming>(
        src.layout, src.k.data(), src.v.data(), sel.indices.data(), prefix_,
        static_cast<std::size_t>(cfg_.shape.num_seqs) * cfg_.shape.num_kv_heads,
        cfg_.shape.num_kv_heads, static_cast<std::size_t>(cfg_.capacity), cfg_.prefetch_rows,
        dst.k.data(), dst.v.data(), first, last);
  }

  config_type cfg_;
  std::int64_t* prefix_ = nullptr;
  std::unique_ptr<thread_pool> pool_;
};

static_assert(prefetch_executor<gather_executor_host<contiguous_layout<half, 128, hnd>>>);
static_assert(!device_step_executor<gather_executor_host<contiguous_layout<half, 128, hnd>>>);
static_assert(
    prefetch_executor<gather_executor_host<paged_layout<float, 64, nhd, block_table, 16>>>);

}  // namespace kvscout
