#pragma once
// Row sources for decode attention over a KIVI cache (kv/kivi.hpp). A quantised row is dequantised
// into attention's float buffer as it is read; the window not yet fetchable is read from its
// resident ring. No full-precision copy of a quantised row exists: only the quantised bytes cross
// the link.
//
//   kivi_layout_rows_host<L>    every token of (s, h) in cache order: the quantised tokens, then
//                               the residual window. The dense reference over the quantised cache.
//   kivi_gathered_rows_host<L>  the counts[s, h] records an executor gathered, then the whole
//                               resident window: rows(s, h) = counts[s, h] + residual_len(s).
// token(s, h, i) is the cache position of row i in both, so rows stay in ascending token order.
//
//   kvscout::kivi_gathered_rows_host rows(l, selection, destination, kv.resident);
//   kvscout::decode_attention_host(rows, current, q, out, {.num_q_heads = 32, .scale = 0.088f});

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvscout/attention/rows.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/simd.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/kv/detail/kivi_pack.hpp"
#include "kvscout/kv/kivi.hpp"

namespace kvscout {
namespace detail {

// Host dequantisation, bit for bit as kivi_dequantize_key_row / kivi_dequantize_value_row
// (x' = fma(code, scale, zero), one rounding; NaN payloads aside), a register at a time. Without
// host_madd_fused, madd is a multiply then an add, still the fma's value for half parameters: a
// code (< 16) times a half is exact in float, so only the add rounds. Float parameters there keep
// the scalar fma.
template <detail::kivi_scale_type S>
inline constexpr bool kivi_host_lanes_exact = std::is_same_v<S, half> || host_madd_fused;

// The codes of the host_float_lanes channels starting at `packed` (a whole byte), as floats.
template <int Bits>
inline host_vec kivi_code_lanes(const std::uint8_t* packed) {
  constexpr int N = host_float_lanes;
  constexpr int bytes = N * Bits / 8;  // 1 to 8
  typedef std::int32_t i32xN __attribute__((vector_size(N * 4)));
  // Through a scalar, then broadcast: a copy into a vector in memory would stall store forwarding.
  std::uint64_t bits = 0;
  std::memcpy(&bits, packed, bytes);
  // Lane t holds bits [t * Bits % 32, + Bits) of word t * Bits / 32: both words broadcast, each
  // lane's picked by a constant mask.
  i32xN high, shift;
  for (int t = 0; t < N; ++t) {
    high[t] = t * Bits / 32 != 0 ? -1 : 0;
    shift[t] = t * Bits % 32;
  }
  const i32xN lo = static_cast<std::int32_t>(static_cast<std::uint32_t>(bits)) - i32xN{};
  i32xN w = lo;
  if constexpr (bytes > 4) {
    const i32xN hi = static_cast<std::int32_t>(static_cast<std::uint32_t>(bits >> 32)) - i32xN{};
    w = (lo & ~high) | (hi & high);
  }
  // Arithmetic shifts: the mask clears what a set sign bit shifted in.
  return __builtin_convertvector((w >> shift) & ((1 << Bits) - 1), host_vec);
}

inline constexpr bool kivi_host_little_endian = std::endian::native == std::endian::little;

template <int Bits, detail::kivi_scale_type S, int D>
inline void kivi_host_key_row(const std::uint8_t* codes, const S* scale, const S* zero,
                              float* out) {
  constexpr int N = host_float_lanes;
  int c = 0;
  if constexpr (kivi_host_lanes_exact<S> && kivi_host_little_endian) {
    for (; c + N <= D; c += N) {
      const host_vec x = madd(load_lanes(zero + c),
                              kivi_code_lanes<Bits>(codes + c / kivi_codes_per_byte<Bits>),
                              load_lanes(scale + c));
      std::memcpy(out + c, &x, sizeof x);
    }
  }
  for (; c < D; ++c)
    out[c] = kivi_dequantize(kivi_code<Bits>(codes, c), kivi_to_float(scale[c]),
                             kivi_to_float(zero[c]));
}

// G divides D: out[c] = fma(code[c], scales[c / G], zeros[c / G]).
template <int Bits, detail::kivi_scale_type S, int D>
inline void kivi_host_value_row(const std::uint8_t* codes, const S* scales, const S* zeros, int G,
                                float* out) {
  constexpr int N = host_float_lanes;
  int c = 0;
  if constexpr (kivi_host_lanes_exact<S> && kivi_host_little_endian) {
    const auto codes_at = [&](int ch) {
      return kivi_code_lanes<Bits>(codes + ch / kivi_codes_per_byte<Bits>);
    };
    if (G % N == 0) {  // whole registers per group (and so D % N == 0): parameters broadcast
      for (int j = 0; j < D / G; ++j) {
        const host_vec sc = kivi_to_float(scales[j]) - host_vec{};  // x - 0 keeps -0
        const host_vec z = kivi_to_float(zeros[j]) - host_vec{};
        for (c = j * G; c < (j + 1) * G; c += N) {
          const host_vec x = madd(z, codes_at(c), sc);
          std::memcpy(out + c, &x, sizeof x);
        }
      }
      return;
    }
    for (; c + N <= D; c += N) {  // groups narrower than a register, or straddling two
      host_vec sc, z;
      for (int t = 0; t < N; ++t) {
        sc[t] = kivi_to_float(scales[(c + t) / G]);
        z[t] = kivi_to_float(zeros[(c + t) / G]);
      }
      const host_vec x = madd(z, codes_at(c), sc);
      std::memcpy(out + c, &x, sizeof x);
    }
  }
  for (; c < D; ++c)
    out[c] = kivi_dequantize(kivi_code<Bits>(codes, c), kivi_to_float(scales[c / G]),
                             kivi_to_float(zeros[c / G]));
}

// Parameters of key group t / G from the resident k_params.
template <kivi_quantized_layout L>
inline void kivi_load_key(const L& l, const std::byte* record, const std::byte* k_params, int s,
                          int t, int h, float* dst) {
  using S = typename L::scale_type;
  const S* scale = reinterpret_cast<const S*>(k_params + l.k_params_offset(s, t / l.group(), h));
  kivi_host_key_row<L::key_bits, S, L::head_dim>(reinterpret_cast<const std::uint8_t*>(record), scale,
                                             scale + L::head_dim, dst);
}

template <kivi_quantized_layout L>
inline void kivi_load_value(const L& l, const std::byte* record, float* dst) {
  using S = typename L::scale_type;
  kivi_host_value_row<L::value_bits, S, L::head_dim>(
      reinterpret_cast<const std::uint8_t*>(record),
      reinterpret_cast<const S*>(record + l.v_scales_offset()),
      reinterpret_cast<const S*>(record + l.v_zeros_offset()), l.group(), dst);
}

}  // namespace detail

template <kivi_quantized_layout L>
class kivi_layout_rows_host {
 public:
  using element_type = typename L::element_type;
  static constexpr int head_dim = L::head_dim;

  explicit kivi_layout_rows_host(const kivi_view<L, host_space>& kv) : kv_(kv) { kv.validate(); }

  int num_seqs() const { return kv_.layout.num_seqs(); }
  int num_kv_heads() const { return kv_.layout.num_kv_heads(); }
  int rows(int s, int /*h*/) const { return kv_.layout.total_len(s); }
  int token(int /*s*/, int /*h*/, int i) const { return i; }

  void load_k(int s, int h, int i, float* dst) const {
    const L& l = kv_.layout;
    if (i < l.seq_len(s)) {
      detail::kivi_load_key(l, kv_.k_codes.data() + l.k_offset(s, i, h),
                            kv_.resident.k_params.data(), s, i, h, dst);
    } else {
      detail::load_row<element_type, head_dim>(
          kv_.resident.k_residual.data() + l.residual_offset(s, i, h), dst);
    }
  }
  void load_v(int s, int h, int i, float* dst) const {
    const L& l = kv_.layout;
    if (i < l.seq_len(s)) {
      detail::kivi_load_value(l, kv_.v_records.data() + l.v_offset(s, i, h), dst);
    } else {
      detail::load_row<element_type, head_dim>(
          kv_.resident.v_residual.data() + l.residual_offset(s, i, h), dst);
    }
  }

 private:
  kivi_view<L, host_space> kv_;
};

template <kivi_quantized_layout L>
class kivi_gathered_rows_host {
 public:
  using element_type = typename L::element_type;
  static constexpr int head_dim = L::head_dim;

  /// k / v: the gathered records, [num_seqs, num_kv_heads, capacity, k_row_bytes / v_row_bytes].
  /// Every listed token must be quantised (key group parameters are looked up by token).
  kivi_gathered_rows_host(const L& layout, const selection_view<host_space>& sel,
                          host_span<const std::byte> k, host_span<const std::byte> v,
                          const kivi_resident_view<host_space>& resident)
      : l_(layout), sel_(sel), k_(k.data()), v_(v.data()), resident_(resident) {
    KVSCOUT_EXPECTS(sel.num_seqs == layout.num_seqs() && sel.num_kv_heads == layout.num_kv_heads(),
                    "selection shape [", sel.num_seqs, ", ", sel.num_kv_heads,
                    "] differs from the layout's [", layout.num_seqs(), ", ",
                    layout.num_kv_heads(), "]");
    KVSCOUT_EXPECTS(sel.capacity >= 0, "selection capacity must be non-negative, got ",
                    sel.capacity);
    layout.validate_lengths();
    const std::size_t pairs = static_cast<std::size_t>(sel.num_seqs) * sel.num_kv_heads;
    const std::size_t slots = pairs * static_cast<std::size_t>(sel.capacity);
    KVSCOUT_EXPECTS(sel.counts.size() >= pairs, "selection counts holds ", sel.counts.size(),
                    " entries, expected ", pairs);
    KVSCOUT_EXPECTS(sel.indices.size() >= slots, "selection indices holds ", sel.indices.size(),
                    " entries, expected ", slots);
    detail::kivi_check_buffer(k.data(), k.size(), slots * layout.k_row_bytes(),
                              "gathered K records");
    detail::kivi_check_buffer(v.data(), v.size(), slots * layout.v_row_bytes(),
                              "gathered V records");
    resident.validate(layout);
    for (int s = 0; s < sel.num_seqs; ++s) {
      const int q = layout.seq_len(s);
      for (int h = 0; h < sel.num_kv_heads; ++h) {
        const int n = sel.counts[sel.row(s, h)];
        KVSCOUT_EXPECTS(n >= 0 && n <= sel.capacity, "count ", n, " for sequence ", s,
                        ", kv_head ", h, " is outside [0, capacity = ", sel.capacity, "]");
        for (int i = 0; i < n; ++i) {
          const int t = sel.indices[slot(s, h, i)];
          KVSCOUT_EXPECTS(t >= 0 && t < q, "token index ", t, " (entry ", i, ") for sequence ",
                          s, ", kv_head ", h, " is not a quantised token [0, quantized_len = ",
                          q, ")");
        }
      }
    }
  }

  kivi_gathered_rows_host(const L& layout, const selection_view<host_space>& sel,
                          const gather_destination<host_space>& gathered,
                          const kivi_resident_view<host_space>& resident)
      : kivi_gathered_rows_host(layout, sel, host_span<const std::byte>(gathered.k),
                                host_span<const std::byte>(gathered.v), resident) {}

  int num_seqs() const { return sel_.num_seqs; }
  int num_kv_heads() const { return sel_.num_kv_heads; }
  int rows(int s, int h) const { return sel_.counts[sel_.row(s, h)] + l_.residual_len(s); }
  int token(int s, int h, int i) const {
    const int n = sel_.counts[sel_.row(s, h)];
    return i < n ? sel_.indices[slot(s, h, i)] : l_.seq_len(s) + (i - n);
  }

  void load_k(int s, int h, int i, float* dst) const {
    const int n = sel_.counts[sel_.row(s, h)];
    if (i < n) {
      const std::size_t at = slot(s, h, i);
      detail::kivi_load_key(l_, k_ + at * l_.k_row_bytes(), resident_.k_params.data(), s,
                            sel_.indices[at], h, dst);
    } else {
      const int t = l_.seq_len(s) + (i - n);
      detail::load_row<element_type, head_dim>(
          resident_.k_residual.data() + l_.residual_offset(s, t, h), dst);
    }
  }
  void load_v(int s, int h, int i, float* dst) const {
    const int n = sel_.counts[sel_.row(s, h)];
    if (i < n) {
      detail::kivi_load_value(l_, v_ + slot(s, h, i) * l_.v_row_bytes(), dst);
    } else {
      const int t = l_.seq_len(s) + (i - n);
      detail::load_row<element_type, head_dim>(
          resident_.v_residual.data() + l_.residual_offset(s, t, h), dst);
    }
  }

 private:
  std::size_t slot(int s, int h, int i) const {
    return sel_.row(s, h) * static_cast<std::size_t>(sel_.capacity) + static_cast<std::size_t>(i);
  }
  L l_;
  selection_view<host_space> sel_;
  const std::byte* k_;
  const std::byte* v_;
  kivi_resident_view<host_space> resident_;
};

static_assert(attention_rows<kivi_layout_rows_host<kivi_layout<half, 128, 2>>>);
static_assert(attention_rows<kivi_gathered_rows_host<kivi_layout<half, 128, 4, float>>>);

}  // namespace kvscout
