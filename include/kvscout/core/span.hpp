#pragma once
// Non-owning views whose type carries the memory space: passing device memory where host memory
// is expected (or the reverse) does not compile. Element access is offered only where the memory
// can be read: host spans from host code, device spans from device code.

#include <concepts>
#include <cstddef>
#include <ranges>
#include <type_traits>

#include "kvscout/core/config.hpp"

namespace kvscout {

struct host_space {
  static constexpr const char* name = "host";
};
struct device_space {
  static constexpr const char* name = "device";
};

template <class T, class Space>
class span;

namespace detail {
template <class X>
inline constexpr bool is_kvscout_span = false;
template <class T, class Space>
inline constexpr bool is_kvscout_span<span<T, Space>> = true;
}  // namespace detail

template <class T, class Space>
class span {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  using memory_space = Space;

  constexpr span() noexcept = default;  // defaulted: callable on host and device alike
  KVSCOUT_HOST_DEVICE constexpr span(T* data, std::size_t size) noexcept
      : data_(data), size_(size) {}

  /// Never across memory spaces.
  template <class U>
    requires(!std::same_as<U, T> && std::is_convertible_v<U (*)[], T (*)[]>)
  KVSCOUT_HOST_DEVICE constexpr span(const span<U, Space>& other) noexcept
      : data_(other.data()), size_(other.size()) {}

  /// A host span over a contiguous host container (a container's memory space is not in its type);
  /// lvalues only, so that a span never outlives a temporary it was made from.
  template <class R, class S = Space>
    requires std::same_as<S, host_space> && (!detail::is_kvscout_span<std::remove_cv_t<R>>) &&
             std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
             std::is_convertible_v<std::remove_reference_t<std::ranges::range_reference_t<R>> (*)[],
                                   T (*)[]>
  constexpr span(R& range) noexcept  // NOLINT(google-explicit-constructor): as std::span
      : data_(std::ranges::data(range)),
        size_(static_cast<std::size_t>(std::ranges::size(range))) {}

  KVSCOUT_HOST_DEVICE constexpr T* data() const noexcept { return data_; }
  KVSCOUT_HOST_DEVICE constexpr std::size_t size() const noexcept { return size_; }
  KVSCOUT_HOST_DEVICE constexpr std::size_t size_bytes() const noexcept {
    return size_ * sizeof(T);
  }
  KVSCOUT_HOST_DEVICE constexpr bool empty() const noexcept { return size_ == 0; }

  KVSCOUT_HOST_DEVICE constexpr span subspan(std::size_t offset, std::size_t count) const noexcept {
    return span(data_ + offset, count);
  }

  template <class S = Space>
    requires std::same_as<S, host_space>
  constexpr T& operator[](std::size_t i) const noexcept {
    return data_[i];
  }
  template <class S = Space>
    requires std::same_as<S, host_space>
  constexpr T* begin() const noexcept {
    return data_;
  }
  template <class S = Space>
    requires std::same_as<S, host_space>
  constexpr T* end() const noexcept {
    return data_ + size_;
  }

#if KVSCOUT_CUDA_COMPILER
  template <class S = Space>
    requires std::same_as<S, device_space>
  __device__ __forceinline__ T& operator[](std::size_t i) const noexcept {
    return data_[i];
  }
#endif

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

template <class T>
using host_span = span<T, host_space>;
template <class T>
using device_span = span<T, device_space>;

template <class T, class Space>
KVSCOUT_HOST_DEVICE span<const std::byte, Space> as_bytes(span<T, Space> s) noexcept {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size_bytes()};
}
template <class T, class Space>
  requires(!std::is_const_v<T>)
KVSCOUT_HOST_DEVICE span<std::byte, Space> as_writable_bytes(span<T, Space> s) noexcept {
  return {reinterpret_cast<std::byte*>(s.data()), s.size_bytes()};
}

}  // namespace kvscout
