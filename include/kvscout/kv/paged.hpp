#pragma once
// Paged KV layout: fixed-size pages of tokens, a page table per sequence.
//
// Page memory (K and V in separate buffers of the same shape):
//   NHD  [num_pages, page_size, kv_heads, head_dim]     (vLLM flash layout, FlashInfer NHD)
//   HND  [num_pages, kv_heads, page_size, head_dim]     (FlashInfer HND)
// `page_stride` (elements between consecutive pages) defaults to page_size * kv_heads * head_dim;
// a larger stride describes pages that interleave K and V ([num_pages, 2, ...]): pass the same
// buffer with the V base offset by one half-page. PageSize: static, or dynamic_extent.
//
//   auto l = kvscout::paged_layout<kvscout::half, 128, kvscout::hnd,
//                                  kvscout::flashinfer_page_table, 16>(pt, /*num_kv_heads=*/8);

#include <cstddef>
#include <cstdint>
#include <limits>
#include <sstream>
#include <type_traits>

#include "kvscout/core/config.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/kv/page_table.hpp"

namespace kvscout {

template <kv_element T, int HeadDim, detail::kv_order Order, page_table PageTable,
          int PageSize = dynamic_extent>
class paged_layout {
  static_assert(HeadDim > 0 && HeadDim % detail::vec_width<T> == 0,
                "kvscout::paged_layout: HeadDim must be a positive multiple of the 16-byte vector "
                "width of T");
  static_assert(PageSize == dynamic_extent || PageSize > 0,
                "kvscout::paged_layout: PageSize must be positive or kvscout::dynamic_extent");

 public:
  using element_type = T;
  using order = Order;
  using page_table_type = PageTable;
  static constexpr int head_dim = HeadDim;
  static constexpr int static_page_size = PageSize;

  paged_layout() = default;

  paged_layout(PageTable table, int num_kv_heads, std::int64_t page_stride = 0)
    requires(PageSize != dynamic_extent)
      : table_(table), num_kv_heads_(num_kv_heads) {
    init(PageSize, page_stride);
  }

  paged_layout(PageTable table, int num_kv_heads, int page_size, std::int64_t page_stride = 0)
    requires(PageSize == dynamic_extent)
      : table_(table), num_kv_heads_(num_kv_heads) {
    init(page_size, page_stride);
  }

  KVSCOUT_HOST_DEVICE int num_seqs() const { return table_.num_seqs(); }
  KVSCOUT_HOST_DEVICE int num_kv_heads() const { return num_kv_heads_; }
  KVSCOUT_HOST_DEVICE int page_size() const {
    if constexpr (PageSize == dynamic_extent) {
      return page_size_;
    } else {
      return PageSize;
    }
  }
  KVSCOUT_HOST_DEVICE std::int64_t page_stride() const { return page_stride_; }
  KVSCOUT_HOST_DEVICE const PageTable& table() const { return table_; }

  KVSCOUT_HOST_DEVICE int seq_len(int s) const { return table_.seq_len(s, page_size()); }

  KVSCOUT_HOST_DEVICE std::size_t k_row_bytes() const { return row_bytes; }
  KVSCOUT_HOST_DEVICE std::size_t v_row_bytes() const { return row_bytes; }

  KVSCOUT_HOST_DEVICE std::size_t k_offset(int s, int t, int h) const {
    const int p = page_size();
    const std::int64_t page = table_.page(s, t / p);
    const std::int64_t slot = t % p;
    std::int64_t in_page;
    if constexpr (std::is_same_v<Order, nhd>) {
      in_page = (slot * num_kv_heads_ + h) * HeadDim;
    } else {
      in_page = (static_cast<std::int64_t>(h) * p + slot) * HeadDim;
    }
    return static_cast<std::size_t>(page * page_stride_ + in_page) * sizeof(T);
  }
  KVSCOUT_HOST_DEVICE std::size_t v_offset(int s, int t, int h) const { return k_offset(s, t, h); }

  /// Within a page, rows of a head are adjacent when the token stride is one row (HND, or NHD with
  /// one KV head); a run continues into the next page when that page follows in memory.
  KVSCOUT_HOST_DEVICE int contiguous_rows(int s, int t, int h, int n) const {
    if (n <= 0) return 0;
    const bool rows_adjacent = std::is_same_v<Order, hnd> || num_kv_heads_ == 1;
    if (!rows_adjacent) return 1;
    const int p = page_size();
    const int len = seq_len(s);
    const int limit = (n < len - t) ? n : len - t;
    int run = p - t % p;
    while (run < limit &&
           k_offset(s, t + run, h) == k_offset(s, t, h) + static_cast<std::size_t>(run) * row_bytes) {
      run += p;
    }
    return run < limit ? run : limit;
  }

  /// Checks the page table against the page size and the number of pages the buffers hold.
  void validate(std::size_t k_bytes, std::size_t v_bytes) const {
    KVSCOUT_EXPECTS(page_stride_ > 0, "paged_layout has page_stride ", page_stride_,
                    ": a default-constructed layout describes no cache; build it from a page "
                    "table");
    const std::size_t page_bytes = static_cast<std::size_t>(page_stride_) * sizeof(T);
    const std::size_t used = static_cast<std::size_t>(page_size()) * num_kv_heads_ * row_bytes;
    const std::size_t smaller = k_bytes < v_bytes ? k_bytes : v_bytes;
    const std::size_t pages = smaller < used ? 0 : (smaller - used) / page_bytes + 1;
    try {
      table_.validate(page_size(), pages > INT32_MAX ? INT32_MAX : static_cast<int>(pages));
    } catch (const error& e) {
      // A page id past the buffers is as often buffers sized for another shape: say how the page
      // count was derived.
      if (e.message().rfind("page id ", 0) != 0) throw;
      std::ostringstream why;
      why << e.message() << "; the K / V buffers (" << k_bytes << " / " << v_bytes
          << " bytes) hold " << pages << " pages of " << page_bytes << " bytes (page stride "
          << page_stride_ << " elements of " << sizeof(T) << " bytes: page_size " << page_size()
          << " x num_kv_heads " << num_kv_heads_ << " x head_dim " << HeadDim << " when dense)";
      throw error(why.str(), e.function(), e.file(), e.line());
    }
  }

 private:
  static constexpr std::size_t row_bytes = sizeof(T) * HeadDim;

  void init(int page_size, std::int64_t page_stride) {
    KVSCOUT_EXPECTS(num_kv_heads_ > 0, "num_kv_heads must be positive, got ", num_kv_heads_);
    KVSCOUT_EXPECTS(page_size > 0, "page_size must be positive, got ", page_size);
    if constexpr (PageSize == dynamic_extent) page_size_ = page_size;
    const std::int64_t dense = static_cast<std::int64_t>(page_size) * num_kv_heads_ * HeadDim;
    page_stride_ = page_stride == 0 ? dense : page_stride;
    KVSCOUT_EXPECTS(page_stride_ >= dense, "page_stride = ", page_stride_,
                    " elements is smaller than one page (page_size * kv_heads * head_dim = ", dense,
                    ")");
    constexpr std::int64_t stride_max =
        std::numeric_limits<std::int64_t>::max() / static_cast<std::int64_t>(2 * sizeof(T));
    KVSCOUT_EXPECTS(page_stride_ <= stride_max, "page_stride = ", page_stride_,
                    " elements is too large: at most ", stride_max,
                    " (byte offsets of pages must fit in 64 bits)");
  }

  PageTable table_{};
  int num_kv_heads_ = 0;
  int page_size_ = 0;  // used when PageSize == dynamic_extent
  std::int64_t page_stride_ = 0;
};

static_assert(kv_layout<paged_layout<half, 128, nhd, flashinfer_page_table, 16>>);
static_assert(kv_layout<paged_layout<float, 64, hnd, block_table>>);
static_assert(kv_layout<paged_layout<bfloat16, 256, hnd, flashinfer_page_table>>);

}  // namespace kvscout
