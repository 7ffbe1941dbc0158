#pragma once
// Whether two byte ranges share a byte: the aliasing checks of the gather's destination, of
// attention's out / q / probs and of KIVI's buffers, written once.

#include <cstddef>
#include <cstdint>

namespace kvscout::detail {

/// True when [a, a + a_bytes) and [b, b + b_bytes) share at least one byte; an empty range
/// overlaps nothing. Compares addresses as integers (ranges from unrelated objects included).
inline bool bytes_overlap(const void* a, std::size_t a_bytes, const void* b,
                          std::size_t b_bytes) noexcept {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace kvscout::detail
