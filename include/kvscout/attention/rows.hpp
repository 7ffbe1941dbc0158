#pragma once
// Row sources for decode attention: where the K / V rows of each (sequence, kv head) come from.
// Attention reads rows only through load_k / load_v (one row into a float[head_dim] buffer), so
// the same code serves the whole cache (dense reference), the gathered rows (sparse attention),
// and KIVI's quantized rows (attention/kivi_rows.hpp).
//
// Every source answers: num_seqs(), num_kv_heads(), rows(s, h), token(s, h, i) (the cache position
// of row i), load_k(s, h, i, float*), load_v(s, h, i, float*).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/simd.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/kv/kivi.hpp"

namespace kvscout {

template <class R>
concept attention_rows = requires(const R& r, int s, int h, int i, float* dst) {
  { R::head_dim } -> std::convertible_to<int>;
  { r.num_seqs() } -> std::same_as<int>;
  { r.num_kv_heads() } -> std::same_as<int>;
  { r.rows(s, h) } -> std::same_as<int>;
  { r.token(s, h, i) } -> std::same_as<int>;
  r.load_k(s, h, i, dst);
  r.load_v(s, h, i, dst);
};

namespace detail {
/// One row of D elements of T as floats, each exact (a NaN's payload may differ). fp8 rows widen
/// through half on F16C targets: an e5m2 code is the high byte of the half of the same value; an
/// e4m3 code, shifted into a half's exponent and mantissa, is its value times 2^-8, so the float is
/// multiplied back by 256, exactly. Elsewhere fp8 rows look up to_float's table.
template <class T, int D>
inline void load_row(const std::byte* p, float* dst) {
  const T* row = reinterpret_cast<const T*>(p);
  int c = 0;
  if constexpr (compute_element<T>) {
    for (; c + host_float_lanes <= D; c += host_float_lanes) {
      const host_vec x = load_lanes(row + c);
      std::memcpy(dst + c, &x, sizeof x);
    }
  } else if constexpr (detail::is_fp8_v<T>) {
#if KVSCOUT_HOST_F16C
    constexpr int N = host_float_lanes;
    static_assert(N == 8 || N == 16, "F16C implies AVX");
    typedef std::uint8_t u8xN __attribute__((vector_size(N)));
    typedef std::uint16_t u16xN __attribute__((vector_size(2 * N)));
    for (; c + N <= D; c += N) {
      u8xN code;
      std::memcpy(&code, row + c, sizeof code);
      const u16xN w = __builtin_convertvector(code, u16xN);
      u16xN h;
      if constexpr (std::is_same_v<T, fp8_e5m2>) {
        h = w << 8;
      } else {
        const u16xN mag = w & 0x7f;
        h = ((w & 0x80) << 8) | (mag << 7);
        h = mag == 0x7f ? (h | 0x7c00) : h;  // exponent all ones, mantissa 0x380: NaN
      }
      half hv[N];  // widened as half rows are (load_lanes: F16C)
      std::memcpy(static_cast<void*>(hv), &h, sizeof h);  // __half is trivially copyable
      host_vec x = load_lanes(hv);
      if constexpr (std::is_same_v<T, fp8_e4m3>) x *= 256.f;
      std::memcpy(dst + c, &x, sizeof x);
    }
#endif
  }
  for (; c < D; ++c) dst[c] = to_float(row[c]);
}
}  // namespace detail

/// All cached tokens of a host KV cache, read through its layout. Not for KIVI layouts
/// (kivi_layout_rows_host; cache_rows_t<L> picks the right one).
template <kv_layout L>
  requires(!kivi_quantized_layout<L>)
class layout_rows_host {
 public:
  using element_type = typename L::element_type;
  static constexpr int head_dim = L::head_dim;

  explicit layout_rows_host(const kv_view<L, host_space>& kv) : kv_(kv) {
    KVSCOUT_EXPECTS(kv.k.data() != nullptr && kv.v.data() != nullptr, "K or V buffer is null");
    kv.layout.validate(kv.k.size(), kv.v.size());
  }

  int num_seqs() const { return kv_.layout.num_seqs(); }
  int num_kv_heads() const { return kv_.layout.num_kv_heads(); }
  int rows(int s, int /*h*/) const { return kv_.layout.seq_len(s); }
  int token(int /*s*/, int /*h*/, int i) const { return i; }
  void load_k(int s, int h, int i, float* dst) const {
    detail::load_row<element_type, head_dim>(kv_.k.data() + kv_.layout.k_offset(s, i, h), dst);
  }
  void load_v(int s, int h, int i, float* dst) const {
    detail::load_row<element_type, head_dim>(kv_.v.data() + kv_.layout.v_offset(s, i, h), dst);
  }

 private:
  kv_view<L, host_space> kv_;
};

template <kv_element T, int HeadDim>
class gathered_rows_host {
 public:
  using element_type = T;
  static constexpr int head_dim = HeadDim;

  gathered_rows_host(const selection_view<host_space>& sel, host_span<const T> k,
                     host_span<const T> v)
      : sel_(sel), k_(k.data()), v_(v.data()) {
    const std::size_t slots = static_cast<std::size_t>(sel.num_seqs) * sel.num_kv_heads *
                              static_cast<std::size_t>(sel.capacity);
    KVSCOUT_EXPECTS(sel.counts.size() >= static_cast<std::size_t>(sel.num_seqs) * sel.num_kv_heads,
                    "selection counts holds ", sel.counts.size(), " entries, expected ",
                    static_cast<std::size_t>(sel.num_seqs) * sel.num_kv_heads);
    KVSCOUT_EXPECTS(sel.indices.size() >= slots, "selection indices holds ", sel.indices.size(),
                    " entries, expected ", slots);
    KVSCOUT_EXPECTS(k.size() >= slots * HeadDim && v.size() >= slots * HeadDim,
                    "gathered K / V rows hold ", k.size(), " / ", v.size(),
                    " elements, expected at least ", slots * HeadDim, " (", slots, " rows of ",
                    HeadDim, ")");
    for (std::size_t r = 0; r < static_cast<std::size_t>(sel.num_seqs) * sel.num_kv_heads; ++r) {
      KVSCOUT_EXPECTS(sel.counts[r] >= 0 && sel.counts[r] <= sel.capacity, "count ",
                      sel.counts[r], " at (sequence, kv_head) entry ", r,
                      " is outside [0, capacity = ", sel.capacity, "]");
    }
  }

  /// The same over the byte buffers an executor wrote, read as T rows (alignment checked).
  gathered_rows_host(const selection_view<host_space>& sel,
                     const gather_destination<host_space>& rows)
      : gathered_rows_host(sel, typed(rows.k, "K"), typed(rows.v, "V")) {}

  /// T and HeadDim are the layout's (deduced: `gathered_rows_host rows(layout, sel, dst)`); the
  /// selection's shape must be the layout's.
  template <kv_layout L>
    requires(!kivi_quantized_layout<L>)
  gathered_rows_host(const L& layout, const selection_view<host_space>& sel,
                     const gather_destination<host_space>& rows)
      : gathered_rows_host(checked_shape(layout, sel), rows) {
    static_assert(std::is_same_v<typename L::element_type, T> && L::head_dim == HeadDim,
                  "gathered_rows_host<T, HeadDim> read from a layout of another element type or "
                  "head_dim");
  }

  int num_seqs() const { return sel_.num_seqs; }
  int num_kv_heads() const { return sel_.num_kv_heads; }
  int rows(int s, int h) const { return sel_.counts[sel_.row(s, h)]; }
  int token(int s, int h, int i) const { return sel_.indices[slot(s, h, i)]; }
  void load_k(int s, int h, int i, float* dst) const {
    detail::load_row<T, HeadDim>(reinterpret_cast<const std::byte*>(k_ + slot(s, h, i) * HeadDim),
                                 dst);
  }
  void load_v(int s, int h, int i, float* dst) const {
    detail::load_row<T, HeadDim>(reinterpret_cast<const std::byte*>(v_ + slot(s, h, i) * HeadDim),
                                 dst);
  }

 private:
  static host_span<const T> typed(host_span<std::byte> b, const char* what) {
    KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(b.data()) % alignof(T) == 0, "gathered ",
                    what, " rows at ", static_cast<const void*>(b.data()), " must be ",
                    alignof(T), "-byte aligned for their element type");
    return {reinterpret_cast<const T*>(b.data()), b.size() / sizeof(T)};
  }
  template <class L>
  static const selection_view<host_space>& checked_shape(const L& layout,
                                                         const selection_view<host_space>& sel) {
    KVSCOUT_EXPECTS(sel.num_seqs == layout.num_seqs() && sel.num_kv_heads == layout.num_kv_heads(),
                    "selection shape [", sel.num_seqs, ", ", sel.num_kv_heads,
                    "] differs from the layout's [", layout.num_seqs(), ", ",
                    layout.num_kv_heads(), "]");
    return sel;
  }
  std::size_t slot(int s, int h, int i) const {
    return sel_.row(s, h) * static_cast<std::size_t>(sel_.capacity) + static_cast<std::size_t>(i);
  }
  selection_view<host_space> sel_;
  const T* k_;
  const T* v_;
};

template <kv_layout L>
  requires(!kivi_quantized_layout<L>)
gathered_rows_host(const L&, const selection_view<host_space>&,
                   const gather_destination<host_space>&)
    -> gathered_rows_host<typename L::element_type, L::head_dim>;

/// Two row sources of one element type, head_dim and shape (checked) read as one: (s, h) has a's
/// rows, then b's. Holds references.
template <attention_rows A, attention_rows B>
  requires std::same_as<typename A::element_type, typename B::element_type>
class joined_rows_host {
 public:
  static_assert(A::head_dim == B::head_dim, "joined_rows_host of two head dims");
  static constexpr int head_dim = A::head_dim;
  using element_type = typename A::element_type;

  joined_rows_host(const A& a, const B& b) : a_(a), b_(b) {
    KVSCOUT_EXPECTS(a.num_seqs() == b.num_seqs() && a.num_kv_heads() == b.num_kv_heads(),
                    "joined rows of shapes [", a.num_seqs(), ", ", a.num_kv_heads(), "] and [",
                    b.num_seqs(), ", ", b.num_kv_heads(), "]");
  }
  int num_seqs() const { return a_.num_seqs(); }
  int num_kv_heads() const { return a_.num_kv_heads(); }
  int rows(int s, int h) const { return a_.rows(s, h) + b_.rows(s, h); }
  int token(int s, int h, int i) const {
    const int n = a_.rows(s, h);
    return i < n ? a_.token(s, h, i) : b_.token(s, h, i - n);
  }
  void load_k(int s, int h, int i, float* dst) const {
    const int n = a_.rows(s, h);
    if (i < n) {
      a_.load_k(s, h, i, dst);
    } else {
      b_.load_k(s, h, i - n, dst);
    }
  }
  void load_v(int s, int h, int i, float* dst) const {
    const int n = a_.rows(s, h);
    if (i < n) {
      a_.load_v(s, h, i, dst);
    } else {
      b_.load_v(s, h, i - n, dst);
    }
  }

 private:
  const A& a_;
  const B& b_;
};

}  // namespace kvscout
