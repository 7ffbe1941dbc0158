#pragma once
// Runtime-to-static dispatch, done once at the outermost host API. The callable receives the
// value as a std::integral_constant, so everything below it is compiled for that value only:
//
//   kvscout::dispatch_head_dim(head_dim, [&](auto hd) { run<decltype(hd)::value>(...); });
//   kvscout::dispatch_dtype(d, [&](auto t) { run<typename decltype(t)::type>(...); });
//
// A std::integral_constant argument skips the search; a static value outside the list is a
// compile-time error, a runtime one throws kvscout::error naming the value and the supported set.

#include <sstream>
#include <string>
#include <type_traits>

#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"

namespace kvscout {
namespace detail {

template <auto... Vs>
struct value_list {
  static constexpr std::size_t size = sizeof...(Vs);
  template <class T>
  static constexpr bool contains(T v) {
    return ((v == Vs) || ...);
  }
};

inline constexpr value_list<64, 128, 256> supported_head_dims{};
inline constexpr value_list<dtype::f32, dtype::f16, dtype::bf16, dtype::f8e4m3, dtype::f8e5m2>
    supported_dtypes{};

template <class T>
struct is_integral_constant : std::false_type {};
template <class T, T V>
struct is_integral_constant<std::integral_constant<T, V>> : std::true_type {};

template <auto... Vs>
std::string list_string() {
  std::ostringstream os;
  os << '{';
  bool first = true;
  ((os << (first ? "" : ", ") << Vs, first = false), ...);
  os << '}';
  return os.str();
}

template <auto V, auto... Rest, class T, class F, auto... All>
decltype(auto) dispatch_search(T value, const char* what, F& f, detail::value_list<All...> all) {
  if (value == V) return f(std::integral_constant<decltype(V), V>{});
  if constexpr (sizeof...(Rest) > 0) {
    return dispatch_search<Rest...>(value, what, f, all);
  } else {
    throw_error("dispatch", __FILE__, __LINE__, "unsupported ", what, " = ", value,
                "; supported values are ", list_string<All...>());
  }
}

/// Calls f(std::integral_constant<decltype(V), V>{}) for the V in `list` equal to `value`. `what`
/// names the parameter in the error message.
template <auto... Vs, class T, class F>
decltype(auto) dispatch(value_list<Vs...> list, T value, const char* what, F&& f) {
  static_assert(sizeof...(Vs) > 0, "kvscout::dispatch: the list of supported values is empty");
  if constexpr (detail::is_integral_constant<T>::value) {
    static_assert(detail::value_list<Vs...>::contains(T::value),
                  "kvscout::dispatch: this static value is not in the supported list");
    (void)what;
    return f(value);
  } else {
    return detail::dispatch_search<Vs...>(value, what, f, list);
  }
}

}  // namespace detail

template <class T, class F>
decltype(auto) dispatch_head_dim(T head_dim, F&& f) {
  return detail::dispatch(detail::supported_head_dims, head_dim, "head_dim", f);
}

template <class F>
decltype(auto) dispatch_dtype(dtype d, F&& f) {
  return detail::dispatch(detail::supported_dtypes, d, "dtype", [&](auto tag) -> decltype(auto) {
    return f(std::type_identity<detail::dtype_of_t<decltype(tag)::value>>{});
  });
}

}  // namespace kvscout
