// The host-side halves of the CUDA executors, attention and append (fetch/detail/
// cuda_fetch_checks.hpp, attention/detail/decode_device_checks.hpp, kv/detail/append_checks.hpp,
// core/device_status.hpp): error messages naming the bad value, workspace sizes, and the
// copy-engine run list, which is replayed with memcpy on the host and must equal
// gather_executor_host's output byte for byte. No GPU needed.

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kv_fixtures.hpp"
#include "kvscout/attention/detail/decode_device_checks.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/core/device_status.hpp"
#include "kvscout/fetch/detail/cuda_fetch_checks.hpp"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/kv/detail/append_checks.hpp"
#include "kvscout/kv/kivi.hpp"
#include "kvscout/select/detail/device_config.hpp"
#include "kvscout/score/infinigen_device.hpp"

using Catch::Matchers::Contains;
using namespace kvscout;

namespace {

struct sel_store {
  std::vector<int32_t> indices, counts;
  int S, H, cap;
  sel_store(int s, int h, int c) : indices(static_cast<std::size_t>(s) * h * c, 0),
                                   counts(static_cast<std::size_t>(s) * h, 0), S(s), H(h), cap(c) {}
  selection_view<host_space> view() const {
    return {{indices.data(), indices.size()}, {counts.data(), counts.size()}, S, H, cap};
  }
};

template <class Case>
void check_runs_replay(std::uint32_t seed, double density) {
  using layout = typename Case::layout;
  CAPTURE(Case::name(), seed, density);
  std::mt19937 rng(seed);
  const std::vector<int32_t> lens = {37, 0, 100};
  const int heads = 3, capacity = 64;
  kvtest::layout_fixture<Case> f(lens, heads, rng);
  std::vector<std::byte> k(f.bytes), v(f.bytes);
  kvtest::fill_random(k, seed);
  kvtest::fill_random(v, seed + 1);
  sel_store sel(3, heads, capacity);
  std::bernoulli_distribution take(density);
  for (int s = 0; s < 3; ++s)
    for (int h = 0; h < heads; ++h) {
      const std::size_t r = static_cast<std::size_t>(s) * heads + h;
      int n = 0;
      for (int t = 0; t < lens[s] && n < capacity; ++t)
        if (take(rng)) sel.indices[r * capacity + n++] = t;
      sel.counts[r] = n;
    }
  const std::size_t row = f.layout.k_row_bytes();
  const std::size_t dst_bytes = 3 * heads * capacity * row;
  std::vector<std::byte> ref_k(dst_bytes, std::byte{0xCD}), ref_v(dst_bytes, std::byte{0xCD});
  std::vector<std::byte> got_k(dst_bytes, std::byte{0xCD}), got_v(dst_bytes, std::byte{0xCD});
  kv_view<layout, host_space> src{f.layout, {k.data(), k.size()}, {v.data(), v.size()}};

  host_gather_config hc{.shape = {.num_seqs = 3, .num_kv_heads = heads}, .capacity = capacity};
  auto ws = make_workspace<gather_executor_host<layout>>(hc);
  gather_executor_host<layout> gather(hc, ws.span());
  gather.submit(src, sel.view(), {{ref_k.data(), dst_bytes}, {ref_v.data(), dst_bytes}});

  copy_engine_config cc{.shape = {.num_seqs = 3, .num_kv_heads = heads}, .capacity = capacity};
  REQUIRE(detail::copy_engine_workspace_bytes(cc) ==
          (9 + 1) * 8 + 2 * 9 * 64 * (2 * sizeof(void*) + sizeof(std::size_t)));
  std::vector<std::int64_t> prefix(10);
  const std::int64_t total = detail::check_host_selection(src, sel.view(), prefix.data());
  std::int64_t sum = 0;
  for (int c : sel.counts) sum += c;
  REQUIRE(total == sum);
  REQUIRE(prefix[9] == sum);
  const std::size_t max_copies = 2 * 9 * 64;
  std::vector<void*> dsts(max_copies);
  std::vector<const void*> srcs(max_copies);
  std::vector<std::size_t> sizes(max_copies);
  const std::size_t n = detail::build_copy_runs(f.layout, k.data(), v.data(), got_k.data(),
                                                got_v.data(), sel.view(), dsts.data(),
                                                srcs.data(), sizes.data());
  REQUIRE(n % 2 == 0);
  REQUIRE(n <= 2 * static_cast<std::size_t>(sum));
  std::size_t moved = 0;
  for (std::size_t c = 0; c < n; ++c) {
    std::memcpy(dsts[c], srcs[c], sizes[c]);
    moved += sizes[c];
  }
  REQUIRE(moved == 2 * static_cast<std::size_t>(sum) * row);
  REQUIRE(got_k == ref_k);
  REQUIRE(got_v == ref_v);
  // Runs merge where rows are adjacent: HND always (for consecutive tokens).
  if (std::is_same_v<typename Case::order, hnd> && density > 0.9 &&
      Case::layout_kind != kvtest::kind::vllm && Case::layout_kind != kvtest::kind::flashinfer) {
    REQUIRE(n <= 2 * 9);
  }
}

}  // namespace

TEST_CASE("device status bits are described", "[cuda][facade]") {
  REQUIRE(device_status::describe(0) == "ok");
  REQUIRE_THAT(device_status::describe(device_status::bad_index | device_status::bad_count),
               Contains("token index out of range") && Contains("count outside"));
  REQUIRE_THAT(device_status::describe(device_status::bad_length), Contains("sequence length"));
  REQUIRE_THAT(device_status::describe(device_status::bad_length | (1 << 20)),
               Contains("sequence length") && Contains("unknown bits 1048576"));
  REQUIRE_THAT(device_status::describe(1 << 20), Contains("unknown bits"));
  // Every bit has its own words.
  const int bits[] = {device_status::bad_index, device_status::bad_count,
                      device_status::out_of_bounds, device_status::misaligned,
                      device_status::bad_value, device_status::bad_length};
  for (int a : bits)
    for (int b : bits)
      if (a != b) REQUIRE(device_status::describe(a) != device_status::describe(b));
}

TEST_CASE("CUDA executor configs are validated with the bad value named", "[cuda][facade]") {
  zero_copy_config z{.shape = {.num_seqs = 1, .num_kv_heads = 2}, .capacity = 8};
  REQUIRE_NOTHROW(detail::check_zero_copy_config(z));
  z.threads_per_block = 100;
  REQUIRE_THROWS_WITH(detail::check_zero_copy_config(z),
                      Contains("threads_per_block must be a multiple of 32") && Contains("100"));
  z.threads_per_block = 256;
  z.max_blocks = -3;
  REQUIRE_THROWS_WITH(detail::check_zero_copy_config(z), Contains("max_blocks") && Contains("-3"));
  z.max_blocks = 0;
  z.shape.num_kv_heads = 0;
  REQUIRE_THROWS_WITH(detail::check_zero_copy_config(z), Contains("num_kv_heads must be positive"));

  copy_engine_config c{.shape = {.num_seqs = -1, .num_kv_heads = 2}, .capacity = 8};
  REQUIRE_THROWS_WITH(detail::copy_engine_workspace_bytes(c), Contains("num_seqs") && Contains("-1"));

  staged_config s{.shape = {.num_seqs = 2, .num_kv_heads = 3}, .capacity = 5, .k_row_bytes = 256,
                  .v_row_bytes = 48};
  // header: (6 + 1) * 8 = 56 -> 64; rows: 30 * (256 + 48)
  REQUIRE(detail::staged_stage_bytes(s) == 64 + 30 * (256 + 48));
  REQUIRE(detail::staged_workspace_bytes(s) == 2 * (64 + 30 * (256 + 48)));
  REQUIRE(detail::staged_device_workspace_bytes(s) == 64 + 30 * (256 + 48));
  s.v_row_bytes = 40;
  REQUIRE_THROWS_WITH(detail::staged_stage_bytes(s),
                      Contains("v_row_bytes must be a positive multiple of 16") && Contains("40"));
  s.v_row_bytes = 48;
  s.stages = 0;
  REQUIRE_THROWS_WITH(detail::staged_stage_bytes(s), Contains("stages must be at least 1"));
  s.stages = 2;
  s.threads = 0;
  REQUIRE_THROWS_WITH(detail::staged_stage_bytes(s), Contains("threads must be at least 1"));
  s.threads = 1;
  REQUIRE(s.stores == gather_stores::streaming);  // nothing on the host reads the staging again
  s.stores = static_cast<gather_stores>(9);
  REQUIRE_THROWS_WITH(detail::staged_stage_bytes(s),
                      Contains("stores gather_stores(9) is not one of automatic, cached, streaming"));

  std::vector<std::byte> small(8);
  REQUIRE_THROWS_WITH(detail::check_workspace(small.data(), small.size(), 64, 8, "workspace"),
                      Contains("workspace holds 8 bytes, expected at least 64"));
  REQUIRE_THROWS_WITH(detail::check_workspace(small.data() + 1, 64, 64, 16, "device workspace"),
                      Contains("must be 16-byte aligned"));
}

TEST_CASE("CUDA executor views are checked without reading device data", "[cuda][facade]") {
  using layout = contiguous_layout<half, 128, hnd>;
  std::vector<int32_t> lens = {10, 20};
  const auto l = layout::padded(2, 32, lens.data(), 2);
  alignas(16) static std::byte k[2 * 2 * 32 * 256], v[2 * 2 * 32 * 256];
  alignas(16) static std::byte dk[2 * 2 * 8 * 256], dv[2 * 2 * 8 * 256];
  sel_store sel(2, 2, 8);
  kv_view<layout, device_space> src{l, {k, sizeof k}, {v, sizeof v}};
  gather_destination<device_space> dst{{dk, sizeof dk}, {dv, sizeof dv}};
  auto sv = [&](const sel_store& x) {
    return selection_view<device_space>{{x.indices.data(), x.indices.size()},
                                        {x.counts.data(), x.counts.size()}, x.S, x.H, x.cap};
  };
  REQUIRE_NOTHROW(detail::check_fetch_views(2, 2, 8, src, sv(sel), dst, true));
  REQUIRE_THROWS_WITH(detail::check_fetch_views(2, 2, 9, src, sv(sel), dst, true),
                      Contains("selection shape [2, 2, 8] differs from the executor's [2, 2, 9]"));
  gather_destination<device_space> small{{dk, 100}, {dv, sizeof dv}};
  REQUIRE_THROWS_WITH(detail::check_fetch_views(2, 2, 8, src, sv(sel), small, true),
                      Contains("destination K buffer holds 100 bytes") && Contains("8192"));
  kv_view<layout, device_space> odd{l, {k + 8, sizeof k - 8}, {v, sizeof v}};
  REQUIRE_THROWS_WITH(detail::check_fetch_views(2, 2, 8, odd, sv(sel), dst, true),
                      Contains("must be 16-byte aligned"));
  REQUIRE_NOTHROW(detail::check_fetch_views(2, 2, 8, odd, sv(sel), dst, false));
  sel_store short_sel(2, 2, 8);
  short_sel.counts.resize(3);
  REQUIRE_THROWS_WITH(detail::check_fetch_views(2, 2, 8, src, sv(short_sel), dst, true),
                      Contains("selection counts holds 3 entries"));
}

TEST_CASE("host-visible selections are checked in full for the copy engine and staging",
          "[cuda][facade]") {
  using layout = contiguous_layout<half, 64, nhd>;
  std::vector<int32_t> lens = {10, 4};
  const auto l = layout::padded(1, 16, lens.data(), 2);
  std::vector<std::byte> k(l.required_bytes()), v(l.required_bytes());
  kv_view<layout, host_space> src{l, {k.data(), k.size()}, {v.data(), v.size()}};
  sel_store sel(2, 1, 4);
  std::vector<std::int64_t> prefix(3);
  sel.counts = {2, 1};
  sel.indices = {3, 7, 0, 0, 2, 0, 0, 0};
  REQUIRE(detail::check_host_selection(src, sel.view(), prefix.data()) == 3);
  REQUIRE(prefix == std::vector<std::int64_t>{0, 2, 3});
  sel.indices[4] = 4;  // seq_len(1) = 4
  REQUIRE_THROWS_WITH(detail::check_host_selection(src, sel.view(), prefix.data()),
                      Contains("token index 4 (entry 0) for sequence 1") &&
                          Contains("[0, seq_len = 4)"));
  sel.indices[4] = 2;
  sel.indices[1] = 3;
  REQUIRE_THROWS_WITH(detail::check_host_selection(src, sel.view(), prefix.data()),
                      Contains("not strictly ascending: 3 then 3"));
  sel.indices[1] = 7;
  sel.counts[0] = 5;
  REQUIRE_THROWS_WITH(detail::check_host_selection(src, sel.view(), prefix.data()),
                      Contains("count 5 for sequence 0") && Contains("capacity = 4"));
}

TEMPLATE_TEST_CASE("copy-engine runs replayed with memcpy equal the host gather", "[cuda][facade]",
                   (kvtest::layout_case<kvtest::kind::padded, nhd, half, 128>),
                   (kvtest::layout_case<kvtest::kind::padded, hnd, half, 128>),
                   (kvtest::layout_case<kvtest::kind::ragged, hnd, float, 128>),
                   (kvtest::layout_case<kvtest::kind::flashinfer, nhd, half, 256>),
                   (kvtest::layout_case<kvtest::kind::flashinfer, hnd, half, 128>),
                   (kvtest::layout_case<kvtest::kind::vllm, hnd, bfloat16, 128>),
                   (kvtest::layout_case<kvtest::kind::vllm, nhd, float, 128>)) {
  for (double density : {0.05, 0.1, 0.25, 1.0})
    for (std::uint32_t seed : {1u, 2u}) check_runs_replay<TestType>(seed, density);
}

TEST_CASE("device attention inputs are validated on the host", "[cuda][facade]") {
  attention_params p{.num_q_heads = 6, .scale = 0.125f};
  const float q = 0.f;
  REQUIRE_NOTHROW(detail::check_decode_cuda(2, 3, 64, p, 2 * 6 * 64, &q, 2 * 6 * 64, &q, false,
                                            0, 0, true));
  p.num_q_heads = 7;
  REQUIRE_THROWS_WITH(detail::check_decode_cuda(2, 3, 64, p, 10000, &q, 10000, &q, false, 0, 0,
                                                true),
                      Contains("num_q_heads = 7 must be a positive multiple of num_kv_heads = 3"));
  p.num_q_heads = 6;
  p.scale = -1.f;
  REQUIRE_THROWS_WITH(detail::check_decode_cuda(2, 3, 64, p, 10000, &q, 10000, &q, false, 0, 0,
                                                true),
                      Contains("scale must be positive"));
  p.scale = 0.125f;
  REQUIRE_THROWS_WITH(detail::check_decode_cuda(2, 3, 64, p, 100, &q, 10000, &q, false, 0, 0,
                                                true),
                      Contains("q holds 100 elements") && Contains("768"));
  REQUIRE_THROWS_WITH(detail::check_decode_cuda(2, 3, 64, p, 768, &q, 768, &q, true, 384, 10,
                                                false),
                      Contains("current token K / V hold 384 / 10"));
  REQUIRE_THROWS_WITH(detail::check_decode_cuda(2, 3, 64, p, 768, &q, 768, &q, true, 384, 384,
                                                true),
                      Contains("V is null"));
  p.k_scale = 0.f;
  REQUIRE_THROWS_WITH(detail::check_decode_cuda(2, 3, 64, p, 768, &q, 768, &q, false, 0, 0,
                                                true),
                      Contains("k_scale and v_scale must be positive and finite, got 0 and 1"));
  p.k_scale = 1.f;
  p.v_scale = std::numeric_limits<float>::infinity();
  REQUIRE_THROWS_WITH(detail::check_decode_cuda(2, 3, 64, p, 768, &q, 768, &q, false, 0, 0,
                                                true),
                      Contains("k_scale and v_scale must be positive and finite"));
  // Append scales divide the input: positive and finite only.
  REQUIRE_NOTHROW(detail::check_kv_scales({0.5f, 3.f}));
  REQUIRE_THROWS_WITH(detail::check_kv_scales({0.f, 1.f}),
                      Contains("kv_scales must be positive and finite, got k = 0, v = 1"));
  REQUIRE_THROWS_WITH(detail::check_kv_scales({1.f, -2.f}), Contains("v = -2"));
  REQUIRE_THROWS_WITH(detail::check_kv_scales({std::numeric_limits<float>::quiet_NaN(), 1.f}),
                      Contains("k = nan"));
  // The current token's rows are read with the loads of load_row_part: aligned to their width.
  static_assert(detail::row_part_alignment<float, 4> == 16);       // float, head_dim 128
  static_assert(detail::row_part_alignment<half, 4> == 8);         // half, head_dim 128
  static_assert(detail::row_part_alignment<half, 3> == 2);         // half, head_dim 96
  static_assert(detail::row_part_alignment<fp8_e4m3, 4> == 1);     // fp8, head_dim 128
  static_assert(detail::row_part_alignment<fp8_e4m3, 8> == 8);     // fp8, head_dim 256
  alignas(16) static std::byte cur[64];
  REQUIRE_NOTHROW(detail::check_current_token_alignment(cur, cur + 32, 16));
  REQUIRE_NOTHROW(detail::check_current_token_alignment(cur + 8, cur + 24, 8));
  REQUIRE_NOTHROW(detail::check_current_token_alignment(cur + 3, cur + 5, 1));
  REQUIRE_THROWS_WITH(detail::check_current_token_alignment(cur + 2, cur, 16),
                      Contains("16-byte boundaries") && Contains("remainders 2 / 0"));
  REQUIRE_THROWS_WITH(detail::check_current_token_alignment(cur, cur + 4, 8),
                      Contains("8-byte boundaries") && Contains("remainders 0 / 4"));

  sel_store sel(2, 3, 4);
  selection_view<device_space> sv{{sel.indices.data(), sel.indices.size()},
                                  {sel.counts.data(), sel.counts.size()}, 2, 3, 4};
  alignas(16) static std::byte rows[24 * 256];
  REQUIRE_NOTHROW(detail::check_gathered_cuda(sv, sizeof rows, rows, sizeof rows, rows, 256, 256));
  REQUIRE_THROWS_WITH(detail::check_gathered_cuda(sv, 1000, rows, sizeof rows, rows, 256, 256),
                      Contains("gathered K / V rows hold 1000") && Contains("6144"));
}

TEST_CASE("device append inputs are validated on the host", "[cuda][facade]") {
  using L = kivi_layout<half, 64, 2>;
  std::vector<int32_t> lens = {0, 0}, other = {0, 0};
  const auto l = L::padded(2, 256, lens.data(), 2, {.group = 32, .residual = 32});
  kivi_host_storage store(l);
  REQUIRE_NOTHROW(detail::check_kivi_append(l, store.buffers(), lens.data()));
  REQUIRE_THROWS_WITH(detail::check_kivi_append(l, store.buffers(), other.data()),
                      Contains("seq_lens must be the (writable) array the layout reads"));
  auto b = store.buffers();
  b.k_params = b.k_params.subspan(0, 10);
  REQUIRE_THROWS_WITH(detail::check_kivi_append(l, b, lens.data()),
                      Contains("key parameter buffer (k_params) holds 10 bytes"));
  const float x = 0.f;
  REQUIRE_THROWS_WITH(detail::check_append_inputs(2, 2, 64, 256, &x, 100, &x),
                      Contains("new K / V hold 256 / 100 elements") && Contains("256"));
  using C = contiguous_layout<float, 64, nhd>;
  const auto c = C::padded(2, 8, lens.data(), 2);
  alignas(16) static std::byte buf[64];
  REQUIRE_THROWS_WITH(detail::check_append_layout(c, buf + 4, buf), Contains("16-byte aligned"));
  REQUIRE(detail::kivi_append_limit<half>() == 65504.f);
}

TEST_CASE("device attention plans fill a 132-SM device at the benchmark shapes",
          "[cuda][facade][launch]") {
  // bench/cuda/bench_attention.cu's shapes: 8 kv heads, 32 query heads, head_dim 128, the rows
  // of 10 % of 16k and 32k tokens, 25 % of 128k (+ KIVI's residual window), batch 1 and 8.
  for (const int seqs : {1, 8}) {
    for (const int rows : {1638, 1638 + 128, 3276, 32768, 32768 + 128}) {
      CAPTURE(seqs, rows);
      const auto p = plan_decode_attention({.shape = {.num_seqs = seqs, .num_kv_heads = 8,
                                            .num_q_heads = 32, .head_dim = 128}, .max_rows = rows,
                                            .num_sms = 132});
      CHECK(p.blocks() >= 132);
      CHECK(p.heads_per_block == 4);
      CHECK(p.head_blocks == 1);
      // Every row is covered: splits - 1 full splits and a last one that takes the rest.
      CHECK(static_cast<long long>(p.splits) * p.rows_per_split >= rows);
      CHECK(static_cast<long long>(p.splits - 1) * p.rows_per_split < rows);
      CHECK(p.rows_per_split >= 32);  // min_rows_per_split
      CHECK(p.workspace_bytes() ==
            (p.splits == 1 ? 0
                           : (static_cast<std::size_t>(seqs) * 32 * p.splits * 8 + 15) / 16 * 16 +
                                 static_cast<std::size_t>(seqs) * 32 * p.splits * 128 * 4));
    }
  }
  // 1638 rows of one sequence, 4 heads a block: 3 blocks per SM (the kernel's occupancy) make
  // 396 slots; 49 splits of 34 rows fill 392 of them in one wave.
  const auto p = plan_decode_attention({.shape = {.num_seqs = 1, .num_kv_heads = 8,
                                        .num_q_heads = 32, .head_dim = 128}, .max_rows = 1638,
                                        .num_sms = 132});
  CHECK(p.splits == 49);
  CHECK(p.rows_per_split == 34);
  CHECK(p.blocks() <= 3 * 132);
  // 8 heads a block (64 query heads over 8 kv heads): 2 blocks per SM.
  const auto p8 = plan_decode_attention({.shape = {.num_seqs = 1, .num_kv_heads = 8,
                                         .num_q_heads = 64, .head_dim = 128}, .max_rows = 32768,
                                         .num_sms = 132});
  CHECK(p8.heads_per_block == 8);
  CHECK(p8.blocks() <= 2 * 132);
  CHECK(p8.blocks() >= 132);
  // An explicit budget: KIVI rows (2 blocks per SM).
  CHECK(plan_decode_attention({.shape = {.num_seqs = 1, .num_kv_heads = 8, .num_q_heads = 32,
                               .head_dim = 128}, .max_rows = 32768, .num_sms = 132,
                               .blocks_per_sm = 2})
            .blocks() <= 2 * 132);
  // Enough pairs to fill the device alone: no split, no workspace.
  const auto big = plan_decode_attention({.shape = {.num_seqs = 80, .num_kv_heads = 8,
                                          .num_q_heads = 32, .head_dim = 128}, .max_rows = 4096,
                                          .num_sms = 132});
  CHECK(big.splits == 1);
  CHECK(big.workspace_bytes() == 0);
  // Groups: MHA, GQA 3 (SmolLM2), GQA 8, GQA 12 (two blocks of 8).
  CHECK(plan_decode_attention({.shape = {.num_seqs = 1, .num_kv_heads = 4, .num_q_heads = 4,
                               .head_dim = 64}, .max_rows = 100, .num_sms = 132})
            .heads_per_block == 1);
  const auto g3 = plan_decode_attention({.shape = {.num_seqs = 1, .num_kv_heads = 3,
                                         .num_q_heads = 9, .head_dim = 64}, .max_rows = 100,
                                         .num_sms = 132});
  CHECK((g3.heads_per_block == 4 && g3.head_blocks == 1));
  const auto g12 = plan_decode_attention({.shape = {.num_seqs = 1, .num_kv_heads = 1,
                                          .num_q_heads = 12, .head_dim = 64}, .max_rows = 100,
                                          .num_sms = 132});
  CHECK((g12.heads_per_block == 8 && g12.head_blocks == 2));
  // No rows: one split.
  CHECK(plan_decode_attention({.shape = {.num_seqs = 1, .num_kv_heads = 8, .num_q_heads = 32,
                               .head_dim = 128}, .max_rows = 0, .num_sms = 132})
            .splits == 1);
}

TEST_CASE("device attention plans and their workspaces are validated", "[cuda][facade]") {
  CHECK_THROWS_WITH(plan_decode_attention({.shape = {.num_seqs = 1, .num_kv_heads = 8,
                                           .num_q_heads = 12, .head_dim = 128}, .max_rows = 10,
                                           .num_sms = 132}),
                    Contains("num_q_heads = 12") && Contains("num_kv_heads = 8"));
  CHECK_THROWS_WITH(plan_decode_attention({.shape = {.num_seqs = 1, .num_kv_heads = 8,
                                           .num_q_heads = 32, .head_dim = 96 + 4}, .max_rows = 10,
                                           .num_sms = 132}),
                    Contains("head_dim = 100"));
  CHECK_THROWS_WITH(plan_decode_attention({.shape = {.num_seqs = 1, .num_kv_heads = 8,
                                           .num_q_heads = 32, .head_dim = 128}, .max_rows = -1,
                                           .num_sms = 132}),
                    Contains("max_rows must be >= 0, got -1"));
  CHECK_THROWS_WITH(plan_decode_attention({.shape = {.num_seqs = 1, .num_kv_heads = 8,
                                           .num_q_heads = 32, .head_dim = 128}, .max_rows = 10,
                                           .num_sms = 0}),
                    Contains("num_sms = 0"));
  const auto p = plan_decode_attention({.shape = {.num_seqs = 1, .num_kv_heads = 8,
                                        .num_q_heads = 32, .head_dim = 128}, .max_rows = 1638,
                                        .num_sms = 132});
  REQUIRE(p.workspace_bytes() > 0);
  alignas(16) static std::byte ws[16];
  // The plan against the call: another shape, a short, null or misaligned workspace.
  CHECK_THROWS_WITH(detail::check_decode_plan(p, 2, 8, 32, 128, p.workspace_bytes(), ws),
                    Contains("the plan is for [num_seqs 1") && Contains("the call is [2, 8, 32, 128]"));
  CHECK_THROWS_WITH(detail::check_decode_plan(p, 1, 8, 32, 128, p.workspace_bytes() - 1, ws),
                    Contains("the workspace holds " + std::to_string(p.workspace_bytes() - 1)));
  CHECK_THROWS_WITH(detail::check_decode_plan(p, 1, 8, 32, 128, p.workspace_bytes(), nullptr),
                    Contains("non-null and 16-byte aligned"));
  CHECK_THROWS_WITH(detail::check_decode_plan(p, 1, 8, 32, 128, p.workspace_bytes(), ws + 4),
                    Contains("16-byte aligned"));
  auto bad = p;
  bad.heads_per_block = 2;
  CHECK_THROWS_WITH(detail::check_decode_plan(bad, 1, 8, 32, 128, p.workspace_bytes(), ws),
                    Contains("plan.heads_per_block = 2"));
  bad = p;
  bad.splits = 0;
  CHECK_THROWS_WITH(detail::check_decode_plan(bad, 1, 8, 32, 128, p.workspace_bytes(), ws),
                    Contains("plan.splits = 0"));
  CHECK_NOTHROW(detail::check_decode_plan(p, 1, 8, 32, 128, p.workspace_bytes(), ws));
  // The zero-copy gather's default SM budget.
  CHECK(detail::zero_copy_default_blocks == 8);
}

TEST_CASE("device selection splits long rows over enough blocks for a 132-SM device",
          "[cuda][facade][launch]") {
  using detail::plan_select_split;
  const select_split_options h200{132, 2048};
  // bench_spec_select.cu: 32 rows (1 sequence x 32 heads) of 8k / 32k / 128k tokens.
  for (const int n : {8192, 32768, 131072}) {
    CAPTURE(n);
    const auto sp = plan_select_split(32, n, h200);
    CHECK(sp.chunks >= 2);
    CHECK(32LL * sp.chunks >= 128);  // a block per SM, near enough: 8k rows give 4 chunks
    CHECK(static_cast<long long>(sp.chunks) * sp.chunk_tokens >= n);
    CHECK(static_cast<long long>(sp.chunks - 1) * sp.chunk_tokens < n);
    CHECK(sp.chunk_tokens % detail::select_split_granule == 0);
  }
  CHECK(plan_select_split(32, 131072, h200).chunks == 16);
  CHECK(plan_select_split(32, 131072, h200).chunk_tokens == 8192);
  CHECK(plan_select_split(32, 32768, h200).chunks == 16);
  // Rows that fill the device, and rows too short to split: one block each.
  CHECK(plan_select_split(512, 131072, h200).chunks == 1);
  CHECK(plan_select_split(32, 2048, h200).chunks == 1);
  // Never more than 64 chunks, whatever the options.
  CHECK(plan_select_split(1, 1 << 20, {132, 64}).chunks <= 64);
  // The workspace holds the most chunks any device could ask for; none where no split is possible.
  CHECK(detail::select_split_workspace_bytes(32, 2048, {}) == 0);
  CHECK(detail::select_split_workspace_bytes(32, 131072, {}) >=
        32 * (2048 * 4 + detail::select_split_state_bytes + 64 * 12));
  CHECK(detail::topk_cuda_workspace_bytes({{.num_seqs = 1, .num_kv_heads = 32,
                                           .max_tokens = 131072}, 13107, 13107, {4, 64}}) ==
        detail::select_split_workspace_bytes(32, 131072, {}));
  CHECK_THROWS_WITH(plan_select_split(32, 131072, {0, 2048}), Contains("num_sms = 0"));
}

TEST_CASE("device speculation launches a block per SM at the benchmark shapes",
          "[cuda][facade][launch]") {
  // bench_spec_select.cu: one Llama-7B layer, 32 kv heads = 32 query heads, head_dim 128, r = 32,
  // post-RoPE skew (the GEMV computes whole query heads: rows = head_dim), one sequence.
  const infinigen_config cfg{{.num_seqs = 1, .num_kv_heads = 32, .num_q_heads = 32,
                                  .head_dim = 128, .d_model = 4096, .max_tokens = 131072,
                                  .scale = 0.088f}, 32, rope_mode::post_rope_skew,
                                  gqa_aggregation::max_logit};
  for (const int n : {8192, 32768, 131072}) {
    CAPTURE(n);
    const auto l = detail::spec_shapes(cfg, 128, 1, n);
    CHECK(l.gemv_blocks == 32 * 128 / detail::spec_gemv_warps);  // 512
    CHECK(detail::spec_launch_shapes::count(l.finish) == 32 * 32 / detail::spec_finish_outputs);
    CHECK(detail::spec_launch_shapes::count(l.finish) >= 132);
    CHECK(detail::spec_launch_shapes::count(l.score) >= 132);
    CHECK(l.score[0] * detail::spec_tokens_per_block >= n);
  }
  // The finish used to be one block per sequence; now the GEMV, the finish and the scoring all
  // fill a 132-SM device from 8k tokens on.
  CHECK(detail::spec_launch_shapes::count(detail::spec_shapes(cfg, 128, 1, 8192).score) == 256);
}
