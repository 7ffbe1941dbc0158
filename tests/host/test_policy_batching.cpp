// Continuous batching: every policy scores batch row b from the sequence score_context::seq_ids
// names, and refuses ids it does not hold.

#include <catch2/catch.hpp>

#include "policy_fixtures.hpp"

using namespace policy_test;  // NOLINT(google-build-using-namespace): the tests' own fixtures

namespace {

// Five held sequences, a batch of three rows naming sequences 3, 0 and 4 (out of order, with
// 1 and 2 idle). Every policy must score batch row b as it scores sequence seq_ids[b] in a batch
// of all five in order, bit for bit.
struct seq_id_fixture {
  static constexpr int S = 5, B = 3, H = 2, g = 3, Hq = H * g, cap = 48, d_model = 80;
  std::vector<int32_t> lens{40, 17, 33, 48, 9}, pos{700, 18, 3000, 49, 10};
  std::vector<int32_t> seq_ids{3, 0, 4};
  std::vector<int32_t> blens, bpos;
  std::vector<float> kpre, kpost, x, q, bx, bq;  // keys [S, cap, H, D]; x, q per sequence
  kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  seq_id_fixture() {
    std::mt19937 rng(404);
    std::normal_distribution<float> nd(0.f, 1.f);
    kpre.resize(static_cast<std::size_t>(S) * cap * H * D);
    for (auto& v : kpre) v = nd(rng);
    kpost = kpre;
    for (int s = 0; s < S; ++s)
      for (int t = 0; t < cap; ++t)
        for (int h = 0; h < H; ++h) kvscout::apply_rope(&kpost[key_at(s, t) + h * D], t, rope);
    x.resize(static_cast<std::size_t>(S) * d_model);
    q.resize(static_cast<std::size_t>(S) * Hq * D);
    for (auto& v : x) v = nd(rng);
    for (auto& v : q) v = nd(rng);
    for (int b = 0; b < B; ++b) {
      const int s = seq_ids[b];
      blens.push_back(lens[s]);
      bpos.push_back(pos[s]);
      bx.insert(bx.end(), x.begin() + s * d_model, x.begin() + (s + 1) * d_model);
      bq.insert(bq.end(), q.begin() + s * Hq * D, q.begin() + (s + 1) * Hq * D);
    }
  }
  std::size_t key_at(int s, int t) const { return (static_cast<std::size_t>(s) * cap + t) * H * D; }
  kvscout::score_context<kvscout::host_space> all() const {
    return {{x.data(), x.size()}, {q.data(), q.size()}, {pos.data(), pos.size()},
            {lens.data(), lens.size()}};
  }
  kvscout::score_context<kvscout::host_space> batch() const {
    return {{bx.data(), bx.size()}, {bq.data(), bq.size()}, {bpos.data(), bpos.size()},
            {blens.data(), blens.size()}, {seq_ids.data(), seq_ids.size()}};
  }
  // Scores the batch and all five sequences; requires row b == row seq_ids[b], bit for bit. The
  // batch is scored once more with row maxima asked for (score_buffer::row_max): the same
  // scores, and each row's largest non-NaN score.
  template <class P>
  void require_rows_of_seq_ids(P& p) const {
    std::vector<float> ref, got, got_max;
    const auto out_all = buffer_for(ref, S, H, cap);
    const auto out_batch = buffer_for(got, B, H, cap);
    p.score(1, all(), out_all);
    p.score(1, batch(), out_batch);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < blens[b]; ++t) {
          CAPTURE(b, h, t);
          REQUIRE(std::bit_cast<std::uint32_t>(out_batch.row(b, h)[t]) ==
                  std::bit_cast<std::uint32_t>(out_all.row(seq_ids[b], h)[t]));
        }
    require_row_max(p, 1, batch(), out_batch);
  }
};

}  // namespace

TEST_CASE("every policy scores batch row b from the sequence seq_ids[b] names", "[spec][seq_ids]") {
  const seq_id_fixture f;
  std::mt19937 rng(405);
  std::normal_distribution<float> nd(0.f, 1.f);
  SECTION("infinigen, every RoPE mode and aggregation") {
    std::vector<float> wq(static_cast<std::size_t>(f.Hq) * D * f.d_model), bq(f.Hq * D);
    for (auto& w : wq) w = nd(rng) / 8.f;
    for (auto& w : bq) w = 0.1f * nd(rng);
    std::vector<float> qs(static_cast<std::size_t>(200) * f.g * D);
    std::vector<float> ks(static_cast<std::size_t>(200) * D);
    for (auto& v : qs) v = nd(rng);
    for (auto& v : ks) v = nd(rng);
    for (auto mode : {kvscout::rope_mode::post_rope_skew, kvscout::rope_mode::rope_planes,
                      kvscout::rope_mode::pre_rope_folded})
      for (auto agg : {kvscout::gqa_aggregation::max_logit, kvscout::gqa_aggregation::mean_logit,
                       kvscout::gqa_aggregation::sum_prob}) {
        CAPTURE(kvscout::to_string(mode), static_cast<int>(agg));
        // Layer 0 dense, layer 1 speculated.
        const kvscout::infinigen_config pc{.shape = {.num_layers = 2, .num_seqs = f.S,
                                            .num_kv_heads = f.H, .num_q_heads = f.Hq, .head_dim = D,
                                            .d_model = f.d_model, .max_tokens = f.cap,
                                            .scale = 0.125f},
                                           .aggregation = agg};
        auto p = kvscout::infinigen_policy_host<>::layers(pc, {{}, calibrated_plans(qs, ks, f.H, f.g, 16, mode, f.rope)},
                                           {{}, {wq.data(), wq.size()}}, {{}, {bq.data(), bq.size()}});
        for (int s = 0; s < f.S; ++s)
          for (int t = 0; t < f.lens[s]; ++t)
            p.append(1, s, t, &f.kpre[f.key_at(s, t)], &f.kpost[f.key_at(s, t)]);
        f.require_rows_of_seq_ids(p);
      }
  }
  SECTION("quest") {
    kvscout::quest_policy_host<D> p({{.num_layers = 2, .num_seqs = f.S,
                                      .num_kv_heads = f.H, .num_q_heads = f.Hq, .max_tokens = f.cap,
                                      .scale = 0.125f}, 8});
    for (int s = 0; s < f.S; ++s)
      for (int t = 0; t < f.lens[s]; ++t) p.append(1, s, t, nullptr, &f.kpost[f.key_at(s, t)]);
    f.require_rows_of_seq_ids(p);
  }
  SECTION("oracle (seq_ids name the cache's sequences)") {
    // The cache holds the same keys, [S, H, cap, D] (HND).
    std::vector<float> k(static_cast<std::size_t>(f.S) * f.H * f.cap * D), v(k.size(), 1.f);
    const layout l = layout::padded(f.H, f.cap, f.lens.data(), f.S);
    for (int s = 0; s < f.S; ++s)
      for (int t = 0; t < f.cap; ++t)
        for (int h = 0; h < f.H; ++h)
          std::copy_n(&f.kpost[f.key_at(s, t) + h * D], D, &k[l.k_offset(s, t, h) / sizeof(float)]);
    const kvscout::kv_view<layout, kvscout::host_space> view{
        l, kvscout::as_bytes(kvscout::host_span<const float>(k.data(), k.size())),
        kvscout::as_bytes(kvscout::host_span<const float>(v.data(), v.size()))};
    kvscout::oracle_policy_host<layout> p({{.num_q_heads = f.Hq, .scale = 0.125f}}, {view, view});
    f.require_rows_of_seq_ids(p);
  }
  SECTION("h2o: observe adds to, and score reads, the sequence's mass") {
    kvscout::h2o_policy_host p({{.num_layers = 2, .num_seqs = f.S, .num_kv_heads = f.H,
                                 .max_tokens = f.cap}});
    // Two steps of the batch, each attending 3 rows per (row, head) plus the current token.
    token_rows rows;
    rows.seqs = f.B, rows.heads = f.H, rows.n = 3;
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    for (int step = 0; step < 2; ++step) {
      rows.tokens.clear();
      for (int b = 0; b < f.B; ++b)
        for (int h = 0; h < f.H; ++h)
          for (int i = 0; i < 3; ++i)
            rows.tokens.push_back((5 * b + 3 * h + 2 * i + step) % f.blens[b]);
      std::vector<float> probs(static_cast<std::size_t>(f.B) * f.H * 4);
      for (auto& v : probs) v = ud(rng);
      p.observe(1, f.batch(), rows, {probs.data(), probs.size()}, 4, false);
    }
    f.require_rows_of_seq_ids(p);
    // The idle sequences saw nothing; sequence 3 (row 0) did.
    std::vector<float> ref;
    const auto out_all = buffer_for(ref, f.S, f.H, f.cap);
    p.score(1, f.all(), out_all);
    for (int s : {1, 2})
      for (int h = 0; h < f.H; ++h)
        REQUIRE(std::all_of(out_all.row(s, h), out_all.row(s, h) + f.lens[s],
                            [](float m) { return m == 0.f; }));
    REQUIRE(std::any_of(out_all.row(3, 0), out_all.row(3, 0) + f.lens[3],
                        [](float m) { return m > 0.f; }));
  }
  SECTION("streaming keeps no state: the rows are the batch's own") {
    kvscout::streaming_policy_host p({{.num_kv_heads = f.H}, 2});
    f.require_rows_of_seq_ids(p);
  }
}

TEST_CASE("seq_ids of a large batch: a permutation passes, a repeat is named by its two rows",
          "[spec][seq_ids][errors]") {
  // Both ways of finding a repeat: the bitmap (a policy holding up to seq_id_bitmap_max
  // sequences, ids up to its last word's last bit) and pairs (more sequences than that).
  for (const int max_seqs : {kvscout::detail::seq_id_bitmap_max, 4097, 9000}) {
    CAPTURE(max_seqs);
    std::vector<int32_t> ids(static_cast<std::size_t>(std::min(max_seqs, 4096)));
    std::iota(ids.begin(), ids.end(), max_seqs - static_cast<int>(ids.size()));  // the top ids
    std::shuffle(ids.begin(), ids.end(), std::mt19937(20261203u));
    kvscout::score_context<kvscout::host_space> ctx{};
    ctx.seq_ids = {ids.data(), ids.size()};
    const int rows = static_cast<int>(ids.size());
    REQUIRE_NOTHROW(kvscout::detail::check_seq_ids(ctx, rows, max_seqs));
    const int32_t at17 = ids[17];
    ids[4000] = at17;  // rows 17 and 4000 now name one sequence
    REQUIRE_THROWS_WITH(kvscout::detail::check_seq_ids(ctx, rows, max_seqs),
                        Catch::Contains("seq_ids[17] and seq_ids[4000] are both " +
                                        std::to_string(at17)));
    REQUIRE_NOTHROW(kvscout::detail::check_seq_ids(ctx, 4000, max_seqs));  // 4000 rows: the repeat is past them
    ids[4000] = max_seqs;
    REQUIRE_THROWS_WITH(kvscout::detail::check_seq_ids(ctx, rows, max_seqs),
                        Catch::Contains("seq_ids[4000] = " + std::to_string(max_seqs) +
                                        " is outside [0, the policy's num_seqs = " +
                                        std::to_string(max_seqs) + ")"));
  }
}

TEST_CASE("policies refuse seq_ids they do not hold, repeated or too few",
          "[spec][seq_ids][errors]") {
  const seq_id_fixture f;
  std::vector<float> scores;
  // A call with `seq_ids` over f's batch must throw `what` and leave the scores as they were.
  const auto refuses = [&](auto& p, std::vector<int32_t> seq_ids, const std::string& what) {
    kvscout::score_context<kvscout::host_space> ctx = f.batch();
    ctx.seq_ids = {seq_ids.data(), seq_ids.size()};
    const auto out = poisoned(scores, f.B, f.H, f.cap);
    REQUIRE_THROWS_WITH(p.score(1, ctx, out), Catch::Contains(what));
    REQUIRE(untouched(scores));
  };
  const auto every_case = [&](auto& p, const std::string& holder) {
    refuses(p, {3, 0, 5}, "seq_ids[2] = 5 is outside [0, " + holder + " num_seqs = 5)");
    refuses(p, {3, -1, 4}, "seq_ids[1] = -1 is outside [0, " + holder + " num_seqs = 5)");
    refuses(p, {3, 0, 3}, "seq_ids[0] and seq_ids[2] are both 3");
    refuses(p, {3, 0}, "seq_ids holds 2 entries, expected num_seqs = 3 (or none)");
  };
  SECTION("infinigen") {
    std::vector<float> wq(static_cast<std::size_t>(f.Hq) * D * f.d_model, 0.01f);
    const kvscout::infinigen_config pc{{.num_layers = 2,
                                        .num_seqs = f.S,
                                        .num_kv_heads = f.H,
                                        .num_q_heads = f.Hq,
                                        .head_dim = D,
                                        .d_model = f.d_model,
                                        .max_tokens = f.cap,
                                        .scale = 0.125f}};
    auto p = kvscout::infinigen_policy_host<>::layers(pc, {{}, std::vector<kvscout::skew_plan>(f.H, identity_planes(16))},
                                       {{}, {wq.data(), wq.size()}}, {{}, {}});
    every_case(p, "the policy's");
  }
  SECTION("quest") {
    kvscout::quest_policy_host<D> p({{.num_layers = 2, .num_seqs = f.S,
                                      .num_kv_heads = f.H, .num_q_heads = f.Hq, .max_tokens = f.cap,
                                      .scale = 0.125f}, 8});
    every_case(p, "the policy's");
  }
  SECTION("h2o, and its observe") {
    kvscout::h2o_policy_host p({{.num_layers = 2, .num_seqs = f.S, .num_kv_heads = f.H,
                                 .max_tokens = f.cap}});
    every_case(p, "the policy's");
    token_rows rows;
    rows.seqs = f.B, rows.heads = f.H, rows.n = 1;
    rows.tokens.assign(static_cast<std::size_t>(f.B) * f.H, 2);
    std::vector<float> probs(static_cast<std::size_t>(f.B) * f.H * 2, 0.5f);
    std::vector<int32_t> dup{4, 1, 4};
    kvscout::score_context<kvscout::host_space> ctx = f.batch();
    ctx.seq_ids = {dup.data(), dup.size()};
    REQUIRE_THROWS_WITH(p.observe(1, ctx, rows, {probs.data(), probs.size()}, 2, true),
                        Catch::Contains("seq_ids[0] and seq_ids[2] are both 4"));
    const auto out = buffer_for(scores, f.S, f.H, f.cap);
    p.score(1, f.all(), out);  // nothing was added
    REQUIRE(std::all_of(scores.begin(), scores.end(),
                        [](float m) { return m == 0.f || std::isnan(m); }));
  }
  SECTION("oracle: the cache's sequences") {
    cache_fixture c(3, 12u);  // 2 sequences
    kvscout::oracle_policy_host<layout> p({{.num_q_heads = c.Hq, .scale = 0.125f}},
                                          {c.view(), c.view()});
    std::vector<int32_t> lens{8, 8}, seq_ids{1, 2};
    const kvscout::score_context<kvscout::host_space> ctx{{}, {c.q.data(), c.q.size()}, {}, {lens.data(), 2},
                                    {seq_ids.data(), 2}};
    const auto out = poisoned(scores, 2, c.H, c.cap);
    REQUIRE_THROWS_WITH(p.score(1, ctx, out),
                        Catch::Contains("seq_ids[1] = 2 is outside [0, the cache's num_seqs = 2)"));
    REQUIRE(untouched(scores));
  }
  SECTION("streaming: repeated or too few (it holds no sequences to bound them)") {
    kvscout::streaming_policy_host p({{.num_kv_heads = f.H}, 2});
    refuses(p, {3, 0, 3}, "seq_ids[0] and seq_ids[2] are both 3");
    refuses(p, {3, 0}, "seq_ids holds 2 entries, expected num_seqs = 3 (or none)");
  }
}
