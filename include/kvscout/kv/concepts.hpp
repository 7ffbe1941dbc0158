#pragma once
// The kv_layout concept: a KV layout is address math, nothing more. It maps (sequence, token,
// kv_head) to the byte offsets of that token's K and V rows from their base pointers, owns no
// memory, and reads its metadata (lengths, page tables) through pointers that must be readable
// where the layout is used.
//
// Requirements, for a const L& l, int s (sequence), t (token), h (kv head), n (row count):
//   L::element_type, L::head_dim    a row's element type; elements per row, compile-time
//   l.num_seqs(), l.num_kv_heads(), l.seq_len(s)
//   l.k_row_bytes(), l.v_row_bytes() bytes one K row / V row occupies and moves
//   l.k_offset(s,t,h), l.v_offset(s,t,h)  byte offsets of the rows from their base pointers
//   l.contiguous_rows(s,t,h,n)      how many of the rows of tokens t .. t+n-1 (head h) follow one
//                                   another in memory, in [1, n]; executors merge such runs
//   l.validate(k_bytes, v_bytes)    host-side check of the metadata against buffers of those
//                                   sizes; throws kvscout::error naming the bad value
// For the CUDA backend the queries and offsets must also be KVSCOUT_HOST_DEVICE, and the layout
// trivially copyable and default-constructible (kernels take it by value): docs/layouts.md.

#include <concepts>
#include <cstddef>
#include <type_traits>

#include "kvscout/core/error.hpp"

namespace kvscout {

template <class L>
concept kv_layout = std::copyable<L> && requires(const L& l, int s, int t, int h, int n,
                                                 std::size_t bytes) {
  typename L::element_type;
  { L::head_dim } -> std::convertible_to<int>;
  { l.num_seqs() } -> std::same_as<int>;
  { l.num_kv_heads() } -> std::same_as<int>;
  { l.seq_len(s) } -> std::same_as<int>;
  { l.k_row_bytes() } -> std::same_as<std::size_t>;
  { l.v_row_bytes() } -> std::same_as<std::size_t>;
  { l.k_offset(s, t, h) } -> std::same_as<std::size_t>;
  { l.v_offset(s, t, h) } -> std::same_as<std::size_t>;
  { l.contiguous_rows(s, t, h, n) } -> std::same_as<int>;
  l.validate(bytes, bytes);
};

namespace detail {
/// What a layout must also be for kernels to take it by value; its member functions must also be
/// KVSCOUT_HOST_DEVICE, which no concept can check.
template <class L>
inline constexpr bool kernel_passable_layout =
    std::is_trivially_copyable_v<L> && std::is_default_constructible_v<L>;

template <class L>
consteval bool layout_passes_to_kernels() {
  static_assert(detail::kernel_passable_layout<L>,
                "kvscout: a layout used on the device must be trivially copyable and "
                "default-constructible (kernels take it by value; docs/layouts.md)");
  return true;
}

struct row_offsets {
  std::size_t k;
  std::size_t v;
};

/// The offsets of (s, t, h) after checking each index on the host, for tools and tests.
template <kv_layout L>
row_offsets checked_row_offsets(const L& l, int s, int t, int h) {
  KVSCOUT_EXPECTS(s >= 0 && s < l.num_seqs(), "sequence ", s, " is out of range [0, ",
                  l.num_seqs(), ")");
  KVSCOUT_EXPECTS(h >= 0 && h < l.num_kv_heads(), "kv_head ", h, " is out of range [0, ",
                  l.num_kv_heads(), ")");
  const int len = l.seq_len(s);
  KVSCOUT_EXPECTS(t >= 0 && t < len, "token ", t, " is out of range [0, seq_len = ", len,
                  ") for sequence ", s);
  return {l.k_offset(s, t, h), l.v_offset(s, t, h)};
}
}  // namespace detail

/// NHD: [tokens, kv_heads, head_dim]; the rows of one head are kv_heads rows apart.
struct nhd {
  static constexpr const char* name = "NHD";
};
/// HND: [kv_heads, tokens, head_dim]; the rows of one head follow one another.
struct hnd {
  static constexpr const char* name = "HND";
};

namespace detail {
template <class O>
concept kv_order = std::same_as<O, nhd> || std::same_as<O, hnd>;
}  // namespace detail

}  // namespace kvscout
