// The host GEMV's widening of 2-byte rows (detail::load16): every one of the 65536 codes of half
// and of bfloat16 gives the float that to_float gives, bit for bit, and NaN stays NaN. This file is
// built three times (tests/CMakeLists.txt): for the default target (the integer half path), with
// F16C (x86-64-v3) and with -march=native (the AVX-512 paths where the machine has them).

#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvscout/core/simd.hpp"

TEMPLATE_TEST_CASE("load16 widens every 2-byte code exactly", "[gemv][dtype]", kvscout::half,
                   kvscout::bfloat16) {
  using W = TestType;
  int mismatched = 0, nan_lost = 0, nans = 0;
  for (std::uint32_t c0 = 0; c0 < 65536; c0 += 16) {
    W row[17];  // one element more, so that a load at an odd (2-byte) offset is tested too
    for (std::uint32_t t = 0; t < 17; ++t) {
      const auto code = static_cast<std::uint16_t>((c0 + t) & 0xffff);
      row[t] = std::bit_cast<W>(code);
    }
    for (const int offset : {0, 1}) {
      kvscout::detail::float_vec<16>::type x;
      kvscout::detail::load16(row + offset, x);
      for (int t = 0; t < 16; ++t) {
        const float want = kvscout::to_float(row[offset + t]);
        if (want != want) {
          ++nans;
          nan_lost += x[t] == x[t];
        } else if (std::bit_cast<std::uint32_t>(want) != std::bit_cast<std::uint32_t>(x[t])) {
          if (mismatched++ < 5) {
            const auto code = std::bit_cast<std::uint16_t>(row[offset + t]);
            UNSCOPED_INFO("code " << code << ": to_float " << want << ", load16 " << x[t]);
          }
        }
      }
    }
  }
  REQUIRE(mismatched == 0);
  REQUIRE(nan_lost == 0);
  // Both formats have 2 x (2^m - 1) NaN codes (m = 10 mantissa bits for half, 7 for bfloat16),
  // each loaded twice (offsets 0 and 1: the odd offset wraps round to code 0 at the end).
  REQUIRE(nans == 2 * (std::is_same_v<W, kvscout::half> ? 2046 : 254));
}
