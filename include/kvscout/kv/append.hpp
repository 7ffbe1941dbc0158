#pragma once
// Writing tokens into a contiguous or paged cache that lives in host memory (pinned or not): the
// host twin of append_token_cuda (kv/append.cuh), for engines whose KV store is on the host and
// for prefill.
//
//   kvscout::append_token_host(layout, k_cache, v_cache, k_new, v_new, positions);
//   kvscout::write_tokens_host(layout, k_cache, v_cache, s, first, count, k_rows, v_rows);
//
// Float input is divided by the kv_scales and rounded once to T, as the device append does; input
// already in T is stored as given, so both appends write the same bytes. The slots a sequence may
// write are the device append's. Where the device append skips a bad sequence, the host append
// checks everything first and throws a kvscout::error naming the value, writing nothing. It
// refuses a position outside the sequence's slots, a row outside the buffers, two sequences that
// would write the same row, input that overlaps the cache, short input, and scales that are not
// positive and finite. KIVI caches are written by kivi_append_host (kv/kivi.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvscout/core/detail/overlap.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/kv/detail/append_checks.hpp"
#include "kvscout/kv/detail/append_room.hpp"
#include "kvscout/kv/kivi.hpp"

namespace kvscout {
namespace detail {

template <kv_layout L>
void check_host_rows(const L& l, int s, int t, std::size_t k_bytes, std::size_t v_bytes) {
  for (int h = 0; h < l.num_kv_heads(); ++h) {
    const std::size_t ko = l.k_offset(s, t, h), vo = l.v_offset(s, t, h);
    KVSCOUT_EXPECTS(ko <= k_bytes && l.k_row_bytes() <= k_bytes - ko && vo <= v_bytes &&
                        l.v_row_bytes() <= v_bytes - vo,
                    "sequence ", s, ", token ", t, ", kv head ", h, ": its K / V row at byte ", ko,
                    " / ", vo, " lies outside the ", k_bytes, " / ", v_bytes,
                    "-byte buffers (a page id past the pool?)");
  }
}

/// No two (sequence, token) writes land on the same K row.
template <kv_layout L>
void check_host_rows_distinct(const L& l, const std::vector<std::pair<int, int>>& writes) {
  std::vector<std::pair<std::size_t, int>> rows;  // (K offset of head 0 of the token, write index)
  rows.reserve(writes.size() * static_cast<std::size_t>(l.num_kv_heads()));
  for (std::size_t i = 0; i < writes.size(); ++i)
    for (int h = 0; h < l.num_kv_heads(); ++h)
      rows.emplace_back(l.k_offset(writes[i].first, writes[i].second, h), static_cast<int>(i));
  std::sort(rows.begin(), rows.end());
  for (std::size_t i = 1; i < rows.size(); ++i) {
    if (rows[i].first - rows[i - 1].first >= l.k_row_bytes()) continue;
    const auto& a = writes[static_cast<std::size_t>(rows[i - 1].second)];
    const auto& b = writes[static_cast<std::size_t>(rows[i].second)];
    KVSCOUT_FAIL("sequence ", a.first, " token ", a.second, " and sequence ", b.first, " token ",
                 b.second, " would write the same K row (bytes ", rows[i - 1].first, " and ",
                 rows[i].first, "): their page tables share a page, or the positions repeat");
  }
}

template <kv_layout L, class In>
void store_token_host(const L& l, std::byte* k, std::byte* v, int s, int t, const In* k_in,
                      const In* v_in, kv_scales scales) {
  using T = typename L::element_type;
  constexpr int D = L::head_dim;
  for (int h = 0; h < l.num_kv_heads(); ++h) {
    T* kr = reinterpret_cast<T*>(k + l.k_offset(s, t, h));
    T* vr = reinterpret_cast<T*>(v + l.v_offset(s, t, h));
    const In* ki = k_in + static_cast<std::size_t>(h) * D;
    const In* vi = v_in + static_cast<std::size_t>(h) * D;
    if constexpr (std::is_same_v<In, T> && !std::is_same_v<In, float>) {
      std::memcpy(kr, ki, sizeof(T) * D);
      std::memcpy(vr, vi, sizeof(T) * D);
    } else {
      for (int c = 0; c < D; ++c) {
        kr[c] = from_float<T>(to_float(ki[c]) / scales.k);
        vr[c] = from_float<T>(to_float(vi[c]) / scales.v);
      }
    }
  }
}

template <kv_layout L>
void check_host_cache(const L& l, host_span<std::byte> k, host_span<std::byte> v) {
  KVSCOUT_EXPECTS(k.data() != nullptr && v.data() != nullptr, "K or V cache buffer is null");
  KVSCOUT_EXPECTS(!bytes_overlap(k.data(), k.size(), v.data(), v.size()), "the K cache (", k.size(),
                  " bytes at ", static_cast<const void*>(k.data()), ") and the V cache (", v.size(),
                  " bytes at ", static_cast<const void*>(v.data()), ") overlap");
  l.validate(k.size(), v.size());
}

template <class In>
void check_input_apart(const In* k_in, const In* v_in, std::size_t n, host_span<std::byte> k,
                       host_span<std::byte> v) {
  const std::size_t b = n * sizeof(In);
  for (const In* p : {k_in, v_in})
    KVSCOUT_EXPECTS(!bytes_overlap(p, b, k.data(), k.size()) && !bytes_overlap(p, b, v.data(), v.size()),
                    "the new K / V (", b, " bytes at ", static_cast<const void*>(p),
                    ") overlap the cache they are written into");
}

}  // namespace detail

/// One new token per sequence, at positions[s] (empty: the layout's seq_len(s)). k_new / v_new:
/// [num_seqs, num_kv_heads, head_dim]. The caller then advances the lengths / page tables.
template <kv_layout L, class InSpan>
  requires(!kivi_quantized_layout<L>)
void append_token_host(const L& layout, host_span<std::byte> k, host_span<std::byte> v,
                       host_span<InSpan> k_new, host_span<InSpan> v_new,
                       host_span<const std::int32_t> positions = {}, kv_scales scales = {}) {
  using T = typename L::element_type;
  using In = std::remove_const_t<InSpan>;
  static_assert(detail::append_input_ok<In, T>,
                "kvscout::append_token_host: new K / V must be float or the cache's element type");
  const int S = layout.num_seqs(), H = layout.num_kv_heads();
  detail::check_host_cache(layout, k, v);
  detail::check_append_inputs(S, H, L::head_dim, k_new.size(), k_new.data(), v_new.size(),
                              v_new.data());
  detail::check_kv_scales(scales);
  KVSCOUT_EXPECTS(positions.empty() || positions.size() >= static_cast<std::size_t>(S),
                  "positions holds ", positions.size(), " entries, expected none or num_seqs = ", S);
  const std::size_t tok = static_cast<std::size_t>(S) * H * L::head_dim;
  if (S > 0) detail::check_input_apart(k_new.data(), v_new.data(), tok, k, v);
  const auto room = detail::append_room<L>::make(layout);
  std::vector<std::pair<int, int>> writes;
  writes.reserve(static_cast<std::size_t>(S));
  for (int s = 0; s < S; ++s) {
    const int t = positions.empty() ? layout.seq_len(s) : positions[static_cast<std::size_t>(s)];
    KVSCOUT_EXPECTS(t >= 0 && room.owns(layout, s, t), "sequence ", s, ": position ", t,
                    " is not a slot it owns (", detail::append_room<L>::rule(), ")");
    detail::check_host_rows(layout, s, t, k.size(), v.size());
    writes.emplace_back(s, t);
  }
  detail::check_host_rows_distinct(layout, writes);
  const std::size_t per_seq = static_cast<std::size_t>(H) * L::head_dim;
  for (const auto& [s, t] : writes)
    detail::store_token_host(layout, k.data(), v.data(), s, t,
                             k_new.data() + static_cast<std::size_t>(s) * per_seq,
                             v_new.data() + static_cast<std::size_t>(s) * per_seq, scales);
}

/// Tokens [first, first + count) of sequence s (prefill, or a chunk of it) from rows
/// [count, num_kv_heads, head_dim]. A paged sequence's pages must be in its table first.
template <kv_layout L, class InSpan>
  requires(!kivi_quantized_layout<L>)
void write_tokens_host(const L& layout, host_span<std::byte> k, host_span<std::byte> v, int seq,
                       int first, int count, host_span<InSpan> k_rows, host_span<InSpan> v_rows,
                       kv_scales scales = {}) {
  using T = typename L::element_type;
  using In = std::remove_const_t<InSpan>;
  static_assert(detail::append_input_ok<In, T>,
                "kvscout::write_tokens_host: K / V rows must be float or the cache's element type");
  const int H = layout.num_kv_heads();
  detail::check_host_cache(layout, k, v);
  KVSCOUT_EXPECTS(seq >= 0 && seq < layout.num_seqs(), "sequence ", seq, " is out of range [0, ",
                  layout.num_seqs(), ")");
  KVSCOUT_EXPECTS(first >= 0 && count >= 0, "tokens [", first, ", ", first, " + ", count,
                  "): first and count must be non-negative");
  detail::check_append_inputs(count, H, L::head_dim, k_rows.size(), k_rows.data(), v_rows.size(),
                              v_rows.data());
  detail::check_kv_scales(scales);
  if (count == 0) return;
  const std::size_t per_tok = static_cast<std::size_t>(H) * L::head_dim;
  detail::check_input_apart(k_rows.data(), v_rows.data(), per_tok * static_cast<std::size_t>(count),
                            k, v);
  const auto room = detail::append_room<L>::make(layout);
  for (int i = 0; i < count; ++i) {
    const int t = first + i;
    KVSCOUT_EXPECTS(t >= first && room.owns(layout, seq, t), "sequence ", seq, ": token ", t,
                    " is not a slot it owns (", detail::append_room<L>::rule(), ")");
    detail::check_host_rows(layout, seq, t, k.size(), v.size());
  }
  std::vector<std::pair<int, int>> writes;
  writes.reserve(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) writes.emplace_back(seq, first + i);
  detail::check_host_rows_distinct(layout, writes);
  for (int i = 0; i < count; ++i)
    detail::store_token_host(layout, k.data(), v.data(), seq, first + i,
                             k_rows.data() + static_cast<std::size_t>(i) * per_tok,
                             v_rows.data() + static_cast<std::size_t>(i) * per_tok, scales);
}

}  // namespace kvscout
