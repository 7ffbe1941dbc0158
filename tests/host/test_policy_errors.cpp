// Speculation policies on bad input: every policy throws before it writes a score (or adds to
// its state), naming the bad value and what was expected.

#include <catch2/catch.hpp>

#include "policy_fixtures.hpp"

using namespace policy_test;  // NOLINT(google-build-using-namespace): the tests' own fixtures

TEST_CASE("quest rejects sequences its page bounds do not hold", "[spec][quest][errors]") {
  // 2 sequences of at most 64 tokens; a third sequence or a longer one would read past them.
  kvscout::quest_policy_host<D> quest({{.num_layers = 1, .num_seqs = 2, .num_kv_heads = 1,
                                        .num_q_heads = 1, .max_tokens = 64, .scale = 0.125f}, 8});
  std::vector<float> key(D, 1.f), q(static_cast<std::size_t>(3) * D, 1.f), scores;
  for (int s = 0; s < 2; ++s)
    for (int t = 0; t < 64; ++t) quest.append(0, s, t, nullptr, key.data());
  SECTION("more sequences than the policy's num_seqs") {
    std::vector<int32_t> lens{8, 8, 8};
    const auto out = poisoned(scores, 3, 1, 64);
    REQUIRE_THROWS_WITH(quest.score(0, {{}, {q.data(), q.size()}, {}, {lens.data(), 3}}, out),
                        Catch::Contains("score buffer num_seqs = 3 exceeds the policy's "
                                        "num_seqs = 2"));
    REQUIRE(untouched(scores));
  }
  SECTION("a sequence longer than max_tokens, after a valid one") {
    std::vector<int32_t> lens{8, 70};
    const auto out = poisoned(scores, 2, 1, 80);
    REQUIRE_THROWS_WITH(quest.score(0, {{}, {q.data(), q.size()}, {}, {lens.data(), 2}}, out),
                        Catch::Contains("seq_lens[1] = 70 exceeds the policy's max_tokens = 64"));
    REQUIRE(untouched(scores));
  }
  SECTION("a query too short for the buffer's sequences") {
    std::vector<int32_t> lens{8, 8};
    const auto out = poisoned(scores, 2, 1, 64);
    REQUIRE_THROWS_WITH(quest.score(0, {{}, {q.data(), D}, {}, {lens.data(), 2}}, out),
                        Catch::Contains("q holds 64 floats, expected [2, 1, 64]"));
    REQUIRE(untouched(scores));
  }
}

TEST_CASE("h2o score rejects sequences its mass does not hold", "[spec][h2o][errors]") {
  kvscout::h2o_policy_host p({{.num_layers = 1, .num_seqs = 1, .num_kv_heads = 1,
                               .max_tokens = 16}});
  std::vector<float> scores;
  SECTION("more sequences than the policy's num_seqs") {
    std::vector<int32_t> lens{4, 4};
    const auto out = poisoned(scores, 2, 1, 16);
    REQUIRE_THROWS_WITH(p.score(0, {{}, {}, {}, {lens.data(), 2}}, out),
                        Catch::Contains("score buffer num_seqs = 2 exceeds the policy's "
                                        "num_seqs = 1"));
    REQUIRE(untouched(scores));
  }
  SECTION("a sequence longer than max_tokens (the stride allows it)") {
    std::vector<int32_t> lens{20};
    const auto out = poisoned(scores, 1, 1, 32);
    REQUIRE_THROWS_WITH(p.score(0, {{}, {}, {}, {lens.data(), 1}}, out),
                        Catch::Contains("seq_lens[0] = 20 exceeds the policy's max_tokens = 16"));
    REQUIRE(untouched(scores));
  }
  SECTION("a sequence to reset that the policy does not hold") {
    REQUIRE_THROWS_WITH(p.reset(1), Catch::Contains("sequence 1 is out of range [0, 1)"));
    REQUIRE_THROWS_WITH(p.reset(-1), Catch::Contains("sequence -1 is out of range [0, 1)"));
  }
}

TEST_CASE("h2o observe rejects rows and probabilities past its mass", "[spec][h2o][errors]") {
  // Each bad call comes after a good row (token 1), so a check made while adding would already
  // have changed the mass; the scores afterwards show it unchanged.
  kvscout::h2o_policy_host p({{.num_layers = 1, .num_seqs = 1, .num_kv_heads = 1,
                               .max_tokens = 16}});
  std::vector<int32_t> lens{5};
  std::vector<float> probs{0.5f, 0.25f, 0.25f, 0.f, 0.f};
  const kvscout::score_context<kvscout::host_space> ctx{{}, {}, {}, {lens.data(), lens.size()}};
  const kvscout::host_span<const float> pr{probs.data(), probs.size()};
  token_rows rows{{1, 3}, 1, 1, 2};
  p.observe(0, ctx, rows, pr, 5, true);  // token 1: 0.5, token 3: 0.25, current (5): 0.25
  std::vector<float> before, after;
  p.score(0, ctx, buffer_for(before, 1, 1, 16));
  REQUIRE(before[1] == 0.5f);

  SECTION("a token at max_tokens") {
    rows.tokens = {1, 16};
    REQUIRE_THROWS_WITH(p.observe(0, ctx, rows, pr, 5, true),
                        Catch::Contains("row 1 of (s, h) = (0, 0) is token 16, out of range "
                                        "[0, max_tokens = 16)"));
  }
  SECTION("a negative token") {
    rows.tokens = {1, -1};
    REQUIRE_THROWS_WITH(p.observe(0, ctx, rows, pr, 5, true),
                        Catch::Contains("row 1 of (s, h) = (0, 0) is token -1, out of range "
                                        "[0, max_tokens = 16)"));
  }
  SECTION("more sequences than the policy's num_seqs") {
    rows = {{1, 3, 1, 3}, 2, 1, 2};
    std::vector<int32_t> lens2{5, 5};
    std::vector<float> probs2(10, 0.1f);
    const kvscout::score_context<kvscout::host_space> ctx2{{}, {}, {}, {lens2.data(), 2}};
    REQUIRE_THROWS_WITH(p.observe(0, ctx2, rows, {probs2.data(), 10}, 5, true),
                        Catch::Contains("rows hold 2 sequences, expected "
                                        "[0, the policy's num_seqs = 1]"));
  }
  SECTION("other kv heads than the policy's") {
    rows = {{1, 3, 1, 3}, 1, 2, 2};
    std::vector<float> probs2(10, 0.1f);
    REQUIRE_THROWS_WITH(p.observe(0, ctx, rows, {probs2.data(), 10}, 5, true),
                        Catch::Contains("rows have 2 kv heads, the policy 1"));
  }
  SECTION("probs shorter than [num_seqs, num_kv_heads, stride]") {
    REQUIRE_THROWS_WITH(p.observe(0, ctx, rows, {probs.data(), 4}, 5, true),
                        Catch::Contains("probs holds 4 floats, expected [1, 1, 5] = 5"));
  }
  SECTION("a stride too short for the rows and the current token") {
    REQUIRE_THROWS_WITH(p.observe(0, ctx, rows, pr, 2, true),
                        Catch::Contains("(s, h) = (0, 0) has 2 rows and the current token, "
                                        "expected at most stride = 2 probabilities"));
    REQUIRE_THROWS_WITH(p.observe(0, ctx, rows, pr, -1, false),
                        Catch::Contains("stride must be non-negative, got -1"));
  }
  SECTION("no seq_lens for the current token's position") {
    REQUIRE_THROWS_WITH(p.observe(0, kvscout::score_context<kvscout::host_space>{}, rows, pr, 5, true),
                        Catch::Contains("seq_lens holds 0 entries, expected num_seqs = 1"));
    std::vector<int32_t> neg{-1};
    REQUIRE_THROWS_WITH(p.observe(0, {{}, {}, {}, {neg.data(), 1}}, rows, pr, 5, true),
                        Catch::Contains("seq_lens[0] = -1 is negative "
                                        "(the current token's position)"));
  }
  SECTION("a layer out of range") {
    REQUIRE_THROWS_WITH(p.observe(1, ctx, rows, pr, 5, true),
                        Catch::Contains("layer 1 is out of range [0, 1)"));
  }
  p.score(0, ctx, buffer_for(after, 1, 1, 16));
  for (int t = 0; t < 5; ++t) REQUIRE(after[t] == before[t]);
}

TEST_CASE("oracle rejects sequences its cache does not hold", "[spec][oracle][errors]") {
  cache_fixture f(1, 9u);  // 2 sequences of 80 and 33 tokens
  kvscout::oracle_policy_host<layout> oracle({{.num_q_heads = f.Hq, .scale = 0.125f}}, {f.view()});
  std::vector<float> q(static_cast<std::size_t>(3) * f.Hq * D, 1.f), scores;
  SECTION("more sequences than the cache's") {
    std::vector<int32_t> lens{8, 8, 8};
    const auto out = poisoned(scores, 3, f.H, f.cap);
    REQUIRE_THROWS_WITH(oracle.score(0, {{}, {q.data(), q.size()}, {}, {lens.data(), 3}}, out),
                        Catch::Contains("score buffer num_seqs = 3 exceeds the cache's "
                                        "num_seqs = 2"));
    REQUIRE(untouched(scores));
  }
  SECTION("a sequence longer than the cache's, after a valid one") {
    std::vector<int32_t> lens{80, 40};
    const auto out = poisoned(scores, 2, f.H, f.cap);
    REQUIRE_THROWS_WITH(oracle.score(0, {{}, {q.data(), q.size()}, {}, {lens.data(), 2}}, out),
                        Catch::Contains("seq_lens[1] = 40 exceeds the cache's length 33"));
    REQUIRE(untouched(scores));
  }
}

TEST_CASE("streaming rejects a malformed score buffer", "[spec][streaming][errors]") {
  kvscout::streaming_policy_host p({{.num_kv_heads = 2}, 4});
  std::vector<float> scores;
  SECTION("a sequence longer than the stride, after a valid one") {
    std::vector<int32_t> lens2{10, 13};
    const auto out = poisoned(scores, 2, 2, 12);
    REQUIRE_THROWS_WITH(p.score(0, {{}, {}, {}, {lens2.data(), 2}}, out),
                        Catch::Contains("seq_lens[1] = 13 is outside [0, stride = 12]"));
    REQUIRE(untouched(scores));
  }
  // One sequence of 3 tokens into a buffer of the given shape over `floats` poisoned floats.
  std::vector<int32_t> lens{3};
  const auto score_into = [&](std::size_t floats, int S, int H, int stride) {
    p.score(0, {{}, {}, {}, {lens.data(), 1}}, {{scores.data(), floats}, S, H, stride});
  };
  SECTION("negative sizes") {
    poisoned(scores, 1, 2, 12);
    REQUIRE_THROWS_WITH(score_into(scores.size(), -1, 2, 12),
                        Catch::Contains("score buffer num_seqs = -1 and stride = 12 must be "
                                        "non-negative"));
    REQUIRE_THROWS_WITH(score_into(scores.size(), 1, 2, -4),
                        Catch::Contains("score buffer num_seqs = 1 and stride = -4 must be "
                                        "non-negative"));
    REQUIRE(untouched(scores));
  }
  SECTION("other kv heads, or a buffer too small") {
    poisoned(scores, 1, 2, 12);
    REQUIRE_THROWS_WITH(score_into(scores.size(), 1, 3, 8),
                        Catch::Contains("score buffer has 3 kv heads, the policy 2"));
    REQUIRE_THROWS_WITH(score_into(23, 1, 2, 12),
                        Catch::Contains("score buffer holds 23 floats, expected [1, 2, 12]"));
    // Row maxima, where asked for, for every row: nothing is written otherwise.
    std::vector<float> top(1, 7.f);
    const kvscout::score_buffer<kvscout::host_space> short_max{{scores.data(), scores.size()}, 1, 2, 12,
                                          {top.data(), top.size()}};
    REQUIRE_THROWS_WITH(p.score(0, {{}, {}, {}, {lens.data(), 1}}, short_max),
                        Catch::Contains("score buffer row_max holds 1 floats, expected none or "
                                        "[1, 2]"));
    REQUIRE(top[0] == 7.f);
    const kvscout::score_buffer<kvscout::host_space> null_max{{scores.data(), scores.size()}, 1, 2, 12, {nullptr, 2}};
    REQUIRE_THROWS_WITH(p.score(0, {{}, {}, {}, {lens.data(), 1}}, null_max),
                        Catch::Contains("score buffer row_max is null"));
    REQUIRE(untouched(scores));
    REQUIRE(untouched(scores));
  }
}

TEST_CASE("infinigen_policy_host keeps its state and scratch in the caller's workspace and checks it",
          "[spec][infinigen][errors][workspace]") {
  // One layer, one sequence, GQA 2 (mean_logit: the group's mean query, qm_), r = 16.
  const int d_model = 64, r = 16, n = 40, max_tokens = 64;
  using P = kvscout::infinigen_policy_host<>;
  const kvscout::infinigen_config pc{.shape = {.num_seqs = 1, .num_kv_heads = 1, .num_q_heads = 2,
                                      .head_dim = D, .d_model = d_model,
                                      .max_tokens = max_tokens, .scale = 0.125f},
                                     .r = r, .mode = kvscout::rope_mode::rope_planes,
                                     .aggregation = kvscout::gqa_aggregation::mean_logit};
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> wq(static_cast<std::size_t>(2) * D * d_model), x(d_model), k(D);
  for (auto& v : wq) v = nd(rng);
  for (auto& v : x) v = nd(rng);
  const std::vector<kvscout::skew_plan> plans{identity_planes(r)};
  const kvscout::host_span<const float> w{wq.data(), wq.size()}, b{};
  // Sized by the config alone, each piece at 64 bytes: the scratch (8 (query_block) RoPE tables,
  // the partial queries of 8 sequences of num_q_heads heads at r = head_dim, one key, one mean
  // query, one widened key), the partial key cache (r channels), and per query head its r W_Q
  // rows, their bias and r / 2 planes.
  const auto al = [](std::size_t bytes) { return (bytes + 63) / 64 * 64; };
  const std::size_t need = P::workspace_bytes(pc);
  const std::size_t keys = al(P::key_store::memory_bytes(1, 1, r, max_tokens));
  REQUIRE(need == al(8 * sizeof(kvscout::rope_table) + sizeof(float) * (8 * 2 * D + 3 * D)) +
                      keys +
                      2 * (al(sizeof(float) * r * d_model) + al(sizeof(float) * r) +
                           al(sizeof(int) * (r / 2))));
  REQUIRE(P::workspace_alignment == 64);
  SECTION("make_workspace sizes it; the partial keys live in it") {
    auto ws = kvscout::make_workspace<P>(pc);
    REQUIRE(ws.size() == need);
    const P p(pc, plans, w, b, ws.span());
    const auto* first = reinterpret_cast<const std::byte*>(p.keys().tile(0, 0, 0));
    REQUIRE(first >= ws.data());
    REQUIRE(first < ws.data() + need);
  }
  SECTION("too small, misaligned, null: refused, naming the value and what was expected") {
    kvscout::host_workspace ws(need + 64, 64);
    REQUIRE_THROWS_WITH(P(pc, plans, w, b, {ws.data(), need - 1}),
                        Catch::Contains("workspace holds " + std::to_string(need - 1) +
                                        " bytes, expected at least workspace_bytes(config) = " +
                                        std::to_string(need)));
    REQUIRE_THROWS_WITH(P(pc, plans, w, b, {ws.data() + 4, need}),
                        Catch::Contains("workspace must be 64-byte aligned, got address"));
    REQUIRE_THROWS_WITH(P(pc, plans, w, b, {static_cast<std::byte*>(nullptr), need}),
                        Catch::Contains("workspace is null"));
    // A larger one serves.
    REQUIRE_NOTHROW(P(pc, plans, w, b, {ws.data(), need + 64}));
  }
  SECTION("a bad config is refused by the size query too") {
    kvscout::infinigen_config bad = pc;
    bad.shape.num_kv_heads = 2;
    bad.shape.num_q_heads = 3;
    REQUIRE_THROWS_WITH(P::workspace_bytes(bad),
                        Catch::Contains("num_q_heads = 3 must be a positive multiple of "
                                        "num_kv_heads = 2"));
    bad = pc;
    bad.r = 0;
    REQUIRE_THROWS_WITH(P::workspace_bytes(bad), Catch::Contains("r = 0 must be in [1, head_dim = "));
    bad = pc;
    bad.correction_r = 9;
    REQUIRE_THROWS_WITH(P::workspace_bytes(bad),
                        Catch::Contains("correction_r = 9 must be 0 (r) or in [r = 16, head_dim = "));
  }
  SECTION("the scores do not depend on what the workspace held before") {
    kvscout::host_workspace zeros(need, P::workspace_alignment), ones(need, P::workspace_alignment);
    std::fill_n(zeros.data(), need, std::byte{0});
    std::fill_n(ones.data(), need, std::byte{0xff});  // NaN floats
    P a(pc, plans, w, b, zeros.span()), c(pc, plans, w, b, ones.span());
    for (int t = 0; t < n; ++t) {
      for (auto& v : k) v = nd(rng);
      const int32_t s0 = 0, tt = t;
      a.append(kvscout::host_span<const float>(k), {&s0, 1}, {&tt, 1}, 1);
      c.append(kvscout::host_span<const float>(k), {&s0, 1}, {&tt, 1}, 1);
    }
    std::vector<int32_t> lens{n}, pos{n};
    const kvscout::score_context<kvscout::host_space> ctx{{x.data(), x.size()}, {}, {pos.data(), 1}, {lens.data(), 1}};
    std::vector<float> sa, sc;
    const auto oa = buffer_for(sa, 1, 1, 64), oc = buffer_for(sc, 1, 1, 64);
    a.score(ctx, oa);
    c.score(ctx, oc);
    for (int t = 0; t < n; ++t) {
      CAPTURE(t);
      REQUIRE(std::isfinite(oa.row(0, 0)[t]));
      REQUIRE(std::bit_cast<std::uint32_t>(oa.row(0, 0)[t]) ==
              std::bit_cast<std::uint32_t>(oc.row(0, 0)[t]));
    }
  }
}

TEST_CASE("infinigen rejects layers and sequences it does not hold", "[spec][infinigen][errors]") {
  // Layer 0 is dense (no plans, not tracked), layer 1 speculated; 1 sequence of at most 32 tokens.
  const int d_model = 64, r = 16;
  std::vector<float> wq(static_cast<std::size_t>(D) * d_model, 0.01f), x(2 * d_model, 1.f);
  const kvscout::infinigen_config pc{{.num_layers = 2, .num_seqs = 1, .num_kv_heads = 1,
                                      .num_q_heads = 1, .head_dim = D, .d_model = d_model,
                                      .max_tokens = 32, .scale = 0.125f}};
  auto p = kvscout::infinigen_policy_host<>::layers(pc, {{}, {identity_planes(r)}}, {{}, {wq.data(), wq.size()}},
                                     {{}, {}});
  std::vector<float> k(D, 1.f), scores;
  for (int t = 0; t < 8; ++t) p.append(1, 0, t, k.data(), k.data());
  SECTION("append: an untracked layer keeps nothing, a layer out of range throws") {
    p.append(0, 0, 0, k.data(), k.data());
    REQUIRE(!p.tracks(0));
    REQUIRE(p.tracks(1));
    REQUIRE_THROWS_WITH(p.append(2, 0, 0, k.data(), k.data()),
                        Catch::Contains("layer 2 is out of range [0, 2)"));
    REQUIRE_THROWS_WITH(p.append(-1, 0, 0, k.data(), k.data()),
                        Catch::Contains("layer -1 is out of range [0, 2)"));
    REQUIRE_THROWS_WITH(p[2].keys(), Catch::Contains("layer 2 is out of range [0, 2)"));
    REQUIRE_THROWS_WITH(p.append(1, 1, 0, k.data(), k.data()),
                        Catch::Contains("entry 0 (sequence 1, token 0) is outside [0, num_seqs = "
                                        "1) x [0, max_tokens = 32)"));
    REQUIRE_THROWS_WITH(p.append(1, 0, 32, k.data(), k.data()),
                        Catch::Contains("entry 0 (sequence 0, token 32) is outside [0, num_seqs "
                                        "= 1) x [0, max_tokens = 32)"));
    REQUIRE_THROWS_WITH(p.score(0, {}, {}), Catch::Contains("layer 0 has no policy (not speculated"));
    // RoPE planes read the post-RoPE key: a null one is refused (the pre-RoPE one is not read).
    REQUIRE_THROWS_WITH(p.append(1, 0, 9, k.data(), nullptr),
                        Catch::Contains("k_post is null (layer 1, token 9)"));
    REQUIRE_NOTHROW(p.append(1, 0, 9, nullptr, k.data()));
  }
  SECTION("score: more sequences than the policy's num_seqs") {
    std::vector<int32_t> lens{8, 8}, pos{8, 8};
    const auto out = poisoned(scores, 2, 1, 32);
    const kvscout::score_context<kvscout::host_space> ctx{{x.data(), x.size()}, {}, {pos.data(), 2}, {lens.data(), 2}};
    REQUIRE_THROWS_WITH(p.score(1, ctx, out),
                        Catch::Contains("score buffer num_seqs = 2 exceeds the policy's "
                                        "num_seqs = 1"));
    REQUIRE(untouched(scores));
  }
  SECTION("score: a sequence longer than max_tokens (the stride allows it)") {
    std::vector<int32_t> lens{40}, pos{40};
    const auto out = poisoned(scores, 1, 1, 64);
    const kvscout::score_context<kvscout::host_space> ctx{{x.data(), x.size()}, {}, {pos.data(), 1}, {lens.data(), 1}};
    REQUIRE_THROWS_WITH(p.score(1, ctx, out),
                        Catch::Contains("seq_lens[0] = 40 exceeds the policy's max_tokens = 32"));
    REQUIRE(untouched(scores));
  }
  SECTION("a head_dim past the RoPE tables' 512 is refused at construction") {
    const int big = 1024, dm = 4;
    const kvscout::rope_config rope{big, 10000.f, kvscout::rope_style::split_half};
    const std::vector<float> w(static_cast<std::size_t>(big) * dm, 0.5f);
    const std::vector<std::vector<kvscout::skew_plan>> plans{
        {kvscout::rope_planes_plan(rope, {0, 300})}};
    const kvscout::infinigen_config big_cfg{.shape = {.num_layers = 1, .num_seqs = 1,
                                             .num_kv_heads = 1, .num_q_heads = 1, .head_dim = big,
                                             .d_model = dm, .max_tokens = 8, .scale = 0.125f},
                                            .aggregation = kvscout::gqa_aggregation::max_logit};
    REQUIRE_THROWS_WITH(
        kvscout::infinigen_policy_host<>::layers(big_cfg, plans, {{w.data(), w.size()}}, {{}}),
        Catch::Contains("layer 0: head_dim 1024 exceeds the RoPE modes' limit 512"));
  }
}

// Partial keys are computed values: fp8 (a scaled storage type) is refused for them.
template <class T>
concept partial_key_type = requires { typename kvscout::partial_key_cache<T>; };
static_assert(partial_key_type<kvscout::half> && !partial_key_type<kvscout::fp8_e4m3>);
template <class T>
concept infinigen_partial_key_type = requires { typename kvscout::infinigen_policy_host<T>; };
static_assert(infinigen_partial_key_type<float> &&
              !infinigen_partial_key_type<kvscout::fp8_e5m2>);

// An fp8 cache stores K / k_scale: the oracle multiplies its layer's k_scale back, so it ranks and
// weighs (sum_prob: a softmax, not scale-free) by the logits attention computes. Against the
// oracle over a float cache of the dequantised keys; without the scale it would be far off.
TEST_CASE("the oracle over an fp8 cache takes each layer's k_scale", "[spec][oracle][fp8]") {
  constexpr int D = 64, H = 2, Hq = 6, n = 50;
  using F = kvscout::fp8_e4m3;
  using L8 = kvscout::contiguous_layout<F, D, kvscout::hnd>;
  using L32 = kvscout::contiguous_layout<float, D, kvscout::hnd>;
  std::vector<int32_t> lens = {n};
  const L8 l8 = L8::padded(H, n, lens.data(), 1);
  const L32 l32 = L32::padded(H, n, lens.data(), 1);
  const std::vector<float> k_scales = {0.9f, 0.013f};  // layer 1's keys stored about 77x larger
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<std::vector<F>> k8(2);
  std::vector<std::vector<float>> k32(2);
  for (int layer = 0; layer < 2; ++layer) {
    k8[layer].resize(l8.required_bytes());
    k32[layer].resize(k8[layer].size());
    for (std::size_t i = 0; i < k8[layer].size(); ++i) {
      k8[layer][i] = kvscout::from_float<F>(nd(rng) / k_scales[layer]);
      k32[layer][i] = kvscout::to_float(k8[layer][i]) * k_scales[layer];
    }
  }
  auto bytes = [](const auto& v) {
    return kvscout::host_span<const std::byte>(reinterpret_cast<const std::byte*>(v.data()),
                                               v.size() * sizeof(v[0]));
  };
  std::vector<kvscout::kv_view<L8, kvscout::host_space>> v8;
  std::vector<kvscout::kv_view<L32, kvscout::host_space>> v32;
  for (int layer = 0; layer < 2; ++layer) {
    v8.push_back({l8, bytes(k8[layer]), bytes(k8[layer])});
    v32.push_back({l32, bytes(k32[layer]), bytes(k32[layer])});
  }
  const typename kvscout::oracle_policy_host<L8>::config cfg{{.num_q_heads = Hq, .scale = 0.125f},
                                                             kvscout::gqa_aggregation::sum_prob};
  kvscout::oracle_policy_host<L8> scaled(cfg, v8, k_scales), unscaled(cfg, v8);
  kvscout::oracle_policy_host<L32> reference({{.num_q_heads = Hq, .scale = 0.125f},
                                              kvscout::gqa_aggregation::sum_prob}, v32);
  std::vector<float> q(static_cast<std::size_t>(Hq) * D);
  for (auto& x : q) x = nd(rng);
  const kvscout::score_context<kvscout::host_space> ctx{{}, {q.data(), q.size()}, {}, {lens.data(), 1}};
  for (int layer = 0; layer < 2; ++layer) {
    std::vector<float> a(H * n), b(H * n), c(H * n);
    scaled.score(layer, ctx, {{a.data(), a.size()}, 1, H, n});
    reference.score(layer, ctx, {{b.data(), b.size()}, 1, H, n});
    unscaled.score(layer, ctx, {{c.data(), c.size()}, 1, H, n});
    double worst = 0, moved = 0;
    for (int i = 0; i < H * n; ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
      moved = std::max(moved, static_cast<double>(std::abs(c[i] - b[i])));
    }
    CAPTURE(layer, worst, moved);
    REQUIRE(worst <= 1e-5);
    if (layer == 1) REQUIRE(moved > 0.1);
  }
  REQUIRE_THROWS_WITH(kvscout::oracle_policy_host<L8>(cfg, v8, {1.f}),
                      Catch::Contains("1 k_scales for 2 layers"));
  REQUIRE_THROWS_WITH(kvscout::oracle_policy_host<L8>(cfg, v8, {1.f, 0.f}),
                      Catch::Contains("k_scales[1] = 0 must be positive and finite"));
}
