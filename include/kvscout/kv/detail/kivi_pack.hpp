#pragma once
// KIVI quantisation math, written once for the host and for CUDA kernels: a group's affine
// parameters, quantising / dequantising one element, code packing, and the row loops built from
// them. The row loops are the definition: attention/kivi_rows.hpp dequantises host rows to the
// same bits.
//
// Quantisation (Bits = 2 or 4, L = 2^Bits - 1 levels above zero), for a group with minimum mn and
// maximum mx, all arithmetic in float:
//   scale = S((mx - mn) / L), zero = S(mn)      S = the scale type (half or float), rounded to
//                                               nearest even; scale is exactly 0 when mx == mn
//   q     = floor(clamp((x - zero) / scale, 0, L) + 0.5)      (q = 0 when scale == 0)
//   x'    = fma(q, scale, zero)
// q uses the *stored* (rounded) scale and zero: dequantising gives the nearest level of the stored
// grid.
//
// Packing: element c of a row is in byte c / (8 / Bits), bits [(c % (8 / Bits)) * Bits, + Bits),
// element 0 lowest: 2-bit byte b = q[4b] | q[4b+1] << 2 | q[4b+2] << 4 | q[4b+3] << 6, 4-bit
// byte b = q[2b] | q[2b+1] << 4. As a little-endian 32-bit word (x86, every CUDA GPU), element c
// is at bit (c * Bits) % 32 of word (c * Bits) / 32: a kernel unpacks 16 or 8 codes per load.

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kvscout/core/config.hpp"
#include "kvscout/core/dtype.hpp"

namespace kvscout {

namespace detail {
template <class S>
concept kivi_scale_type = std::is_same_v<S, half> || std::is_same_v<S, float>;

template <int Bits>
inline constexpr bool kivi_bits_supported = Bits == 2 || Bits == 4;

template <int Bits>
inline constexpr int kivi_levels = (1 << Bits) - 1;

template <int Bits>
inline constexpr int kivi_codes_per_byte = 8 / Bits;

/// Bytes the packed codes of n elements take (n a multiple of kivi_codes_per_byte<Bits>).
template <int Bits>
KVSCOUT_HOST_DEVICE constexpr std::size_t kivi_code_bytes(int n) {
  return static_cast<std::size_t>(n) * Bits / 8;
}

// std::bit_cast is a host function to nvcc.
KVSCOUT_HOST_DEVICE std::uint32_t kivi_float_bits(float x) {
#if KVSCOUT_DEVICE_PASS
  return __float_as_uint(x);
#else
  return std::bit_cast<std::uint32_t>(x);
#endif
}
KVSCOUT_HOST_DEVICE float kivi_bits_float(std::uint32_t u) {
#if KVSCOUT_DEVICE_PASS
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}

/// float(h) for the raw bits of an IEEE half, exact for every value. Branch-free, so that a host
/// loop vectorises; subnormals go through int -> float, so the result does not depend on FTZ / DAZ.
KVSCOUT_HOST_DEVICE float kivi_half_bits_to_float(std::uint32_t h) {
  const std::uint32_t em = h & 0x7fffu;                  // exponent and mantissa
  const std::uint32_t normal = (em << 13) + 0x38000000u;  // rebias 15 -> 127: + (112 << 23)
  const std::uint32_t special = (em << 13) | 0x7f800000u; // infinity or NaN
  const std::uint32_t sub = kivi_float_bits(static_cast<float>(em) * 0x1p-24f);  // em * 2^-24
  // Masks, not branches: GCC does not if-convert the ternaries here.
  const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(em < 0x0400u);
  const std::uint32_t is_special = 0u - static_cast<std::uint32_t>(em >= 0x7c00u);
  const std::uint32_t bits = (sub & is_sub) | (special & is_special) |
                             (normal & ~(is_sub | is_special));
  return kivi_bits_float(bits | ((h & 0x8000u) << 16));
}

KVSCOUT_HOST_DEVICE float kivi_to_float(float x) { return x; }
KVSCOUT_HOST_DEVICE float kivi_to_float(half x) {
#if KVSCOUT_DEVICE_PASS
  return __half2float(x);
#else
  return kivi_half_bits_to_float(static_cast<__half_raw>(x).x);
#endif
}

/// The same instruction on both sides (the host build may not contract a * b + c).
KVSCOUT_HOST_DEVICE float kivi_fma(float a, float b, float c) {
#if KVSCOUT_DEVICE_PASS
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

template <detail::kivi_scale_type S>
struct kivi_affine {
  S scale;
  S zero;
};

/// mn <= mx, both finite.
template <int Bits, detail::kivi_scale_type S>
KVSCOUT_HOST_DEVICE kivi_affine<S> kivi_make_affine(float mn, float mx) {
  static_assert(kivi_bits_supported<Bits>, "kvscout KIVI: Bits must be 2 or 4 (KIVI-2 or KIVI-4)");
  const float scale = (mx - mn) / static_cast<float>(kivi_levels<Bits>);
  return {from_float<S>(scale), from_float<S>(mn)};
}

/// In [0, 2^Bits - 1]. Ties round up.
template <int Bits>
KVSCOUT_HOST_DEVICE std::uint32_t kivi_quantize(float x, float scale, float zero) {
  static_assert(kivi_bits_supported<Bits>, "kvscout KIVI: Bits must be 2 or 4 (KIVI-2 or KIVI-4)");
  constexpr float top = static_cast<float>(kivi_levels<Bits>);
  if (!(scale > 0.f)) return 0u;  // constant group, or a range below the scale type's resolution
  float y = (x - zero) / scale;
  y = y < 0.f ? 0.f : (y > top ? top : y);  // clamp before rounding: same as after, integer bounds
  return static_cast<std::uint32_t>(y + 0.5f);
}

KVSCOUT_HOST_DEVICE float kivi_dequantize(std::uint32_t q, float scale, float zero) {
  return kivi_fma(static_cast<float>(q), scale, zero);
}

template <int Bits>
KVSCOUT_HOST_DEVICE std::uint32_t kivi_code(const std::uint8_t* packed, int c) {
  constexpr int per = kivi_codes_per_byte<Bits>;
  constexpr std::uint32_t mask = (1u << Bits) - 1u;
  return (static_cast<std::uint32_t>(packed[c / per]) >> ((c % per) * Bits)) & mask;
}

/// Each code < 2^Bits; n a multiple of 8 / Bits.
template <int Bits>
KVSCOUT_HOST_DEVICE void kivi_pack(const std::uint8_t* codes, int n, std::uint8_t* packed) {
  static_assert(kivi_bits_supported<Bits>, "kvscout KIVI: Bits must be 2 or 4 (KIVI-2 or KIVI-4)");
  constexpr int per = kivi_codes_per_byte<Bits>;
  constexpr std::uint32_t mask = (1u << Bits) - 1u;
  for (int b = 0; b < n / per; ++b) {
    std::uint32_t byte = 0;
    for (int k = 0; k < per; ++k) byte |= (codes[b * per + k] & mask) << (k * Bits);
    packed[b] = static_cast<std::uint8_t>(byte);
  }
}

template <int Bits>
KVSCOUT_HOST_DEVICE void kivi_unpack(const std::uint8_t* packed, int n, std::uint8_t* codes) {
  for (int c = 0; c < n; ++c) codes[c] = static_cast<std::uint8_t>(kivi_code<Bits>(packed, c));
}

/// One value row x[D] per token over groups of G channels (G divides D): scales[D / G],
/// zeros[D / G] and the packed codes[D * Bits / 8].
template <int Bits, detail::kivi_scale_type S, kv_element T>
KVSCOUT_HOST_DEVICE void kivi_quantize_value_row(const T* x, int D, int G, std::uint8_t* codes,
                                                 S* scales, S* zeros) {
  constexpr int per = kivi_codes_per_byte<Bits>;
  for (int b = 0; b < D / per; ++b) codes[b] = 0;
  for (int j = 0; j < D / G; ++j) {
    float mn = to_float(x[j * G]), mx = mn;
    for (int c = j * G + 1; c < (j + 1) * G; ++c) {
      const float v = to_float(x[c]);
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
    }
    const kivi_affine<S> a = kivi_make_affine<Bits, S>(mn, mx);
    scales[j] = a.scale;
    zeros[j] = a.zero;
    const float sc = kivi_to_float(a.scale), z = kivi_to_float(a.zero);
    for (int c = j * G; c < (j + 1) * G; ++c) {
      const std::uint32_t q = kivi_quantize<Bits>(to_float(x[c]), sc, z);
      codes[c / per] = static_cast<std::uint8_t>(codes[c / per] | (q << ((c % per) * Bits)));
    }
  }
}

/// One key group per channel over G tokens: rows[G] point at the tokens' keys [D]; writes scale[D],
/// zero[D] and the packed codes of token i at records + i * record_stride.
template <int Bits, detail::kivi_scale_type S, kv_element T>
KVSCOUT_HOST_DEVICE void kivi_quantize_key_group(const T* const* rows, int G, int D, S* scale,
                                                 S* zero, std::uint8_t* records,
                                                 std::size_t record_stride) {
  constexpr int per = kivi_codes_per_byte<Bits>;
  for (int i = 0; i < G; ++i)
    for (int b = 0; b < D / per; ++b) records[i * record_stride + b] = 0;
  for (int c = 0; c < D; ++c) {
    float mn = to_float(rows[0][c]), mx = mn;
    for (int i = 1; i < G; ++i) {
      const float v = to_float(rows[i][c]);
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
    }
    const kivi_affine<S> a = kivi_make_affine<Bits, S>(mn, mx);
    scale[c] = a.scale;
    zero[c] = a.zero;
    const float sc = kivi_to_float(a.scale), z = kivi_to_float(a.zero);
    for (int i = 0; i < G; ++i) {
      const std::uint32_t q = kivi_quantize<Bits>(to_float(rows[i][c]), sc, z);
      std::uint8_t& byte = records[i * record_stride + c / per];
      byte = static_cast<std::uint8_t>(byte | (q << ((c % per) * Bits)));
    }
  }
}

template <int Bits, detail::kivi_scale_type S>
KVSCOUT_HOST_DEVICE void kivi_dequantize_key_row(const std::uint8_t* codes, const S* scale,
                                                 const S* zero, int D, float* out) {
  constexpr int per = kivi_codes_per_byte<Bits>;
  constexpr std::uint32_t mask = (1u << Bits) - 1u;
  for (int b = 0; b < D / per; ++b) {
    const std::uint32_t byte = codes[b];
    for (int k = 0; k < per; ++k) {
      const int c = b * per + k;
      out[c] = kivi_dequantize((byte >> (k * Bits)) & mask, kivi_to_float(scale[c]),
                               kivi_to_float(zero[c]));
    }
  }
}

template <int Bits, detail::kivi_scale_type S>
KVSCOUT_HOST_DEVICE void kivi_dequantize_value_row(const std::uint8_t* codes, const S* scales,
                                                   const S* zeros, int D, int G, float* out) {
  constexpr int per = kivi_codes_per_byte<Bits>;
  constexpr std::uint32_t mask = (1u << Bits) - 1u;
  // Two simple loops (codes, then parameters) vectorise; one with a runtime G would not.
  for (int b = 0; b < D / per; ++b) {
    const std::uint32_t byte = codes[b];
    for (int k = 0; k < per; ++k) out[b * per + k] = static_cast<float>((byte >> (k * Bits)) & mask);
  }
  for (int j = 0; j < D / G; ++j) {
    const float sc = kivi_to_float(scales[j]), z = kivi_to_float(zeros[j]);
    for (int c = j * G; c < (j + 1) * G; ++c) out[c] = kivi_fma(out[c], sc, z);
  }
}

}  // namespace detail
}  // namespace kvscout
