// Host gather executor: bit-exact against a naive row-by-row loop on seeded random data, for
// every layout x dtype x head_dim, 1 to 3 threads; unselected destination slots stay poisoned;
// bad input raises kvscout::error naming the bad value and writes nothing.

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <limits>

#include "kv_fixtures.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/fetch/host_gather.hpp"

using namespace kvtest;

namespace {

// The executor concept needs the workspace alignment as well as its size: a type with
// everything else is not an executor.
struct executor_without_alignment {
  using config_type = int;
  using source_type = int;
  using selection_type = kvscout::selection_view<kvscout::host_space>;
  using destination_type = int;
  using completion_type = kvscout::ready_completion;
  using exec_type = kvscout::host_exec;
  static std::size_t workspace_bytes(const config_type&) { return 0; }
  completion_type submit(const source_type&, const selection_type&, const destination_type&,
                         exec_type) {
    return {};
  }
};
struct executor_with_alignment : executor_without_alignment {
  static constexpr std::size_t workspace_alignment = 8;
};
// submit()'s last argument is the execution argument (core/exec.hpp): an executor whose submit
// takes none, or that names no exec_type, is not one.
struct executor_without_exec {
  using config_type = int;
  using source_type = int;
  using selection_type = kvscout::selection_view<kvscout::host_space>;
  using destination_type = int;
  using completion_type = kvscout::ready_completion;
  using exec_type = kvscout::cuda_exec;
  static constexpr std::size_t workspace_alignment = 8;
  static std::size_t workspace_bytes(const config_type&) { return 0; }
  completion_type submit(const source_type&, const selection_type&, const destination_type&) {
    return {};
  }
};
static_assert(!kvscout::prefetch_executor<executor_without_alignment>);
static_assert(kvscout::prefetch_executor<executor_with_alignment>);
static_assert(!kvscout::prefetch_executor<executor_without_exec>);

constexpr std::byte poison{0xCD};

// A seeded random selection: per (s, h) a count in [0, min(capacity, len)] of ascending tokens,
// with runs of adjacent tokens mixed in so that merging is exercised.
struct random_selection {
  std::vector<int32_t> indices, counts;
  int num_seqs, heads, capacity;

  random_selection(const std::vector<int32_t>& lens, int h, int cap, std::mt19937& rng)
      : num_seqs(static_cast<int>(lens.size())), heads(h), capacity(cap) {
    indices.assign(static_cast<std::size_t>(num_seqs) * heads * cap, -7);
    counts.assign(static_cast<std::size_t>(num_seqs) * heads, 0);
    for (int s = 0; s < num_seqs; ++s) {
      for (int hh = 0; hh < heads; ++hh) {
        std::vector<int32_t> chosen;
        const int mode = static_cast<int>(rng() % 3);
        for (int t = 0; t < lens[s]; ++t) {
          const bool take = mode == 0 ? rng() % 4 == 0 : mode == 1 ? rng() % 5 != 0 : true;
          if (take) chosen.push_back(t);
        }
        if (static_cast<int>(chosen.size()) > cap) {
          std::shuffle(chosen.begin(), chosen.end(), rng);
          chosen.resize(cap);
          std::sort(chosen.begin(), chosen.end());
        }
        const std::size_t r = static_cast<std::size_t>(s) * heads + hh;
        counts[r] = static_cast<int32_t>(chosen.size());
        std::copy(chosen.begin(), chosen.end(), indices.begin() + r * cap);
      }
    }
  }

  kvscout::selection_view<kvscout::host_space> view() const {
    return {{indices.data(), indices.size()}, {counts.data(), counts.size()}, num_seqs, heads,
            capacity};
  }
};

template <class Layout>
void naive_gather(const Layout& l, const std::vector<std::byte>& k, const std::vector<std::byte>& v,
                  const random_selection& sel, std::vector<std::byte>& dk,
                  std::vector<std::byte>& dv) {
  const std::size_t row = l.k_row_bytes();
  for (int s = 0; s < sel.num_seqs; ++s)
    for (int h = 0; h < sel.heads; ++h) {
      const std::size_t r = static_cast<std::size_t>(s) * sel.heads + h;
      for (int i = 0; i < sel.counts[r]; ++i) {
        const int t = sel.indices[r * sel.capacity + i];
        for (std::size_t b = 0; b < row; ++b) {
          dk[(r * sel.capacity + i) * row + b] = k[l.k_offset(s, t, h) + b];
          dv[(r * sel.capacity + i) * row + b] = v[l.v_offset(s, t, h) + b];
        }
      }
    }
}

// A destination buffer whose data() sits `misalign` bytes past a 64-byte boundary, so that the
// streaming stores are taken (0) or refused for a plain copy (8; 16 takes SSE2's 16-byte stores).
struct dest_buffer {
  std::vector<std::byte> storage;
  std::byte* p;
  std::size_t n;
  dest_buffer(std::size_t bytes, std::size_t misalign) : storage(bytes + 128, poison), n(bytes) {
    const auto base = reinterpret_cast<std::uintptr_t>(storage.data());
    p = storage.data() + ((64 - base % 64) % 64) + misalign;
  }
  std::byte* data() { return p; }
  std::size_t size() const { return n; }
  void fill(std::byte b) { std::fill(p, p + n, b); }
  // Nothing written before or after [p, p + n).
  bool guards_intact() const {
    for (const std::byte* q = storage.data(); q < p; ++q)
      if (*q != poison) return false;
    for (const std::byte* q = p + n; q < storage.data() + storage.size(); ++q)
      if (*q != poison) return false;
    return true;
  }
};

template <class Case>
void check_gather(const std::vector<int32_t>& lens, int heads, int capacity, int threads,
                  std::uint32_t seed, kvscout::gather_stores stores = kvscout::gather_stores::cached,
                  std::size_t misalign = 0, int prefetch_rows = 8) {
  using layout = typename Case::layout;
  using executor = kvscout::gather_executor_host<layout>;
  CAPTURE(Case::name(), heads, capacity, threads, seed, stores, misalign, prefetch_rows);
  std::mt19937 rng(seed);
  layout_fixture<Case> f(lens, heads, rng);
  std::vector<std::byte> k(f.bytes), v(f.bytes);
  fill_random(k, seed + 1);
  fill_random(v, seed + 2);
  random_selection sel(lens, heads, capacity, rng);

  const int n = static_cast<int>(lens.size());
  kvscout::host_gather_config cfg{{.num_seqs = n, .num_kv_heads = heads}, capacity, threads};
  cfg.stores = stores;
  cfg.prefetch_rows = prefetch_rows;
  const auto ws_storage = kvscout::make_workspace<executor>(cfg);
  executor ex(cfg, ws_storage.span());

  const std::size_t dst_bytes = static_cast<std::size_t>(n) * heads * capacity * f.row;
  dest_buffer dk(dst_bytes, misalign), dv(dst_bytes, misalign);
  std::vector<std::byte> ek(dst_bytes, poison), ev(dst_bytes, poison);
  naive_gather(f.layout, k, v, sel, ek, ev);

  kvscout::kv_view<layout, kvscout::host_space> src{f.layout, {k.data(), k.size()},
                                                    {v.data(), v.size()}};
  auto done = ex.submit(src, sel.view(), {{dk.data(), dk.size()}, {dv.data(), dv.size()}});
  done.wait();
  REQUIRE(done.ready());
  // Bit-exact, and every slot past a count is still poison (ek / ev keep poison there).
  REQUIRE(std::memcmp(dk.data(), ek.data(), dst_bytes) == 0);
  REQUIRE(std::memcmp(dv.data(), ev.data(), dst_bytes) == 0);
  REQUIRE(dk.guards_intact());
  REQUIRE(dv.guards_intact());
  // Run it again on the same executor: no state leaks between steps.
  dk.fill(poison);
  ex.submit(src, sel.view(), {{dk.data(), dk.size()}, {dv.data(), dv.size()}}).wait();
  REQUIRE(std::memcmp(dk.data(), ek.data(), dst_bytes) == 0);
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("host gather is bit-exact against a naive loop", "[fetch][gather]",
                        all_layout_cases) {
  const std::vector<int32_t> lens = {15, 16, 17, 0, 1, 6, 7, 8, 40};
  for (int threads : {1, 2, 3}) check_gather<TestType>(lens, 3, 24, threads, 100 + threads);
  check_gather<TestType>({33}, 1, 33, 2, 7);  // k = n: everything selected, one big run
  check_gather<TestType>({9, 0}, 2, 1, 1, 8);  // k = 1
}

TEMPLATE_LIST_TEST_CASE("host gather is bit-exact with streaming stores, aligned or not",
                        "[fetch][gather]", all_layout_cases) {
  // Streaming (non-temporal) stores where the destination rows are aligned to the store width,
  // plain copies where they are not; automatic streams only past gather_streaming_bytes, which
  // these small gathers never reach. Every mode must write exactly what the naive loop writes.
  const std::vector<int32_t> lens = {15, 16, 17, 0, 1, 6, 7, 8, 40};
  using kvscout::gather_stores;
  for (const gather_stores stores : {gather_stores::streaming, gather_stores::automatic})
    for (const std::size_t misalign : {0, 8, 16})
      for (int threads : {1, 2}) check_gather<TestType>(lens, 3, 24, threads, 200 + threads, stores, misalign);
}

TEST_CASE("host gather streams past the automatic threshold and still matches", "[fetch][gather]") {
  // 8 heads, each selecting a quarter to all of 4200 tokens (at most 4096) of 256-B rows, K and
  // V: past gather_streaming_bytes, so automatic streams (the decision is tested below).
  using Case = layout_case<kind::padded, kvscout::hnd, kvscout::half, 128>;
  check_gather<Case>({4200}, 8, 4096, 2, 77, kvscout::gather_stores::automatic, 0);
}

TEST_CASE("host gather takes any prefetch distance, INT_MAX included", "[fetch][gather]") {
  // The distance is compared with the rows left, never added to a row index: INT_MAX once
  // overflowed `i + dist` (UBSan reports it; tests/fuzz/corpus/layout_metadata holds the input
  // regress_prefetch_int_max for the fuzz target).
  using Case = layout_case<kind::padded, kvscout::hnd, kvscout::half, 128>;
  const std::vector<int32_t> lens = {15, 16, 17, 0, 1, 40};
  for (const int dist : {0, 1, 23, 24, std::numeric_limits<int>::max() - 1,
                         std::numeric_limits<int>::max()}) {
    check_gather<Case>(lens, 3, 24, 1, 300, kvscout::gather_stores::cached, 0, dist);
  }
}

TEST_CASE("host gather merges adjacent rows and still matches", "[fetch][gather]") {
  using Case = layout_case<kind::padded, kvscout::hnd, kvscout::half, 128>;
  std::mt19937 rng(5);
  std::vector<int32_t> lens(200);
  for (auto& x : lens) x = static_cast<int32_t>(rng() % 300);
  check_gather<Case>(lens, 4, 128, 2, 55);
}

namespace {

// A small valid problem whose pieces the error tests break one at a time.
struct gather_problem {
  using layout = kvscout::paged_layout<kvscout::half, 64, kvscout::nhd,
                                       kvscout::flashinfer_page_table, 4>;
  using executor = kvscout::gather_executor_host<layout>;
  std::vector<int32_t> indptr{0, 2, 3}, pages{2, 0, 1}, last{3, 4};  // lengths 7 and 4
  std::vector<int32_t> indices{0, 6, -1, 2, 3, -1, 1, 2, 3, 0, -1, -1};  // [2, 2, 3]
  std::vector<int32_t> counts{2, 2, 3, 1};
  std::vector<std::byte> k, v, dk, dv;
  kvscout::host_gather_config cfg{{.num_seqs = 2, .num_kv_heads = 2}, 3, 1};
  kvscout::host_workspace ws = kvscout::make_workspace<executor>(cfg);
  layout l{{indptr.data(), pages.data(), last.data(), 2}, 2};

  gather_problem() : k(3 * 4 * 2 * 128), v(k.size()), dk(2 * 2 * 3 * 128, poison), dv(dk.size(), poison) {
    fill_random(k, 1);
    fill_random(v, 2);
  }
  kvscout::host_span<std::byte> workspace() { return ws.span(); }
  void submit() {
    executor ex(cfg, workspace());
    kvscout::kv_view<layout, kvscout::host_space> src{l, {k.data(), k.size()}, {v.data(), v.size()}};
    kvscout::selection_view<kvscout::host_space> sel{
        {indices.data(), indices.size()}, {counts.data(), counts.size()}, 2, 2, 3};
    ex.submit(src, sel, {{dk.data(), dk.size()}, {dv.data(), dv.size()}});
  }
  bool destination_untouched() const {
    return std::all_of(dk.begin(), dk.end(), [](std::byte b) { return b == poison; }) &&
           std::all_of(dv.begin(), dv.end(), [](std::byte b) { return b == poison; });
  }
};

}  // namespace

TEST_CASE("host gather rejects bad input before writing", "[fetch][gather][errors]") {
  gather_problem p;
  SECTION("the valid problem runs") {
    REQUIRE_NOTHROW(p.submit());
    REQUIRE_FALSE(p.destination_untouched());
    return;
  }
  SECTION("token index past the sequence") {
    p.indices[7] = 4;  // sequence 1 has 4 tokens; entry 1 of (1, 0)
    p.indices[8] = 5;
    REQUIRE_THROWS_WITH(p.submit(), Catch::Contains("token index 4 (entry 1) for sequence 1, kv_head 0") &&
                                        Catch::Contains("[0, seq_len = 4)"));
  }
  SECTION("negative token index") {
    p.indices[0] = -2;
    REQUIRE_THROWS_WITH(p.submit(), Catch::Contains("token index -2"));
  }
  SECTION("indices not ascending") {
    p.indices[4] = 2;
    REQUIRE_THROWS_WITH(p.submit(), Catch::Contains("not strictly ascending: 2 then 2"));
  }
  SECTION("count above capacity") {
    p.counts[1] = 4;
    REQUIRE_THROWS_WITH(p.submit(), Catch::Contains("count 4 for sequence 0, kv_head 1") &&
                                        Catch::Contains("capacity = 3"));
  }
  SECTION("destination too small") {
    p.dk.resize(p.dk.size() - 1);
    REQUIRE_THROWS_WITH(p.submit(), Catch::Contains("destination K buffer holds 1535 bytes") &&
                                        Catch::Contains("at least 1536"));
  }
  SECTION("source smaller than its page table needs") {
    p.k.resize(2 * 4 * 2 * 128);  // two pages; the table names page 2
    REQUIRE_THROWS_WITH(p.submit(), Catch::Contains("page id 2") && Catch::Contains("[0, 2)"));
  }
  SECTION("page table and lengths disagree") {
    p.last[1] = 5;
    REQUIRE_THROWS_WITH(p.submit(), Catch::Contains("last_page_len[1] = 5"));
  }
  SECTION("null source") {
    p.v.clear();
    p.v.shrink_to_fit();
    REQUIRE_THROWS_WITH(p.submit(), Catch::Contains("source K or V buffer is null"));
  }
  SECTION("selection shape differs from the executor's") {
    p.cfg.capacity = 2;
    p.ws = kvscout::make_workspace<gather_problem::executor>(p.cfg);
    REQUIRE_THROWS_WITH(p.submit(), Catch::Contains("selection shape [2, 2, 3]") &&
                                        Catch::Contains("executor's [2, 2, 2]"));
  }
  SECTION("workspace too small") {
    p.ws = kvscout::host_workspace(8, 64);
    REQUIRE_THROWS_WITH(p.submit(), Catch::Contains("workspace holds 8 bytes"));
  }
  SECTION("zero threads") {
    p.cfg.threads = 0;
    REQUIRE_THROWS_WITH(p.submit(), Catch::Contains("threads must be at least 1, got 0"));
  }
  SECTION("unknown store mode") {
    p.cfg.stores = static_cast<kvscout::gather_stores>(7);
    REQUIRE_THROWS_WITH(p.submit(), Catch::Contains("stores gather_stores(7) is not one of "
                                                    "automatic, cached, streaming"));
  }
  REQUIRE(p.destination_untouched());
}

TEST_CASE("the host gather's workspace alignment is the one it declares", "[fetch][gather][errors]") {
  using executor = gather_problem::executor;
  gather_problem p;
  constexpr std::size_t a = executor::workspace_alignment;
  STATIC_REQUIRE(a == alignof(std::int64_t));
  const std::size_t need = executor::workspace_bytes(p.cfg);
  std::vector<std::int64_t> storage(need / 8 + 2);
  auto* base = reinterpret_cast<std::byte*>(storage.data());
  REQUIRE_NOTHROW(executor(p.cfg, {base + a, need}));
  for (std::size_t off = 1; off < a; ++off)
    REQUIRE_THROWS_WITH(executor(p.cfg, {base + off, need}),
                        Catch::Contains("workspace must be " + std::to_string(a) + "-byte aligned"));
}

TEST_CASE("host gather streams where it is asked to, or past the threshold", "[fetch][gather]") {
  using kvscout::gather_stores;
  using kvscout::detail::gather_streams;
  constexpr std::size_t at = kvscout::detail::gather_streaming_bytes;
  constexpr bool can = kvscout::detail::gather_can_stream;
  REQUIRE(gather_streams(gather_stores::automatic, at) == can);
  REQUIRE(gather_streams(gather_stores::automatic, 10 * at) == can);
  REQUIRE_FALSE(gather_streams(gather_stores::automatic, at - 1));
  REQUIRE(gather_streams(gather_stores::streaming, 1) == can);
  REQUIRE_FALSE(gather_streams(gather_stores::cached, 10 * at));
}
