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
// One layer's policy: each token's keys after RoPE, or before for pre_rope_folded plans.
template <class P>
void append_one(P& p, const slice& m) {
  for (int s = 0; s < m.S; ++s)
    for (int t = 0; t < m.n; ++t) {
      const int32_t seq = s, tok = t;
      const float* k = p.rotated_keys() ? m.key_post(s, t) : m.key_pre(s, t);
      p.append(kvscout::host_span<const float>(k, static_cast<std::size_t>(m.H) * D), {&seq, 1},
               {&tok, 1}, 1);
    }
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
        auto nested = P::layers(pc, {narrow}, {wide}, w, b);
        auto spec_only = P::layers(pc, {narrow}, w, b);
        auto corr_only = P::layers(pc, {wide}, w, b);
        append_all(nested, m);
        append_all(spec_only, m);
        append_all(corr_only, m);
        REQUIRE(nested[0].configuration().r == rs);
        REQUIRE(nested[0].configuration().key_r() == rc);
        REQUIRE(spec_only[0].configuration().key_r() == rs);
        for (int h = 0; h < m.H; ++h) {
          const auto& kp = nested[0].key_plans()[static_cast<std::size_t>(h)];
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
  const auto planes = m.plans(16, kvscout::rope_mode::rope_planes, 3u);
  const auto rope = planes[0].rope;
  using plans_t = std::vector<std::vector<kvscout::skew_plan>>;

  // A plane of the speculation's missing from the correction's.
  auto missing = m.plans(24, kvscout::rope_mode::rope_planes, 3u);
  std::vector<int> others;
  for (int j = 0; j < D / 2 && others.size() < 12; ++j)
    if (j != planes[1].planes[0]) others.push_back(j);
  missing[1] = kvscout::rope_planes_plan(rope, others);
  REQUIRE_THROWS_WITH(P::layers(pc, plans_t{{}, planes}, plans_t{{}, missing}, w, b),
                      Catch::Contains("layer 1: kv head 1: the speculation plan's channel") &&
                          Catch::Contains("is not among the correction plan's 24 channels"));
  // Narrower than the speculation.
  REQUIRE_THROWS_WITH(P::layers(pc, plans_t{{}, planes}, plans_t{{}, m.plans(8, kvscout::rope_mode::rope_planes, 3u)}, w, b),
                      Catch::Contains("layer 1: correction_r = 8 must be 0 (r) or in [r = 16, head_dim = 64]"));
  // Another mode.
  REQUIRE_THROWS_WITH(P::layers(pc, plans_t{{}, planes}, plans_t{{}, m.plans(32, kvscout::rope_mode::post_rope_skew, 3u)}, w, b),
                      Catch::Contains("the correction plan's mode post_rope_skew differs from the "
                                      "speculation plan's rope_planes"));
  // Another rotation (calibrated from other samples).
  const auto skew = m.plans(12, kvscout::rope_mode::post_rope_skew, 3u);
  REQUIRE_THROWS_WITH(P::layers(pc, plans_t{{}, skew}, plans_t{{}, m.plans(24, kvscout::rope_mode::post_rope_skew, 4u)}, w, b),
                      Catch::Contains("the correction plan's rotation A differs from the speculation plan's"));
  // Shapes: per layer, per kv head.
  REQUIRE_THROWS_WITH(P::layers(pc, plans_t{{}, planes}, plans_t{{}}, w, b),
                      Catch::Contains("expected no correction plans or one entry per layer (2) in correction_plans, got 1"));
  REQUIRE_THROWS_WITH(P::layers(pc, plans_t{{}, planes}, plans_t{{}, {missing[0]}}, w, b),
                      Catch::Contains("layer 1: got 1 correction plans, expected one per kv head (2)"));
  REQUIRE_THROWS_WITH(P::layers(pc, plans_t{{}, planes}, plans_t{planes, {}}, w, b),
                      Catch::Contains("layer 0 has correction plans but no speculation plans"));
  // A config that names a correction width needs correction plans for every speculated layer, as
  // the one-layer policy and its CUDA twin do.
  kvscout::infinigen_config wide_cfg = pc;
  wide_cfg.correction_r = 24;
  REQUIRE_THROWS_WITH(P::layers(wide_cfg, plans_t{{}, planes}, plans_t{{}, {}}, w, b),
                      Catch::Contains("layer 1: the config's correction_r = 24 needs correction "
                                      "plans, and the layer has none"));
  REQUIRE_THROWS_WITH(P::layers(wide_cfg, plans_t{{}, planes}, w, b),
                      Catch::Contains("layer 1: the config's correction_r = 24 needs correction "
                                      "plans"));
  // A layer without correction plans keeps its own width.
  auto ok = P::layers(pc, plans_t{{}, planes}, plans_t{{}, {}}, w, b);
  REQUIRE(ok[1].configuration().r == 16);
  REQUIRE(ok[1].configuration().key_r() == 16);
}

TEMPLATE_TEST_CASE("the policy's state in the caller's workspace (partial key cache, partial W_Q rows): the same policy",
                   "[spec][infinigen][nested][workspace]", float, kvscout::half, kvscout::quantized_keys<4>) {
  using P = kvscout::infinigen_policy_host<TestType>;
  using mem = kvscout::detail::infinigen_host_memory<TestType, float>;
  constexpr int max_tokens = 80, stride = 84;
  const slice m(2, 2, 3, 70, 21u, slice::keys::channel_offsets);
  const auto narrow = m.plans(16, kvscout::rope_mode::rope_planes, 5u);
  const auto wide = m.plans(40, kvscout::rope_mode::rope_planes, 5u);
  // One cache at two widths: the speculation's 16 channels first, the correction's 40 in all.
  kvscout::infinigen_config pc{.shape = {.num_seqs = m.S, .num_kv_heads = m.H,
                                         .num_q_heads = m.Hq, .head_dim = D, .d_model = m.d_model,
                                         .max_tokens = max_tokens, .scale = 0.125f},
                               .r = 16, .mode = kvscout::rope_mode::rope_planes,
                               .correction_r = 40};
  pc.query_aggregation = kvscout::gqa_aggregation::sum_prob;
  const kvscout::host_span<const float> w{m.wq.data(), m.wq.size()}, b{m.bq.data(), m.bq.size()};

  // The scratch, then the cache at the correction's width, then the weights, each 64-byte aligned.
  const std::size_t scratch = mem::scratch_bytes(pc);
  const std::size_t keys = (P::key_store::memory_bytes(m.S, m.H, 40, max_tokens) + 63) / 64 * 64;
  // rope_planes at r = 16: per query head 16 rows of W_Q, 16 bias floats and 8 plane indices.
  const std::size_t head_bytes = (16 * sizeof(float) * m.d_model + 63) / 64 * 64 + 64 + 64;
  const std::size_t need = P::workspace_bytes(pc);
  REQUIRE(scratch % 64 == 0);
  REQUIRE(need == scratch + keys + static_cast<std::size_t>(m.Hq) * head_bytes);
  REQUIRE(P::workspace_alignment == 64);

  // The caller's workspace, dirty: the policy must zero what it reads before writing it (seen
  // with quantised keys, whose token counts and staging start at zero).
  kvscout::host_workspace ws(need + 64, P::workspace_alignment);
  std::memset(ws.data(), 0xAB, ws.size());
  P theirs(pc, narrow, wide, w, b, ws.span().subspan(0, need));
  auto own_ws = kvscout::make_workspace<P>(pc);
  P own(pc, narrow, wide, w, b, own_ws.span());
  append_one(theirs, m);
  append_one(own, m);
  // The cache after the scratch.
  const auto* base = ws.data();
  const auto first_of = [](const typename P::key_store& k) -> const void* {
    if constexpr (P::quantized) return k.group_min(0, 0, 0);
    else return k.tile(0, 0, 0);
  };
  REQUIRE(first_of(theirs.keys()) == base + scratch);
  // The weights after the cache: query head 0 first, its rows W_Q's rows of the plan's channels,
  // its bias theirs, its planes the plan's.
  const std::byte* weights = base + scratch + keys;
  for (int i = 0; i < 16; ++i) {
    const int c = narrow[0].channels[static_cast<std::size_t>(i)];
    CAPTURE(i, c);
    REQUIRE(std::memcmp(weights + sizeof(float) * i * m.d_model, &m.wq[static_cast<std::size_t>(c) * m.d_model],
                        sizeof(float) * m.d_model) == 0);
    float bias = 0;
    std::memcpy(&bias, weights + (head_bytes - 128) + sizeof(float) * i, sizeof(float));
    REQUIRE(bias == m.bq[static_cast<std::size_t>(c)]);
  }
  for (int i = 0; i < 8; ++i) {
    int plane = -1;
    std::memcpy(&plane, weights + (head_bytes - 64) + sizeof(int) * i, sizeof(int));
    REQUIRE(plane == narrow[0].planes[static_cast<std::size_t>(i)]);
  }
  // Nothing past the workspace was written.
  for (std::size_t i = need; i < need + 64; ++i) REQUIRE(base[i] == std::byte{0xAB});

  std::vector<int32_t> lens{m.n, m.n - 9}, pos{m.pos, m.pos};
  const kvscout::score_context<kvscout::host_space> ctx{{m.x.data(), m.x.size()}, {m.q.data(), m.q.size()},
                                                        {pos.data(), 2}, {lens.data(), 2}};
  const kvscout::host_span<const float> q{m.q.data(), m.q.size()};
  {
    std::vector<float> a, c, e, f;
    const auto ab = kvtest::nan_score_buffer(a, m.S, m.H, stride), cb = kvtest::nan_score_buffer(c, m.S, m.H, stride);
    const auto eb = kvtest::nan_score_buffer(e, m.S, m.H, stride), fb = kvtest::nan_score_buffer(f, m.S, m.H, stride);
    theirs.score(ctx, ab);
    own.score(ctx, cb);
    theirs.score_query(q, ctx, eb);
    own.score_query(q, ctx, fb);
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      REQUIRE((std::isnan(a[i]) ? std::isnan(c[i]) : a[i] == c[i]));
      REQUIRE((std::isnan(e[i]) ? std::isnan(f[i]) : e[i] == f[i]));
    }
  }
  // score() reads the weights from the workspace: with query head 0's rows doubled there, it
  // scores as a policy built from a W_Q whose head 0 is doubled (exact in float).
  {
    auto* rows = reinterpret_cast<float*>(ws.data() + scratch + keys);
    for (int i = 0; i < 16 * m.d_model; ++i) rows[i] *= 2.f;
    std::vector<float> wq2 = m.wq;
    for (std::size_t i = 0; i < static_cast<std::size_t>(D) * m.d_model; ++i) wq2[i] *= 2.f;
    auto dbl_ws = kvscout::make_workspace<P>(pc);
    P dbl(pc, narrow, wide, {wq2.data(), wq2.size()}, b, dbl_ws.span());
    append_one(dbl, m);
    std::vector<float> a, c, e;
    const auto ab = kvtest::nan_score_buffer(a, m.S, m.H, stride), cb = kvtest::nan_score_buffer(c, m.S, m.H, stride);
    const auto eb = kvtest::nan_score_buffer(e, m.S, m.H, stride);
    theirs.score(ctx, ab);
    dbl.score(ctx, cb);
    own.score(ctx, eb);
    int changed = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      REQUIRE((std::isnan(a[i]) ? std::isnan(c[i]) : a[i] == c[i]));
      changed += !std::isnan(a[i]) && a[i] != e[i];
    }
    REQUIRE(changed > 0);  // and the doubling did change them
    for (int i = 0; i < 16 * m.d_model; ++i) rows[i] *= 0.5f;  // exact: back as it was
  }

  // Too little, misaligned or null workspace is refused by name, before anything is built.
  REQUIRE_THROWS_WITH(P(pc, narrow, wide, w, b, ws.span().subspan(0, need - 1)),
                      Catch::Contains("workspace holds " + std::to_string(need - 1) +
                                      " bytes, expected at least workspace_bytes(config) = " +
                                      std::to_string(need)));
  REQUIRE_THROWS_WITH(P(pc, narrow, wide, w, b, ws.span().subspan(4, need)),
                      Catch::Contains("must be 64-byte aligned"));
  REQUIRE_THROWS_WITH(P(pc, narrow, wide, w, b, kvscout::host_span<std::byte>{nullptr, need}),
                      Catch::Contains("workspace is null"));
  // Correction plans with a config whose correction_r is another, or none.
  kvscout::infinigen_config other = pc;
  other.correction_r = 0;
  REQUIRE_THROWS_WITH(P(pc, narrow, w, b, ws.span().subspan(0, need)),
                      Catch::Contains("the config's correction_r = 40 needs correction plans"));
  REQUIRE_THROWS_WITH(P(other, narrow, wide, w, b, ws.span().subspan(0, need)),
                      Catch::Contains("correction plans were given but the config's correction_r is 0"));
  // A cache of its own over too little memory, alone.
  REQUIRE_THROWS_WITH(typename P::key_store(m.S, m.H, 16, max_tokens, ws.span().subspan(0, keys / 4)),
                      Catch::Contains("the caller's memory holds"));
}

TEMPLATE_TEST_CASE("the state in the caller's workspace for every mode and weight type, and after a move",
                   "[spec][infinigen][workspace]", kvscout::half, kvscout::bfloat16, float) {
  using P = kvscout::infinigen_policy_host<float, TestType>;
  using mem = kvscout::detail::infinigen_host_memory<float, TestType>;
  constexpr int max_tokens = 80, stride = 84, r = 12;
  const slice m(2, 2, 3, 70, 23u, slice::keys::channel_offsets);
  const kvscout::host_span<const float> w{m.wq.data(), m.wq.size()}, b{m.bq.data(), m.bq.size()};
  const auto pad = [](std::size_t x) { return (x + 63) / 64 * 64; };
  std::vector<int32_t> lens{m.n, m.n - 5}, pos{m.pos, m.pos};
  const kvscout::score_context<kvscout::host_space> ctx{{m.x.data(), m.x.size()}, {m.q.data(), m.q.size()},
                                                        {pos.data(), 2}, {lens.data(), 2}};
  for (const auto mode : {kvscout::rope_mode::post_rope_skew, kvscout::rope_mode::rope_planes,
                          kvscout::rope_mode::pre_rope_folded}) {
    CAPTURE(kvscout::to_string(mode));
    const kvscout::infinigen_config pc{.shape = {.num_seqs = m.S, .num_kv_heads = m.H,
                                                 .num_q_heads = m.Hq, .head_dim = D,
                                                 .d_model = m.d_model, .max_tokens = max_tokens,
                                                 .scale = 0.125f},
                                       .r = r, .mode = mode};
    const std::vector<kvscout::skew_plan> plans = m.plans(r, mode, 9u);
    // Per query head: the rows (head_dim of them for the skew, r otherwise) in the weight type,
    // the bias, the skew's rotation [head_dim, r], the planes [r / 2], each piece padded to 64.
    const bool skew = mode == kvscout::rope_mode::post_rope_skew;
    const std::size_t rows = skew ? D : r;
    const std::size_t head = pad(rows * m.d_model * sizeof(TestType)) + pad(4 * rows) + (skew ? pad(4 * D * r) : 0) +
                             (mode == kvscout::rope_mode::rope_planes ? pad(4 * (r / 2)) : 0);
    const std::size_t need = P::workspace_bytes(pc);
    REQUIRE(need == mem::scratch_bytes(pc) + pad(P::key_store::memory_bytes(m.S, m.H, r, max_tokens)) +
                        static_cast<std::size_t>(m.Hq) * head);
    kvscout::host_workspace ws(need + 64, P::workspace_alignment);
    std::memset(ws.data(), 0xAB, ws.size());
    auto own_ws = kvscout::make_workspace<P>(pc);
    P theirs(pc, plans, w, b, ws.span().subspan(0, need));
    P own(pc, plans, w, b, own_ws.span());
    append_one(theirs, m);
    append_one(own, m);
    P moved(std::move(theirs));  // its cache and weights stay where they were
    std::vector<float> a, c;
    const auto ab = kvtest::nan_score_buffer(a, m.S, m.H, stride), cb = kvtest::nan_score_buffer(c, m.S, m.H, stride);
    moved.score(ctx, ab);
    own.score(ctx, cb);
    int scored = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      REQUIRE((std::isnan(a[i]) ? std::isnan(c[i]) : a[i] == c[i]));
      scored += !std::isnan(a[i]);
    }
    REQUIRE(scored == m.H * (lens[0] + lens[1]));
    for (std::size_t i = need; i < need + 64; ++i) REQUIRE(ws.data()[i] == std::byte{0xAB});
  }
}
