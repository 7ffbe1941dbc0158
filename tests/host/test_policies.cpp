// Speculation policies on constructed inputs: each scores what its definition says, and the
// scores select what they should (upper bounds hold, sinks and windows, heavy hitters).

#include <catch2/catch.hpp>

#include "policy_fixtures.hpp"

using namespace policy_test;  // NOLINT(google-build-using-namespace): the tests' own fixtures

TEST_CASE("oracle scores are the true logits aggregated over the group", "[spec][oracle]") {
  for (int g : {1, 3, 8}) {
    cache_fixture f(g, 40u + g);
    const float scale = 0.125f;
    for (auto agg : {kvscout::gqa_aggregation::max_logit, kvscout::gqa_aggregation::mean_logit,
                     kvscout::gqa_aggregation::sum_prob}) {
      CAPTURE(g, static_cast<int>(agg));
      kvscout::oracle_policy_host<layout> oracle({{.num_q_heads = f.Hq, .scale = scale}, agg},
                                                 {f.view()});
      std::vector<float> scores;
      const auto out = buffer_for(scores, f.S, f.H, f.cap);
      const kvscout::score_context<kvscout::host_space> ctx{{}, {f.q.data(), f.q.size()}, {}, {f.lens.data(), f.lens.size()}};
      oracle.score(0, ctx, out);
      for (int s = 0; s < f.S; ++s)
        for (int h = 0; h < f.H; ++h) {
          const int n = f.lens[s];
          std::vector<double> want(n, 0.0);
          for (int j = 0; j < g; ++j) {
            std::vector<double> z(n);
            double m = -INFINITY, sum = 0;
            for (int t = 0; t < n; ++t) m = std::max(m, z[t] = f.logit(s, h * g + j, t, scale));
            for (int t = 0; t < n; ++t) sum += std::exp(z[t] - m);
            for (int t = 0; t < n; ++t) {
              if (agg == kvscout::gqa_aggregation::max_logit) want[t] = j == 0 ? z[t] : std::max(want[t], z[t]);
              else if (agg == kvscout::gqa_aggregation::mean_logit) want[t] += z[t] / g;
              else want[t] += std::exp(z[t] - m) / sum;
            }
          }
          for (int t = 0; t < n; ++t) REQUIRE(out.row(s, h)[t] == Approx(want[t]).margin(1e-5).epsilon(1e-4));
          if (n < f.cap) REQUIRE(std::isnan(out.row(s, h)[n]));  // nothing written past seq_len
        }
    }
  }
}

TEST_CASE("streaming scores keep the sinks and the most recent tokens on top", "[spec][streaming]") {
  kvscout::streaming_policy_host p({{.num_kv_heads = 2}, 4});
  std::vector<int32_t> lens{10, 3};
  std::vector<float> scores;
  const auto out = buffer_for(scores, 2, 2, 12);
  p.score(0, {{}, {}, {}, {lens.data(), lens.size()}}, out);
  for (int h = 0; h < 2; ++h) {
    for (int t = 0; t < 4; ++t) REQUIRE(std::isinf(out.row(0, h)[t]));
    for (int t = 4; t < 10; ++t) REQUIRE(out.row(0, h)[t] == static_cast<float>(t));
    for (int t = 0; t < 3; ++t) REQUIRE(std::isinf(out.row(1, h)[t]));
  }
  // The call of the CUDA twin (no layer): the same scores.
  std::vector<float> again;
  const auto out2 = buffer_for(again, 2, 2, 12);
  p.score({{}, {}, {}, {lens.data(), lens.size()}}, out2);
  for (int s = 0; s < 2; ++s)
    for (int h = 0; h < 2; ++h)
      for (int t = 0; t < lens[static_cast<std::size_t>(s)]; ++t)
        REQUIRE(out2.row(s, h)[t] == out.row(s, h)[t]);
}

TEST_CASE("h2o scores are the accumulated attention mass", "[spec][h2o]") {
  kvscout::h2o_policy_host p({{.num_layers = 2, .num_seqs = 1, .num_kv_heads = 1,
                               .max_tokens = 16}});
  std::vector<int32_t> lens{5};
  // Step 1 attended tokens {1, 3} and the current token (position 5); step 2 tokens {0, 1}.
  std::vector<int32_t> idx{1, 3, 0, 0}, counts{2};
  std::vector<float> rows_k(4 * D, 1.f), rows_v(4 * D, 1.f);
  const kvscout::selection_view<kvscout::host_space> sel{{idx.data(), idx.size()}, {counts.data(), counts.size()}, 1, 1, 4};
  const kvscout::gathered_rows_host<float, D> rows(sel, {rows_k.data(), rows_k.size()}, {rows_v.data(), rows_v.size()});
  std::vector<float> probs{0.5f, 0.25f, 0.25f, 0.f, 0.f};
  const kvscout::score_context<kvscout::host_space> ctx{{}, {}, {}, {lens.data(), lens.size()}};
  p.observe(1, ctx, rows, {probs.data(), probs.size()}, 5, true);
  idx = {0, 1, 0, 0};
  probs = {0.125f, 0.375f, 0.5f, 0.f, 0.f};
  lens[0] = 6;
  p.observe(1, ctx, rows, {probs.data(), probs.size()}, 5, true);
  std::vector<float> scores;
  const auto out = buffer_for(scores, 1, 1, 16);
  lens[0] = 7;
  p.score(1, ctx, out);
  const std::vector<float> want{0.125f, 0.875f, 0.f, 0.25f, 0.f, 0.25f, 0.5f};
  for (int t = 0; t < 7; ++t) REQUIRE(out.row(0, 0)[t] == want[t]);
  p.score(0, ctx, out);  // another layer saw nothing
  for (int t = 0; t < 7; ++t) REQUIRE(out.row(0, 0)[t] == 0.f);
  REQUIRE_THROWS_WITH(p.score(2, ctx, out), Catch::Contains("layer 2 is out of range [0, 2)"));
}

TEST_CASE("h2o's mass and quest's page bounds in the caller's memory: the same policy", "[spec][h2o][quest][workspace]") {
  cache_fixture f(3, 91u);
  const kvscout::quest_policy_host<D>::config qc{{.num_layers = 2, .num_seqs = f.S,
                                                  .num_kv_heads = f.H, .num_q_heads = f.Hq,
                                                  .max_tokens = f.cap, .scale = 0.125f}, 8,
                                                 kvscout::gqa_aggregation::max_logit};
  const kvscout::h2o_policy_host::config hc{{.num_layers = 2, .num_seqs = f.S,
                                             .num_kv_heads = f.H, .max_tokens = f.cap}};
  const std::size_t qb = kvscout::quest_policy_host<D>::workspace_bytes(qc), hb = kvscout::h2o_policy_host::workspace_bytes(hc);
  REQUIRE(qb == sizeof(float) * 2 * f.S * f.H * ((f.cap + 7) / 8) * 2 * D);
  REQUIRE(hb == sizeof(float) * 2 * f.S * f.H * f.cap);
  // The caller's memory, dirty, with a tail that must stay untouched.
  kvscout::host_workspace qm(qb + 16, kvscout::quest_policy_host<D>::workspace_alignment),
      hm(hb + 16, kvscout::h2o_policy_host::workspace_alignment);
  std::memset(qm.span().data(), 0xAB, qm.span().size());
  std::memset(hm.span().data(), 0xAB, hm.span().size());
  kvscout::quest_policy_host<D> q_own(qc), q_theirs(qc, qm.span().subspan(0, qb));
  kvscout::h2o_policy_host h_own(hc), h_theirs(hc, hm.span().subspan(0, hb));

  std::vector<float> k_post(static_cast<std::size_t>(f.H) * D);
  for (int s = 0; s < f.S; ++s)
    for (int t = 0; t < f.lens[s]; ++t) {
      for (int h = 0; h < f.H; ++h) std::copy_n(f.key(s, h, t), D, &k_post[static_cast<std::size_t>(h) * D]);
      q_own.append(1, s, t, nullptr, k_post.data());
      q_theirs.append(1, s, t, nullptr, k_post.data());
    }
  // h2o: every sequence attended its first 4 tokens with fixed probabilities, at layer 1.
  std::vector<int32_t> idx(static_cast<std::size_t>(f.S) * f.H * 4), counts(static_cast<std::size_t>(f.S) * f.H, 4);
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i % 4);
  std::vector<float> rows_k(idx.size() * D, 1.f), rows_v(rows_k.size(), 1.f);
  const kvscout::selection_view<kvscout::host_space> sel{{idx.data(), idx.size()}, {counts.data(), counts.size()}, f.S, f.H, 4};
  const kvscout::gathered_rows_host<float, D> rows(sel, {rows_k.data(), rows_k.size()}, {rows_v.data(), rows_v.size()});
  std::vector<float> probs(static_cast<std::size_t>(f.S) * f.H * 5);
  for (std::size_t i = 0; i < probs.size(); ++i) probs[i] = 0.05f * static_cast<float>(i % 5 + 1);
  const kvscout::score_context<kvscout::host_space> hctx{{}, {}, {}, {f.lens.data(), f.lens.size()}};
  h_own.observe(1, hctx, rows, {probs.data(), probs.size()}, 5, false);
  h_theirs.observe(1, hctx, rows, {probs.data(), probs.size()}, 5, false);

  const kvscout::score_context<kvscout::host_space> qctx{{}, {f.q.data(), f.q.size()}, {}, {f.lens.data(), f.lens.size()}};
  for (int l = 0; l < 2; ++l) {
    std::vector<float> a, b, c, d;
    const auto ab = buffer_for(a, f.S, f.H, f.cap), bb = buffer_for(b, f.S, f.H, f.cap);
    const auto cb = buffer_for(c, f.S, f.H, f.cap), db = buffer_for(d, f.S, f.H, f.cap);
    q_own.score(l, qctx, ab);
    q_theirs.score(l, qctx, bb);
    h_own.score(l, hctx, cb);
    h_theirs.score(l, hctx, db);
    for (int s = 0; s < f.S; ++s)
      for (int h = 0; h < f.H; ++h)
        for (int t = 0; t < f.lens[s]; ++t) {
          CAPTURE(l, s, h, t);
          REQUIRE(ab.row(s, h)[t] == bb.row(s, h)[t]);
          REQUIRE(cb.row(s, h)[t] == db.row(s, h)[t]);
          if (l == 1 && t < 4) REQUIRE(db.row(s, h)[t] > 0.f);  // what was observed
          if (l == 0) REQUIRE(db.row(s, h)[t] == 0.f);          // zeroed, not 0xAB
        }
  }
  for (std::size_t i = qb; i < qb + 16; ++i) REQUIRE(qm.span()[i] == std::byte{0xAB});
  for (std::size_t i = hb; i < hb + 16; ++i) REQUIRE(hm.span()[i] == std::byte{0xAB});
  REQUIRE_THROWS_WITH(kvscout::quest_policy_host<D>(qc, qm.span().subspan(0, qb - 4)),
                      Catch::Contains("quest_policy_host workspace: the caller's memory holds " + std::to_string(qb - 4) +
                                      " bytes, expected at least " + std::to_string(qb)));
  REQUIRE_THROWS_WITH(kvscout::h2o_policy_host(hc, hm.span().subspan(1, hb)), Catch::Contains("must be 4-byte aligned"));
}

TEST_CASE("quest page bounds never underestimate a key's score", "[spec][quest]") {
  for (int g : {1, 3}) {
    cache_fixture f(g, 70u + g);
    const float scale = 0.125f;
    kvscout::quest_policy_host<D> quest({{.num_layers = 1, .num_seqs = f.S,
                                          .num_kv_heads = f.H, .num_q_heads = f.Hq,
                                          .max_tokens = f.cap, .scale = scale},
                                         16, kvscout::gqa_aggregation::max_logit});
    std::vector<float> k_post(static_cast<std::size_t>(f.H) * D);
    for (int s = 0; s < f.S; ++s)
      for (int t = 0; t < f.lens[s]; ++t) {
        for (int h = 0; h < f.H; ++h) std::copy_n(f.key(s, h, t), D, &k_post[static_cast<std::size_t>(h) * D]);
        quest.append(0, s, t, nullptr, k_post.data());
      }
    std::vector<float> scores;
    const auto out = buffer_for(scores, f.S, f.H, f.cap);
    quest.score(0, {{}, {f.q.data(), f.q.size()}, {}, {f.lens.data(), f.lens.size()}}, out);
    for (int s = 0; s < f.S; ++s)
      for (int h = 0; h < f.H; ++h)
        for (int t = 0; t < f.lens[s]; ++t) {
          double best = -INFINITY;
          for (int j = 0; j < g; ++j) best = std::max(best, f.logit(s, h * g + j, t, scale));
          REQUIRE(out.row(s, h)[t] >= best - 1e-4);                          // an upper bound
          REQUIRE(out.row(s, h)[t] == out.row(s, h)[(t / 16) * 16]);         // page-granular
        }
  }
  SECTION("the page holding the aligned key ranks first") {
    kvscout::quest_policy_host<D> quest({{.num_layers = 1, .num_seqs = 1,
                                          .num_kv_heads = 1, .num_q_heads = 1, .max_tokens = 64,
                                          .scale = 0.125f}, 8});
    std::vector<float> key(D);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 0.1f);
    std::vector<float> q(D);
    for (auto& x : q) x = nd(rng);
    for (int t = 0; t < 64; ++t) {
      for (auto& x : key) x = nd(rng);
      if (t == 37) for (int c = 0; c < D; ++c) key[c] = 5.f * q[c];  // strongly aligned with q
      quest.append(0, 0, t, nullptr, key.data());
    }
    std::vector<int32_t> lens{64};
    std::vector<float> scores;
    const auto out = buffer_for(scores, 1, 1, 64);
    quest.score(0, {{}, {q.data(), q.size()}, {}, {lens.data(), lens.size()}}, out);
    const float* row = out.row(0, 0);
    REQUIRE(std::max_element(row, row + 64) - row == 32);  // page 4 = tokens 32..39
  }
}

TEST_CASE("infinigen with a full partial dimension scores exactly like the oracle", "[spec][infinigen]") {
  // One layer; with r = D the partial score is the full score, for every mode and group size
  // (group sizes 1 and 3 take the static-group kernel, 12 the generic one).
  for (const int g : {1, 3, 12}) {
  const int H = 2, Hq = H * g, d_model = 128, n = 60;
  CAPTURE(g);
  std::mt19937 rng(11u + g);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> wq(static_cast<std::size_t>(Hq) * D * d_model), x(d_model), bq(Hq * D);
  for (auto& w : wq) w = nd(rng) / 16.f;
  for (auto& w : x) w = nd(rng);
  for (auto& w : bq) w = 0.1f * nd(rng);
  const kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  for (auto mode : {kvscout::rope_mode::post_rope_skew, kvscout::rope_mode::rope_planes}) {
    CAPTURE(kvscout::to_string(mode));
    // Calibration samples: random post-RoPE queries / keys.
    std::vector<float> qs(static_cast<std::size_t>(200) * g * D), ks(static_cast<std::size_t>(200) * D);
    for (auto& v : qs) v = nd(rng);
    for (auto& v : ks) v = nd(rng);
    std::vector<kvscout::skew_plan> plans;
    for (int h = 0; h < H; ++h)
      plans.push_back(kvscout::calibrate_skew({qs.data(), qs.size()}, {ks.data(), ks.size()}, 200, g, D,
                                              {D, false, mode, rope}));
    const kvscout::infinigen_config pc{.shape = {.num_layers = 1, .num_seqs = 1, .num_kv_heads = H,
                                        .num_q_heads = Hq, .head_dim = D, .d_model = d_model,
                                        .max_tokens = 128, .scale = 0.125f},
                                       .aggregation = kvscout::gqa_aggregation::max_logit};
    auto p = kvscout::infinigen_policy_host<>::layers(pc, {plans}, {{wq.data(), wq.size()}}, {{bq.data(), bq.size()}});
    // Keys of n tokens (pre-RoPE random; post-RoPE = rotated at their positions).
    std::vector<float> kpre(static_cast<std::size_t>(n) * H * D), kpost(kpre.size());
    for (auto& v : kpre) v = nd(rng);
    kpost = kpre;
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < H; ++h) kvscout::apply_rope(&kpost[(static_cast<std::size_t>(t) * H + h) * D], t, rope);
    for (int t = 0; t < n; ++t) p.append(0, 0, t, &kpre[static_cast<std::size_t>(t) * H * D], &kpost[static_cast<std::size_t>(t) * H * D]);
    // The true query of the decoded token at position n.
    std::vector<float> q(static_cast<std::size_t>(Hq) * D);
    for (int qh = 0; qh < Hq; ++qh) {
      for (int c = 0; c < D; ++c) {
        double a = bq[qh * D + c];
        for (int i = 0; i < d_model; ++i) a += static_cast<double>(wq[(static_cast<std::size_t>(qh) * D + c) * d_model + i]) * x[i];
        q[static_cast<std::size_t>(qh) * D + c] = static_cast<float>(a);
      }
      kvscout::apply_rope(&q[static_cast<std::size_t>(qh) * D], n, rope);
    }
    std::vector<int32_t> lens{n}, pos{n};
    std::vector<float> scores;
    const auto out = buffer_for(scores, 1, H, 128);
    p.score(0, {{x.data(), x.size()}, {}, {pos.data(), pos.size()}, {lens.data(), lens.size()}}, out);
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < n; ++t) {
        double best = -INFINITY;
        for (int j = 0; j < g; ++j) {
          double d = 0;
          for (int c = 0; c < D; ++c) d += static_cast<double>(q[(h * g + j) * D + c]) * kpost[(static_cast<std::size_t>(t) * H + h) * D + c];
          best = std::max(best, d * 0.125);
        }
        REQUIRE(out.row(0, h)[t] == Approx(best).margin(2e-3));
      }
    REQUIRE(p[0].keys().r() == D);
    REQUIRE_THROWS_WITH(p.score(1, {{x.data(), x.size()}, {}, {pos.data(), pos.size()}, {lens.data(), lens.size()}}, out),
                        Catch::Contains("layer 1 is out of range [0, 1)"));
  }
  }
}

namespace {

template <class PkT>
void check_tiles_agree(int g, kvscout::gqa_aggregation agg) {
  // Scoring takes several tiles at a time where they are whole and one at a time after; every
  // token's sum is formed in the same order either way. So a row scored at length n must be the
  // same bits as the first n tokens of the row scored at full length, whatever n leaves to the
  // tail, and both must be the partial logits (fp64 reference from the cache's own contents).
  const int H = 2, Hq = H * g, d_model = 64, r = 16, full = 300;
  std::mt19937 rng(100u + static_cast<unsigned>(g) * 7u + static_cast<unsigned>(agg));
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> wq(static_cast<std::size_t>(Hq) * D * d_model), x(d_model);
  for (auto& w : wq) w = nd(rng) / 8.f;
  for (auto& w : x) w = nd(rng);
  std::vector<kvscout::skew_plan> plans(H, identity_planes(r));
  const kvscout::infinigen_config pc{.shape = {.num_layers = 1, .num_seqs = 1, .num_kv_heads = H,
                                      .num_q_heads = Hq, .head_dim = D, .d_model = d_model,
                                      .max_tokens = full, .scale = 0.125f},
                                     .aggregation = agg};
  auto p = kvscout::infinigen_policy_host<PkT>::layers(pc, {plans}, {{wq.data(), wq.size()}}, {{}});
  std::vector<float> k(static_cast<std::size_t>(H) * D);
  for (int t = 0; t < full; ++t) {
    for (auto& v : k) v = nd(rng);
    p.append(0, 0, t, k.data(), k.data());
  }
  std::vector<int32_t> pos{full};
  const auto score_at = [&](int n, std::vector<float>& scores) {
    std::vector<int32_t> lens{n};
    const auto out = buffer_for(scores, 1, H, full);
    p.score(0, {{x.data(), x.size()}, {}, {pos.data(), 1}, {lens.data(), 1}}, out);
  };
  std::vector<float> ref;
  score_at(full, ref);
  // The partial queries, from the same weights: rope_planes with identity planes is rows 0..r-1
  // of each head's W_Q, rotated plane by plane at position `full`.
  kvscout::rope_table rt;
  rt.fill(plans[0].rope, full);
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < full; ++t) {
      double agg_want = agg == kvscout::gqa_aggregation::max_logit ? -INFINITY : 0.0;
      for (int j = 0; j < g; ++j) {
        const int qh = h * g + j;
        std::vector<double> q(r);
        for (int c = 0; c < r; ++c) {
          double a = 0;
          for (int i = 0; i < d_model; ++i)
            a += static_cast<double>(wq[(static_cast<std::size_t>(qh) * D + plans[0].channels[c]) * d_model + i]) * x[i];
          q[c] = a;
        }
        for (int i = 0; i < r / 2; ++i) {
          const double c0 = rt.cs[i], s0 = rt.sn[i], a = q[2 * i], b = q[2 * i + 1];
          q[2 * i] = a * c0 - b * s0;
          q[2 * i + 1] = a * s0 + b * c0;
        }
        double d = 0;
        for (int c = 0; c < r; ++c) d += q[c] * static_cast<double>(kvscout::to_float(p[0].keys().at(0, h, c, t)));
        d *= 0.125;
        agg_want = agg == kvscout::gqa_aggregation::max_logit ? std::max(agg_want, d) : agg_want + d / g;
      }
      REQUIRE(ref[static_cast<std::size_t>(h) * full + t] == Approx(agg_want).margin(1e-4).epsilon(1e-4));
    }
  for (int n : {1, 15, 16, 17, 31, 47, 48, 49, 63, 64, 65, 100, 127, 128, 129, 200, 257, 299}) {
    CAPTURE(g, n);
    std::vector<float> got;
    score_at(n, got);
    for (int h = 0; h < H; ++h) {
      const float* a = got.data() + static_cast<std::size_t>(h) * full;
      const float* b = ref.data() + static_cast<std::size_t>(h) * full;
      for (int t = 0; t < n; ++t) REQUIRE(std::bit_cast<std::uint32_t>(a[t]) == std::bit_cast<std::uint32_t>(b[t]));
      for (int t = n; t < full; ++t) REQUIRE(std::isnan(a[t]));  // nothing written past seq_len
    }
  }
}

}  // namespace

TEST_CASE("infinigen scores the same bits whether a tile is scored alone or with its neighbours",
          "[spec][infinigen]") {
  for (int g : {1, 2, 3, 4, 5, 8})
    for (auto agg : {kvscout::gqa_aggregation::max_logit, kvscout::gqa_aggregation::mean_logit}) {
      check_tiles_agree<float>(g, agg);
      check_tiles_agree<kvscout::half>(g, agg);
    }
}

TEST_CASE("infinigen scores the same bits on rows past the register-pinning bound", "[spec][infinigen]") {
  // Rows of up to 4 MiB of partial keys pin each key line in a register on AVX-512 builds,
  // longer rows do not (infinigen_policy_host::pin_row_bytes); both must form the same sums. With
  // r = 16 floats the bound is 65536 tokens: a row of 69632 scored whole and its first 65536
  // tokens scored alone must agree bit for bit.
  const int H = 1, g = 3, Hq = H * g, d_model = 32, r = 16, full = 65536 + 4096, cut = 65536;
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> wq(static_cast<std::size_t>(Hq) * D * d_model), x(d_model);
  for (auto& w : wq) w = nd(rng) / 8.f;
  for (auto& w : x) w = nd(rng);
  std::vector<kvscout::skew_plan> plans(H, identity_planes(r));
  const kvscout::infinigen_config pc{.shape = {.num_layers = 1, .num_seqs = 1, .num_kv_heads = H,
                                      .num_q_heads = Hq, .head_dim = D, .d_model = d_model,
                                      .max_tokens = full, .scale = 0.125f},
                                     .aggregation = kvscout::gqa_aggregation::max_logit};
  auto p = kvscout::infinigen_policy_host<float>::layers(pc, {plans}, {{wq.data(), wq.size()}}, {{}});
  std::vector<float> k(static_cast<std::size_t>(H) * D);
  for (int t = 0; t < full; ++t) {
    for (auto& v : k) v = nd(rng);
    p.append(0, 0, t, k.data(), k.data());
  }
  std::vector<int32_t> pos{full};
  std::vector<float> whole, part;
  for (auto [n, scores] : {std::pair{full, &whole}, std::pair{cut, &part}}) {
    std::vector<int32_t> lens{n};
    const auto out = buffer_for(*scores, 1, H, full);
    const kvscout::score_context<kvscout::host_space> ctx{{x.data(), x.size()}, {}, {pos.data(), 1}, {lens.data(), 1}};
    p.score(0, ctx, out);
    require_row_max(p, 0, ctx, out);  // the maximum kept by both loops
  }
  int differ = 0;
  for (int t = 0; t < cut; ++t)
    differ += std::bit_cast<std::uint32_t>(whole[t]) != std::bit_cast<std::uint32_t>(part[t]);
  REQUIRE(differ == 0);
  REQUIRE(std::isnan(part[cut]));  // nothing written past seq_len
}

TEST_CASE("max_non_nan is the largest non-NaN, whatever the length, NaN and infinities",
          "[spec][row_max]") {
  // Every length around the vector blocks (4 x host_float_lanes), the maximum at every position
  // class (first, in a block, in the tail), NaN runs, +-inf, all-NaN and empty rows.
  std::mt19937 rng(79);
  std::normal_distribution<float> nd(0.f, 1.f);
  const float inf = std::numeric_limits<float>::infinity();
  for (int n : {0, 1, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 4099})
    for (int variant = 0; variant < 6; ++variant) {
      CAPTURE(n, variant);
      std::vector<float> row(static_cast<std::size_t>(n));
      for (auto& x : row) x = nd(rng);
      for (int i = 0; i < n; ++i) {
        if (variant == 1 && i % 3 == 0) row[i] = NAN;           // NaN among them
        if (variant == 2) row[i] = NAN;                         // all NaN: -inf
        if (variant == 3 && i == n - 1) row[i] = inf;           // +inf last (the tail)
        if (variant == 4) row[i] = -inf;                        // all -inf
        if (variant == 5 && i == n / 2) row[i] = 1e30f;         // inside a block
      }
      float want = -inf;
      for (float x : row)
        if (!std::isnan(x)) want = std::max(want, x);
      REQUIRE(kvscout::detail::max_non_nan(row.data(), n) == want);
    }
}

TEST_CASE("dot_rows gives every row the bits of dot", "[spec][gemv]") {
  // partial_query's GEMV runs 8 rows at a time; each row must be the same sum, in the same
  // order, as detail::dot (so the partial queries did not change when the GEMV was blocked).
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const int n : {1, 15, 16, 17, 64, 576, 577})
    for (const int rows : {1, 7, 8, 9, 17, 64}) {
      CAPTURE(n, rows);
      const std::size_t ld = static_cast<std::size_t>(n) + 3;  // a row stride past the row
      std::vector<float> a(ld * rows), b(n), got(rows + 1, -1.f);
      for (auto& x : a) x = nd(rng);
      for (auto& x : b) x = nd(rng);
      kvscout::detail::dot_rows(a.data(), ld, b.data(), n, rows, got.data());
      for (int j = 0; j < rows; ++j)
        REQUIRE(std::bit_cast<std::uint32_t>(got[j]) ==
                std::bit_cast<std::uint32_t>(kvscout::detail::dot(a.data() + j * ld, b.data(), n)));
      REQUIRE(got[rows] == -1.f);  // nothing written past the rows
    }
}

TEST_CASE("dot_rows_multi gives every (row, vector) the bits of dot", "[spec][gemv]") {
  // The batched GEMV of partial_queries: 4 vectors at a time, then 3, 2 or 1; each output must be
  // dot()'s sum of that row and that vector, and nothing past the rows or the vectors written.
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const int n : {1, 16, 17, 576})
    for (const int rows : {1, 3, 4, 5, 9, 64})
      for (const int count : {1, 2, 3, 4, 5, 7, 8, 9}) {
        CAPTURE(n, rows, count);
        const std::size_t lda = static_cast<std::size_t>(n) + 5;
        const std::size_t ldb = static_cast<std::size_t>(n) + 2;
        const std::size_t ldo = static_cast<std::size_t>(rows) + 3;
        std::vector<float> a(lda * rows), b(ldb * count), got(ldo * count + 1, -1.f);
        for (auto& x : a) x = nd(rng);
        for (auto& x : b) x = nd(rng);
        kvscout::detail::dot_rows_multi(a.data(), lda, b.data(), ldb, count, n, rows, got.data(),
                                        ldo);
        for (int v = 0; v < count; ++v) {
          for (int j = 0; j < rows; ++j)
            REQUIRE(std::bit_cast<std::uint32_t>(got[v * ldo + j]) ==
                    std::bit_cast<std::uint32_t>(kvscout::detail::dot(a.data() + j * lda,
                                                                      b.data() + v * ldb, n)));
          for (std::size_t j = rows; j < ldo; ++j) REQUIRE(got[v * ldo + j] == -1.f);
        }
        REQUIRE(got[ldo * count] == -1.f);
      }
}

TEST_CASE("infinigen, RoPE planes: each kv head's queries rotate its own planes",
          "[spec][infinigen]") {
  // score() computes the rotation of only the planes some kv head's plan uses (their union, per
  // layer, from the layer's own RoPE); a head whose planes were left out would score NaN, one
  // given another head's or another layer's angles would score wrongly. Three layers, scored in
  // the order 0, 1, 0, 2, 1: heads with disjoint, overlapping and shared planes, two thetas and
  // both channel styles, against partial_query over a full rope_table of the layer's RoPE and
  // the cache's own partial keys (fp64 dot products).
  const int L = 3, H = 3, g = 2, Hq = H * g, d_model = 48, r = 8, n = 40, pos = 5000;
  const kvscout::rope_config ropes[L] = {{D, 10000.f, kvscout::rope_style::interleaved},
                                         {D, 1000000.f, kvscout::rope_style::interleaved},
                                         {D, 10000.f, kvscout::rope_style::split_half}};
  const std::vector<std::vector<int>> head_planes[L] = {
      {{0, 5, 9, 31}, {2, 5, 17, 30}, {0, 5, 9, 31}},
      {{1, 2, 3, 4}, {20, 21, 22, 23}, {3, 4, 27, 28}},
      {{6, 7, 8, 9}, {6, 7, 8, 9}, {10, 11, 12, 13}}};
  std::vector<std::vector<kvscout::skew_plan>> plans(L);
  for (int l = 0; l < L; ++l)
    for (const auto& hp : head_planes[l])
      plans[l].push_back(kvscout::rope_planes_plan(ropes[l], hp));
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> wq(static_cast<std::size_t>(Hq) * D * d_model), bq(Hq * D), x(d_model);
  for (auto& w : wq) w = nd(rng) / 8.f;
  for (auto& w : bq) w = 0.1f * nd(rng);
  for (auto& w : x) w = nd(rng);
  const kvscout::host_span<const float> W_Q(wq.data(), wq.size()), b_Q(bq.data(), bq.size());
  const kvscout::infinigen_config pc{.shape = {.num_layers = L, .num_seqs = 1, .num_kv_heads = H,
                                      .num_q_heads = Hq, .head_dim = D, .d_model = d_model,
                                      .max_tokens = n, .scale = 0.125f},
                                     .aggregation = kvscout::gqa_aggregation::max_logit};
  auto p = kvscout::infinigen_policy_host<>::layers(pc, plans, {W_Q, W_Q, W_Q}, {b_Q, b_Q, b_Q});
  std::vector<float> k(static_cast<std::size_t>(H) * D);
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < n; ++t) {
      for (auto& v : k) v = nd(rng);
      p.append(l, 0, t, k.data(), k.data());
    }
  std::vector<int32_t> lens{n}, ps{pos};
  for (const int l : {0, 1, 0, 2, 1}) {
    std::vector<float> scores;
    const auto out = buffer_for(scores, 1, H, n);
    p.score(l, {{x.data(), x.size()}, {}, {ps.data(), 1}, {lens.data(), 1}}, out);
    kvscout::rope_table rt;
    rt.fill(ropes[l], pos);
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < n; ++t) {
        CAPTURE(l, h, t);
        double want = -INFINITY;
        for (int j = 0; j < g; ++j) {
          const auto w =
              kvscout::make_partial_query_weights(plans[l][h], W_Q, b_Q, d_model, h * g + j);
          std::vector<float> q(r);
          kvscout::partial_query(w, x.data(), rt, q.data());
          double d = 0;
          for (int c = 0; c < r; ++c)
            d += static_cast<double>(q[c]) * kvscout::to_float(p[l].keys().at(0, h, c, t));
          want = std::max(want, d * 0.125);
        }
        REQUIRE(out.row(0, h)[t] == Approx(want).margin(1e-5).epsilon(1e-5));
      }
  }
}

TEST_CASE("infinigen writes each row's maximum as it scores: tails, NaN keys, empty rows",
          "[spec][infinigen][row_max]") {
  // score_buffer::row_max is kept in the scoring loop (score_tiles), not read back: rows of every
  // length around the tile and multi-tile steps (16 tokens, 3 tiles for a group of 3), with a
  // NaN key (a NaN score, which the maximum skips), an empty row (-inf), every aggregation and
  // groups of 1, 3, 8 (static group sizes) and 9 (the runtime-group loop).
  const int H = 2, d_model = 40, r = 16, cap = 260;
  std::mt19937 rng(78);
  std::normal_distribution<float> nd(0.f, 1.f);
  const std::vector<int32_t> lens{0, 1, 15, 16, 17, 47, 48, 49, 95, 257};
  const int S = static_cast<int>(lens.size());
  std::vector<int32_t> pos(S);
  for (int s = 0; s < S; ++s) pos[s] = 300 + 5 * s;
  for (int g : {1, 3, 8, 9})
    for (auto agg : {kvscout::gqa_aggregation::max_logit, kvscout::gqa_aggregation::mean_logit,
                     kvscout::gqa_aggregation::sum_prob}) {
      CAPTURE(g, static_cast<int>(agg));
      const int Hq = H * g;
      std::vector<float> wq(static_cast<std::size_t>(Hq) * D * d_model),
          x(static_cast<std::size_t>(S) * d_model);
      for (auto& w : wq) w = nd(rng) / 8.f;
      for (auto& w : x) w = nd(rng);
      std::vector<kvscout::skew_plan> plans(H, identity_planes(r));
      const kvscout::infinigen_config pc{.shape = {.num_layers = 1,
                                          .num_seqs = S,
                                          .num_kv_heads = H,
                                          .num_q_heads = Hq,
                                          .head_dim = D,
                                          .d_model = d_model,
                                          .max_tokens = cap,
                                          .scale = 0.125f},
                                         .aggregation = agg};
      auto p = kvscout::infinigen_policy_host<float>::layers(pc, {plans}, {{wq.data(), wq.size()}}, {{}});
      std::vector<float> k(static_cast<std::size_t>(H) * D);
      for (int s = 0; s < S; ++s)
        for (int t = 0; t < lens[s]; ++t) {
          for (auto& v : k) v = nd(rng);
          // A NaN key in the rows of 17 and 257 tokens (kv head 0): a NaN score there.
          if ((lens[s] == 17 && t == 3) || (lens[s] == 257 && t == 200)) k[0] = NAN;
          p.append(0, s, t, k.data(), k.data());
        }
      std::vector<float> scores;
      const auto out = buffer_for(scores, S, H, cap);
      const kvscout::score_context<kvscout::host_space> ctx{{x.data(), x.size()}, {}, {pos.data(), pos.size()},
                                      {lens.data(), lens.size()}};
      p.score(0, ctx, out);
      REQUIRE(std::isnan(out.row(3 + 1, 0)[3]));
      require_row_max(p, 0, ctx, out);
    }
}

TEST_CASE("infinigen scores a batch of sequences with the bits each gets alone",
          "[spec][infinigen]") {
  // score() computes the partial queries of up to 8 sequences together (each head's weights read
  // once for them) and partial_queries runs them 4 at a time. 11 sequences (a block of 8 = 4 + 4,
  // then one of 3), each with its own input, position and length, must give every sequence the
  // scores that a policy holding that sequence alone gives it, bit for bit, in every RoPE mode.
  const int S = 11, H = 2, g = 3, Hq = H * g, d_model = 96, r = 16, cap = 70;
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> wq(static_cast<std::size_t>(Hq) * D * d_model), bq(Hq * D);
  std::vector<float> x(static_cast<std::size_t>(S) * d_model);
  for (auto& w : wq) w = nd(rng) / 8.f;
  for (auto& w : bq) w = 0.1f * nd(rng);
  for (auto& w : x) w = nd(rng);
  std::vector<int32_t> lens(S), pos(S);
  for (int s = 0; s < S; ++s) lens[s] = 20 + 4 * s, pos[s] = 1000 + 37 * s;
  std::vector<float> kpre(static_cast<std::size_t>(S) * cap * H * D), kpost(kpre.size());
  for (auto& v : kpre) v = nd(rng);
  const kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  kpost = kpre;
  for (int s = 0; s < S; ++s)
    for (int t = 0; t < cap; ++t)
      for (int h = 0; h < H; ++h)
        kvscout::apply_rope(&kpost[((static_cast<std::size_t>(s) * cap + t) * H + h) * D], t, rope);
  std::vector<float> qs(static_cast<std::size_t>(200) * g * D);
  std::vector<float> ks(static_cast<std::size_t>(200) * D);
  for (auto& v : qs) v = nd(rng);
  for (auto& v : ks) v = nd(rng);
  using policy = kvscout::infinigen_policy_host<>;
  for (auto mode : {kvscout::rope_mode::post_rope_skew, kvscout::rope_mode::rope_planes,
                    kvscout::rope_mode::pre_rope_folded}) {
    CAPTURE(kvscout::to_string(mode));
    const std::vector<kvscout::skew_plan> plans = calibrated_plans(qs, ks, H, g, r, mode, rope);
    const auto make = [&](int seqs) {
      const kvscout::infinigen_config pc{.shape = {.num_layers = 1, .num_seqs = seqs,
                                          .num_kv_heads = H, .num_q_heads = Hq, .head_dim = D,
                                          .d_model = d_model, .max_tokens = cap, .scale = 0.125f},
                                         .aggregation = kvscout::gqa_aggregation::max_logit};
      return policy::layers(pc, {plans}, {{wq.data(), wq.size()}}, {{bq.data(), bq.size()}});
    };
    const auto key = [&](const std::vector<float>& k, int s, int t) {
      return &k[(static_cast<std::size_t>(s) * cap + t) * H * D];
    };
    auto all = make(S);
    for (int s = 0; s < S; ++s)
      for (int t = 0; t < lens[s]; ++t) all.append(0, s, t, key(kpre, s, t), key(kpost, s, t));
    std::vector<float> batch;
    const auto out = buffer_for(batch, S, H, cap);
    all.score(0, {{x.data(), x.size()}, {}, {pos.data(), pos.size()}, {lens.data(), lens.size()}},
              out);
    for (int s = 0; s < S; ++s) {
      CAPTURE(s);
      auto one = make(1);
      for (int t = 0; t < lens[s]; ++t) one.append(0, 0, t, key(kpre, s, t), key(kpost, s, t));
      std::vector<float> alone;
      const auto out1 = buffer_for(alone, 1, H, cap);
      const float* xs = x.data() + static_cast<std::size_t>(s) * d_model;
      one.score(0, {{xs, static_cast<std::size_t>(d_model)}, {}, {pos.data() + s, 1},
                    {lens.data() + s, 1}}, out1);
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < lens[s]; ++t) {
          CAPTURE(h, t);
          REQUIRE(std::bit_cast<std::uint32_t>(out.row(s, h)[t]) ==
                  std::bit_cast<std::uint32_t>(out1.row(0, h)[t]));
        }
    }
  }
}

TEMPLATE_TEST_CASE("partial query weights in half or bfloat16 give the bits of float weights "
                   "holding the same values",
                   "[spec][gemv][infinigen]", kvscout::half, kvscout::bfloat16) {
  // The GEMV widens each 2-byte weight exactly and then does the float arithmetic, so the only
  // change from float weights is the one rounding of the weights to W.
  using W = TestType;
  std::mt19937 rng(47);
  std::normal_distribution<float> nd(0.f, 1.f);
  const auto widened = [](const std::vector<W>& w) {
    std::vector<float> f(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) f[i] = kvscout::to_float(w[i]);
    return f;
  };
  // src rounded to W (in) and those values back in float (out; may be src itself).
  const auto round_to_w = [](const std::vector<float>& src, std::vector<W>& in,
                             std::vector<float>& out) {
    in.resize(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) in[i] = kvscout::from_float<W>(src[i]);
    out.resize(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) out[i] = kvscout::to_float(in[i]);
  };
  const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i, a[i], b[i]);
      REQUIRE(std::bit_cast<std::uint32_t>(a[i]) == std::bit_cast<std::uint32_t>(b[i]));
    }
  };
  SECTION("dot and dot_rows_multi over 2-byte rows") {
    for (const int n : {1, 15, 16, 17, 576})
      for (const int rows : {1, 5, 9})
        for (const int count : {1, 3, 4, 5}) {
          CAPTURE(n, rows, count);
          const std::size_t lda = static_cast<std::size_t>(n) + 5, ldb = n + 2u, ldo = rows + 1u;
          std::vector<W> a(lda * rows);
          for (auto& v : a) v = kvscout::from_float<W>(nd(rng));
          const std::vector<float> af = widened(a);
          std::vector<float> b(ldb * count), got(ldo * count, -1.f), ref(got);
          for (auto& v : b) v = nd(rng);
          kvscout::detail::dot_rows_multi(a.data(), lda, b.data(), ldb, count, n, rows,
                                          got.data(), ldo);
          kvscout::detail::dot_rows_multi(af.data(), lda, b.data(), ldb, count, n, rows,
                                          ref.data(), ldo);
          same_bits(got, ref);
          REQUIRE(std::bit_cast<std::uint32_t>(kvscout::detail::dot(a.data(), b.data(), n)) ==
                  std::bit_cast<std::uint32_t>(kvscout::detail::dot(af.data(), b.data(), n)));
        }
  }
  const int H = 2, g = 3, Hq = H * g, d_model = 80, r = 16, cap = 40, S = 5;
  std::vector<float> wq(static_cast<std::size_t>(Hq) * D * d_model), bq(Hq * D);
  std::vector<float> x(static_cast<std::size_t>(S) * d_model);
  for (auto& w : wq) w = nd(rng) / 8.f;
  for (auto& w : bq) w = 0.1f * nd(rng);
  for (auto& w : x) w = nd(rng);
  std::vector<float> qs(static_cast<std::size_t>(200) * g * D);
  std::vector<float> ks(static_cast<std::size_t>(200) * D);
  for (auto& v : qs) v = nd(rng);
  for (auto& v : ks) v = nd(rng);
  const kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  std::vector<int32_t> lens(S), pos(S);
  for (int s = 0; s < S; ++s) lens[s] = 17 + 5 * s, pos[s] = 300 + 41 * s;
  for (auto mode : {kvscout::rope_mode::post_rope_skew, kvscout::rope_mode::rope_planes,
                    kvscout::rope_mode::pre_rope_folded}) {
    CAPTURE(kvscout::to_string(mode));
    const std::vector<kvscout::skew_plan> plans = calibrated_plans(qs, ks, H, g, r, mode, rope);
    SECTION(std::string("partial_queries, ") + kvscout::to_string(mode)) {
      const auto w = kvscout::make_partial_query_weights(plans[0], {wq.data(), wq.size()},
                                                         {bq.data(), bq.size()}, d_model, 1);
      const kvscout::detail::basic_partial_query_weights<W> w16 = kvscout::detail::weights_as<W>(w);
      REQUIRE(w16.weight.size() == w.weight.size());
      for (std::size_t i = 0; i < w.weight.size(); ++i)
        REQUIRE(kvscout::to_float(w16.weight[i]) ==
                kvscout::to_float(kvscout::from_float<W>(w.weight[i])));
      kvscout::partial_query_weights wf = w;
      wf.weight = widened(w16.weight);
      std::vector<kvscout::rope_table> rt(S);
      for (int s = 0; s < S; ++s) rt[s].fill(rope, pos[s]);
      std::vector<float> q16(static_cast<std::size_t>(S) * r), qf(q16.size());
      kvscout::partial_queries(w16, x.data(), d_model, S, rt.data(), q16.data(), r);
      kvscout::partial_queries(wf, x.data(), d_model, S, rt.data(), qf.data(), r);
      same_bits(q16, qf);
      // W_Q and b_Q given in W itself (the model's own tensors) build the weights a float W_Q
      // holding the same values builds, folded ones included.
      std::vector<W> wq_in, bq_in;
      std::vector<float> wq_widened, bq_widened;
      round_to_w(wq, wq_in, wq_widened);
      round_to_w(bq, bq_in, bq_widened);
      const auto from_w = kvscout::make_partial_query_weights(
          plans[1], kvscout::host_span<const W>(wq_in.data(), wq_in.size()),
          kvscout::host_span<const W>(bq_in.data(), bq_in.size()), d_model, 4);
      const auto from_f = kvscout::make_partial_query_weights(
          plans[1], {wq_widened.data(), wq_widened.size()}, {bq_widened.data(), bq_widened.size()},
          d_model, 4);
      same_bits(from_w.weight, from_f.weight);
      same_bits(from_w.bias, from_f.bias);
    }
    if (mode == kvscout::rope_mode::pre_rope_folded) continue;  // its rows are folded, not W_Q's
    SECTION(std::string("the policy, ") + kvscout::to_string(mode)) {
      // post_rope_skew and rope_planes keep W_Q's own rows: a policy with W weights over W_Q
      // scores the bits of a float-weight policy over W_Q rounded to W (a model stored in W).
      // The bias is kept in float by every policy; here it holds values W represents, so that
      // a policy given W_Q and b_Q in W itself (the model's own tensors) can be compared too.
      std::vector<float> wq_w;
      std::vector<W> wq_in, bq_in;
      round_to_w(wq, wq_in, wq_w);
      round_to_w(bq, bq_in, bq);  // bq itself now holds values W represents
      const kvscout::infinigen_config cfg{.shape = {.num_layers = 1, .num_seqs = S,
                                           .num_kv_heads = H, .num_q_heads = Hq, .head_dim = D,
                                           .d_model = d_model, .max_tokens = cap, .scale = 0.125f},
                                          .aggregation = kvscout::gqa_aggregation::max_logit};
      using narrow_t = kvscout::infinigen_policy_host<float, W>;
      using wide_t = kvscout::infinigen_policy_host<float, float>;
      const std::vector<kvscout::host_span<const float>> b_f{{bq.data(), bq.size()}};
      auto narrow = narrow_t::layers(cfg, {plans}, {{wq.data(), wq.size()}}, b_f);
      auto wide = wide_t::layers(cfg, {plans}, {{wq_w.data(), wq_w.size()}}, b_f);
      auto exact = wide_t::layers(cfg, {plans}, {{wq.data(), wq.size()}}, b_f);
      auto model_typed = narrow_t::layers(
          cfg, {plans}, std::vector<kvscout::host_span<const W>>{{wq_in.data(), wq_in.size()}},
          std::vector<kvscout::host_span<const W>>{{bq_in.data(), bq_in.size()}});
      std::vector<float> k(static_cast<std::size_t>(H) * D);
      for (int s = 0; s < S; ++s)
        for (int t = 0; t < lens[s]; ++t) {
          for (auto& v : k) v = nd(rng);
          for (auto* p : {&narrow, &model_typed}) p->append(0, s, t, k.data(), k.data());
          for (auto* p : {&wide, &exact}) p->append(0, s, t, k.data(), k.data());
        }
      std::vector<float> a, b, c, m;
      const auto out_a = buffer_for(a, S, H, cap), out_b = buffer_for(b, S, H, cap);
      const auto out_c = buffer_for(c, S, H, cap), out_m = buffer_for(m, S, H, cap);
      const kvscout::score_context<kvscout::host_space> ctx{{x.data(), x.size()}, {}, {pos.data(), pos.size()},
                                      {lens.data(), lens.size()}};
      narrow.score(0, ctx, out_a);
      wide.score(0, ctx, out_b);
      exact.score(0, ctx, out_c);
      model_typed.score(0, ctx, out_m);
      int rounded = 0;
      for (int s = 0; s < S; ++s)
        for (int h = 0; h < H; ++h)
          for (int t = 0; t < lens[s]; ++t) {
            CAPTURE(s, h, t);
            REQUIRE(std::bit_cast<std::uint32_t>(out_a.row(s, h)[t]) ==
                    std::bit_cast<std::uint32_t>(out_b.row(s, h)[t]));
            REQUIRE(std::bit_cast<std::uint32_t>(out_m.row(s, h)[t]) ==
                    std::bit_cast<std::uint32_t>(out_b.row(s, h)[t]));
            rounded += out_a.row(s, h)[t] != out_c.row(s, h)[t];
          }
      // The rounding to W is visible (the test would pass vacuously if W were float).
      REQUIRE(rounded > 0);
    }
  }
}
