#pragma once
// Element types of a KV cache: float, half (__half) and bfloat16 (__nv_bfloat16).
//
// The half types are CUDA's own, from <cuda_fp16.h> and <cuda_bf16.h>; their conversions are
// host-callable, so every algorithm is tested on the CPU with the exact types a GPU engine uses.
//
//   using T = kvscout::half;
//   static_assert(kvscout::dtype_traits<T>::id == kvscout::dtype::f16);
//   T x = kvscout::from_float<T>(0.5f);
//   float y = kvscout::to_float(x);                // 0.5f

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "kvscout/core/config.hpp"

namespace kvscout {

using half = __half;
using bfloat16 = __nv_bfloat16;

/// Runtime tag of an element type; dispatched once, at the outermost host API.
enum class dtype : int { f32 = 0, f16 = 1, bf16 = 2 };

constexpr std::string_view to_string(dtype d) noexcept {
  switch (d) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
  }
  return "unknown";
}

inline std::ostream& operator<<(std::ostream& os, dtype d) {
  const auto s = to_string(d);
  if (s == "unknown") return os << "dtype(" << static_cast<int>(d) << ")";
  return os << s;
}

/// Traits of a supported element type. Unsupported types have no specialisation, so using one
/// fails at compile time (see is_kv_element).
template <class T>
struct dtype_traits;

template <>
struct dtype_traits<float> {
  static constexpr dtype id = dtype::f32;
  static constexpr std::string_view name = "f32";
  /// Unit round-off (half the distance from 1 to the next value).
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

/// A type kvscout can store in a KV cache.
template <class T>
concept kv_element = requires {
  { dtype_traits<std::remove_cv_t<T>>::id } -> std::convertible_to<dtype>;
};

/// The element type for a runtime tag: dtype_of_t<dtype::f16> is half.
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
template <dtype D>
using dtype_of_t = typename dtype_of<D>::type;

constexpr std::size_t size_of(dtype d) noexcept { return d == dtype::f32 ? 4 : 2; }

/// Elements per 16-byte vector: the natural unit of a coalesced load on the GPU and of SIMD
/// on the CPU. Derived from sizeof(T), never hard-coded per instantiation.
template <kv_element T>
inline constexpr int vec_width = static_cast<int>(16 / sizeof(T));

// Conversions, written once for both backends.
KVSCOUT_HOST_DEVICE float to_float(float x) { return x; }
KVSCOUT_HOST_DEVICE float to_float(half x) { return __half2float(x); }
KVSCOUT_HOST_DEVICE float to_float(bfloat16 x) { return __bfloat162float(x); }

/// Round-to-nearest-even conversion from float.
template <kv_element T>
KVSCOUT_HOST_DEVICE T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, half>) {
    return __float2half_rn(x);
  } else {
    return __float2bfloat16_rn(x);
  }
}

/// Loads p[i] as float.
template <kv_element T>
KVSCOUT_HOST_DEVICE float load_float(const T* p, std::size_t i) {
  return to_float(p[i]);
}

/// Stores v into p[i] with round-to-nearest-even.
template <kv_element T>
KVSCOUT_HOST_DEVICE void store_float(T* p, std::size_t i, float v) {
  p[i] = from_float<T>(v);
}

/// Converts between element types through float.
template <kv_element To, kv_element From>
KVSCOUT_HOST_DEVICE To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else {
    return from_float<To>(to_float(x));
  }
}

}  // namespace kvscout
