#pragma once
// The checks every executor makes before it moves a byte: shapes, null pointers and buffer sizes of
// the views (check_fetch_views), and, where the selection is host-readable, every count and index
// (check_host_selection).

#include <cstddef>
#include <cstdint>
#include <tuple>

#include "kvscout/core/detail/overlap.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/kv/concepts.hpp"

namespace kvscout::detail {

inline constexpr std::size_t fetch_vector_bytes = 16;

inline std::size_t fetch_pairs(int num_seqs, int num_kv_heads) {
  return static_cast<std::size_t>(num_seqs) * static_cast<std::size_t>(num_kv_heads);
}

/// Everything a CUDA executor can check without reading the selection or the layout's metadata
/// (either may live in device memory).
template <kv_layout L, class SrcSpace, class SelSpace, class DstSpace>
void check_fetch_views(int num_seqs, int num_kv_heads, int capacity,
                       const kv_view<L, SrcSpace>& src, const selection_view<SelSpace>& sel,
                       const gather_destination<DstSpace>& dst, bool vector_aligned) {
  const L& l = src.layout;
  KVSCOUT_EXPECTS(sel.num_seqs == num_seqs && sel.num_kv_heads == num_kv_heads &&
                      sel.capacity == capacity,
                  "selection shape [", sel.num_seqs, ", ", sel.num_kv_heads, ", ", sel.capacity,
                  "] differs from the executor's [", num_seqs, ", ", num_kv_heads, ", ", capacity,
                  "]");
  KVSCOUT_EXPECTS(l.num_seqs() == num_seqs && l.num_kv_heads() == num_kv_heads,
                  "source layout has ", l.num_seqs(), " sequences x ", l.num_kv_heads(),
                  " kv heads, the executor expects ", num_seqs, " x ", num_kv_heads);
  const std::size_t pairs = fetch_pairs(num_seqs, num_kv_heads);
  const std::size_t slots = pairs * static_cast<std::size_t>(capacity);
  KVSCOUT_EXPECTS(sel.counts.data() != nullptr || pairs == 0, "selection counts is null");
  KVSCOUT_EXPECTS(sel.counts.size() >= pairs, "selection counts holds ", sel.counts.size(),
                  " entries, expected num_seqs * num_kv_heads = ", pairs);
  KVSCOUT_EXPECTS(sel.indices.data() != nullptr || slots == 0, "selection indices is null");
  KVSCOUT_EXPECTS(sel.indices.size() >= slots, "selection indices holds ", sel.indices.size(),
                  " entries, expected num_seqs * num_kv_heads * capacity = ", slots);
  KVSCOUT_EXPECTS(src.k.data() != nullptr && src.v.data() != nullptr,
                  "source K or V buffer is null");
  const std::size_t kb = l.k_row_bytes(), vb = l.v_row_bytes();
  const std::size_t k_need = slots * kb, v_need = slots * vb;
  KVSCOUT_EXPECTS(dst.k.data() != nullptr || k_need == 0, "destination K buffer is null");
  KVSCOUT_EXPECTS(dst.v.data() != nullptr || v_need == 0, "destination V buffer is null");
  KVSCOUT_EXPECTS(dst.k.size() >= k_need, "destination K buffer holds ", dst.k.size(),
                  " bytes, expected at least ", k_need, " (", slots, " rows of ", kb, " bytes)");
  KVSCOUT_EXPECTS(dst.v.size() >= v_need, "destination V buffer holds ", dst.v.size(),
                  " bytes, expected at least ", v_need, " (", slots, " rows of ", vb, " bytes)");
  if (vector_aligned) {
    constexpr std::size_t a = fetch_vector_bytes;
    KVSCOUT_EXPECTS(kb % a == 0 && vb % a == 0, "row sizes K ", kb, " / V ", vb,
                    " bytes must be multiples of ", a, " (rows move as 16-byte vectors)");
    auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; };
    KVSCOUT_EXPECTS(aligned(src.k.data()) && aligned(src.v.data()), "source K / V at ",
                    static_cast<const void*>(src.k.data()), " / ",
                    static_cast<const void*>(src.v.data()), " must be ", a, "-byte aligned");
    KVSCOUT_EXPECTS(aligned(dst.k.data()) && aligned(dst.v.data()), "destination K / V at ",
                    static_cast<const void*>(dst.k.data()), " / ",
                    static_cast<const void*>(dst.v.data()), " must be ", a, "-byte aligned");
  }
  // The rows written must not land on each other, on the cache they are read from (K and V may
  // share a buffer), or on the selection. The layout's own metadata is the caller's to keep apart.
  KVSCOUT_EXPECTS(!bytes_overlap(dst.k.data(), k_need, dst.v.data(), v_need),
                  "destination K and V overlap (", k_need, " bytes at ",
                  static_cast<const void*>(dst.k.data()), ", ", v_need, " bytes at ",
                  static_cast<const void*>(dst.v.data()), "): each needs its own rows");
  using written = std::tuple<const char*, const void*, std::size_t>;
  for (const auto& [what, p, n] : {written{"K", dst.k.data(), k_need},
                                   written{"V", dst.v.data(), v_need}}) {
    KVSCOUT_EXPECTS(!bytes_overlap(p, n, src.k.data(), src.k.size()) &&
                        !bytes_overlap(p, n, src.v.data(), src.v.size()),
                    "destination ", what, " (", n, " bytes at ", p,
                    ") overlaps the source K / V cache it gathers from");
    KVSCOUT_EXPECTS(!bytes_overlap(p, n, sel.indices.data(), slots * sizeof(std::int32_t)) &&
                        !bytes_overlap(p, n, sel.counts.data(), pairs * sizeof(std::int32_t)),
                    "destination ", what, " (", n, " bytes at ", p,
                    ") overlaps the selection's indices or counts it is gathered by");
  }
}

/// A host-visible selection, checked in full against a host-readable layout, as
/// gather_executor_host does; fills prefix[pairs + 1] with the running row counts and returns the
/// total.
template <kv_layout L>
std::int64_t check_host_selection(const kv_view<L, host_space>& src,
                                  const selection_view<host_space>& sel, std::int64_t* prefix) {
  const L& l = src.layout;
  l.validate(src.k.size(), src.v.size());
  constexpr const char* quantized_hint =
      requires(const L& x) { x.residual_len(0); }
          ? " (a KIVI layout's seq_len is its quantised length: select among the quantised "
            "tokens, e.g. with the lengths of fill_quantized_lens; the residual window is read "
            "in place)"
          : "";
  std::int64_t total = 0;
  prefix[0] = 0;
  const std::size_t capacity = static_cast<std::size_t>(sel.capacity);
  for (int s = 0; s < sel.num_seqs; ++s) {
    const int len = l.seq_len(s);
    for (int h = 0; h < sel.num_kv_heads; ++h) {
      const std::size_t r = sel.row(s, h);
      const int n = sel.counts[r];
      KVSCOUT_EXPECTS(n >= 0 && n <= sel.capacity, "count ", n, " for sequence ", s,
                      ", kv_head ", h, " is outside [0, capacity = ", sel.capacity, "]");
      const std::int32_t* idx = sel.indices.data() + r * capacity;
      int prev = -1;
      for (int i = 0; i < n; ++i) {
        const int t = idx[i];
        KVSCOUT_EXPECTS(t >= 0 && t < len, "token index ", t, " (entry ", i, ") for sequence ",
                        s, ", kv_head ", h, " is out of range [0, seq_len = ", len, ")",
                        quantized_hint);
        KVSCOUT_EXPECTS(t > prev, "token indices for sequence ", s, ", kv_head ", h,
                        " are not strictly ascending: ", prev, " then ", t, " at entry ", i);
        prev = t;
      }
      total += n;
      prefix[r + 1] = total;
    }
  }
  return total;
}

}  // namespace kvscout::detail
