// core/: errors, dtype traits and conversions, dispatch, memory-space-tagged spans.

#include <catch2/catch.hpp>

#include <array>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <type_traits>
#include <vector>

#include "kvscout/core/dispatch.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/core/workspace.hpp"

namespace {
int checked_sqrt_floor(int x) {
  KVSCOUT_EXPECTS(x >= 0, "x must be non-negative, got ", x);
  return static_cast<int>(std::sqrt(x));
}
}  // namespace

TEST_CASE("kvscout::error carries function, file, line and the values", "[core][error]") {
  CHECK(checked_sqrt_floor(17) == 4);
  try {
    checked_sqrt_floor(-3);
    FAIL("no error thrown");
  } catch (const kvscout::error& e) {
    CHECK(e.function() == "checked_sqrt_floor");
    CHECK(e.file() == "test_core.cpp");
    CHECK(e.line() > 0);
    CHECK(e.message() == "x must be non-negative, got -3 [expected `x >= 0`]");
    const std::string what = e.what();
    CHECK_THAT(what, Catch::StartsWith("kvscout::error: checked_sqrt_floor: x must be"));
    CHECK_THAT(what, Catch::Contains("test_core.cpp:"));
  }
  // It is a std::runtime_error for callers that catch broadly.
  CHECK_THROWS_AS(checked_sqrt_floor(-1), std::runtime_error);
}

TEMPLATE_TEST_CASE("dtype conversions round to nearest even and round-trip", "[core][dtype]", float,
                   kvscout::half, kvscout::bfloat16) {
  using T = TestType;
  using traits = kvscout::dtype_traits<T>;
  CHECK(kvscout::dtype_traits<kvscout::detail::dtype_of_t<traits::id>>::id == traits::id);
  CHECK(kvscout::detail::size_of(traits::id) == sizeof(T));
  CHECK(kvscout::detail::vec_width<T> * sizeof(T) == 16);

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-100.f, 100.f);
  for (int i = 0; i < 2000; ++i) {
    const float x = dist(rng);
    const T y = kvscout::from_float<T>(x);
    const double back = kvscout::to_float(y);
    // Round-to-nearest: the error is at most half an ulp, i.e. epsilon relative.
    CAPTURE(x, back);
    REQUIRE(std::abs(back - x) <= traits::epsilon * std::abs(x) * (1 + 1e-12));
    // Exactly representable values survive the trip bit-exactly.
    REQUIRE(kvscout::to_float(kvscout::from_float<T>(static_cast<float>(back))) == back);
  }
  // Values with a known rounding: 1 + epsilon is a tie between 1 and 1 + 2 epsilon, and ties go
  // to even (1).
  const float tie = static_cast<float>(1.0 + traits::epsilon);
  if constexpr (!std::is_same_v<T, float>) {
    CHECK(kvscout::to_float(kvscout::from_float<T>(tie)) == 1.0f);
    const float above = static_cast<float>(1.0 + 1.5 * traits::epsilon);
    CHECK(kvscout::to_float(kvscout::from_float<T>(above)) ==
          static_cast<float>(1.0 + 2 * traits::epsilon));
  }
  // load / store through pointers, and convert between types.
  std::vector<T> buf(4);
  kvscout::detail::store_float(buf.data(), 2, 0.75f);
  CHECK(kvscout::detail::load_float(buf.data(), 2) == 0.75f);
  CHECK(kvscout::to_float(kvscout::detail::convert<float>(buf[2])) == 0.75f);
  CHECK(kvscout::to_float(kvscout::detail::convert<kvscout::half>(buf[2])) == 0.75f);
  CHECK(std::isinf(kvscout::to_float(kvscout::from_float<T>(std::numeric_limits<float>::infinity()))));
  CHECK(std::isnan(kvscout::to_float(kvscout::from_float<T>(std::numeric_limits<float>::quiet_NaN()))));
}

namespace {
// The OCP 8-bit float formats from their definition: sign, exponent field e, mantissa field m.
// E4M3: bias 7, subnormals at e = 0, no infinities, NaN only at e = 15 and m = 7.
// E5M2: bias 15, subnormals at e = 0, e = 31 holds the infinities (m = 0) and NaNs.
double decode_e4m3(unsigned code) {
  const int sign = (code >> 7) & 1, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return sign ? -mag : mag;
}
double decode_e5m2(unsigned code) {
  const int sign = (code >> 7) & 1, e = (code >> 2) & 31, m = code & 3;
  if (e == 31)
    return m == 0 ? (sign ? -INFINITY : INFINITY) : std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 4.0, -14) : std::ldexp(1.0 + m / 4.0, e - 15);
  return sign ? -mag : mag;
}
template <class T>
double decode_ref(unsigned code) {
  return std::is_same_v<T, kvscout::fp8_e4m3> ? decode_e4m3(code) : decode_e5m2(code);
}
template <class T>
unsigned code_of(T x) {
  unsigned char c;
  std::memcpy(&c, &x, 1);
  return c;
}
// Round to nearest, ties to the even code (mantissa LSB 0), saturating to the largest finite
// value: a search over every finite code, independent of how the conversion is written.
template <class T>
double nearest_ref(double x) {
  double best = 0, best_err = INFINITY;
  unsigned best_code = 0;
  for (unsigned c = 0; c < 256; ++c) {
    const double v = decode_ref<T>(c);
    if (!std::isfinite(v)) continue;
    const double err = std::abs(v - x);
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best_code & 1) == 1)) {
      best = v, best_err = err, best_code = c;
    }
  }
  return best;
}
}  // namespace

// fp8 is a storage type of KV rows: the interfaces that take values to compute with (partial
// keys, speculation's keys, queries and outputs) refuse it at compile time.
static_assert(kvscout::kv_element<kvscout::fp8_e4m3> && kvscout::kv_element<kvscout::fp8_e5m2>);
static_assert(kvscout::compute_element<float> && kvscout::compute_element<kvscout::half> &&
              kvscout::compute_element<const kvscout::bfloat16>);
static_assert(!kvscout::compute_element<kvscout::fp8_e4m3> &&
              !kvscout::compute_element<const kvscout::fp8_e5m2>);

TEMPLATE_TEST_CASE("fp8 decodes every code as the OCP format defines it", "[core][dtype][fp8]",
                   kvscout::fp8_e4m3, kvscout::fp8_e5m2) {
  using T = TestType;
  using traits = kvscout::dtype_traits<T>;
  CHECK(kvscout::dtype_traits<kvscout::detail::dtype_of_t<traits::id>>::id == traits::id);
  CHECK(kvscout::detail::size_of(traits::id) == 1);
  CHECK(kvscout::detail::vec_width<T> == 16);
  CHECK(kvscout::detail::is_fp8_v<T>);
  int nans = 0;
  for (unsigned c = 0; c < 256; ++c) {
    T x;
    const auto byte = static_cast<unsigned char>(c);
    std::memcpy(&x, &byte, 1);
    const double want = decode_ref<T>(c);
    const float got = kvscout::to_float(x);
    const auto cuda = static_cast<float>(x);  // CUDA's own conversion, what device code uses
    CAPTURE(c, want, got, cuda);
    REQUIRE(((std::isnan(got) && std::isnan(cuda)) || got == cuda));
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
      ++nans;
    } else if (std::isinf(want)) {
      // E5M2's infinities: decoded as such, saturated on the way back (0x7b / 0xfb = +-57344).
      REQUIRE(got == static_cast<float>(want));
      REQUIRE(code_of(kvscout::from_float<T>(got)) == (c & 0x80u) + 0x7bu);
    } else {
      REQUIRE(static_cast<double>(got) == want);
      // Every finite code survives the trip back, -0 included.
      REQUIRE(code_of(kvscout::from_float<T>(got)) == c);
    }
  }
  CHECK(nans == (std::is_same_v<T, kvscout::fp8_e4m3> ? 2 : 6));
}

TEMPLATE_TEST_CASE("fp8 rounds to nearest even and saturates", "[core][dtype][fp8]",
                   kvscout::fp8_e4m3, kvscout::fp8_e5m2) {
  using T = TestType;
  const double max = std::is_same_v<T, kvscout::fp8_e4m3> ? 448.0 : 57344.0;
  // Seeded floats over every binade the format has and past its range, both signs.
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> log2mag(-24.0, std::log2(max) + 3.0);
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>((rng() % 2 ? -1.0 : 1.0) * std::exp2(log2mag(rng)));
    const double want = nearest_ref<T>(x);
    const float got = kvscout::to_float(kvscout::from_float<T>(x));
    CAPTURE(x, want, got);
    REQUIRE(static_cast<double>(got) == want);
  }
  // Every midpoint between neighbouring positive finite codes goes to the even one.
  int ties = 0;
  for (unsigned c = 0; c + 1 < 128; ++c) {
    const double a = decode_ref<T>(c), b = decode_ref<T>(c + 1);
    if (!std::isfinite(a) || !std::isfinite(b)) continue;
    const float mid = static_cast<float>((a + b) / 2);
    REQUIRE(static_cast<double>(mid) == (a + b) / 2);  // exact in float
    const unsigned even = (c & 1) == 0 ? c : c + 1;
    CAPTURE(c, mid);
    REQUIRE(code_of(kvscout::from_float<T>(mid)) == even);
    REQUIRE(code_of(kvscout::from_float<T>(-mid)) == (even | 0x80u));
    ++ties;
  }
  CHECK(ties > 100);
  // Saturation: past the range, infinities included, the largest finite value; NaN stays NaN.
  const float inf = std::numeric_limits<float>::infinity();
  for (float big : {static_cast<float>(max) * 1.5f, 1e30f, inf}) {
    CHECK(kvscout::to_float(kvscout::from_float<T>(big)) == static_cast<float>(max));
    CHECK(kvscout::to_float(kvscout::from_float<T>(-big)) == -static_cast<float>(max));
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(kvscout::to_float(kvscout::from_float<T>(nan))));
  // Conversions between element types go through float.
  CHECK(kvscout::to_float(kvscout::detail::convert<kvscout::half>(kvscout::from_float<T>(-3.5f))) ==
        -3.5f);
  CHECK(kvscout::to_float(kvscout::detail::convert<T>(kvscout::from_float<kvscout::half>(0.75f))) ==
        0.75f);
}

TEST_CASE("dtype names print", "[core][dtype]") {
  std::ostringstream os;
  os << kvscout::dtype::f16 << ' ' << kvscout::dtype::bf16 << ' ' << kvscout::dtype::f8e4m3 << ' '
     << kvscout::dtype::f8e5m2 << ' ' << static_cast<kvscout::dtype>(9);
  CHECK(os.str() == "f16 bf16 f8e4m3 f8e5m2 dtype(9)");
  CHECK(kvscout::detail::size_of(static_cast<kvscout::dtype>(9)) == 0);
}

TEST_CASE("dispatch_head_dim turns a runtime head_dim into a static one", "[core][dispatch]") {
  for (int hd : {64, 128, 256}) {
    const int seen = kvscout::dispatch_head_dim(hd, [](auto d) {
      static_assert(decltype(d)::value == 64 || decltype(d)::value == 128 ||
                    decltype(d)::value == 256);
      return decltype(d)::value;
    });
    CHECK(seen == hd);
  }
  // A static value skips the search.
  CHECK(kvscout::dispatch_head_dim(std::integral_constant<int, 128>{},
                                   [](auto d) { return decltype(d)::value * 2; }) == 256);
  // A callable returning nothing.
  int calls = 0;
  kvscout::dispatch_head_dim(64, [&](auto) { ++calls; });
  CHECK(calls == 1);
}

TEST_CASE("dispatch rejects unsupported values and names the supported set", "[core][dispatch]") {
  REQUIRE_THROWS_WITH(kvscout::dispatch_head_dim(96, [](auto) {}),
                      Catch::Contains("unsupported head_dim = 96") &&
                          Catch::Contains("supported values are {64, 128, 256}"));
  REQUIRE_THROWS_WITH(kvscout::dispatch_head_dim(0, [](auto) {}),
                      Catch::Contains("head_dim = 0"));
  REQUIRE_THROWS_WITH(kvscout::dispatch_dtype(static_cast<kvscout::dtype>(7), [](auto) {}),
                      Catch::Contains("unsupported dtype = dtype(7)") &&
                          Catch::Contains("{f32, f16, bf16, f8e4m3, f8e5m2}"));
  // A user-defined list: page sizes.
  constexpr kvscout::detail::value_list<8, 16, 32> pages{};
  REQUIRE_THROWS_WITH(
      kvscout::detail::dispatch(pages, 12, "page_size", [](auto) {}),
      Catch::Contains("unsupported page_size = 12") && Catch::Contains("{8, 16, 32}"));
}

TEST_CASE("dispatch_dtype hands over the element type", "[core][dispatch]") {
  for (auto d : {kvscout::dtype::f32, kvscout::dtype::f16, kvscout::dtype::bf16,
                 kvscout::dtype::f8e4m3, kvscout::dtype::f8e5m2}) {
    const auto size = kvscout::dispatch_dtype(d, [](auto tag) {
      using T = typename decltype(tag)::type;
      return sizeof(T);
    });
    CHECK(size == kvscout::detail::size_of(d));
  }
}

TEST_CASE("spans carry their memory space in the type", "[core][span]") {
  static_assert(!std::is_convertible_v<kvscout::host_span<float>, kvscout::device_span<float>>);
  static_assert(!std::is_convertible_v<kvscout::device_span<float>, kvscout::host_span<float>>);
  static_assert(std::is_convertible_v<kvscout::host_span<float>, kvscout::host_span<const float>>);
  static_assert(
      !std::is_convertible_v<kvscout::host_span<const float>, kvscout::host_span<float>>);
  std::vector<float> v = {1.f, 2.f, 3.f, 4.f};
  kvscout::host_span<float> s(v.data(), v.size());
  kvscout::host_span<const float> c = s;
  CHECK(c.size() == 4);
  CHECK(c[2] == 3.f);
  CHECK(s.subspan(1, 2)[1] == 3.f);
  float sum = 0;
  for (float x : c) sum += x;
  CHECK(sum == 10.f);
  auto bytes = kvscout::as_bytes(c);
  CHECK(bytes.size() == 16);
  CHECK(std::memcmp(bytes.data(), v.data(), 16) == 0);
  CHECK(kvscout::as_writable_bytes(s).size() == 16);
}

TEST_CASE("host spans view contiguous host containers", "[core][span]") {
  using kvscout::host_span;
  // From lvalue containers whose elements convert; never from a temporary, never to a device
  // span, never dropping const or changing the element type.
  static_assert(std::is_convertible_v<std::vector<float>&, host_span<float>>);
  static_assert(std::is_convertible_v<std::vector<float>&, host_span<const float>>);
  static_assert(std::is_convertible_v<const std::vector<float>&, host_span<const float>>);
  static_assert(std::is_convertible_v<std::array<int, 3>&, host_span<int>>);
  static_assert(!std::is_convertible_v<const std::vector<float>&, host_span<float>>);
  static_assert(!std::is_convertible_v<std::vector<float>&&, host_span<const float>>);
  static_assert(!std::is_convertible_v<std::vector<double>&, host_span<float>>);
  static_assert(!std::is_convertible_v<std::vector<float>&, kvscout::device_span<float>>);
  static_assert(!std::is_constructible_v<kvscout::device_span<float>, std::vector<float>&>);
  std::vector<float> v = {1.f, 2.f, 3.f};
  host_span<float> s = v;
  CHECK(s.data() == v.data());
  CHECK(s.size() == 3);
  s[1] = 5.f;
  CHECK(v[1] == 5.f);
  const std::array<std::int32_t, 2> a = {7, 8};
  const host_span<const std::int32_t> c = a;
  CHECK((c.data() == a.data() && c.size() == 2));
}

namespace {
struct three_bytes_part {
  static std::size_t workspace_bytes(int n) { return static_cast<std::size_t>(n) * 3; }
  static constexpr std::size_t workspace_alignment = 64;
};
}  // namespace

TEST_CASE("make_workspace sizes and aligns a part's workspace", "[core][workspace]") {
  using part = three_bytes_part;
  for (int n : {1, 5, 1000}) {
    const kvscout::host_workspace ws = kvscout::make_workspace<part>(n);
    CHECK(ws.size() == static_cast<std::size_t>(n) * 3);
    CHECK(ws.span().size() == ws.size());
    CHECK(reinterpret_cast<std::uintptr_t>(ws.data()) % 64 == 0);
    std::memset(ws.data(), 0x5a, ws.size());  // writable, whole (ASan checks the bounds)
  }
  const kvscout::host_workspace empty = kvscout::make_workspace<part>(0);
  CHECK(empty.size() == 0);
  CHECK(empty.span().empty());
  const kvscout::host_workspace big(100, 4096);
  CHECK(reinterpret_cast<std::uintptr_t>(big.data()) % 4096 == 0);
  CHECK_THROWS_WITH(kvscout::host_workspace(16, 48), Catch::Contains("alignment 48 is not a power of two"));
}
