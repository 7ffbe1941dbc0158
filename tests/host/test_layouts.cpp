// KV layouts: every layout x dtype x head_dim against reference offsets from the documented
// shapes; rows never overlap and stay inside the buffers; contiguous_rows is exact (every row of
// a run is adjacent, and the run stops exactly where adjacency stops); paged edge cases.

#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "kv_fixtures.hpp"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/core/workspace.hpp"

using namespace kvtest;

namespace {

// What check_rows reads of a layout, type-erased: the checks below are compiled once, not once per
// layout x dtype x head_dim case (88 of them: that cost 107 s of compile time under the
// sanitizers, docs/testing.md); only these few calls are instantiated per case.
struct layout_probe {
  std::string name;
  std::size_t row, bytes;
  std::function<std::size_t(int, int, int)> k_offset, v_offset, ref_offset;
  std::function<int(int, int, int, int)> contiguous_rows;
};

void check_rows(const layout_probe& p, const std::vector<int32_t>& lens, int heads,
                std::uint32_t seed) {
  CAPTURE(p.name, heads, lens.size(), seed);
  std::set<std::size_t> seen;
  for (int s = 0; s < static_cast<int>(lens.size()); ++s) {
    for (int t = 0; t < lens[s]; ++t) {
      for (int h = 0; h < heads; ++h) {
        CAPTURE(s, t, h);
        const std::size_t off = p.k_offset(s, t, h);
        REQUIRE(off == p.ref_offset(s, t, h));
        REQUIRE(p.v_offset(s, t, h) == off);
        REQUIRE(off % p.row == 0);
        REQUIRE(off + p.row <= p.bytes);
        REQUIRE(seen.insert(off).second);  // no two rows share memory
        // contiguous_rows: exact maximal run, for several caps n.
        for (int n : {1, 2, 5, lens[s] - t}) {
          if (n < 1 || n > lens[s] - t) continue;
          const int run = p.contiguous_rows(s, t, h, n);
          CAPTURE(n, run);
          REQUIRE(run >= 1);
          REQUIRE(run <= n);
          for (int i = 1; i < run; ++i) REQUIRE(p.k_offset(s, t + i, h) == off + i * p.row);
          if (run < n) REQUIRE(p.k_offset(s, t + run, h) != off + run * p.row);
        }
      }
    }
  }
}

template <class Case>
void check_layout(const std::vector<int32_t>& lens, int heads, std::uint32_t seed) {
  std::mt19937 rng(seed);
  layout_fixture<Case> f(lens, heads, rng);
  const auto& l = f.layout;
  CAPTURE(Case::name(), heads, lens.size(), seed);
  REQUIRE(l.num_seqs() == static_cast<int>(lens.size()));
  REQUIRE(l.num_kv_heads() == heads);
  REQUIRE(l.k_row_bytes() == f.row);
  REQUIRE(l.v_row_bytes() == f.row);
  REQUIRE_NOTHROW(l.validate(f.bytes, f.bytes));
  for (int s = 0; s < l.num_seqs(); ++s) REQUIRE(l.seq_len(s) == lens[s]);
  check_rows({Case::name(), f.row, f.bytes,
              [&](int s, int t, int h) -> std::size_t { return l.k_offset(s, t, h); },
              [&](int s, int t, int h) -> std::size_t { return l.v_offset(s, t, h); },
              [&](int s, int t, int h) { return f.ref_offset(s, t, h); },
              [&](int s, int t, int h, int n) { return l.contiguous_rows(s, t, h, n); }},
             lens, heads, seed);
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("layouts map rows as their documented shapes say", "[kv][layout]",
                        all_layout_cases) {
  // Lengths around the page sizes (7 and 16), an empty sequence, and a single token.
  check_layout<TestType>({15, 16, 17, 0, 1, 6, 7, 8, 33}, 3, 11);
  check_layout<TestType>({5}, 1, 12);  // one head: NHD rows become adjacent too
  check_layout<TestType>({}, 2, 13);   // an empty batch
}

TEMPLATE_LIST_TEST_CASE("layouts handle many sequences", "[kv][layout]", all_layout_cases) {
  std::mt19937 rng(21);
  std::vector<int32_t> lens(64);
  for (auto& x : lens) x = static_cast<int32_t>(rng() % 40);
  check_layout<TestType>(lens, 2, 22);
}

TEST_CASE("paged runs continue across physically consecutive pages", "[kv][paged]") {
  // One KV head, HND: pages 4 and 5 are adjacent, page 9 is not.
  std::vector<int32_t> indptr = {0, 3}, indices = {4, 5, 9}, last = {2};
  kvscout::flashinfer_page_table pt{indptr.data(), indices.data(), last.data(), 1};
  kvscout::paged_layout<float, 64, kvscout::hnd, kvscout::flashinfer_page_table, 8> l(pt, 1);
  REQUIRE(l.seq_len(0) == 18);
  CHECK(l.contiguous_rows(0, 3, 0, 15) == 13);  // 5 rows of page 4, 8 of page 5
  CHECK(l.contiguous_rows(0, 3, 0, 10) == 10);
  CHECK(l.contiguous_rows(0, 16, 0, 2) == 2);  // inside page 9
  // NHD with two heads: no two rows of one head are adjacent.
  kvscout::paged_layout<float, 64, kvscout::nhd, kvscout::flashinfer_page_table, 8> m(pt, 2);
  CHECK(m.contiguous_rows(0, 0, 1, 8) == 1);
}

TEST_CASE("paged layout: page_stride describes pages that interleave K and V", "[kv][paged]") {
  // [num_pages, 2, page_size, kv_heads, head_dim]: K at the start of a page, V one half later.
  std::vector<int32_t> table = {1, 0}, lens = {10};
  kvscout::block_table bt{table.data(), lens.data(), 2, 1};
  constexpr int P = 8, H = 2, D = 64;
  kvscout::paged_layout<kvscout::half, D, kvscout::nhd, kvscout::block_table> l(bt, H, P,
                                                                                 2 * P * H * D);
  REQUIRE(l.page_stride() == 2 * P * H * D);
  // token 9 lives in logical page 1 = physical page 0, slot 1.
  CHECK(l.k_offset(0, 9, 1) == static_cast<std::size_t>((1 * H + 1) * D) * 2);
  // token 0 lives in physical page 1.
  CHECK(l.k_offset(0, 0, 0) == static_cast<std::size_t>(2 * P * H * D) * 2);
  const std::size_t bytes = static_cast<std::size_t>(2 * 2 * P * H * D) * 2;
  REQUIRE_NOTHROW(l.validate(bytes, bytes));

  // A gather from such a cache (K and V views into one buffer, V half a page later) into one
  // destination buffer, K rows then V rows: nothing overlaps what it must not, so it runs, and
  // every row is the right half of the right page.
  std::vector<kvscout::half> cache(bytes / 2);
  for (std::size_t i = 0; i < cache.size(); ++i)
    cache[i] = kvscout::from_float<kvscout::half>(static_cast<float>(i % 2039));
  const auto all = kvscout::as_bytes(kvscout::host_span<const kvscout::half>(cache));
  const std::size_t half_page = static_cast<std::size_t>(P * H * D) * 2;
  const kvscout::kv_view<decltype(l), kvscout::host_space> src{
      l, all.subspan(0, bytes), all.subspan(half_page, bytes - half_page)};
  std::vector<int32_t> idx = {0, 9, 3, 9}, counts = {2, 2};  // (s 0, h 0): 0, 9; (h 1): 3, 9
  const kvscout::selection_view<kvscout::host_space> sel{{idx.data(), idx.size()},
                                                         {counts.data(), counts.size()}, 1, H, 2};
  const kvscout::host_gather_config cfg{{.num_seqs = 1, .num_kv_heads = H}, 2};
  auto ws = kvscout::make_workspace<kvscout::gather_executor_host<decltype(l)>>(cfg);
  kvscout::gather_executor_host<decltype(l)> g(cfg, ws.span());
  constexpr std::size_t row = D * 2;
  std::vector<std::byte> dst(2 * 4 * row);
  const auto d = kvscout::host_span<std::byte>(dst);
  g.submit(src, sel, {d.subspan(0, 4 * row), d.subspan(4 * row, 4 * row)}).wait();
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < 2; ++i) {
      const int t = idx[h * 2 + i];
      const std::size_t slot = static_cast<std::size_t>(h * 2 + i) * row;
      CHECK(std::memcmp(dst.data() + slot, all.data() + l.k_offset(0, t, h), row) == 0);
      CHECK(std::memcmp(dst.data() + 4 * row + slot, all.data() + half_page + l.v_offset(0, t, h),
                        row) == 0);
    }
}

TEST_CASE("layout metadata that disagrees is rejected with the bad value", "[kv][errors]") {
  using fi = kvscout::paged_layout<float, 64, kvscout::nhd, kvscout::flashinfer_page_table, 16>;
  const std::size_t page_bytes = 16 * 2 * 64 * 4;

  SECTION("last_page_len larger than the page size") {
    std::vector<int32_t> indptr = {0, 2}, indices = {0, 1}, last = {17};
    fi l({indptr.data(), indices.data(), last.data(), 1}, 2);
    REQUIRE_THROWS_WITH(l.validate(2 * page_bytes, 2 * page_bytes),
                        Catch::Contains("last_page_len[0] = 17") &&
                            Catch::Contains("[1, 16]"));
  }
  SECTION("last_page_len of zero on a sequence with pages") {
    std::vector<int32_t> indptr = {0, 1}, indices = {0}, last = {0};
    fi l({indptr.data(), indices.data(), last.data(), 1}, 2);
    REQUIRE_THROWS_WITH(l.validate(page_bytes, page_bytes),
                        Catch::Contains("last_page_len[0] = 0"));
  }
  SECTION("indptr that decreases") {
    std::vector<int32_t> indptr = {0, 2, 1}, indices = {0, 1}, last = {3, 3};
    fi l({indptr.data(), indices.data(), last.data(), 2}, 2);
    REQUIRE_THROWS_WITH(l.validate(2 * page_bytes, 2 * page_bytes),
                        Catch::Contains("indptr[1] = 2 > indptr[2] = 1"));
  }
  SECTION("page id past the buffer") {
    std::vector<int32_t> indptr = {0, 2}, indices = {0, 5}, last = {3};
    fi l({indptr.data(), indices.data(), last.data(), 1}, 2);
    REQUIRE_THROWS_WITH(l.validate(2 * page_bytes, 2 * page_bytes),
                        Catch::Contains("page id 5") && Catch::Contains("[0, 2)"));
  }
  SECTION("buffers sized for another head_dim: the message says how the page count was derived") {
    // A vLLM cache of 4 pages at head_dim 64 given to a head_dim 128 layout holds 2 pages of it.
    std::vector<int32_t> table = {0, 3}, lens = {20};
    kvscout::paged_layout<kvscout::half, 128, kvscout::nhd, kvscout::block_table> l(
        {.table = table.data(), .seq_lens = lens.data(), .max_blocks_per_seq = 2, .seqs = 1}, 2,
        16);
    const std::size_t b = 4 * 16 * 2 * 64 * 2;
    REQUIRE_THROWS_WITH(l.validate(b, b),
                        Catch::Contains("page id 3 (sequence 0, logical page 1) is outside "
                                        "[0, 2)") &&
                            Catch::Contains("the K / V buffers (16384 / 16384 bytes) hold 2 pages "
                                            "of 8192 bytes") &&
                            Catch::Contains("page_size 16 x num_kv_heads 2 x head_dim 128"));
  }
  SECTION("vLLM seq_lens longer than the block table row") {
    std::vector<int32_t> table = {0, 1}, lens = {15};
    kvscout::paged_layout<float, 64, kvscout::hnd, kvscout::block_table> l(
        {table.data(), lens.data(), 2, 1}, 2, 7);
    const std::size_t b = 2 * 7 * 2 * 64 * 4;
    REQUIRE_THROWS_WITH(l.validate(b, b),
                        Catch::Contains("seq_lens[0] = 15") && Catch::Contains("[0, 14]") &&
                            !Catch::Contains("pages of"));  // no page-count context: not an id
  }
  SECTION("negative vLLM block id") {
    std::vector<int32_t> table = {0, -1}, lens = {9};
    kvscout::paged_layout<float, 64, kvscout::hnd, kvscout::block_table> l(
        {table.data(), lens.data(), 2, 1}, 2, 7);
    const std::size_t b = 2 * 7 * 2 * 64 * 4;
    REQUIRE_THROWS_WITH(l.validate(b, b), Catch::Contains("page id -1"));
  }
  SECTION("padded lengths beyond the capacity") {
    std::vector<int32_t> lens = {4, 9};
    auto l = kvscout::contiguous_layout<float, 64, kvscout::nhd>::padded(2, 8, lens.data(), 2);
    const std::size_t b = 2 * 8 * 2 * 64 * 4;
    REQUIRE_THROWS_WITH(l.validate(b, b), Catch::Contains("seq_lens[1] = 9") &&
                                              Catch::Contains("capacity = 8"));
  }
  SECTION("buffers smaller than the layout") {
    std::vector<int32_t> lens = {4};
    auto l = kvscout::contiguous_layout<kvscout::half, 128, kvscout::hnd>::padded(2, 8, lens.data(), 1);
    REQUIRE_THROWS_WITH(l.validate(100, 1 << 20), Catch::Contains("K buffer holds 100 bytes") &&
                                                      Catch::Contains("needs 4096"));
  }
  SECTION("ragged indptr past total_tokens") {
    std::vector<int32_t> indptr = {0, 4, 12};
    auto l = kvscout::contiguous_layout<float, 64, kvscout::nhd>::ragged(1, 10, indptr.data(), 2);
    REQUIRE_THROWS_WITH(l.validate(1 << 20, 1 << 20),
                        Catch::Contains("indptr[2] = 12") && Catch::Contains("total_tokens = 10"));
  }
  SECTION("bad construction arguments") {
    std::vector<int32_t> lens = {1};
    using c = kvscout::contiguous_layout<float, 64, kvscout::nhd>;
    REQUIRE_THROWS_WITH(c::padded(0, 8, lens.data(), 1),
                        Catch::Contains("num_kv_heads must be positive, got 0"));
    REQUIRE_THROWS_WITH(c::padded(2, 8, nullptr, 1), Catch::Contains("seq_lens is null"));
    REQUIRE_THROWS_WITH(c::ragged(2, 8, nullptr, 1), Catch::Contains("indptr is null"));
    std::vector<int32_t> indptr = {0, 1}, indices = {0}, last = {1};
    kvscout::flashinfer_page_table pt{indptr.data(), indices.data(), last.data(), 1};
    using p = kvscout::paged_layout<float, 64, kvscout::nhd, kvscout::flashinfer_page_table>;
    REQUIRE_THROWS_WITH(p(pt, 2, 0), Catch::Contains("page_size must be positive, got 0"));
    REQUIRE_THROWS_WITH(p(pt, 2, 16, 100), Catch::Contains("page_stride = 100"));
  }
}

TEST_CASE("checked_row_offsets names the index that is out of range", "[kv][errors]") {
  std::vector<int32_t> lens = {3, 5};
  auto l = kvscout::contiguous_layout<kvscout::half, 64, kvscout::nhd>::padded(4, 8, lens.data(), 2);
  const auto ok = kvscout::detail::checked_row_offsets(l, 1, 4, 3);
  CHECK(ok.k == l.k_offset(1, 4, 3));
  CHECK(ok.v == l.v_offset(1, 4, 3));
  REQUIRE_THROWS_WITH(kvscout::detail::checked_row_offsets(l, 0, 0, 4),
                      Catch::Contains("kv_head 4 is out of range [0, 4)"));
  REQUIRE_THROWS_WITH(kvscout::detail::checked_row_offsets(l, 0, 3, 0),
                      Catch::Contains("token 3 is out of range [0, seq_len = 3) for sequence 0"));
  REQUIRE_THROWS_WITH(kvscout::detail::checked_row_offsets(l, 2, 0, 0),
                      Catch::Contains("sequence 2 is out of range [0, 2)"));
  REQUIRE_THROWS_WITH(kvscout::detail::checked_row_offsets(l, 1, -1, 0),
                      Catch::Contains("token -1"));
}
