#pragma once
// Host gather executor: copies the selected K and V rows from a host KV cache of any layout into
// a contiguous host destination, merging rows that are adjacent in both source and destination
// into one copy, optionally over several threads.
//
//   using layout = kvscout::contiguous_layout<kvscout::half, 128, kvscout::hnd>;
//   kvscout::host_gather_config cfg{.num_seqs = 1, .num_kv_heads = 8, .capacity = 512,
//                                   .threads = 2};
//   std::vector<std::byte> ws(kvscout::host_gather_executor<layout>::workspace_bytes(cfg));
//   kvscout::host_gather_executor<layout> gather(cfg, {ws.data(), ws.size()});
//   gather.submit(source, selection, destination).wait();
//
// submit() validates everything it is given before it writes a byte (dimensions, buffer sizes,
// counts, every index: in range and strictly ascending) and throws kvscout::error naming the bad
// value; it allocates nothing. The destination layout is the one core/selection.hpp describes.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "kvscout/backend/host/thread_pool.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/fetch/concepts.hpp"
#include "kvscout/fetch/detail/checks.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/paged.hpp"

namespace kvscout {

namespace detail {

inline void prefetch_bytes(const std::byte* p, std::size_t bytes) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  constexpr std::size_t line = 64;
  for (std::size_t o = 0; o < bytes; o += line) __builtin_prefetch(p + o, 0, 0);
  // A row that does not start on a line may end on one more (e.g. 48-byte KIVI-2 records).
  if (bytes % line != 0) __builtin_prefetch(p + bytes - 1, 0, 0);
#else
  (void)p, (void)bytes;
#endif
}

/// Copies the selected rows [first, last) of the flattened (sequence, kv_head, entry) order, where
/// prefix[r] is the number of selected rows before pair r, merging runs adjacent in the source
/// and prefetching `dist` rows ahead. Entry i of pair r lands at destination row
/// r * capacity + i (Packed = false: the layout of core/selection.hpp) or prefix[r] + i
/// (Packed = true: back to back, the staged executor's staging buffer). Arguments are taken by
/// value: the copies write through std::byte pointers, which may alias anything, and references
/// into the caller's structs would force reloads on every row.
template <bool Packed, kv_layout Layout>
void gather_row_range(const Layout l, const std::byte* const kbase, const std::byte* const vbase,
                      const std::int32_t* const indices, const std::int64_t* const prefix,
                      const std::size_t pairs, const int heads, const std::size_t capacity,
                      const int dist, std::byte* const kdst, std::byte* const vdst,
                      const std::int64_t first, const std::int64_t last) noexcept {
  if (first >= last) return;
  const std::size_t kb = l.k_row_bytes();
  const std::size_t vb = l.v_row_bytes();
  // The pair holding row `first`: the last r with prefix[r] <= first.
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
      // Rows are scattered: keep `dist` rows of loads in flight ahead of the copies.
      if (dist > 0 && i + dist < i_end) {
        const int ahead = idx[i + dist];
        prefetch_bytes(kbase + l.k_offset(s, ahead, h), kb);
        prefetch_bytes(vbase + l.v_offset(s, ahead, h), vb);
      }
      const int max_run = l.contiguous_rows(s, t, h, i_end - i);
      int run = 1;
      while (run < max_run && idx[i + run] == t + run) ++run;
      const std::size_t at = dst0 + static_cast<std::size_t>(i);
      std::memcpy(kdst + at * kb, kbase + l.k_offset(s, t, h), static_cast<std::size_t>(run) * kb);
      std::memcpy(vdst + at * vb, vbase + l.v_offset(s, t, h), static_cast<std::size_t>(run) * vb);
      i += run;
    }
    row = pair_end;
  }
}

}  // namespace detail

struct host_gather_config {
  int num_seqs = 0;
  int num_kv_heads = 0;
  int capacity = 0;       // most rows selected per (sequence, kv_head)
  int threads = 1;        // copying threads, the caller included
  int prefetch_rows = 8;  // software prefetch distance in selected rows (0 turns it off)
};

template <kv_layout Layout>
class host_gather_executor {
 public:
  using layout_type = Layout;
  using config_type = host_gather_config;
  using source_type = kv_view<Layout, host_space>;
  using selection_type = selection_view<host_space>;
  using destination_type = gather_destination<host_space>;
  using completion_type = ready_completion;

  /// Workspace: the running row count of every (sequence, kv_head), which splits the rows
  /// evenly between the threads.
  static std::size_t workspace_bytes(const config_type& cfg) {
    check_config(cfg);
    return (static_cast<std::size_t>(cfg.num_seqs) * cfg.num_kv_heads + 1) * sizeof(std::int64_t);
  }

  host_gather_executor(const config_type& cfg, host_span<std::byte> workspace) : cfg_(cfg) {
    const std::size_t need = workspace_bytes(cfg);
    KVSCOUT_EXPECTS(workspace.size() >= need, "workspace holds ", workspace.size(),
                    " bytes, expected at least workspace_bytes(config) = ", need);
    KVSCOUT_EXPECTS(workspace.data() != nullptr, "workspace is null");
    KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(workspace.data()) % alignof(std::int64_t) == 0,
                    "workspace must be ", alignof(std::int64_t), "-byte aligned");
    prefix_ = reinterpret_cast<std::int64_t*>(workspace.data());
    pool_ = std::make_unique<thread_pool>(cfg.threads);
  }

  [[nodiscard]] const config_type& config() const noexcept { return cfg_; }

  completion_type submit(const source_type& src, const selection_type& sel,
                         const destination_type& dst) {
    const std::int64_t total = validate(src, sel, dst);
    if (total == 0) return {};
    pool_->run([&](int part, int parts) noexcept {
      const std::int64_t first = total * part / parts;
      const std::int64_t last = total * (part + 1) / parts;
      copy_rows(src, sel, dst, first, last);
    });
    return {};
  }

 private:
  static void check_config(const config_type& cfg) {
    KVSCOUT_EXPECTS(cfg.num_seqs >= 0, "num_seqs must be non-negative, got ", cfg.num_seqs);
    KVSCOUT_EXPECTS(cfg.num_kv_heads > 0, "num_kv_heads must be positive, got ",
                    cfg.num_kv_heads);
    KVSCOUT_EXPECTS(cfg.capacity >= 0, "capacity must be non-negative, got ", cfg.capacity);
    KVSCOUT_EXPECTS(cfg.threads >= 1, "threads must be at least 1, got ", cfg.threads);
    KVSCOUT_EXPECTS(cfg.prefetch_rows >= 0, "prefetch_rows must be non-negative, got ",
                    cfg.prefetch_rows);
  }

  // Checks every input and fills prefix_ with the running row counts; returns the total.
  std::int64_t validate(const source_type& src, const selection_type& sel,
                        const destination_type& dst) {
    detail::check_fetch_views(cfg_.num_seqs, cfg_.num_kv_heads, cfg_.capacity, src, sel, dst,
                              /*vector_aligned=*/false);
    return detail::check_host_selection(src, sel, prefix_);
  }

  // Copies the selected rows [first, last) of the flattened (sequence, kv_head, entry) order.
  void copy_rows(const source_type& src, const selection_type& sel, const destination_type& dst,
                 std::int64_t first, std::int64_t last) const noexcept {
    detail::gather_row_range<false>(
        src.layout, src.k.data(), src.v.data(), sel.indices.data(), prefix_,
        static_cast<std::size_t>(cfg_.num_seqs) * cfg_.num_kv_heads, cfg_.num_kv_heads,
        static_cast<std::size_t>(cfg_.capacity), cfg_.prefetch_rows, dst.k.data(), dst.v.data(),
        first, last);
  }

  config_type cfg_;
  std::int64_t* prefix_ = nullptr;
  std::unique_ptr<thread_pool> pool_;
};

static_assert(prefetch_executor<host_gather_executor<contiguous_layout<half, 128, hnd>>>);
static_assert(
    prefetch_executor<host_gather_executor<paged_layout<float, 64, nhd, block_table, 16>>>);

}  // namespace kvscout
