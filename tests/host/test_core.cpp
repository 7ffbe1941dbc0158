// core/: errors, dtype traits and conversions, dispatch, memory-space-tagged spans.

#include <catch2/catch.hpp>

#include <array>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kvscout/core/dispatch.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/span.hpp"

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
  CHECK(kvscout::dtype_traits<kvscout::dtype_of_t<traits::id>>::id == traits::id);
  CHECK(kvscout::size_of(traits::id) == sizeof(T));
  CHECK(kvscout::vec_width<T> * sizeof(T) == 16);

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
  kvscout::store_float(buf.data(), 2, 0.75f);
  CHECK(kvscout::load_float(buf.data(), 2) == 0.75f);
  CHECK(kvscout::to_float(kvscout::convert<float>(buf[2])) == 0.75f);
  CHECK(kvscout::to_float(kvscout::convert<kvscout::half>(buf[2])) == 0.75f);
  CHECK(std::isinf(kvscout::to_float(kvscout::from_float<T>(std::numeric_limits<float>::infinity()))));
  CHECK(std::isnan(kvscout::to_float(kvscout::from_float<T>(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("dtype names print", "[core][dtype]") {
  std::ostringstream os;
  os << kvscout::dtype::f16 << ' ' << kvscout::dtype::bf16 << ' ' << static_cast<kvscout::dtype>(9);
  CHECK(os.str() == "f16 bf16 dtype(9)");
}

TEST_CASE("dispatch turns a runtime head_dim into a static one", "[core][dispatch]") {
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
                          Catch::Contains("{f32, f16, bf16}"));
  // A user-defined list: page sizes.
  constexpr kvscout::value_list<8, 16, 32> pages{};
  REQUIRE_THROWS_WITH(kvscout::dispatch(pages, 12, "page_size", [](auto) {}),
                      Catch::Contains("unsupported page_size = 12") &&
                          Catch::Contains("{8, 16, 32}"));
}

TEST_CASE("dispatch_dtype hands over the element type", "[core][dispatch]") {
  for (auto d : {kvscout::dtype::f32, kvscout::dtype::f16, kvscout::dtype::bf16}) {
    const auto size = kvscout::dispatch_dtype(d, [](auto tag) {
      using T = typename decltype(tag)::type;
      return sizeof(T);
    });
    CHECK(size == kvscout::size_of(d));
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
