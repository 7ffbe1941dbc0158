#pragma once
// Element types of a KV cache: float, half (__half), bfloat16 (__nv_bfloat16) and the two OCP
// 8-bit floats, fp8_e4m3 and fp8_e5m2; CUDA's own types, whose conversions are host-callable, so
// every algorithm is tested on the CPU with the exact types a GPU engine uses. from_float rounds
// to nearest even; into fp8 it saturates to the largest finite value (__NV_SATFINITE), NaN stays
// NaN. An fp8 cache usually stores x / scale with one scale per layer for K and one for V
// (vLLM's k_scale / v_scale): attention takes them (attention_params), appends divide by them.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <bit>
#include <cstddef>
#include <limits>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "kvscout/core/config.hpp"

namespace kvscout {

using half = __half;
using bfloat16 = __nv_bfloat16;
using fp8_e4m3 = __nv_fp8_e4m3;
using fp8_e5m2 = __nv_fp8_e5m2;

enum class dtype : int { f32 = 0, f16 = 1, bf16 = 2, f8e4m3 = 3, f8e5m2 = 4 };

constexpr std::string_view to_string(dtype d) noexcept {
  switch (d) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::f8e4m3: return "f8e4m3";
    case dtype::f8e5m2: return "f8e5m2";
  }
  return "unknown";
}

inline std::ostream& operator<<(std::ostream& os, dtype d) {
  const auto s = to_string(d);
  if (s == "unknown") return os << "dtype(" << static_cast<int>(d) << ")";
  return os << s;
}

/// Unsupported types have no specialisation, so using one fails at compile time.
template <class T>
struct dtype_traits;

template <>
struct dtype_traits<float> {
  static constexpr dtype id = dtype::f32;
  static constexpr std::string_view name = "f32";
  static constexpr double epsilon = 5.9604644775390625e-08;  // 2^-24
};
template <>
struct dtype_traits<half> {
  static constexpr dtype id = dtype::f16;
  static constexpr std::string_view name = "f16";
  static constexpr double epsilon = 4.8828125e-04;  // 2^-11
};
template <>
struct dtype_traits<bfloat16> {
  static constexpr dtype id = dtype::bf16;
  static constexpr std::string_view name = "bf16";
  static constexpr double epsilon = 3.90625e-03;  // 2^-8
};
template <>
struct dtype_traits<fp8_e4m3> {
  static constexpr dtype id = dtype::f8e4m3;
  static constexpr std::string_view name = "f8e4m3";
  static constexpr double epsilon = 6.25e-02;  // 2^-4
};
template <>
struct dtype_traits<fp8_e5m2> {
  static constexpr dtype id = dtype::f8e5m2;
  static constexpr std::string_view name = "f8e5m2";
  static constexpr double epsilon = 1.25e-01;  // 2^-3
};

template <class T>
concept kv_element = requires {
  { dtype_traits<std::remove_cv_t<T>>::id } -> std::convertible_to<dtype>;
};

namespace detail {
template <dtype D>
struct dtype_of;
template <>
struct dtype_of<dtype::f32> {
  using type = float;
};
template <>
struct dtype_of<dtype::f16> {
  using type = half;
};
template <>
struct dtype_of<dtype::bf16> {
  using type = bfloat16;
};
template <>
struct dtype_of<dtype::f8e4m3> {
  using type = fp8_e4m3;
};
template <>
struct dtype_of<dtype::f8e5m2> {
  using type = fp8_e5m2;
};
template <dtype D>
using dtype_of_t = typename detail::dtype_of<D>::type;

constexpr std::size_t size_of(dtype d) noexcept {
  switch (d) {
    case dtype::f32: return 4;
    case dtype::f16:
    case dtype::bf16: return 2;
    case dtype::f8e4m3:
    case dtype::f8e5m2: return 1;
  }
  return 0;
}

template <class T>
inline constexpr bool is_fp8_v =
    std::is_same_v<std::remove_cv_t<T>, fp8_e4m3> || std::is_same_v<std::remove_cv_t<T>, fp8_e5m2>;
}  // namespace detail

/// float, half or bfloat16: the types values are computed in and handed over as. fp8 is a storage
/// type of KV rows only: its values carry a scale that those interfaces do not take.
template <class T>
concept compute_element = kv_element<T> && !detail::is_fp8_v<T>;

namespace detail {
/// Elements per 16-byte vector: a coalesced load on the GPU, SIMD on the CPU.
template <kv_element T>
inline constexpr int vec_width = static_cast<int>(16 / sizeof(T));
}  // namespace detail

KVSCOUT_HOST_DEVICE float to_float(float x) { return x; }
KVSCOUT_HOST_DEVICE float to_float(half x) { return __half2float(x); }
KVSCOUT_HOST_DEVICE float to_float(bfloat16 x) { return __bfloat162float(x); }
namespace detail {
/// Every value of an OCP 8-bit float by code: the host widens fp8 with one load (cuda_fp8.h's host
/// path converts bit by bit, several times slower).
struct fp8_values {
  float v[256];
  constexpr fp8_values(int mbits, int bias) : v{} {
    const int ebits = 7 - mbits;
    const int emax = (1 << ebits) - 1, mmax = (1 << mbits) - 1;
    for (int c = 0; c < 256; ++c) {
      const int e = (c >> mbits) & emax, m = c & mmax;
      float mag;
      if (mbits == 3 && e == emax && m == mmax) {
        mag = std::numeric_limits<float>::quiet_NaN();
      } else if (mbits == 2 && e == emax) {
        mag = m == 0 ? std::numeric_limits<float>::infinity()
                     : std::numeric_limits<float>::quiet_NaN();
      } else {
        float scale = 1.f;
        const int p = (e == 0 ? 1 : e) - bias - mbits;
        for (int i = 0; i < p; ++i) scale *= 2.f;
        for (int i = 0; i > p; --i) scale *= 0.5f;
        mag = static_cast<float>(e == 0 ? m : (1 << mbits) + m) * scale;
      }
      v[c] = (c & 0x80) != 0 ? -mag : mag;
    }
  }
};
inline constexpr fp8_values e4m3_values{3, 7};
inline constexpr fp8_values e5m2_values{2, 15};
}  // namespace detail

KVSCOUT_HOST_DEVICE float to_float(fp8_e4m3 x) {
#if KVSCOUT_DEVICE_PASS
  return static_cast<float>(x);
#else
  return detail::e4m3_values.v[std::bit_cast<unsigned char>(x)];
#endif
}
KVSCOUT_HOST_DEVICE float to_float(fp8_e5m2 x) {
#if KVSCOUT_DEVICE_PASS
  return static_cast<float>(x);
#else
  return detail::e5m2_values.v[std::bit_cast<unsigned char>(x)];
#endif
}

template <kv_element T>
KVSCOUT_HOST_DEVICE T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, half>) {
    return __float2half_rn(x);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    static_assert(detail::is_fp8_v<T>);
    return T(x);  // cuda_fp8.h: round to nearest even, __NV_SATFINITE
  }
}

/// The dequantisation scales of a cache that stores K / k and V / v (fp8 caches); 1 otherwise.
struct kv_scales {
  float k = 1.f;
  float v = 1.f;
};

namespace detail {
template <kv_element T>
KVSCOUT_HOST_DEVICE float load_float(const T* p, std::size_t i) {
  return to_float(p[i]);
}

template <kv_element T>
KVSCOUT_HOST_DEVICE void store_float(T* p, std::size_t i, float v) {
  p[i] = from_float<T>(v);
}

template <kv_element To, kv_element From>
KVSCOUT_HOST_DEVICE To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else {
    return from_float<To>(to_float(x));
  }
}
}  // namespace detail

}  // namespace kvscout
