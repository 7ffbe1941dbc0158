#pragma once

#include <cstddef>
#include <ostream>

namespace kvscout {

/// How a host gather writes its destination.
///   cached:    ordinary stores (memcpy): the rows stay in the cache for whoever reads them next.
///   streaming: non-temporal stores where the destination row is aligned to the store width: the
///              destination lines are not read first and do not evict the cache.
///   automatic: streaming when a submit moves at least 4 MiB, cached otherwise.
enum class gather_stores : int { automatic = 0, cached = 1, streaming = 2 };

namespace detail {
/// About one core's share of a last-level cache.
inline constexpr std::size_t gather_streaming_bytes = std::size_t{4} << 20;
}  // namespace detail

inline std::ostream& operator<<(std::ostream& os, gather_stores s) {
  switch (s) {
    case gather_stores::automatic: return os << "automatic";
    case gather_stores::cached: return os << "cached";
    case gather_stores::streaming: return os << "streaming";
  }
  return os << "gather_stores(" << static_cast<int>(s) << ")";
}

}  // namespace kvscout
