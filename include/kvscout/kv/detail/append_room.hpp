#pragma once

#include <cstddef>
#include <type_traits>

#include "kvscout/core/config.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/page_table.hpp"
#include "kvscout/kv/paged.hpp"

namespace kvscout::detail {

// Which slots a sequence owns: the rule both appends keep. make() runs on the host; owns(l, s, t),
// for t >= 0, runs where the layout's metadata lives, before any page table entry for t is read.
// Primary template: a layout kvscout does not know; only the buffer bounds apply.
template <class L>
struct append_room {
  static append_room make(const L&) { return {}; }
  KVSCOUT_HOST_DEVICE bool owns(const L&, int, int) const { return true; }
  static const char* rule() { return "a layout kvscout does not know: any slot inside the buffers"; }
};

template <kv_element T, int D, detail::kv_order O>
struct append_room<contiguous_layout<T, D, O>> {
  using layout = contiguous_layout<T, D, O>;
  // Padded: slots per sequence (the capacity); ragged: total_tokens.
  long long slots = 0;

  static append_room make(const layout& l) {
    const std::size_t per_token = static_cast<std::size_t>(l.num_kv_heads()) * l.k_row_bytes();
    const std::size_t seqs =
        l.is_ragged() || l.num_seqs() <= 0 ? 1 : static_cast<std::size_t>(l.num_seqs());
    return {per_token == 0 ? 0 : static_cast<long long>(l.required_bytes() / per_token / seqs)};
  }
  static const char* rule() {
    return "contiguous: padded, t < capacity; ragged, t < seq_len(s), the last sequence up to "
           "total_tokens";
  }
  KVSCOUT_HOST_DEVICE bool owns(const layout& l, int s, int t) const {
    if (!l.is_ragged()) return t < slots;
    if (t < l.seq_len(s)) return true;  // its own slots [indptr[s], indptr[s+1])
    if (s != l.num_seqs() - 1) return false;  // slot indptr[s+1] + ... belongs to a later one
    // The last sequence may grow into the free tail [indptr[num_seqs], total_tokens).
    const std::size_t token_bytes =
        l.k_row_bytes() * (std::is_same_v<O, nhd> ? static_cast<std::size_t>(l.num_kv_heads()) : 1);
    const long long first = static_cast<long long>(l.k_offset(s, 0, 0) / token_bytes);
    return first + t < slots;
  }
};

template <kv_element T, int D, detail::kv_order O, int P>
struct append_room<paged_layout<T, D, O, flashinfer_page_table, P>> {
  using layout = paged_layout<T, D, O, flashinfer_page_table, P>;
  static append_room make(const layout&) { return {}; }
  static const char* rule() {
    return "FlashInfer pages: t / page_size < the sequence's page count (its new page must be in "
           "its table first)";
  }
  KVSCOUT_HOST_DEVICE bool owns(const layout& l, int s, int t) const {
    return t / l.page_size() < l.table().num_pages(s);
  }
};

template <kv_element T, int D, detail::kv_order O, int P>
struct append_room<paged_layout<T, D, O, block_table, P>> {
  using layout = paged_layout<T, D, O, block_table, P>;
  static append_room make(const layout&) { return {}; }
  static const char* rule() {
    return "block table: t / page_size < max_blocks_per_seq, the new page's id stored first";
  }
  KVSCOUT_HOST_DEVICE bool owns(const layout& l, int /*s*/, int t) const {
    return t / l.page_size() < l.table().max_blocks_per_seq;
  }
};

}  // namespace kvscout::detail
