#pragma once
// An owning, aligned host allocation for a host KV store, set up once, outside the decode loop.
//
// host_pages::huge asks the kernel for transparent huge pages (Linux: a 2 MiB-aligned anonymous
// mapping with MADV_HUGEPAGE): a gather of scattered rows then stops waiting on page walks. Where
// that is unavailable the buffer still works with normal pages and huge_pages() says so. The
// memory can later be page-locked for the GPU (cudaHostRegister) without copying.
//
// Contents start zeroed. T must be trivially copyable. A buffer may instead borrow the caller's
// memory (host_buffer(host_span<T>)), which it never frees.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "kvscout/core/error.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

enum class host_pages { normal, huge };

template <class T>
class host_buffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "kvscout::host_buffer holds trivially copyable elements only");

 public:
  static constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

  host_buffer() = default;

  explicit host_buffer(std::size_t count, host_pages pages = host_pages::normal) : size_(count) {
    // The mapping rounds up to whole huge pages and may take one more (for the alignment).
    KVSCOUT_EXPECTS(count <= (SIZE_MAX - 2 * huge_page_bytes) / sizeof(T), "host_buffer of ",
                    count, " elements of ", sizeof(T), " bytes overflows size_t (at most ",
                    (SIZE_MAX - 2 * huge_page_bytes) / sizeof(T), ")");
    const std::size_t bytes = count * sizeof(T);
    if (bytes == 0) return;
#if defined(__linux__)
    mapped_ = (bytes + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes;
    void* p = mmap(nullptr, mapped_ + (pages == host_pages::huge ? huge_page_bytes : 0),
                   PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base_ = p;
    std::byte* start = static_cast<std::byte*>(p);
    if (pages == host_pages::huge) {
      const auto addr = reinterpret_cast<std::uintptr_t>(start);
      start += (huge_page_bytes - addr % huge_page_bytes) % huge_page_bytes;
      mapped_ += huge_page_bytes;
#if defined(MADV_HUGEPAGE)
      huge_ = madvise(start, (bytes + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes,
                      MADV_HUGEPAGE) == 0;
#endif
    }
    data_ = reinterpret_cast<T*>(start);
#else
    (void)pages;
    data_ = static_cast<T*>(::operator new(bytes, std::align_val_t{64}));
    base_ = data_;
    for (std::size_t i = 0; i < bytes; ++i) reinterpret_cast<std::byte*>(data_)[i] = std::byte{0};
#endif
  }

  /// Borrows the caller's memory: not freed here, its contents as the caller left them. `borrowed`
  /// must be aligned for T.
  explicit host_buffer(host_span<T> borrowed) noexcept : data_(borrowed.data()), size_(borrowed.size()) {}
  host_buffer(host_buffer&& o) noexcept { swap(o); }
  host_buffer& operator=(host_buffer&& o) noexcept {
    host_buffer(std::move(o)).swap(*this);
    return *this;
  }
  host_buffer(const host_buffer&) = delete;
  host_buffer& operator=(const host_buffer&) = delete;
  ~host_buffer() { release(); }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  [[nodiscard]] bool huge_pages() const noexcept { return huge_; }

  T* begin() noexcept { return data_; }
  T* end() noexcept { return data_ + size_; }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }

  [[nodiscard]] host_span<T> span() noexcept { return {data_, size_}; }
  [[nodiscard]] host_span<const T> span() const noexcept { return {data_, size_}; }

  void swap(host_buffer& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(mapped_, o.mapped_);
    std::swap(huge_, o.huge_);
  }

 private:
  void release() noexcept {
    if (base_ == nullptr) return;
#if defined(__linux__)
    munmap(base_, mapped_);
#else
    ::operator delete(base_, std::align_val_t{64});
#endif
    base_ = nullptr;
  }

  void* base_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t mapped_ = 0;
  bool huge_ = false;
};

namespace detail {
/// Non-null where bytes are needed, at least `need` bytes, at `alignment`.
inline void check_cache_memory(const char* what, host_span<std::byte> memory, std::size_t need,
                               std::size_t alignment) {
  KVSCOUT_EXPECTS(memory.size() >= need, what, ": the caller's memory holds ", memory.size(),
                  " bytes, expected at least ", need);
  KVSCOUT_EXPECTS(need == 0 || memory.data() != nullptr, what, ": the caller's memory is null");
  KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(memory.data()) % alignment == 0, what,
                  ": the caller's memory must be ", alignment, "-byte aligned, got address ",
                  static_cast<const void*>(memory.data()));
}
/// The checks above, then the first `need` bytes zeroed. Returns memory.data().
inline std::byte* zeroed_cache_memory(const char* what, host_span<std::byte> memory, std::size_t need,
                                      std::size_t alignment) {
  check_cache_memory(what, memory, need, alignment);
  if (need > 0) std::memset(memory.data(), 0, need);
  return memory.data();
}
template <class T>
host_buffer<T> borrow_zeroed(const char* what, host_span<std::byte> memory, std::size_t need,
                             std::size_t alignment) {
  T* p = reinterpret_cast<T*>(zeroed_cache_memory(what, memory, need, alignment));
  return host_buffer<T>(host_span<T>{p, need / sizeof(T)});
}
}  // namespace detail

}  // namespace kvscout
