// The host kernels' widening of rows to float: detail::load_lanes (the GEMV's and scoring's
// 2-byte rows: every one of the 65536 codes of half and of bfloat16) and detail::load_row
// (attention's rows: every code of both fp8 formats, and half rows) give the float that to_float
// gives, bit for bit, and NaN stays NaN. This file is built three times (tests/CMakeLists.txt):
// for the default target (the integer half path, fp8 by table), with F16C (x86-64-v3: 8 lanes,
// fp8 through half) and with -march=native (the AVX-512 paths where the machine has them).

#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kvscout/attention/rows.hpp"
#include "kvscout/core/simd.hpp"

TEMPLATE_TEST_CASE("load_lanes widens every 2-byte code exactly", "[gemv][dtype]", kvscout::half,
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
      float x[16];  // 16 / host_float_lanes loads, as the GEMV makes them
      for (int l = 0; l < 16; l += kvscout::detail::host_float_lanes) {
        const kvscout::detail::host_vec v = kvscout::detail::load_lanes(row + offset + l);
        std::memcpy(x + l, &v, sizeof v);
      }
      for (int t = 0; t < 16; ++t) {
        const float want = kvscout::to_float(row[offset + t]);
        if (want != want) {
          ++nans;
          nan_lost += x[t] == x[t];
        } else if (std::bit_cast<std::uint32_t>(want) != std::bit_cast<std::uint32_t>(x[t])) {
          if (mismatched++ < 5) {
            const auto code = std::bit_cast<std::uint16_t>(row[offset + t]);
            UNSCOPED_INFO("code " << code << ": to_float " << want << ", load_lanes " << x[t]);
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

// Attention's row loads: every code of the format, in rows of D = 40 (not a multiple of 16: the
// last 8 take the scalar tail on AVX-512, a whole register on AVX2), each code at every position
// of a row, against to_float.
TEMPLATE_TEST_CASE("load_row widens every fp8 code and half rows exactly", "[attention][dtype]",
                   kvscout::fp8_e4m3, kvscout::fp8_e5m2, kvscout::half, kvscout::bfloat16) {
  using T = TestType;
  constexpr int D = 40;
  constexpr int codes = sizeof(T) == 1 ? 256 : 65536;
  std::vector<T> all(codes + D);
  for (int c = 0; c < codes + D; ++c) {
    if constexpr (sizeof(T) == 1) {
      all[c] = std::bit_cast<T>(static_cast<std::uint8_t>(c & 0xff));
    } else {
      all[c] = std::bit_cast<T>(static_cast<std::uint16_t>(c & 0xffff));
    }
  }
  int mismatched = 0, nan_lost = 0, nans = 0;
  for (int start = 0; start < codes; ++start) {  // every code at every position of a row
    float x[D];
    kvscout::detail::load_row<T, D>(reinterpret_cast<const std::byte*>(all.data() + start), x);
    for (int t = 0; t < D; ++t) {
      const float want = kvscout::to_float(all[start + t]);
      if (want != want) {
        ++nans;
        nan_lost += x[t] == x[t];
      } else if (std::bit_cast<std::uint32_t>(want) != std::bit_cast<std::uint32_t>(x[t])) {
        if (mismatched++ < 5) UNSCOPED_INFO("index " << start + t << ": to_float " << want << ", load_row " << x[t]);
      }
    }
  }
  REQUIRE(mismatched == 0);
  REQUIRE(nan_lost == 0);
  REQUIRE(nans > 0);
}
