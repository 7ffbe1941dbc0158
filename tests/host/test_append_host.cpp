// The host append (kv/append.hpp): every layout x dtype writes each sequence's new row where the
// layout's documented shape says (kv_fixtures.hpp's reference offsets, not the layouts' code) and
// nothing else; float input is divided by the scales and rounded once, input in the cache's type
// is stored as given; prefill writes a token range; every bad input throws naming the value and
// leaves both buffers untouched.

#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kv_fixtures.hpp"
#include "kvscout/kv/append.hpp"

namespace {

using namespace kvtest;
using kvscout::half;

template <class T>
std::vector<T> random_input(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<T> v(n);
  for (auto& x : v) x = kvscout::from_float<T>(nd(rng));
  return v;
}

// What the append must leave: `init` with token t of sequence s (positions) overwritten.
template <class Case, class In>
std::vector<std::byte> expected(const layout_fixture<Case>& f, const std::vector<std::byte>& init,
                                const std::vector<std::pair<int, int>>& writes,
                                const std::vector<In>& in, kvscout::kv_scales scales, bool is_k) {
  using T = typename Case::element;
  constexpr int D = Case::head_dim;
  std::vector<std::byte> out = init;
  for (std::size_t w = 0; w < writes.size(); ++w) {
    const auto [s, t] = writes[w];
    for (int h = 0; h < f.heads; ++h)
      for (int c = 0; c < D; ++c) {
        const In x = in[(w * f.heads + h) * D + c];
        T y;
        if constexpr (std::is_same_v<In, T> && !std::is_same_v<In, float>) {
          y = x;
        } else {
          y = kvscout::from_float<T>(kvscout::to_float(x) / (is_k ? scales.k : scales.v));
        }
        std::memcpy(&out[f.ref_offset(s, t, h) + c * sizeof(T)], &y, sizeof(T));
      }
  }
  return out;
}

template <class Case, class In>
void append_case(kvscout::kv_scales scales, std::uint32_t seed) {
  using T = typename Case::element;
  constexpr int D = Case::head_dim;
  std::mt19937 rng(seed);
  layout_fixture<Case> f({5, 3, 12, 7}, 2, rng);
  const int S = 4;
  std::vector<std::byte> init_k(f.bytes), init_v(f.bytes);
  fill_random(init_k, seed + 1);
  fill_random(init_v, seed + 2);
  auto k = init_k, v = init_v;
  // Every sequence owns its last token's slot in every layout.
  const std::vector<int32_t> pos = {4, 2, 11, 6};
  const auto kin = random_input<In>(static_cast<std::size_t>(S) * f.heads * D, seed + 3);
  const auto vin = random_input<In>(kin.size(), seed + 4);
  kvscout::append_token_host(f.layout, kvscout::host_span<std::byte>(k.data(), k.size()),
                             kvscout::host_span<std::byte>(v.data(), v.size()),
                             kvscout::host_span<const In>(kin.data(), kin.size()),
                             kvscout::host_span<const In>(vin.data(), vin.size()),
                             kvscout::host_span<const int32_t>(pos.data(), pos.size()), scales);
  const std::vector<std::pair<int, int>> writes = {{0, 4}, {1, 2}, {2, 11}, {3, 6}};
  CHECK(k == expected<Case, In>(f, init_k, writes, kin, scales, true));
  CHECK(v == expected<Case, In>(f, init_v, writes, vin, scales, false));

  // Prefill: tokens [3, 12) of sequence 2 from [9, H, D] rows.
  k = init_k, v = init_v;
  const auto kr = random_input<In>(9ull * f.heads * D, seed + 5), vr = random_input<In>(kr.size(), seed + 6);
  kvscout::write_tokens_host(f.layout, kvscout::host_span<std::byte>(k.data(), k.size()),
                             kvscout::host_span<std::byte>(v.data(), v.size()), 2, 3, 9,
                             kvscout::host_span<const In>(kr.data(), kr.size()),
                             kvscout::host_span<const In>(vr.data(), vr.size()), scales);
  std::vector<std::pair<int, int>> range;
  for (int t = 3; t < 12; ++t) range.emplace_back(2, t);
  CHECK(k == expected<Case, In>(f, init_k, range, kr, scales, true));
  CHECK(v == expected<Case, In>(f, init_v, range, vr, scales, false));
  (void)sizeof(T);
}

// Calls f and checks that it throws a kvscout::error naming `needle`, and that k / v are unchanged.
template <class F>
void refuses(F&& f, const std::string& needle, const std::vector<std::byte>& k,
             const std::vector<std::byte>& k0, const std::vector<std::byte>& v,
             const std::vector<std::byte>& v0) {
  CHECK_THROWS_WITH(f(), Catch::Contains(needle));
  CHECK(k == k0);
  CHECK(v == v0);
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("append_token_host and write_tokens_host write the documented rows",
                        "[kv][append]", all_layout_cases) {
  using T = typename TestType::element;
  const kvscout::kv_scales scales =
      std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, kvscout::bfloat16>
          ? kvscout::kv_scales{0.5f, 4.f}
          : kvscout::kv_scales{0.05f, 0.011f};
  append_case<TestType, float>(scales, 10);
  append_case<TestType, T>(scales, 20);  // stored as given: the scales do not apply
  append_case<TestType, float>({}, 30);
}

TEST_CASE("append_token_host takes seq_len(s) when no positions are given", "[kv][append]") {
  using Case = layout_case<kind::padded, kvscout::hnd, half, 64>;
  std::mt19937 rng(1);
  layout_fixture<Case> f({5, 0, 9}, 3, rng);
  std::vector<std::byte> k0(f.bytes), v0(f.bytes);
  fill_random(k0, 2);
  fill_random(v0, 3);
  auto k = k0, v = v0;
  const auto kin = random_input<half>(3ull * 3 * 64, 4), vin = random_input<half>(kin.size(), 5);
  kvscout::append_token_host(f.layout, kvscout::host_span<std::byte>(k.data(), k.size()),
                             kvscout::host_span<std::byte>(v.data(), v.size()),
                             kvscout::host_span<const half>(kin.data(), kin.size()),
                             kvscout::host_span<const half>(vin.data(), vin.size()));
  CHECK(k == expected<Case, half>(f, k0, {{0, 5}, {1, 0}, {2, 9}}, kin, {}, true));
  CHECK(v == expected<Case, half>(f, v0, {{0, 5}, {1, 0}, {2, 9}}, vin, {}, false));
}

TEST_CASE("the host append refuses what would write outside a sequence's slots, and writes nothing",
          "[kv][append][bad_input]") {
  const auto run = [](auto& f, std::vector<int32_t> pos, const std::string& needle,
                      std::size_t in_elems = 0) {
    using Case = typename std::remove_reference_t<decltype(f)>::layout_type;
    (void)sizeof(Case);
    std::vector<std::byte> k0(f.bytes), v0(f.bytes);
    fill_random(k0, 7);
    fill_random(v0, 8);
    auto k = k0, v = v0;
    const std::size_t n = in_elems ? in_elems : f.lens.size() * static_cast<std::size_t>(f.heads) * 64;
    const std::vector<float> kin(n, 1.f), vin(n, 2.f);
    refuses(
        [&] {
          kvscout::append_token_host(f.layout, kvscout::host_span<std::byte>(k.data(), k.size()),
                                     kvscout::host_span<std::byte>(v.data(), v.size()),
                                     kvscout::host_span<const float>(kin.data(), kin.size()),
                                     kvscout::host_span<const float>(vin.data(), vin.size()),
                                     kvscout::host_span<const int32_t>(pos.data(), pos.size()));
        },
        needle, k, k0, v, v0);
  };
  std::mt19937 rng(3);
  SECTION("padded: t == capacity is the next sequence's or head's slot 0") {
    layout_fixture<layout_case<kind::padded, kvscout::nhd, float, 64>> f({5, 3}, 2, rng);
    run(f, {f.capacity, 1}, "sequence 0: position " + std::to_string(f.capacity) + " is not a slot it owns");
    run(f, {1, -1}, "sequence 1: position -1");
  }
  SECTION("ragged: a sequence but the last cannot grow in place") {
    layout_fixture<layout_case<kind::ragged, kvscout::hnd, float, 64>> f({5, 3, 4}, 2, rng);
    run(f, {5, 0, 0}, "sequence 0: position 5 is not a slot it owns (contiguous");
    run(f, {0, 0, 4 + 2}, "sequence 2: position 6");  // the tail holds 2 free slots: 4, 5
  }
  SECTION("FlashInfer pages: a full last page has no next page") {
    layout_fixture<layout_case<kind::flashinfer, kvscout::nhd, float, 64>> f({16, 5}, 2, rng);
    run(f, {16, 0}, "sequence 0: position 16 is not a slot it owns (FlashInfer pages");
  }
  SECTION("block table: past the row's width, or an unallocated page") {
    layout_fixture<layout_case<kind::vllm, kvscout::hnd, float, 64>> f({20, 9}, 2, rng);
    const int width = static_cast<int>(f.a.size() / f.lens.size());
    run(f, {width * 7, 0}, "is not a slot it owns (block table");
    // Sequence 1 has 2 pages of 7; its third entry is -1 (unallocated).
    run(f, {0, 14}, "lies outside the");
  }
  SECTION("two sequences whose tables share a page") {
    layout_fixture<layout_case<kind::vllm, kvscout::hnd, float, 64>> f({7, 7}, 2, rng);
    const int width = static_cast<int>(f.a.size() / 2);
    f.a[static_cast<std::size_t>(width)] = f.a[0];  // sequence 1's page 0 is sequence 0's
    run(f, {3, 3}, "would write the same K row");
  }
  SECTION("short input, short positions") {
    layout_fixture<layout_case<kind::padded, kvscout::hnd, float, 64>> f({5, 3}, 2, rng);
    run(f, {1, 1}, "new K / V hold 255 / 255 elements, expected [2, 2, 64] = 256", 255);
    run(f, {1}, "positions holds 1 entries, expected none or num_seqs = 2");
  }
}

TEST_CASE("the host append refuses bad buffers, scales and ranges", "[kv][append][bad_input]") {
  using Case = layout_case<kind::padded, kvscout::nhd, kvscout::fp8_e4m3, 64>;
  std::mt19937 rng(5);
  layout_fixture<Case> f({5, 3}, 2, rng);
  std::vector<std::byte> k0(f.bytes), v0(f.bytes);
  fill_random(k0, 1);
  fill_random(v0, 2);
  auto k = k0, v = v0;
  const std::vector<float> kin(256, 1.f), vin(256, 2.f);
  const kvscout::host_span<std::byte> K(k.data(), k.size()), V(v.data(), v.size());
  const kvscout::host_span<const float> KI(kin.data(), kin.size()), VI(vin.data(), vin.size());
  refuses([&] { kvscout::append_token_host(f.layout, K, V, KI, VI, {}, {0.f, 1.f}); },
          "kv_scales must be positive and finite, got k = 0", k, k0, v, v0);
  refuses([&] { kvscout::append_token_host(f.layout, K, K, KI, VI); }, "overlap", k, k0, v, v0);
  refuses([&] { kvscout::append_token_host(f.layout, K.subspan(0, K.size() - 1), V, KI, VI); },
          "K buffer holds", k, k0, v, v0);
  refuses(
      [&] {  // input that lies inside the cache
        kvscout::append_token_host(
            f.layout, K, V,
            kvscout::host_span<const float>(reinterpret_cast<const float*>(k.data()), 256), VI);
      },
      "overlap the cache", k, k0, v, v0);
  refuses([&] { kvscout::write_tokens_host(f.layout, K, V, 2, 0, 1, KI, VI); },
          "sequence 2 is out of range [0, 2)", k, k0, v, v0);
  refuses([&] { kvscout::write_tokens_host(f.layout, K, V, 0, -1, 1, KI, VI); },
          "first and count must be non-negative", k, k0, v, v0);
  refuses([&] { kvscout::write_tokens_host(f.layout, K, V, 0, f.capacity - 1, 2, KI, VI); },
          "token " + std::to_string(f.capacity) + " is not a slot it owns", k, k0, v, v0);
  refuses([&] { kvscout::write_tokens_host(f.layout, K, V, 0, 2147483647, 1, KI, VI); },
          "token 2147483647 is not a slot it owns", k, k0, v, v0);
  refuses([&] { kvscout::write_tokens_host(f.layout, K, V, 0, 0, 3, KI, VI); },
          "new K / V hold 256 / 256 elements, expected [3, 2, 64] = 384", k, k0, v, v0);
  // A count of zero writes nothing and is fine.
  kvscout::write_tokens_host(f.layout, K, V, 0, 0, 0, KI, VI);
  CHECK(k == k0);
}
