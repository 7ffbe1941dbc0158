#pragma once

#include <cstddef>
#include <cstdint>

namespace kvscout::detail {

/// An empty range overlaps nothing. Compares addresses as integers (unrelated objects included).
inline bool bytes_overlap(const void* a, std::size_t a_bytes, const void* b,
                          std::size_t b_bytes) noexcept {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace kvscout::detail
