#pragma once
// The formats partial keys can be kept in, and the cache that keeps each: a compute element (float,
// half, bfloat16) in a partial_key_cache<T>, or a quantized_keys<Bits, Group> tag in a
// quantized_partial_key_cache<Bits, Group>.

#include <type_traits>

#include "kvscout/cache/partial_key_cache.hpp"
#include "kvscout/cache/quantized_partial_key_cache.hpp"
#include "kvscout/core/dtype.hpp"

namespace kvscout {

namespace detail {
template <class T>
struct is_quantized_keys : std::false_type {};
template <int Bits, int Group>
struct is_quantized_keys<quantized_keys<Bits, Group>>
    : std::bool_constant<detail::supported_key_quantization(Bits, Group)> {};
template <class T>
inline constexpr bool is_quantized_keys_v = detail::is_quantized_keys<T>::value;
}  // namespace detail

/// A format partial keys can be kept in: float, half, bfloat16, or quantized_keys<Bits, Group>.
template <class T>
concept partial_key_format = compute_element<T> || detail::is_quantized_keys_v<T>;

namespace detail {
template <class T>
struct partial_key_store_of {
  using type = partial_key_cache<T>;
};
template <int Bits, int Group>
struct partial_key_store_of<quantized_keys<Bits, Group>> {
  using type = quantized_partial_key_cache<Bits, Group>;
};
}  // namespace detail

namespace detail {
/// The cache a format is kept in (an InfiniGen policy's `key_store`).
template <partial_key_format PkT>
using partial_key_store = typename partial_key_store_of<PkT>::type;
}  // namespace detail

static_assert(partial_key_format<float> && partial_key_format<quantized_keys<2>> &&
              !partial_key_format<fp8_e4m3> && !partial_key_format<quantized_keys<3>>);

}  // namespace kvscout
