// Bad input at the edges of the public host API: sizes whose products do not fit, lengths that
// overflow an int, aliased buffers, out-of-range plan entries, null pointers, metric
// preconditions. Each one is an error naming the bad value, never a wrapped size, a crash or a
// silently wrong answer (an audit of 2026-11-30 found these reached memory errors or wrong
// results before).

#include <catch2/catch.hpp>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvscout/attention/decode.hpp"
#include "kvscout/cache/partial_key_cache.hpp"
#include "kvscout/cache/quantized_partial_key_cache.hpp"
#include "kvscout/core/detail/checked_size.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/eval/metrics.hpp"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/kivi.hpp"
#include "kvscout/kv/paged.hpp"
#include "kvscout/pipeline/host_pipeline.hpp"
#include "kvscout/score/h2o.hpp"
#include "kvscout/score/oracle.hpp"
#include "kvscout/score/quest.hpp"
#include "kvscout/score/streaming.hpp"
#include "kvscout/select/topk.hpp"
#include "kvscout/skew/partial_query.hpp"
#include "kvscout/skew/plan.hpp"

using Catch::Contains;

namespace {
template <class T>
kvscout::host_span<std::byte> bytes_of(std::vector<T>& v) {
  return {reinterpret_cast<std::byte*>(v.data()), v.size() * sizeof(T)};
}
template <class T>
kvscout::host_span<const std::byte> cbytes_of(const std::vector<T>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}
}  // namespace

TEST_CASE("checked_size names what overflows and its factors", "[errors][size]") {
  CHECK(kvscout::detail::checked_size("x", 3, 5, std::size_t{7}) == 105);
  CHECK(kvscout::detail::checked_size("x", 0, INT_MAX, INT_MAX, INT_MAX) == 0);
  REQUIRE_THROWS_WITH(kvscout::detail::checked_size("the buffer", 1 << 20, 1 << 20, 1 << 16,
                                                    std::size_t{256}),
                      Contains("the buffer = 1048576 x 1048576 x 65536 x 256 does not fit in "
                               "size_t"));
  REQUIRE_THROWS_WITH(kvscout::detail::checked_size("n", 4, -2), Contains("n = 4 x -2"));
}

TEST_CASE("layout sizes that do not fit in size_t are rejected", "[errors][kv]") {
  // 2^20 sequences x 2^20 slots x 2^16 heads x 256-byte rows = 2^64 bytes: it used to wrap to 0,
  // so that validate(0, 0) passed.
  std::vector<int32_t> lens(1 << 20, 0);
  using L = kvscout::contiguous_layout<kvscout::half, 128, kvscout::hnd>;
  REQUIRE_THROWS_WITH(L::padded(1 << 16, 1 << 20, lens.data(), 1 << 20),
                      Contains("padded K / V buffer's bytes") && Contains("does not fit"));
  std::vector<int32_t> indptr = {0, 1};
  using F = kvscout::contiguous_layout<float, 256, kvscout::nhd>;
  REQUIRE_THROWS_WITH(F::ragged(INT_MAX, INT_MAX, indptr.data(), 1),
                      Contains("ragged K / V buffer's bytes"));
  // The same shapes one size smaller are fine.
  CHECK_NOTHROW(L::padded(16, 1 << 20, lens.data(), 1 << 20));

  // KIVI: a residual length that is no multiple of G, and buffers past size_t.
  using K = kvscout::kivi_layout<float, 16, 2, float>;
  std::vector<int32_t> one = {0};
  REQUIRE_THROWS_WITH(K::padded(1, 8, one.data(), 1, {.group = 16, .residual = INT_MAX - 1}),
                      Contains("residual length R = 2147483646 must be a multiple of the group "
                               "size G = 16"));
  CHECK_NOTHROW(K::padded(1, 8, one.data(), 1, {.group = 16, .residual = INT_MAX / 16 * 16}));
  REQUIRE_THROWS_WITH(K::padded(1 << 16, INT_MAX, lens.data(), 1 << 20, {.group = 16}),
                      Contains("KIVI record buffer's bytes"));
}

TEST_CASE("paged layouts reject strides and tables that overflow", "[errors][kv][paged]") {
  std::vector<int32_t> table = {0}, lens = {1};
  const kvscout::block_table bt{table.data(), lens.data(), 1, 1};
  using B = kvscout::paged_layout<float, 4, kvscout::nhd, kvscout::block_table>;
  // A page stride whose bytes overflow: validate() divided by zero.
  REQUIRE_THROWS_WITH(B(bt, 1, 1, std::int64_t{1} << 62),
                      Contains("page_stride = 4611686018427387904 elements is too large"));
  CHECK_NOTHROW(B(bt, 1, 1, std::int64_t{1} << 40));

  // FlashInfer: 4097 pages of 2^20 tokens are more tokens than an int holds; seq_len used to
  // wrap to 5 and validate passed.
  {
    const int P = 1 << 20;
    std::vector<int32_t> indptr = {0, 4097}, indices(4097, 0), last = {5};
    const kvscout::flashinfer_page_table pt{indptr.data(), indices.data(), last.data(), 1};
    const kvscout::paged_layout<float, 4, kvscout::hnd, kvscout::flashinfer_page_table> l(pt, 1, P);
    const std::size_t bytes = std::size_t(P) * 16;
    REQUIRE_THROWS_WITH(l.validate(bytes, bytes),
                        Contains("sequence 0 has 4097 pages of 1048576 tokens") &&
                            Contains("exceed the int range"));
  }
  // Block table: seq_len + page_size - 1 overflowed, no page id was checked, and the gather read
  // page 5 of a buffer that holds none.
  {
    const int P = 1 << 30;
    std::vector<int32_t> t2 = {5, 7}, l2 = {INT_MAX};
    const kvscout::block_table b2{t2.data(), l2.data(), 2, 1};
    const B l(b2, 1, P);
    REQUIRE_THROWS_WITH(l.validate(16, 16), Contains("page id 5 (sequence 0, logical page 0) is "
                                                     "outside [0, 0)"));
  }
}

TEST_CASE("page tables and paged layouts that describe no cache are errors, not crashes",
          "[errors][kv][paged]") {
  // A decreasing indptr with a null indices array: the null check passed (indptr[1] ==
  // indptr[0]), then sequence 0's 5 pages were read from null. The whole indptr is checked
  // first now; a non-decreasing one with pages still needs indices.
  {
    std::vector<int32_t> indptr = {0, 5, 0}, last = {1, 1};
    const kvscout::flashinfer_page_table pt{indptr.data(), nullptr, last.data(), 2};
    REQUIRE_THROWS_WITH(pt.validate(4, 8), Contains("indptr[1] = 5 > indptr[2] = 0"));
    std::vector<int32_t> flat = {0, 5, 5};
    const kvscout::flashinfer_page_table p1{flat.data(), nullptr, last.data(), 2};
    REQUIRE_THROWS_WITH(p1.validate(4, 8), Contains("page table indices is null, but sequence 0 "
                                                    "has 5 pages"));
    // indices holds indptr[num_seqs] = 1 entry; sequence 0's 3 pages were read from it (past its
    // end) before the decrease at sequence 1 was seen (ASan; the fuzz target layout_metadata
    // keeps the input as regress_flashinfer_indptr_dip).
    std::vector<int32_t> dip = {0, 3, 1}, one_page = {0};
    const kvscout::flashinfer_page_table p4{dip.data(), one_page.data(), last.data(), 2};
    REQUIRE_THROWS_WITH(p4.validate(4, 8), Contains("indptr[1] = 3 > indptr[2] = 1"));
    std::vector<int32_t> down = {0, 0, 3, 1};
    std::vector<int32_t> last3 = {1, 1, 1}, ids = {0, 1, 2};
    const kvscout::flashinfer_page_table p2{down.data(), ids.data(), last3.data(), 3};
    REQUIRE_THROWS_WITH(p2.validate(4, 8), Contains("indptr[2] = 3 > indptr[3] = 1"));
    // No pages at all: indices may be null.
    std::vector<int32_t> none = {2, 2, 2};
    const kvscout::flashinfer_page_table p3{none.data(), nullptr, last.data(), 2};
    CHECK_NOTHROW(p3.validate(4, 8));
  }
  // A block table of no blocks may be null, with empty sequences; with blocks it may not.
  {
    std::vector<int32_t> zero = {0, 0}, one = {0, 3};
    CHECK_NOTHROW(kvscout::block_table{nullptr, zero.data(), 0, 2}.validate(16, 4));
    REQUIRE_THROWS_WITH((kvscout::block_table{nullptr, one.data(), 0, 2}.validate(16, 4)),
                        Contains("seq_lens[1] = 3 disagrees with the block table"));
    REQUIRE_THROWS_WITH((kvscout::block_table{nullptr, zero.data(), 1, 2}.validate(16, 4)),
                        Contains("block table is null, with 2 sequences of 1 blocks"));
    REQUIRE_THROWS_WITH((kvscout::block_table{one.data(), nullptr, 1, 2}.validate(16, 4)),
                        Contains("block table seq_lens is null"));
  }
  // A default-constructed paged layout: validate() divided by its zero page stride (SIGFPE).
  REQUIRE_THROWS_WITH(
      (kvscout::paged_layout<float, 4, kvscout::nhd, kvscout::block_table, 16>{}.validate(64, 64)),
      Contains("paged_layout has page_stride 0"));
  REQUIRE_THROWS_WITH(
      (kvscout::paged_layout<float, 4, kvscout::hnd, kvscout::flashinfer_page_table>{}.validate(
          64, 64)),
      Contains("a default-constructed layout describes no cache"));
}

TEST_CASE("host buffers and partial key caches reject sizes past their arithmetic",
          "[errors][cache]") {
  // Rounding SIZE_MAX bytes up to huge pages wrapped: a 2 MiB mapping reported SIZE_MAX bytes.
  for (const auto pages : {kvscout::host_pages::normal, kvscout::host_pages::huge}) {
    REQUIRE_THROWS_WITH(kvscout::host_buffer<std::byte>(SIZE_MAX, pages),
                        Contains("host_buffer of 18446744073709551615 elements of 1 bytes "
                                 "overflows size_t"));
    REQUIRE_THROWS_WITH(kvscout::host_buffer<float>(SIZE_MAX / 4 - 100, pages),
                        Contains("overflows size_t (at most"));
  }
  // max_tokens near INT_MAX overflowed the tile count (signed overflow; then an error that named
  // a negative tile count). Now the count is exact and the size check names the factors.
  REQUIRE_THROWS_WITH(kvscout::partial_key_cache<float>(1 << 20, 1 << 10, 16, INT_MAX),
                      Contains("x 134217728 x 16 x 16 does not fit in size_t"));
  const kvscout::partial_key_cache<float> pkc(1, 1, 16, 100);
  CHECK(pkc.tiles() == 7);
  CHECK(pkc.bytes_for(100) == pkc.bytes());
  CHECK(pkc.bytes_for(0) == 0);
  CHECK(pkc.bytes_for(17) == 2 * 16 * 16 * sizeof(float));
  REQUIRE_THROWS_WITH(pkc.bytes_for(101), Contains("bytes_for(101): the token count must be in "
                                                   "[0, max_tokens = 100]"));
  REQUIRE_THROWS_WITH(pkc.bytes_for(-1), Contains("bytes_for(-1)"));
}

TEST_CASE("policy and cache state that does not fit is rejected", "[errors][spec]") {
  REQUIRE_THROWS_WITH(kvscout::partial_key_cache<float>(1 << 16, 1 << 16, 1 << 12, (1 << 16) * 16),
                      Contains("partial_key_cache elements") && Contains("does not fit"));
  REQUIRE_THROWS_WITH(kvscout::h2o_policy_host({{.num_layers = 1 << 16, .num_seqs = 1 << 16,
                                                .num_kv_heads = 1 << 16, .max_tokens = 1 << 16}}),
                      Contains("the policy's state in bytes"));
  // In caller memory: 2^62 elements fit size_t, their bytes do not; a wrapped (small) size would
  // let an empty span pass and the first append write out of bounds.
  REQUIRE_THROWS_WITH(kvscout::partial_key_cache<float>::memory_bytes(1 << 15, 1 << 15, 1 << 12, 1 << 20),
                      Contains("partial_key_cache bytes (elements x element size)") && Contains("does not fit"));
  REQUIRE_THROWS_WITH(kvscout::partial_key_cache<float>(1 << 15, 1 << 15, 1 << 12, 1 << 20,
                                                        kvscout::host_span<std::byte>{}),
                      Contains("does not fit"));
  REQUIRE_THROWS_WITH((kvscout::quantized_partial_key_cache<8, 16>::memory_bytes(1 << 15, 1 << 15, 1 << 13, 1 << 21)),
                      Contains("quantized_partial_key_cache") && Contains("does not fit"));
  // max_tokens + page_size - 1 overflowed an int.
  REQUIRE_THROWS_WITH(kvscout::quest_policy_host<16>({{.num_layers = 1 << 12, .num_seqs = 1 << 12,
                                                      .num_kv_heads = 1 << 8, .num_q_heads = 1 << 8,
                                                      .max_tokens = INT_MAX, .scale = 0.25f}, 16}),
                      Contains("does not fit in size_t"));
  // The page count itself: max_tokens + page_size - 1 overflowed an int before the state size
  // was ever checked; now it is one page of INT_MAX tokens.
  const kvscout::quest_policy_host<16> one_page({{.num_layers = 1, .num_seqs = 1, .num_kv_heads = 1,
                                                 .num_q_heads = 1, .max_tokens = INT_MAX,
                                                 .scale = 0.25f}, INT_MAX});
  CHECK(one_page.configuration().shape.max_tokens == INT_MAX);
  // An infinite scale made every quest score inf (the ranking lost); now every policy that takes
  // a scale wants it finite.
  REQUIRE_THROWS_WITH(
      kvscout::quest_policy_host<16>({{.num_layers = 1,
                                       .num_seqs = 1,
                                       .num_kv_heads = 1,
                                       .num_q_heads = 1,
                                       .max_tokens = 32,
                                       .scale = std::numeric_limits<float>::infinity()},
                                      8}),
      Contains("scale must be positive and finite, got inf"));
}

TEST_CASE("null key pointers are rejected before they are read", "[errors][spec]") {
  kvscout::partial_key_cache<float> pkc(1, 1, 4, 16);
  REQUIRE_THROWS_WITH(pkc.append(0, 0, 3, nullptr), Contains("partial key of token 3 is null"));
  kvscout::quest_policy_host<16> q({{.num_layers = 1, .num_seqs = 1, .num_kv_heads = 1,
                                    .num_q_heads = 1, .max_tokens = 16, .scale = 0.25f}, 4});
  REQUIRE_THROWS_WITH(q.append(0, 0, 0, nullptr, nullptr), Contains("k_post is null"));
}

TEST_CASE("the oracle checks the GQA group of every layer", "[errors][spec]") {
  using L = kvscout::contiguous_layout<float, 4, kvscout::hnd>;
  std::vector<int32_t> lens = {2};
  const auto l0 = L::padded(1, 2, lens.data(), 1);
  const auto l1 = L::padded(2, 2, lens.data(), 1);  // 3 query heads over 2 kv heads: no group
  std::vector<float> k0(8, 1.f), k1(16, 1.f);
  std::vector<kvscout::kv_view<L, kvscout::host_space>> layers = {
      {l0, cbytes_of(k0), cbytes_of(k0)}, {l1, cbytes_of(k1), cbytes_of(k1)}};
  REQUIRE_THROWS_WITH(
      (kvscout::oracle_policy_host<L>({{.num_q_heads = 3, .scale = 0.5f},
                                       kvscout::gqa_aggregation::max_logit}, layers)),
      Contains("num_q_heads = 3 must be a positive multiple of layer 1's num_kv_heads = 2"));
}

TEST_CASE("skew plans with out-of-range channels, planes or theta are rejected",
          "[errors][skew]") {
  const int D = 8, dm = 4;
  const std::vector<float> W(D * dm, 0.5f);
  std::vector<float> k(D, 1.f), pk(8);
  // A NaN theta gave NaN partial queries.
  const kvscout::rope_config nan_rope{.head_dim = D,
                                      .theta = std::numeric_limits<float>::quiet_NaN()};
  REQUIRE_THROWS_WITH(kvscout::rope_planes_plan(nan_rope, {0, 1}),
                      Contains("rope theta must be positive and finite, got nan"));
  kvscout::skew_plan planes = kvscout::rope_planes_plan({.head_dim = D}, {0, 1});
  planes.rope.theta = -1.f;
  REQUIRE_THROWS_WITH(kvscout::make_partial_query_weights(planes, W, {}, dm, 0),
                      Contains("skew_plan rope theta must be positive and finite, got -1"));
  // A plane past head_dim / 2 read past the RoPE table.
  planes = kvscout::rope_planes_plan({.head_dim = D}, {0});
  planes.planes = {1000};
  REQUIRE_THROWS_WITH(kvscout::make_partial_query_weights(planes, W, {}, dm, 0),
                      Contains("skew_plan plane 1000 (entry 0) is outside [0, head_dim / 2 = 4)"));
  // A channel past head_dim read past A.
  kvscout::skew_plan p;
  p.mode = kvscout::rope_mode::post_rope_skew;
  p.head_dim = D;
  p.r = 2;
  p.rope = {.head_dim = D};
  p.A.assign(D * D, 0.f);
  p.channels = {0, D};
  REQUIRE_THROWS_WITH(kvscout::make_partial_query_weights(p, W, {}, dm, 0),
                      Contains("skew_plan channel 8 (entry 1) is outside [0, head_dim = 8)"));
  p.mode = kvscout::rope_mode::pre_rope_folded;
  p.r = 1;
  p.channels = {100};
  REQUIRE_THROWS_WITH(kvscout::project_key(p, k.data(), pk.data()),
                      Contains("skew_plan channel 100 (entry 0)"));
  p.channels = {-1};
  REQUIRE_THROWS_WITH(kvscout::project_key(p, k.data(), pk.data()),
                      Contains("skew_plan channel -1 (entry 0)"));
}

TEST_CASE("a gather into overlapping buffers is rejected before it writes", "[errors][fetch]") {
  using L = kvscout::contiguous_layout<float, 4, kvscout::hnd>;
  std::vector<int32_t> lens = {4};
  const auto l = L::padded(1, 4, lens.data(), 1);
  std::vector<float> k(16), v(16);
  for (int i = 0; i < 16; ++i)
    k[i] = 100.f + static_cast<float>(i), v[i] = 200.f + static_cast<float>(i);
  std::vector<int32_t> idx = {1, 2}, cnt = {2};
  const kvscout::host_gather_config cfg{.shape = {.num_seqs = 1, .num_kv_heads = 1}, .capacity = 2};
  const auto ws = kvscout::make_workspace<kvscout::gather_executor_host<L>>(cfg);
  kvscout::gather_executor_host<L> g(cfg, ws.span());
  const kvscout::selection_view<kvscout::host_space> sel{{idx.data(), 2}, {cnt.data(), 1}, 1, 1, 2};
  const kvscout::kv_view<L, kvscout::host_space> src{l, cbytes_of(k), cbytes_of(v)};
  const std::vector<float> k_before = k;
  // K and V rows into one buffer: the V rows overwrote the K rows.
  std::vector<float> d(8, -1.f), dv(8, -1.f);
  REQUIRE_THROWS_WITH(g.submit(src, sel, {bytes_of(d), bytes_of(d)}),
                      Contains("destination K and V overlap"));
  // Half-overlapping: V starts at K's second row.
  std::vector<float> big(16, -1.f);
  const auto all = bytes_of(big);
  REQUIRE_THROWS_WITH(g.submit(src, sel, {all.subspan(0, 32), all.subspan(16, 32)}),
                      Contains("destination K and V overlap"));
  // Into the cache it reads from.
  REQUIRE_THROWS_WITH(g.submit(src, sel, {bytes_of(k), bytes_of(dv)}),
                      Contains("destination K (32 bytes at") &&
                          Contains("overlaps the source K / V cache"));
  REQUIRE_THROWS_WITH(g.submit(src, sel, {bytes_of(d), bytes_of(v)}),
                      Contains("destination V (32 bytes at"));
  CHECK(k == k_before);
  CHECK(d == std::vector<float>(8, -1.f));
  // Adjacent, not overlapping: fine.
  g.submit(src, sel, {all.subspan(0, 32), all.subspan(32, 32)}).wait();
  CHECK(big[0] == 104.f);
  CHECK(big[8] == 204.f);

  // Over the selection it is gathered by: the first row copied overwrote the indices still to
  // be read (a review of 2026-12-04 reached an out-of-bounds read this way).
  {
    std::vector<float> arena(16, -1.f);
    auto* sel_idx = reinterpret_cast<int32_t*>(arena.data());
    sel_idx[0] = 1, sel_idx[1] = 2;
    auto* sel_cnt = reinterpret_cast<int32_t*>(arena.data() + 15);
    *sel_cnt = 2;
    const kvscout::selection_view<kvscout::host_space> in_arena{
        {sel_idx, 2}, {sel_cnt, 1}, 1, 1, 2};
    const auto ab = bytes_of(arena);
    REQUIRE_THROWS_WITH(g.submit(src, in_arena, {ab.subspan(0, 32), bytes_of(dv)}),
                        Contains("destination K (32 bytes at") &&
                            Contains("overlaps the selection's indices or counts"));
    REQUIRE_THROWS_WITH(g.submit(src, in_arena, {bytes_of(d), ab.subspan(32, 32)}),
                        Contains("destination V (32 bytes at") &&
                            Contains("overlaps the selection's indices or counts"));
    CHECK(sel_idx[0] == 1);
    CHECK(sel_idx[1] == 2);
    CHECK(*sel_cnt == 2);
    // The arena's middle holds neither: fine.
    g.submit(src, in_arena, {ab.subspan(8, 32), bytes_of(dv)}).wait();
    CHECK(arena[2] == 104.f);
  }
  // A workspace over what the submit reads or writes: the running counts it writes corrupted
  // the copy.
  {
    const std::size_t wb = kvscout::gather_executor_host<L>::workspace_bytes(cfg);  // 16 bytes
    std::vector<std::int64_t> arena(16, 0);
    const auto ab = bytes_of(arena);
    kvscout::gather_executor_host<L> g2(cfg, ab.subspan(0, wb));
    REQUIRE_THROWS_WITH(g2.submit(src, sel, {ab.subspan(0, 32), ab.subspan(64, 32)}),
                        Contains("the workspace (16 bytes at") &&
                            Contains("overlaps the destination K rows (32 bytes at"));
    REQUIRE_THROWS_WITH(g2.submit(src, sel, {ab.subspan(64, 32), ab.subspan(8, 32)}),
                        Contains("overlaps the destination V rows"));
    auto* in_ws = reinterpret_cast<int32_t*>(arena.data());
    in_ws[0] = 1, in_ws[1] = 2;
    const kvscout::selection_view<kvscout::host_space> over{{in_ws, 2}, {cnt.data(), 1}, 1, 1, 2};
    REQUIRE_THROWS_WITH(g2.submit(src, over, {bytes_of(d), bytes_of(dv)}),
                        Contains("overlaps the selection's indices (8 bytes at"));
    CHECK(in_ws[0] == 1);
    CHECK(in_ws[1] == 2);
    std::vector<float> kk = k;
    kvscout::gather_executor_host<L> g3(cfg, {reinterpret_cast<std::byte*>(kk.data()), wb});
    REQUIRE_THROWS_WITH(
        g3.submit({l, cbytes_of(kk), cbytes_of(v)}, sel, {bytes_of(d), bytes_of(dv)}),
        Contains("overlaps the source K cache (64 bytes at"));
    CHECK(kk == k);
    // Apart from everything: fine.
    g2.submit(src, sel, {ab.subspan(16, 32), ab.subspan(64, 32)}).wait();
    CHECK(reinterpret_cast<const float*>(ab.subspan(16, 32).data())[0] == 104.f);
  }
}

TEST_CASE("a KIVI writer refuses buffers that overlap", "[errors][kivi]") {
  using L = kvscout::kivi_layout<float, 16, 2, float>;
  std::vector<int32_t> lens = {0};
  const auto l = L::padded(1, 8, lens.data(), 1, {.group = 16, .residual = 16});
  kvscout::kivi_host_storage st(l);
  auto b = st.buffers();
  b.v_residual = b.k_residual;  // V would overwrite K in the residual window
  REQUIRE_THROWS_WITH((kvscout::kivi_append_host<L>(l, b, lens.data())),
                      Contains("the K residual buffer") && Contains("and the V residual buffer") &&
                          Contains("overlap"));
  CHECK_NOTHROW(kvscout::kivi_append_host<L>(l, st.buffers(), lens.data()));
  // Records exist once the capacity holds whole groups past the window.
  const auto l2 = L::padded(1, 128, lens.data(), 1, {.group = 16, .residual = 16});
  REQUIRE(l2.required_k_bytes() > 0);
  kvscout::kivi_host_storage st2(l2);
  b = st2.buffers();
  b.k_params = b.k_codes;
  REQUIRE_THROWS_WITH((kvscout::kivi_append_host<L>(l2, b, lens.data())),
                      Contains("the K code buffer") && Contains("key parameter buffer"));
}

TEST_CASE("attention refuses outputs that overlap its query", "[errors][attention]") {
  using L = kvscout::contiguous_layout<float, 4, kvscout::hnd>;
  std::vector<int32_t> lens = {4};
  const auto l = L::padded(1, 4, lens.data(), 1);
  std::vector<float> k(16), v(16);
  for (int t = 0; t < 4; ++t) k[t * 4] = static_cast<float>(t), v[t * 4 + 1] = 1.f;
  const kvscout::layout_rows_host<L> rows(kvscout::kv_view<L, kvscout::host_space>{l, cbytes_of(k),
                                                                                  cbytes_of(v)});
  std::vector<float> q = {1, 0, 0, 0}, out(4), probs(4);
  const kvscout::attention_params p{1, 1.f};
  // out == q: the probabilities pass read the overwritten query (they summed to 0.128).
  REQUIRE_THROWS_WITH(kvscout::decode_attention_host(rows, kvscout::current_token<float>{},
                                                     {q.data(), q.size()}, {q.data(), q.size()}, p,
                                                     {probs.data(), probs.size()}, 4),
                      Contains("out overlaps q"));
  REQUIRE_THROWS_WITH(kvscout::decode_attention_host(rows, kvscout::current_token<float>{},
                                                     {q.data(), q.size()},
                                                     {out.data(), out.size()}, p,
                                                     {out.data(), out.size()}, 4),
                      Contains("probs overlaps q or out"));
  kvscout::decode_attention_host(rows, kvscout::current_token<float>{}, {q.data(), q.size()},
                                 {out.data(), out.size()}, p, {probs.data(), probs.size()}, 4);
  double sum = 0;
  for (float x : probs) sum += x;
  CHECK(sum == Approx(1.0));
  // Without probs, in place is fine (each query is read before its output is written) and gives
  // the same bits; shifted against q it is not.
  std::vector<float> inplace = q;
  kvscout::decode_attention_host(rows, kvscout::current_token<float>{},
                                 {inplace.data(), inplace.size()},
                                 {inplace.data(), inplace.size()}, p);
  CHECK(inplace == out);
  std::vector<float> two(8, 0.f);
  two[1] = 1.f;
  REQUIRE_THROWS_WITH(kvscout::decode_attention_host(rows, kvscout::current_token<float>{},
                                                     {two.data() + 1, 4}, {two.data(), 4}, p),
                      Contains("out overlaps q"));
}

TEST_CASE("the host pipeline's last_selection checks the layer", "[errors][pipeline]") {
  using L = kvscout::contiguous_layout<float, 4, kvscout::hnd>;
  const int H = 1, MT = 8;
  kvscout::streaming_policy_host sp({{.num_kv_heads = H}, 0});
  const kvscout::topk_selector_host::config sc{{.num_seqs = 1, .num_kv_heads = H, .max_tokens = MT},
                                               2, 2, {}};
  std::vector<std::byte> ws(kvscout::topk_selector_host::workspace_bytes(sc) + 16);
  kvscout::topk_selector_host sel(sc, {ws.data(), ws.size()});
  const kvscout::host_pipeline_config pc{{.num_layers = 2, .num_seqs = 1, .num_kv_heads = H,
                                         .num_q_heads = 1, .max_tokens = MT, .scale = 0.5f}, 0, 2,
                                         1};
  using pipe_t = kvscout::decode_pipeline_host<L, kvscout::streaming_policy_host, kvscout::topk_selector_host>;
  auto gws = kvscout::make_workspace<kvscout::gather_executor_host<L>>(pc.gather_config());
  kvscout::gather_executor_host<L> gather(pc.gather_config(), gws.span());
  auto pws = kvscout::make_workspace<pipe_t>(pc);
  pipe_t pipe(pc, sp, sel, gather, pws.span());
  CHECK_NOTHROW(pipe.last_selection(1));
  REQUIRE_THROWS_WITH(pipe.last_selection(-1), Contains("layer -1 is out of range [0, 2)"));
  REQUIRE_THROWS_WITH(pipe.last_selection(2), Contains("layer 2 is out of range [0, 2)"));
}

TEST_CASE("metrics check their preconditions", "[errors][eval]") {
  const std::vector<float> probs = {0.25f, 0.25f, 0.25f, 0.25f};
  const std::vector<int32_t> dup = {1, 1, 1, 1, 1, 1};  // gave recall 1.5
  REQUIRE_THROWS_WITH(kvscout::attention_mass_recall(probs.data(), 4, dup.data(), 6),
                      Contains("selected tokens must be strictly ascending: 1 then 1"));
  const std::vector<float> neg = {1.f, -0.9f, 0.f, 0.f};  // gave recall 10
  const std::vector<int32_t> first = {0};
  REQUIRE_THROWS_WITH(kvscout::attention_mass_recall(neg.data(), 4, first.data(), 1),
                      Contains("weight -0.9 of token 1 is not a finite non-negative value"));
  CHECK(kvscout::attention_mass_recall(probs.data(), 4, first.data(), 1) == Approx(0.25));
  const std::vector<int32_t> a = {3, 1, 2}, b = {1, 2, 3};  // gave 0.333
  REQUIRE_THROWS_WITH(kvscout::overlap(a.data(), 3, b.data(), 3),
                      Contains("list a must be strictly ascending: 3 then 1"));
  CHECK(kvscout::overlap(b.data(), 3, b.data(), 3) == 1.0);
  // counts shorter than num_seqs * num_kv_heads: read past it.
  std::vector<int32_t> idx(8), counts(1, 1);
  const kvscout::selection_view<kvscout::host_space> sel{{idx.data(), idx.size()},
                                                         {counts.data(), counts.size()}, 2, 2, 2};
  REQUIRE_THROWS_WITH(kvscout::bytes_fetched(sel, 16, 16),
                      Contains("counts holds 1 entries, expected num_seqs * num_kv_heads = 4"));
  std::vector<int32_t> four = {1, 2, 0, 3};
  const kvscout::selection_view<kvscout::host_space> sel4{{idx.data(), idx.size()},
                                                          {four.data(), four.size()}, 2, 2, 2};
  REQUIRE_THROWS_WITH(kvscout::bytes_fetched(sel4, 16, 16),
                      Contains("count 3 of row 3 is outside [0, capacity = 2]"));
  four[3] = 1;
  CHECK(kvscout::bytes_fetched(sel4, 16, 8) == 4 * 24);
}
