#pragma once
// Owned workspaces sized by a part's own query, for callers that do not bring their own memory
// (examples, tests, tools). Set-up time only: these allocate.
//
//   auto ws = kvscout::make_workspace<kvscout::gather_executor_host<L>>(cfg);
//   kvscout::gather_executor_host<L> gather(cfg, ws.span());
//
// make_workspace<Part>(args...) holds Part::workspace_bytes(args...) bytes at
// Part::workspace_alignment. A zero-byte workspace is an empty span.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <concepts>
#include <cstdlib>
#include <memory>
#include <new>
#include <utility>

#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {
namespace detail {
struct aligned_host_delete {
  std::size_t alignment = alignof(std::max_align_t);
  void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{alignment}); }
};
struct device_free {
  void operator()(std::byte* p) const noexcept { KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(p)); }
};
}  // namespace detail

class host_workspace {
 public:
  host_workspace() = default;
  host_workspace(std::size_t bytes, std::size_t alignment) : bytes_(bytes) {
    KVSCOUT_EXPECTS(alignment > 0 && (alignment & (alignment - 1)) == 0, "workspace alignment ",
                    alignment, " is not a power of two");
    if (bytes == 0) return;
    const std::size_t a = alignment < alignof(std::max_align_t) ? alignof(std::max_align_t) : alignment;
    void* p = ::operator new(bytes, std::align_val_t{a});
    p_ = std::unique_ptr<std::byte, detail::aligned_host_delete>(static_cast<std::byte*>(p),
                                                                  detail::aligned_host_delete{a});
  }
  [[nodiscard]] host_span<std::byte> span() const noexcept { return {p_.get(), bytes_}; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  [[nodiscard]] std::byte* data() const noexcept { return p_.get(); }

 private:
  std::unique_ptr<std::byte, detail::aligned_host_delete> p_;
  std::size_t bytes_ = 0;
};

/// cudaMalloc: 256-byte aligned.
class device_workspace {
 public:
  device_workspace() = default;
  device_workspace(std::size_t bytes, std::size_t alignment) : bytes_(bytes) {
    KVSCOUT_EXPECTS(alignment > 0 && alignment <= 256 && (alignment & (alignment - 1)) == 0,
                    "device workspace alignment ", alignment,
                    " must be a power of two up to 256 (cudaMalloc's)");
    if (bytes == 0) return;
    void* p = nullptr;
    KVSCOUT_CUDA_CHECK(cudaMalloc(&p, bytes));
    p_ = std::unique_ptr<std::byte, detail::device_free>(static_cast<std::byte*>(p));
  }
  [[nodiscard]] device_span<std::byte> span() const noexcept { return {p_.get(), bytes_}; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  [[nodiscard]] std::byte* data() const noexcept { return p_.get(); }

 private:
  std::unique_ptr<std::byte, detail::device_free> p_;
  std::size_t bytes_ = 0;
};

template <class Part, class... Args>
  requires requires(const Args&... a) {
    { Part::workspace_bytes(a...) } -> std::convertible_to<std::size_t>;
    { Part::workspace_alignment } -> std::convertible_to<std::size_t>;
  }
host_workspace make_workspace(const Args&... args) {
  return host_workspace(Part::workspace_bytes(args...), Part::workspace_alignment);
}

template <class Part, class... Args>
  requires requires(const Args&... a) {
    { Part::workspace_bytes(a...) } -> std::convertible_to<std::size_t>;
    { Part::workspace_alignment } -> std::convertible_to<std::size_t>;
  }
device_workspace make_device_workspace(const Args&... args) {
  return device_workspace(Part::workspace_bytes(args...), Part::workspace_alignment);
}

}  // namespace kvscout
