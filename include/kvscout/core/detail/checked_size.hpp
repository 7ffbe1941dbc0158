#pragma once
// Sizes from caller-given dimensions, checked: an overflow is an error naming what was sized and
// its factors, never a wrapped (too small) size.

#include <cstddef>
#include <sstream>
#include <string>
#include <utility>

#include "kvscout/core/error.hpp"

namespace kvscout::detail {

template <class... I>
std::size_t checked_size(const char* what, I... factors) {
  std::size_t r = 1;
  bool over = false;
  ((over = over || std::cmp_less(factors, 0) ||
           __builtin_mul_overflow(r, static_cast<std::size_t>(factors), &r)),
   ...);
  if (over) {
    std::ostringstream os;
    bool first = true;
    ((os << (first ? "" : " x ") << factors, first = false), ...);
    KVSCOUT_EXPECTS(!over, what, " = ", os.str(), " does not fit in size_t");
  }
  return r;
}

inline std::size_t checked_sum(const char* what, std::size_t a, std::size_t b) {
  std::size_t r = 0;
  KVSCOUT_EXPECTS(!__builtin_add_overflow(a, b, &r), what, " = ", a, " + ", b, " does not fit in size_t");
  return r;
}

}  // namespace kvscout::detail
