// One partial key cache read at two widths (issue 32): infinigen_policy_host built with
// correction plans keeps the wider plans' channels, the speculation's first. Its score() must be
// the speculation-only policy's, bit for bit; its score_query() the correction plans' definition
// (fp64) and the correction-only policy's up to summation order; bad plan pairs are refused by
// name.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvscout/core/workspace.hpp"
#include "kvscout/skew/calibrate.hpp"
#include "kvscout/score/infinigen.hpp"
#include "model_slice.hpp"

namespace {

constexpr int D = kvtest::model_slice::D;
using slice = kvtest::model_slice;
const float nan_f = std::numeric_limits<float>::quiet_NaN();

template <class P>
void append_all(P& p, const slice& m) {
  for (int s = 0; s < m.S; ++s)
    for (int t = 0; t < m.n; ++t) p.append(0, s, t, m.key_pre(s, t), m.key_post(s, t));
}

}  // namespace

TEMPLATE_TEST_CASE("one partial key cache serves a narrow speculation and a wide correction",
                   "[spec][infinigen][nested]", float, kvscout::half, kvscout::quantized_keys<4>,
                   kvscout::quantized_keys<2>) {
  using kvscout::gqa_aggregation;
  using P = kvscout::infinigen_policy_host<TestType>;
  constexpr int max_tokens = 80, stride = 84;
  for (const auto mode : {kvscout::rope_mode::post_rope_skew, kvscout::rope_mode::rope_planes})
    for (const int g : {1, 3})
      for (const auto agg : {gqa_aggregation::max_logit, gqa_aggregation::mean_logit, gqa_aggregation::sum_prob}) {
        const int rs = mode == kvscout::rope_mode::rope_planes ? 16 : 12;
        const int rc = mode == kvscout::rope_mode::rope_planes ? 40 : 33;
        CAPTURE(kvscout::to_string(mode), g, static_cast<int>(agg));
        const slice m(2, 2, g, 70, 11u + static_cast<unsigned>(g), slice::keys::channel_offsets);
        const auto narrow = m.plans(rs, mode, 7u);
        const auto wide = m.plans(rc, mode, 7u);
        kvscout::infinigen_config pc{.shape = {.num_layers = 1,
                                               .num_seqs = m.S,
                                               .num_kv_heads = m.H,
                                               .num_q_heads = m.Hq,
                                               .head_dim = D,
                                               .d_model = m.d_model,
                                               .max_tokens = max_tokens,
                                               .scale = 0.125f},
                                     .aggregation = agg};
        pc.query_aggregation = agg == gqa_aggregation::sum_prob ? gqa_aggregation::max_logit : gqa_aggregation::sum_prob;
        const std::vector<kvscout::host_span<const float>> w{{m.wq.data(), m.wq.size()}}, b{{m.bq.data(), m.bq.size()}};
        auto ws1 = kvscout::make_workspace<P>(pc), ws2 = kvscout::make_workspace<P>(pc), ws3 = kvscout::make_workspace<P>(pc);
        P nested(pc, {narrow}, {wide}, w, b, ws1.span());
        P spec_only(pc, {narrow}, w, b, ws2.span());
        P corr_only(pc, {wide}, w, b, ws3.span());
        append_all(nested, m);
        append_all(spec_only, m);
        append_all(corr_only, m);
        REQUIRE(nested.speculation_channels(0) == rs);
        REQUIRE(nested.correction_channels(0) == rc);
        REQUIRE(spec_only.correction_channels(0) == rs);
        for (int h = 0; h < m.H; ++h) {
          const auto& kp = nested.key_plans(0)[static_cast<std::size_t>(h)];
          REQUIRE(kp.r == rc);
          const auto& nc = narrow[static_cast<std::size_t>(h)].channels;
          REQUIRE(std::equal(nc.begin(), nc.end(), kp.channels.begin()));
          auto sorted_kp = kp.channels, sorted_w = wide[static_cast<std::size_t>(h)].channels;
          std::sort(sorted_kp.begin(), sorted_kp.end());
          std::sort(sorted_w.begin(), sorted_w.end());
          REQUIRE(sorted_kp == sorted_w);
        }

        std::vector<int32_t> lens{m.n, m.n - 9}, pos{m.pos, m.pos};
        const kvscout::score_context<kvscout::host_space> ctx{{m.x.data(), m.x.size()}, {m.q.data(), m.q.size()},
                                                              {pos.data(), 2}, {lens.data(), 2}};
        // The speculation: the narrow policy's scores, bit for bit (and its row maxima).
        std::vector<float> a, bsc, amax(4, nan_f), bmax(4, nan_f);
        auto ab = kvtest::nan_score_buffer(a, m.S, m.H, stride), bb = kvtest::nan_score_buffer(bsc, m.S, m.H, stride);
        ab.row_max = {amax.data(), amax.size()};
        bb.row_max = {bmax.data(), bmax.size()};
        nested.score(0, ctx, ab);
        spec_only.score(0, ctx, bb);
        for (std::size_t i = 0; i < a.size(); ++i) {
          CAPTURE(i);
          REQUIRE((std::isnan(a[i]) ? std::isnan(bsc[i]) : a[i] == bsc[i]));
        }
        REQUIRE(amax == bmax);

        // The correction: the wide plans' definition in fp64, and the wide policy's scores.
        std::vector<float> c, d;
        const auto cb = kvtest::nan_score_buffer(c, m.S, m.H, stride), db = kvtest::nan_score_buffer(d, m.S, m.H, stride);
        nested.score_query(0, ctx, cb);
        corr_only.score_query(0, ctx, db);
        const bool quantized = P::quantized;
        for (int s = 0; s < m.S; ++s)
          for (int h = 0; h < m.H; ++h) {
            const auto& pl = wide[static_cast<std::size_t>(h)];
            const int n = lens[static_cast<std::size_t>(s)];
            std::vector<double> z(static_cast<std::size_t>(g) * n);
            for (int j = 0; j < g; ++j) {
              const float* qv = &m.q[(static_cast<std::size_t>(s) * m.Hq + h * g + j) * D];
              for (int t = 0; t < n; ++t) {
                const float* kv = m.key_post(s, t) + static_cast<std::size_t>(h) * D;
                double acc = 0;
                for (int i = 0; i < rc; ++i) {
                  const int ch = pl.channels[static_cast<std::size_t>(i)];
                  double qa = 0, ka = 0;
                  for (int e = 0; e < D; ++e) {
                    const double a_ec = mode == kvscout::rope_mode::rope_planes
                                            ? (e == ch ? 1.0 : 0.0)
                                            : static_cast<double>(pl.A[static_cast<std::size_t>(e) * D + ch]);
                    qa += qv[e] * a_ec;
                    ka += kv[e] * a_ec;
                  }
                  acc += qa * ka;
                }
                z[static_cast<std::size_t>(j) * n + t] = 0.125 * acc;
              }
            }
            const std::vector<double> want = kvtest::aggregate_fp64(z, g, n, pc.late_aggregation());
            for (int t = 0; t < stride; ++t) {
              CAPTURE(s, h, t);
              if (t >= n) {
                REQUIRE(std::isnan(cb.row(s, h)[t]));
                continue;
              }
              const double got = cb.row(s, h)[t], other = db.row(s, h)[t];
              // The two caches hold the same values per channel; only the order of the sum differs.
              REQUIRE(got == Approx(other).margin(2e-5).epsilon(2e-5));
              if (quantized) continue;  // quantised keys: the wide policy is the reference
              // fp16 keys: rounding of each key channel (2^-11 relative) bounds the difference.
              const double tol = std::is_same_v<TestType, float> ? 1e-4 : 2e-2;
              REQUIRE(got == Approx(want[static_cast<std::size_t>(t)]).margin(tol).epsilon(tol));
            }
          }
      }
}

TEST_CASE("a correction plan that does not nest the speculation's is refused by name",
          "[spec][infinigen][nested][errors]") {
  using P = kvscout::infinigen_policy_host<>;
  const slice m(1, 2, 2, 8, 5u);
  kvscout::infinigen_config pc{{.num_layers = 2, .num_seqs = m.S, .num_kv_heads = m.H,
                               .num_q_heads = m.Hq, .head_dim = D, .d_model = m.d_model,
                               .max_tokens = 16, .scale = 0.125f}};
  const std::vector<kvscout::host_span<const float>> w(2, {m.wq.data(), m.wq.size()}), b(2, {m.bq.data(), m.bq.size()});
  auto ws = kvscout::make_workspace<P>(pc);
  const auto planes = m.plans(16, kvscout::rope_mode::rope_planes, 3u);
  const auto rope = planes[0].rope;
  using plans_t = std::vector<std::vector<kvscout::skew_plan>>;

  // A plane of the speculation's missing from the correction's.
  auto missing = m.plans(24, kvscout::rope_mode::rope_planes, 3u);
  std::vector<int> others;
  for (int j = 0; j < D / 2 && others.size() < 12; ++j)
    if (j != planes[1].planes[0]) others.push_back(j);
  missing[1] = kvscout::rope_planes_plan(rope, others);
  REQUIRE_THROWS_WITH(P(pc, plans_t{{}, planes}, plans_t{{}, missing}, w, b, ws.span()),
                      Catch::Contains("layer 1, kv head 1: the speculation plan's channel") &&
                          Catch::Contains("is not among the correction plan's 24 channels"));
  // Narrower than the speculation.
  REQUIRE_THROWS_WITH(P(pc, plans_t{{}, planes}, plans_t{{}, m.plans(8, kvscout::rope_mode::rope_planes, 3u)}, w, b,
                        ws.span()),
                      Catch::Contains("layer 1, kv head 0: the correction plan's r = 8 is smaller than the "
                                      "speculation plan's r = 16"));
  // Another mode.
  REQUIRE_THROWS_WITH(P(pc, plans_t{{}, planes}, plans_t{{}, m.plans(32, kvscout::rope_mode::post_rope_skew, 3u)}, w,
                        b, ws.span()),
                      Catch::Contains("the correction plan's mode post_rope_skew differs from the "
                                      "speculation plan's rope_planes"));
  // Another rotation (calibrated from other samples).
  const auto skew = m.plans(12, kvscout::rope_mode::post_rope_skew, 3u);
  REQUIRE_THROWS_WITH(P(pc, plans_t{{}, skew}, plans_t{{}, m.plans(24, kvscout::rope_mode::post_rope_skew, 4u)}, w, b,
                        ws.span()),
                      Catch::Contains("the correction plan's rotation A differs from the speculation plan's"));
  // Shapes: per layer, per kv head.
  REQUIRE_THROWS_WITH(P(pc, plans_t{{}, planes}, plans_t{{}}, w, b, ws.span()),
                      Catch::Contains("expected one entry per layer (2) in correction_plans (1)"));
  REQUIRE_THROWS_WITH(P(pc, plans_t{{}, planes}, plans_t{{}, {missing[0]}}, w, b, ws.span()),
                      Catch::Contains("layer 1 has 1 correction plans, expected one per kv head (2)"));
  REQUIRE_THROWS_WITH(P(pc, plans_t{{}, planes}, plans_t{planes, {}}, w, b, ws.span()),
                      Catch::Contains("layer 0 has correction plans but no speculation plans"));
  // A layer without correction plans keeps its own width.
  P ok(pc, plans_t{{}, planes}, plans_t{{}, {}}, w, b, ws.span());
  REQUIRE(ok.speculation_channels(1) == 16);
  REQUIRE(ok.correction_channels(1) == 16);
}

TEMPLATE_TEST_CASE("the policy's state in the caller's memory (partial key caches, partial W_Q rows): the same policy",
                   "[spec][infinigen][nested][workspace]", float, kvscout::half, kvscout::quantized_keys<4>) {
  using P = kvscout::infinigen_policy_host<TestType>;
  using plans_t = std::vector<std::vector<kvscout::skew_plan>>;
  constexpr int max_tokens = 80, stride = 84;
  const slice m(2, 2, 3, 70, 21u, slice::keys::channel_offsets);
  const auto narrow = m.plans(16, kvscout::rope_mode::rope_planes, 5u);
  const auto wide = m.plans(40, kvscout::rope_mode::rope_planes, 5u);
  // Layer 0 dense, layer 1 the speculation's width, layer 2 one cache at two widths.
  const plans_t plans{{}, narrow, narrow}, corr{{}, {}, wide};
  kvscout::infinigen_config pc{{.num_layers = 3, .num_seqs = m.S, .num_kv_heads = m.H,
                               .num_q_heads = m.Hq, .head_dim = D, .d_model = m.d_model,
                               .max_tokens = max_tokens, .scale = 0.125f}};
  pc.query_aggregation = kvscout::gqa_aggregation::sum_prob;
  const std::vector<kvscout::host_span<const float>> w(3, {m.wq.data(), m.wq.size()}), b(3, {m.bq.data(), m.bq.size()});

  const auto layer_bytes = [&](int r) {
    const std::size_t x = P::key_store::memory_bytes(m.S, m.H, r, max_tokens);
    return (x + 63) / 64 * 64;
  };
  const std::size_t keys = P::key_memory_bytes(pc, plans, corr);
  REQUIRE(keys == layer_bytes(16) + layer_bytes(40));
  REQUIRE(P::key_memory_bytes(pc, plans) == 2 * layer_bytes(16));
  // rope_planes at r = 16: per query head 16 rows of W_Q, 16 bias floats and 8 plane indices,
  // each piece 64-byte aligned; both speculated layers at the speculation's width.
  const std::size_t head_bytes = (16 * sizeof(float) * m.d_model + 63) / 64 * 64 + 64 + 64;
  REQUIRE(P::weight_memory_bytes(pc, plans) == 2 * static_cast<std::size_t>(m.Hq) * head_bytes);
  const std::size_t need = P::memory_bytes(pc, plans, corr);
  REQUIRE(need == keys + P::weight_memory_bytes(pc, plans));
  REQUIRE(P::memory_alignment == 64);

  // The caller's memory, dirty: the policy must zero what it uses (seen with quantised keys,
  // whose token counts and staging start at zero; float and half keys read only what was appended).
  kvscout::host_workspace mem(need + 64, P::memory_alignment);
  std::memset(mem.span().data(), 0xAB, mem.span().size());
  auto ws1 = kvscout::make_workspace<P>(pc), ws2 = kvscout::make_workspace<P>(pc);
  P theirs(pc, plans, corr, w, b, ws1.span(), mem.span().subspan(0, need));
  P own(pc, plans, corr, w, b, ws2.span());
  for (int l = 1; l < 3; ++l)
    for (int s = 0; s < m.S; ++s)
      for (int t = 0; t < m.n; ++t) {
        theirs.append(l, s, t, m.key_pre(s, t), m.key_post(s, t));
        own.append(l, s, t, m.key_pre(s, t), m.key_post(s, t));
      }
  // The caches are in the caller's memory: layer 1's at its start, layer 2's after it.
  const auto* base = reinterpret_cast<const std::byte*>(mem.span().data());
  const auto first_of = [](const typename P::key_store& k) -> const void* {
    if constexpr (P::quantized) return k.group_min(0, 0, 0);
    else return k.tile(0, 0, 0);
  };
  REQUIRE(first_of(theirs.keys(1)) == base);
  REQUIRE(first_of(theirs.keys(2)) == base + layer_bytes(16));
  // The weights after the caches: layer 1's query head 0 first, its rows W_Q's rows of the plan's
  // channels, its bias theirs, its planes the plan's.
  for (int i = 0; i < 16; ++i) {
    const int c = narrow[0].channels[static_cast<std::size_t>(i)];
    CAPTURE(i, c);
    REQUIRE(std::memcmp(base + keys + sizeof(float) * i * m.d_model, &m.wq[static_cast<std::size_t>(c) * m.d_model],
                        sizeof(float) * m.d_model) == 0);
    float bias = 0;
    std::memcpy(&bias, base + keys + (head_bytes - 128) + sizeof(float) * i, sizeof(float));
    REQUIRE(bias == m.bq[static_cast<std::size_t>(c)]);
  }
  for (int i = 0; i < 8; ++i) {
    int plane = -1;
    std::memcpy(&plane, base + keys + (head_bytes - 64) + sizeof(int) * i, sizeof(int));
    REQUIRE(plane == narrow[0].planes[static_cast<std::size_t>(i)]);
  }
  // Nothing past the state was written.
  for (std::size_t i = need; i < need + 64; ++i) REQUIRE(base[i] == std::byte{0xAB});

  std::vector<int32_t> lens{m.n, m.n - 9}, pos{m.pos, m.pos};
  const kvscout::score_context<kvscout::host_space> ctx{{m.x.data(), m.x.size()}, {m.q.data(), m.q.size()},
                                                        {pos.data(), 2}, {lens.data(), 2}};
  for (int l = 1; l < 3; ++l) {
    std::vector<float> a, c, e, f;
    const auto ab = kvtest::nan_score_buffer(a, m.S, m.H, stride), cb = kvtest::nan_score_buffer(c, m.S, m.H, stride);
    const auto eb = kvtest::nan_score_buffer(e, m.S, m.H, stride), fb = kvtest::nan_score_buffer(f, m.S, m.H, stride);
    theirs.score(l, ctx, ab);
    own.score(l, ctx, cb);
    theirs.score_query(l, ctx, eb);
    own.score_query(l, ctx, fb);
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(l, i);
      REQUIRE((std::isnan(a[i]) ? std::isnan(c[i]) : a[i] == c[i]));
      REQUIRE((std::isnan(e[i]) ? std::isnan(f[i]) : e[i] == f[i]));
    }
  }
  // score() reads the weights from the caller's memory: with layer 1's query head 0 rows doubled
  // there, it scores as a policy built from a W_Q whose head 0 is doubled (exact in float).
  {
    auto* rows = reinterpret_cast<float*>(mem.span().data() + keys);
    for (int i = 0; i < 16 * m.d_model; ++i) rows[i] *= 2.f;
    std::vector<float> wq2 = m.wq;
    for (std::size_t i = 0; i < static_cast<std::size_t>(D) * m.d_model; ++i) wq2[i] *= 2.f;
    const std::vector<kvscout::host_span<const float>> w2(3, {wq2.data(), wq2.size()});
    auto ws3 = kvscout::make_workspace<P>(pc);
    P dbl(pc, plans, corr, w2, b, ws3.span());
    for (int s = 0; s < m.S; ++s)
      for (int t = 0; t < m.n; ++t) dbl.append(1, s, t, m.key_pre(s, t), m.key_post(s, t));
    std::vector<float> a, c, e;
    const auto ab = kvtest::nan_score_buffer(a, m.S, m.H, stride), cb = kvtest::nan_score_buffer(c, m.S, m.H, stride);
    const auto eb = kvtest::nan_score_buffer(e, m.S, m.H, stride);
    theirs.score(1, ctx, ab);
    dbl.score(1, ctx, cb);
    own.score(1, ctx, eb);
    int changed = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      REQUIRE((std::isnan(a[i]) ? std::isnan(c[i]) : a[i] == c[i]));
      changed += !std::isnan(a[i]) && a[i] != e[i];
    }
    REQUIRE(changed > 0);  // and the doubling did change them
    for (int i = 0; i < 16 * m.d_model; ++i) rows[i] *= 0.5f;  // exact: back as it was
  }

  // Too little, misaligned or null memory is refused by name, before anything is built.
  REQUIRE_THROWS_WITH(P(pc, plans, corr, w, b, ws1.span(), mem.span().subspan(0, need - 1)),
                      Catch::Contains("infinigen_policy_host memory: the caller's memory holds " +
                                      std::to_string(need - 1) + " bytes, expected at least " +
                                      std::to_string(need)));
  REQUIRE_THROWS_WITH(P(pc, plans, corr, w, b, ws1.span(), mem.span().subspan(4, need)),
                      Catch::Contains("must be 64-byte aligned"));
  REQUIRE_THROWS_WITH(P(pc, plans, corr, w, b, ws1.span(), kvscout::host_span<std::byte>{nullptr, need}),
                      Catch::Contains("the caller's memory is null"));
  REQUIRE_THROWS_WITH(P::key_memory_bytes(pc, plans_t{narrow}),
                      Catch::Contains("expected one entry per layer (3) in plans, got 1"));
  REQUIRE_THROWS_WITH(P::weight_memory_bytes(pc, plans_t{narrow}),
                      Catch::Contains("expected one entry per layer (3) in plans, got 1"));
  // A cache of its own over too little memory, alone.
  REQUIRE_THROWS_WITH(typename P::key_store(m.S, m.H, 16, max_tokens, mem.span().subspan(0, layer_bytes(16) / 2)),
                      Catch::Contains("the caller's memory holds"));
}

TEMPLATE_TEST_CASE("the state in the caller's memory for every mode and weight type, and after a move",
                   "[spec][infinigen][workspace]", kvscout::half, kvscout::bfloat16, float) {
  using P = kvscout::infinigen_policy_host<float, TestType>;
  constexpr int max_tokens = 80, stride = 84, r = 12;
  const slice m(2, 2, 3, 70, 23u, slice::keys::channel_offsets);
  kvscout::infinigen_config pc{{.num_layers = 1, .num_seqs = m.S, .num_kv_heads = m.H,
                               .num_q_heads = m.Hq, .head_dim = D, .d_model = m.d_model,
                               .max_tokens = max_tokens, .scale = 0.125f}};
  const std::vector<kvscout::host_span<const float>> w(1, {m.wq.data(), m.wq.size()}), b(1, {m.bq.data(), m.bq.size()});
  const auto pad = [](std::size_t x) { return (x + 63) / 64 * 64; };
  std::vector<int32_t> lens{m.n, m.n - 5}, pos{m.pos, m.pos};
  const kvscout::score_context<kvscout::host_space> ctx{{m.x.data(), m.x.size()}, {m.q.data(), m.q.size()},
                                                        {pos.data(), 2}, {lens.data(), 2}};
  for (const auto mode : {kvscout::rope_mode::post_rope_skew, kvscout::rope_mode::rope_planes,
                          kvscout::rope_mode::pre_rope_folded}) {
    CAPTURE(kvscout::to_string(mode));
    const std::vector<std::vector<kvscout::skew_plan>> plans{m.plans(r, mode, 9u)};
    // Per query head: the rows (head_dim of them for the skew, r otherwise) in the weight type,
    // the bias, the skew's rotation [head_dim, r], the planes [r / 2], each piece padded to 64.
    const bool skew = mode == kvscout::rope_mode::post_rope_skew;
    const std::size_t rows = skew ? D : r;
    const std::size_t head = pad(rows * m.d_model * sizeof(TestType)) + pad(4 * rows) + (skew ? pad(4 * D * r) : 0) +
                             (mode == kvscout::rope_mode::rope_planes ? pad(4 * (r / 2)) : 0);
    REQUIRE(P::weight_memory_bytes(pc, plans) == static_cast<std::size_t>(m.Hq) * head);
    const std::size_t need = P::memory_bytes(pc, plans);
    REQUIRE(need == P::key_memory_bytes(pc, plans) + P::weight_memory_bytes(pc, plans));
    kvscout::host_workspace mem(need + 64, P::memory_alignment);
    std::memset(mem.span().data(), 0xAB, mem.span().size());
    auto ws1 = kvscout::make_workspace<P>(pc), ws2 = kvscout::make_workspace<P>(pc);
    P theirs(pc, plans, {}, w, b, ws1.span(), mem.span().subspan(0, need));
    P own(pc, plans, w, b, ws2.span());
    append_all(theirs, m);
    append_all(own, m);
    P moved(std::move(theirs));  // its caches and weights stay where they were
    std::vector<float> a, c;
    const auto ab = kvtest::nan_score_buffer(a, m.S, m.H, stride), cb = kvtest::nan_score_buffer(c, m.S, m.H, stride);
    moved.score(0, ctx, ab);
    own.score(0, ctx, cb);
    int scored = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      REQUIRE((std::isnan(a[i]) ? std::isnan(c[i]) : a[i] == c[i]));
      scored += !std::isnan(a[i]);
    }
    REQUIRE(scored == m.H * (lens[0] + lens[1]));
    for (std::size_t i = need; i < need + 64; ++i) REQUIRE(mem.span()[i] == std::byte{0xAB});
  }
}
