// KIVI attention rows dequantise on the host a register of channels at a time
// (attention/kivi_rows.hpp: kivi_host_key_row / kivi_host_value_row). They must give, bit for bit,
// what the scalar loops of kv/detail/kivi_pack.hpp give (the definition shared with the CUDA
// kernels): fma(code, scale, zero) with one rounding. Tested over random codes and parameters of
// every kind (normal, subnormal, signed zeros, infinities, NaN; NaN payloads may differ), at
// head dims with and without a tail below the register width, every value group size dividing
// the head dim, codes and parameters at unaligned addresses. This file is
// built four times (tests/CMakeLists.txt): the default target (SSE2: no FMA, half parameters by
// multiply + add, float ones by the scalar fma), F16C without FMA, x86-64-v3 (FMA) and
// -march=native (AVX-512 where the machine has it).

#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "kvscout/attention/kivi_rows.hpp"

namespace {

using kvscout::half;

// A parameter of type S: mostly values of the magnitudes a cache holds, some of each edge case.
template <class S>
S random_param(std::mt19937& rng) {
  std::uniform_int_distribution<int> kind(0, 15);
  std::normal_distribution<float> nd(0.f, 1.f);
  switch (kind(rng)) {
    case 0: {  // any bit pattern: infinities, NaN, subnormals of S included
      if constexpr (std::is_same_v<S, half>) {
        return std::bit_cast<half>(static_cast<std::uint16_t>(rng()));
      } else {
        return std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
      }
    }
    case 1:
      return kvscout::from_float<S>(-0.f);
    case 2:
      return kvscout::from_float<S>(nd(rng) * 1e-6f);  // half subnormals
    case 3:
      return kvscout::from_float<S>(nd(rng) * 3e4f);  // near the half's largest value
    default:
      return kvscout::from_float<S>(nd(rng) * (kind(rng) % 2 ? 0.05f : 4.f));
  }
}

bool same_float(float a, float b) {
  if (a != a || b != b) return a != a && b != b;  // NaN stays NaN; its payload may differ
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

template <int Bits, class S, int D>
void check_rows(std::mt19937& rng, int& compared) {
  using namespace kvscout::detail;
  const int code_bytes = D * Bits / 8;
  for (int trial = 0; trial < 60; ++trial) {
    // The row sits at an odd offset: nothing may assume an aligned record.
    std::vector<std::uint8_t> buf(static_cast<std::size_t>(code_bytes) + 1);
    for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
    const std::uint8_t* codes = buf.data() + 1;
    // The parameters too, one element off their vectors' alignment.
    std::vector<S> scale_buf(D + 1), zero_buf(D + 1);
    S* scale = scale_buf.data() + 1;
    S* zero = zero_buf.data() + 1;
    for (int c = 0; c < D; ++c) scale[c] = random_param<S>(rng), zero[c] = random_param<S>(rng);

    std::vector<float> want(D), got(D, -3.f);
    kivi_dequantize_key_row<Bits, S>(codes, scale, zero, D, want.data());
    kivi_host_key_row<Bits, S, D>(codes, scale, zero, got.data());
    for (int c = 0; c < D; ++c) {
      CAPTURE(Bits, D, trial, c, kivi_code<Bits>(codes, c), kivi_to_float(scale[c]),
              kivi_to_float(zero[c]), want[c], got[c]);
      REQUIRE(same_float(want[c], got[c]));
      ++compared;
    }

    for (int G = 1; G <= D; ++G) {
      if (D % G != 0) continue;
      std::fill(got.begin(), got.end(), -3.f);
      kivi_dequantize_value_row<Bits, S>(codes, scale, zero, D, G, want.data());
      kivi_host_value_row<Bits, S, D>(codes, scale, zero, G, got.data());
      for (int c = 0; c < D; ++c) {
        CAPTURE(Bits, D, G, trial, c, kivi_code<Bits>(codes, c), kivi_to_float(scale[c / G]),
                kivi_to_float(zero[c / G]), want[c], got[c]);
        REQUIRE(same_float(want[c], got[c]));
        ++compared;
      }
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("kivi host rows dequantise a register at a time to the scalar definition's bits",
                   "[kivi][attention]", half, float) {
  using S = TestType;
  std::mt19937 rng(std::is_same_v<S, half> ? 31 : 37);
  int compared = 0;
  // 12, 20, 24 and 40: tails below 8 or 16 lanes (20: below 4 and 8 lanes too; 12, 24, 40
  // with 16 lanes: a register and a tail, or no register at all).
  check_rows<2, S, 12>(rng, compared);
  check_rows<4, S, 12>(rng, compared);
  check_rows<2, S, 20>(rng, compared);
  check_rows<4, S, 20>(rng, compared);
  check_rows<2, S, 24>(rng, compared);
  check_rows<4, S, 24>(rng, compared);
  check_rows<2, S, 40>(rng, compared);
  check_rows<4, S, 40>(rng, compared);
  check_rows<2, S, 64>(rng, compared);
  check_rows<4, S, 64>(rng, compared);
  check_rows<2, S, 128>(rng, compared);
  check_rows<4, S, 128>(rng, compared);
  INFO("host_float_lanes = " << kvscout::detail::host_float_lanes
                             << ", lanes exact = " << kvscout::detail::kivi_host_lanes_exact<S>);
  REQUIRE(compared > 100000);
}
