// The host decode pipeline on a small Llama-shaped model (toy_model.hpp): with a budget of every
// token, sparse decoding equals dense decoding for every policy; with a small budget only the
// selected rows move, and the oracle's selection carries at least as much attention mass as any
// other policy's at the same budget.

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "../common/counting_executor.hpp"
#include "kvscout/calibrate.hpp"
#include "kvscout/core/configured.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/eval/metrics.hpp"
#include "kvscout/pipeline/host_pipeline.hpp"
#include "kvscout/preset_pipeline.hpp"
#include "kvscout/presets.hpp"
#include "kvscout/score/h2o.hpp"
#include "kvscout/score/infinigen.hpp"
#include "kvscout/score/infinigen_query_scores.hpp"
#include "kvscout/score/oracle.hpp"
#include "kvscout/score/quest.hpp"
#include "kvscout/score/streaming.hpp"
#include "kvscout/select/threshold.hpp"
#include "kvscout/select/topk.hpp"
#include "kvscout/skew/calibrate.hpp"
#include "toy_model.hpp"

namespace {

constexpr int D = 64, L = 4, Hq = 6, H = 2, S = 2, max_tokens = 96, prompt = 48, steps = 6;
// The step's shape; every config below holds it (a part reads the fields it needs).
const kvscout::decode_shape shape{.num_layers = L, .num_seqs = S, .num_kv_heads = H,
                                  .num_q_heads = Hq, .max_tokens = max_tokens, .scale = 0.125f};
// The InfiniGen policy's, which also needs the model's widths.
kvscout::decode_shape shape_of(int d_model) {
  kvscout::decode_shape s = shape;
  s.head_dim = D;
  s.d_model = d_model;
  return s;
}
using T = kvscout::half;
using model = kvtest::toy_model<T, D>;
using layout = model::layout;

// The host pipeline is for full-precision layouts; over a KIVI cache it does not compile (its
// rows would be read as full-precision elements).
template <class Lay>
concept host_pipeline_for =
    requires { typename kvscout::decode_pipeline_host<Lay, kvscout::streaming_policy_host,
                                                      kvscout::topk_selector_host>; };
static_assert(host_pipeline_for<layout>);
static_assert(!host_pipeline_for<kvscout::kivi_layout<T, D, 2>>);

// Every configured host component hands back its configuration the same way.
static_assert(kvscout::configured<kvscout::decode_pipeline_host<layout, kvscout::streaming_policy_host,
                                                                kvscout::topk_selector_host>>);
static_assert(kvscout::configured<kvscout::topk_selector_host>);
static_assert(kvscout::configured<kvscout::threshold_selector_host>);
static_assert(kvscout::configured<kvscout::gather_executor_host<layout>>);
static_assert(kvscout::configured<kvscout::streaming_policy_host>);
static_assert(kvscout::configured<kvscout::h2o_policy_host>);
static_assert(kvscout::configured<kvscout::quest_policy_host<D>>);
static_assert(kvscout::configured<kvscout::oracle_policy_host<layout>>);
static_assert(kvscout::configured<kvscout::infinigen_policy_host<>>);
static_assert(!kvscout::configured<int>);

// What a pipeline takes besides its policy and selector, owned here (the caller): the executor
// (the host gather, from the pipeline's config) and both workspaces.
template <class Pipe>
struct pipe_memory {
  using executor_type = typename Pipe::executor_type;
  explicit pipe_memory(const kvscout::host_pipeline_config& pc)
      : gather_ws(kvscout::make_workspace<executor_type>(pc.gather_config())),
        gather(pc.gather_config(), gather_ws.span()),
        ws(kvscout::make_workspace<Pipe>(pc)) {}
  kvscout::host_workspace gather_ws;
  executor_type gather;
  kvscout::host_workspace ws;
};

// A pipeline built from a config and its own memory, thrown away: what construction refuses.
template <class Pipe, class P, class Sel>
void build(const kvscout::host_pipeline_config& pc, P& policy, Sel& sel) {
  pipe_memory<Pipe> mem(pc);
  const Pipe pipe(pc, policy, sel, mem.gather, mem.ws.span());
}

// A pipeline over `policy` with a top-k selector of config sc, and everything else it needs (the
// selector, the executor and the workspaces), owned here: the set-up the tests share.
template <class Policy, class Lay = layout>
struct topk_pipeline {
  using pipe_t = kvscout::decode_pipeline_host<Lay, Policy, kvscout::topk_selector_host>;
  topk_pipeline(const kvscout::host_pipeline_config& pc, Policy& policy,
                const kvscout::topk_selector_host::config& sc)
      : sel_ws(kvscout::make_workspace<kvscout::topk_selector_host>(sc)),
        sel(sc, sel_ws.span()),
        mem(pc),
        pipe(pc, policy, sel, mem.gather, mem.ws.span()) {}
  kvscout::host_workspace sel_ws;
  kvscout::topk_selector_host sel;
  pipe_memory<pipe_t> mem;
  pipe_t pipe;
};

// An infinigen policy per speculated layer, their workspaces owned.
using infinigen_layers = kvscout::policy_layers<kvscout::infinigen_policy_host<>>;
struct owned_infinigen {
  owned_infinigen(const kvscout::infinigen_config& cfg,
                  const std::vector<std::vector<kvscout::skew_plan>>& plans,
                  const std::vector<kvscout::host_span<const float>>& wq,
                  const std::vector<kvscout::host_span<const float>>& bq)
      : policy(kvscout::infinigen_policy_host<>::layers(cfg, plans, wq, bq)) {}
  infinigen_layers policy;
};

// Skew plans from a calibration run of the same weights on another prompt.
std::vector<std::vector<kvscout::skew_plan>> calibrate(kvscout::rope_mode mode, int r) {
  model m(L, Hq, H, 1, max_tokens, 1234);
  m.collect = true;
  kvscout::streaming_policy_host sp({{.num_kv_heads = H}, 4});
  topk_pipeline<kvscout::streaming_policy_host> tp({{.num_layers = L, .num_seqs = 1,
                                                    .num_kv_heads = H, .num_q_heads = Hq,
                                                    .max_tokens = max_tokens, .scale = 0.125f}, L,
                                                    8, 1}, sp,
                                                   {{.num_seqs = 1, .num_kv_heads = H,
                                                    .max_tokens = max_tokens}, 8, 8, {}});
  auto& pipe = tp.pipe;
  std::vector<float> hs;
  for (int t = 0; t < 64; ++t) m.step(pipe, hs, m.embedding(9000u + t), true);
  std::vector<std::vector<kvscout::skew_plan>> plans(L);
  const int g = Hq / H, n = 64;
  for (int l = 2; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      std::vector<float> qs(static_cast<std::size_t>(n) * g * D), ks(static_cast<std::size_t>(n) * D);
      for (int t = 0; t < n; ++t) {
        std::copy_n(&m.q_samples[l][(static_cast<std::size_t>(t) * Hq + h * g) * D], g * D, &qs[static_cast<std::size_t>(t) * g * D]);
        std::copy_n(&m.k_samples[l][(static_cast<std::size_t>(t) * H + h) * D], D, &ks[static_cast<std::size_t>(t) * D]);
      }
      plans[l].push_back(kvscout::calibrate_skew({qs.data(), qs.size()}, {ks.data(), ks.size()}, n, g, D,
                                                 {r, false, mode, m.rope}));
    }
  return plans;
}

// Runs prompt + decode steps with `policy` and a top-k selector of `budget`; returns the final
// residual stream and lets the caller inspect the pipeline after each step.
template <class Policy, class Inspect>
std::vector<float> run(model& m, Policy& policy, int budget, Inspect&& inspect,
                       kvscout::gather_stores stores = kvscout::gather_stores::automatic) {
  kvscout::host_pipeline_config pc{shape,
                                   2,
                                   budget,
                                   2};
  pc.stores = stores;
  topk_pipeline<Policy> tp(pc, policy, {shape, budget, budget, {}});
  auto& pipe = tp.pipe;
  std::vector<float> hs;
  for (int t = 0; t < prompt; ++t) m.step(pipe, hs, m.embedding(100u + t), true);
  for (int t = 0; t < steps; ++t) {
    m.step(pipe, hs, m.embedding(500u + t));
    inspect(pipe);
  }
  return hs;
}

std::vector<float> run_dense() {
  model m(L, Hq, H, S, max_tokens, 77);
  kvscout::streaming_policy_host p({{.num_kv_heads = H}, 4});
  std::vector<float> hs;
  topk_pipeline<kvscout::streaming_policy_host> tp({shape, L,
                                                    8, 1}, p,
                                                   {shape, 8, 8, {}});
  auto& pipe = tp.pipe;
  for (int t = 0; t < prompt; ++t) m.step(pipe, hs, m.embedding(100u + t), true);
  for (int t = 0; t < steps; ++t) m.step(pipe, hs, m.embedding(500u + t), true);
  return hs;
}

auto no_inspect = [](auto&) {};

}  // namespace

TEST_CASE("with a budget of every token the pipeline equals dense decoding", "[pipeline]") {
  const std::vector<float> dense = run_dense();
  auto check = [&](const std::vector<float>& hs, const char* name) {
    CAPTURE(name);
    const double err = kvscout::relative_error({hs.data(), hs.size()}, {dense.data(), dense.size()});
    CAPTURE(err);
    REQUIRE(err <= 1e-6);  // same rows, same order, same arithmetic
  };
  {
    model m(L, Hq, H, S, max_tokens, 77);
    kvscout::streaming_policy_host p({{.num_kv_heads = H}, 4});
    check(run(m, p, max_tokens, no_inspect), "streaming");
  }
  {
    model m(L, Hq, H, S, max_tokens, 77);
    kvscout::h2o_policy_host p({shape});
    check(run(m, p, max_tokens, no_inspect), "h2o");
  }
  {
    model m(L, Hq, H, S, max_tokens, 77);
    kvscout::quest_policy_host<D> p({shape,
                                     16});
    check(run(m, p, max_tokens, no_inspect), "quest");
  }
  {
    model m(L, Hq, H, S, max_tokens, 77);
    std::vector<kvscout::kv_view<layout, kvscout::host_space>> views;
    for (int l = 0; l < L; ++l) views.push_back(m.view(l));
    kvscout::oracle_policy_host<layout> p({{.num_q_heads = Hq, .scale = 0.125f}}, views);
    check(run(m, p, max_tokens, no_inspect), "oracle");
  }
  for (auto mode : {kvscout::rope_mode::post_rope_skew, kvscout::rope_mode::rope_planes}) {
    model m(L, Hq, H, S, max_tokens, 77);
    const auto plans = calibrate(mode, 16);
    std::vector<kvscout::host_span<const float>> wq, bq(L);
    for (int l = 0; l < L; ++l) wq.push_back({m.wq[l].data(), m.wq[l].size()});
    owned_infinigen p({shape_of(m.d)},
                      plans, wq, bq);
    check(run(m, p.policy, max_tokens, no_inspect), kvscout::to_string(mode));
  }
}

TEST_CASE("a small budget moves only the selected rows and the oracle carries the most mass",
          "[pipeline]") {
  constexpr int budget = 12;
  model m(L, Hq, H, S, max_tokens, 77);
  const auto plans = calibrate(kvscout::rope_mode::post_rope_skew, 16);
  std::vector<kvscout::host_span<const float>> wq, bq(L);
  for (int l = 0; l < L; ++l) wq.push_back({m.wq[l].data(), m.wq[l].size()});
  owned_infinigen owned({shape_of(m.d)},
                        plans, wq, bq);
  infinigen_layers& ig = owned.policy;
  // At every speculated layer of every decode step: the true attention probabilities of the
  // cached tokens (dense, on the state the pipeline is decoding), the oracle's top-budget set by
  // those probabilities, and the mass each set covers.
  std::vector<kvscout::kv_view<layout, kvscout::host_space>> views;
  for (int l = 0; l < L; ++l) views.push_back(m.view(l));
  kvscout::oracle_policy_host<layout> oracle({{.num_q_heads = Hq, .scale = 0.125f},
                                              kvscout::gqa_aggregation::sum_prob}, views);
  kvscout::topk_selector_host::config oc{shape, budget, budget, {}};
  auto ows = kvscout::make_workspace<kvscout::topk_selector_host>(oc);
  kvscout::topk_selector_host oracle_sel(oc, ows.span());
  std::vector<float> scores(static_cast<std::size_t>(S) * H * max_tokens), probs(static_cast<std::size_t>(S) * H * (max_tokens + 1));
  std::vector<int32_t> oidx(static_cast<std::size_t>(S) * H * budget), ocnt(S * H);
  std::vector<float> out(static_cast<std::size_t>(S) * Hq * D);
  double ig_mass = 0, oracle_mass = 0, random_mass = 0;
  int samples = 0;
  // Rows each layer re-selects from its previous step, counted independently of the pipeline.
  std::vector<std::vector<std::vector<int32_t>>> previous(L, std::vector<std::vector<int32_t>>(S * H));
  std::vector<std::int64_t> reused(L, 0);
  const kvscout::decode_pipeline_host<layout, infinigen_layers, kvscout::topk_selector_host>* live = nullptr;
  m.on_attend = [&](int l, const kvscout::score_context<kvscout::host_space>& ctx, const kvscout::current_token<T>&) {
    if (live == nullptr || l < 2) return;
    kvscout::decode_attention_host(kvscout::layout_rows_host(m.view(l)), kvscout::current_token<T>{}, ctx.q,
                                   {out.data(), out.size()}, {Hq, 0.125f}, {probs.data(), probs.size()},
                                   max_tokens + 1);
    oracle.score(l, ctx, {{scores.data(), scores.size()}, S, H, max_tokens});
    oracle_sel.select({{scores.data(), scores.size()}, ctx.seq_lens, S, H, max_tokens},
                      {{oidx.data(), oidx.size()}, {ocnt.data(), ocnt.size()}, S, H, budget});
    const auto sel = live->last_selection(l);
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h) {
        const float* p = &probs[(static_cast<std::size_t>(s) * H + h) * (max_tokens + 1)];
        const int n = ctx.seq_lens[s], r = s * H + h;
        REQUIRE(sel.counts[r] == budget);
        const double mi = kvscout::attention_mass_recall(p, n, &sel.indices[static_cast<std::size_t>(r) * budget], budget);
        const double mo = kvscout::attention_mass_recall(p, n, &oidx[static_cast<std::size_t>(r) * budget], ocnt[r]);
        REQUIRE(mo >= mi - 1e-6);  // top-k by true mass maximises the mass
        const int32_t* cur = &sel.indices[static_cast<std::size_t>(r) * budget];
        std::vector<int32_t> both;
        std::set_intersection(previous[l][r].begin(), previous[l][r].end(), cur, cur + budget,
                              std::back_inserter(both));
        reused[l] += static_cast<std::int64_t>(both.size());
        previous[l][r].assign(cur, cur + budget);
        ig_mass += mi, oracle_mass += mo, random_mass += static_cast<double>(budget) / n;
        ++samples;
      }
  };
  topk_pipeline<infinigen_layers> tp(
      {shape,
       2,
       budget,
       2},
      ig, {shape, budget, budget, {}});
  auto& pipe = tp.pipe;
  std::vector<float> hs;
  for (int t = 0; t < prompt; ++t) m.step(pipe, hs, m.embedding(100u + t), true);
  live = &pipe;
  for (int t = 0; t < steps; ++t) m.step(pipe, hs, m.embedding(500u + t));
  REQUIRE(samples == steps * (L - 2) * S * H);
  // Only the selected rows moved: budget rows per (sequence, kv head) per step, K and V.
  for (int l = 2; l < L; ++l) {
    REQUIRE(pipe.stats().rows[l] == static_cast<std::int64_t>(steps) * S * H * budget);
    REQUIRE(pipe.stats().bytes[l] == pipe.stats().rows[l] * 2 * D * static_cast<std::int64_t>(sizeof(T)));
  }
  REQUIRE(pipe.stats().rows[0] == 0);
  // Reuse: the pipeline's count equals the independent one, and consecutive steps share rows.
  std::int64_t reused_total = 0;
  for (int l = 0; l < L; ++l) {
    CAPTURE(l);
    REQUIRE(pipe.stats().reused[l] == reused[l]);
    reused_total += reused[l];
  }
  INFO("rows re-selected from the previous step: " << reused_total << " of "
                                                    << steps * (L - 2) * S * H * budget);
  CHECK(reused_total > 0);
  ig_mass /= samples, oracle_mass /= samples, random_mass /= samples;
  INFO("attention mass at budget " << budget << ": infinigen " << ig_mass << ", oracle " << oracle_mass
                                   << ", uniform expectation " << random_mass);
  CHECK(ig_mass > 1.5 * random_mass);
  CHECK(ig_mass <= oracle_mass + 1e-9);
}

// An fp8 cache (K / k_scale, V / v_scale per layer): the pipeline hands the layer's scales to
// attention, dense and sparse alike; with every row selected, sparse gives dense's bits.
TEST_CASE("the pipeline attends an fp8 cache with the layer's scales", "[pipeline][fp8]") {
  using F = kvscout::fp8_e4m3;
  using Lay = kvscout::contiguous_layout<F, D, kvscout::hnd>;
  const int n = 40, cap = 48;
  std::vector<int32_t> lens = {n};
  const Lay l = Lay::padded(H, cap, lens.data(), 1);
  const kvscout::kv_scales scales{0.021f, 0.37f};
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<F> k(l.required_bytes() / sizeof(F)), v(k.size());
  for (auto& x : k) x = kvscout::from_float<F>(nd(rng) / scales.k);
  for (auto& x : v) x = kvscout::from_float<F>(nd(rng) / scales.v);
  const kvscout::kv_view<Lay, kvscout::host_space> kv{
      l, kvscout::as_bytes(kvscout::host_span<const F>(k.data(), k.size())),
      kvscout::as_bytes(kvscout::host_span<const F>(v.data(), v.size()))};
  std::vector<float> q(static_cast<std::size_t>(Hq) * D);
  for (auto& x : q) x = nd(rng);
  std::vector<int32_t> pos = {n};
  const kvscout::score_context<kvscout::host_space> ctx{{}, {q.data(), q.size()}, {pos.data(), 1}, {lens.data(), 1}};

  kvscout::streaming_policy_host sp({{.num_kv_heads = H}, 4});
  topk_pipeline<kvscout::streaming_policy_host, Lay> tp({{.num_layers = 3, .num_seqs = 1,
                                                         .num_kv_heads = H, .num_q_heads = Hq,
                                                         .max_tokens = cap, .scale = 0.125f}, 2,
                                                         cap, 1}, sp,
                                                        {{.num_seqs = 1, .num_kv_heads = H,
                                                         .max_tokens = cap}, cap, cap, {}});
  auto& pipe = tp.pipe;

  std::vector<float> want(q.size()), unscaled(q.size()), dense(q.size()), sparse(q.size());
  kvscout::attention_params ap{Hq, 0.125f, scales.k, scales.v};
  kvscout::decode_attention_host(kvscout::layout_rows_host(kv), kvscout::current_token<F>{},
                                 {q.data(), q.size()}, {want.data(), want.size()}, ap);
  kvscout::decode_attention_host(kvscout::layout_rows_host(kv), kvscout::current_token<F>{},
                                 {q.data(), q.size()}, {unscaled.data(), unscaled.size()},
                                 {Hq, 0.125f});
  pipe.attend(0, ctx, kv, {}, {dense.data(), dense.size()}, scales);  // below skip_layers
  pipe.speculate(2, ctx, kv);
  pipe.attend(2, ctx, kv, {}, {sparse.data(), sparse.size()}, scales);
  CHECK(dense == want);
  CHECK(sparse == want);
  CHECK(kvscout::relative_error({want.data(), want.size()}, {unscaled.data(), unscaled.size()}) >
        0.5);
}

TEST_CASE("pipeline misuse is reported", "[pipeline][errors]") {
  model m(L, Hq, H, S, max_tokens, 5);
  kvscout::streaming_policy_host p({{.num_kv_heads = H}, 4});
  topk_pipeline<kvscout::streaming_policy_host> tp({shape, 2,
                                                    8, 1}, p,
                                                   {shape, 8, 8, {}});
  auto& pipe = tp.pipe;
  using pipe_t = decltype(tp)::pipe_t;
  auto& sel = tp.sel;
  std::vector<float> q(S * Hq * D, 1.f), out(q.size());
  std::vector<int32_t> pos(S, 0);
  const kvscout::score_context<kvscout::host_space> ctx{{}, {q.data(), q.size()}, {pos.data(), pos.size()}, {m.lens.data(), m.lens.size()}};
  REQUIRE_THROWS_WITH(pipe.attend(3, ctx, m.view(3), {}, {out.data(), out.size()}),
                      Catch::Contains("attend(3) without speculate(3) first"));
  REQUIRE_THROWS_WITH(pipe.speculate(1, ctx, m.view(1)),
                      Catch::Contains("layer 1 is not speculated: expected [skip_layers = 2, num_layers = 4)"));
  REQUIRE_THROWS_WITH(build<pipe_t>({shape,
                                     2, max_tokens + 1, 1}, p, sel),
                      Catch::Contains("capacity = 97 must be in [1, max_tokens = 96]"));
  REQUIRE_THROWS_WITH(build<pipe_t>({{.num_layers = L, .num_seqs = S, .num_kv_heads = H,
                                     .num_q_heads = 5, .max_tokens = max_tokens, .scale = 0.125f},
                                     2, 8, 1}, p, sel),
                      Catch::Contains("num_q_heads = 5"));
  // A selector configured for another shape is refused when the pipeline is built.
  REQUIRE_THROWS_WITH(
      build<pipe_t>({shape,
                     2,
                     16,
                     1},
                    p, sel),
      Catch::Contains("selector configured for [num_seqs, num_kv_heads, max_tokens, "
                      "capacity] = [2, 2, 96, 8], expected the pipeline's [2, 2, "
                      "96, 16]"));
}

TEST_CASE("the pipeline decodes the same bits with cached and streaming gather stores",
          "[pipeline]") {
  // The store mode changes how the fetched rows are written, never what: the residual stream
  // after prompt + decode must be identical.
  const auto final_state = [](kvscout::gather_stores stores) {
    model m(L, Hq, H, S, max_tokens, 77);
    kvscout::streaming_policy_host p({{.num_kv_heads = H}, 4});
    return run(m, p, 12, [](const auto&) {}, stores);
  };
  const std::vector<float> cached = final_state(kvscout::gather_stores::cached);
  const std::vector<float> streaming = final_state(kvscout::gather_stores::streaming);
  REQUIRE(cached.size() == streaming.size());
  REQUIRE_FALSE(cached.empty());
  REQUIRE(std::memcmp(cached.data(), streaming.data(), cached.size() * sizeof(float)) == 0);
}

namespace {

// Rows listed by token index, read straight from the toy model's cache of one layer: the
// reference attention set of a correction step (independent of the gather and joined_rows_host).
struct listed_rows {
  static constexpr int head_dim = D;
  using element_type = T;
  const model* m;
  int layer;
  std::vector<std::vector<int32_t>> tokens;  // [S * H]
  int num_seqs() const { return S; }
  int num_kv_heads() const { return H; }
  int rows(int s, int h) const { return static_cast<int>(tokens[static_cast<std::size_t>(s) * H + h].size()); }
  int token(int s, int h, int i) const { return tokens[static_cast<std::size_t>(s) * H + h][static_cast<std::size_t>(i)]; }
  void load(const std::vector<std::vector<T>>& c, int s, int h, int i, float* dst) const {
    const std::size_t at = ((static_cast<std::size_t>(s) * H + h) * max_tokens + token(s, h, i)) * D;
    for (int e = 0; e < D; ++e) dst[e] = kvscout::to_float(c[static_cast<std::size_t>(layer)][at + e]);
  }
  void load_k(int s, int h, int i, float* dst) const { load(m->kc, s, h, i, dst); }
  void load_v(int s, int h, int i, float* dst) const { load(m->vc, s, h, i, dst); }
};
static_assert(kvscout::attention_rows<listed_rows>);

}  // namespace

TEST_CASE("the correction step fetches the rows the layer's own query ranks and speculation missed",
          "[pipeline][correction]") {
  constexpr int budget = 8, extra = 6;
  model m(L, Hq, H, S, max_tokens, 91);
  const auto plans = calibrate(kvscout::rope_mode::rope_planes, 16);
  std::vector<kvscout::host_span<const float>> wq, bq(L);
  for (int l = 0; l < L; ++l) wq.push_back({m.wq[l].data(), m.wq[l].size()});
  owned_infinigen owned({shape_of(m.d)},
                        plans, wq, bq);
  infinigen_layers& ig = owned.policy;
  const kvscout::keep_set keep{1, 2};
  kvscout::host_pipeline_config pc{shape,
                                   2,
                                   budget,
                                   2};
  pc.correction_capacity = extra;
  topk_pipeline<infinigen_layers> tp(pc, ig, {shape, budget,
                                                              budget, keep});
  auto& pipe = tp.pipe;
  // The test's own correction: the late scores of the same policy, the same selector semantics.
  const kvscout::correction_selector_host::config cc{shape, extra, extra};
  auto cws = kvscout::make_workspace<kvscout::correction_selector_host>(cc);
  kvscout::correction_selector_host corr(cc, cws.span());
  std::vector<float> late(static_cast<std::size_t>(S) * H * max_tokens), want_out(static_cast<std::size_t>(S) * Hq * D);
  std::vector<int32_t> aidx(static_cast<std::size_t>(S) * H * extra), acnt(S * H);
  std::int64_t added_total = 0, speculated_total = 0;
  bool live = false;
  int checked = 0;
  m.on_attend = [&](int l, const kvscout::score_context<kvscout::host_space>& ctx, const kvscout::current_token<T>& cur) {
    if (!live || l < 2) return;
    ig.score_query(l, ctx, {{late.data(), late.size()}, S, H, max_tokens});
    const auto spec = pipe.last_selection(l);
    corr.select({{late.data(), late.size()}, ctx.seq_lens, S, H, max_tokens}, spec,
                {{aidx.data(), aidx.size()}, {acnt.data(), acnt.size()}, S, H, extra});
    // The attention the step must compute: the speculated rows and the added ones, read from
    // the cache itself, and the current token.
    listed_rows ref{&m, l, std::vector<std::vector<int32_t>>(S * H)};
    for (int r = 0; r < S * H; ++r) {
      auto& t = ref.tokens[static_cast<std::size_t>(r)];
      t.assign(&spec.indices[static_cast<std::size_t>(r) * budget], &spec.indices[static_cast<std::size_t>(r) * budget] + spec.counts[r]);
      t.insert(t.end(), &aidx[static_cast<std::size_t>(r) * extra], &aidx[static_cast<std::size_t>(r) * extra] + acnt[r]);
      speculated_total += spec.counts[r];
      added_total += acnt[r];
    }
    kvscout::decode_attention_host(ref, cur, ctx.q, {want_out.data(), want_out.size()}, {Hq, 0.125f});
  };
  m.on_output = [&](int l, const std::vector<float>& out) {
    if (!live || l < 2) return;
    CAPTURE(l);
    REQUIRE(pipe.last_corrected_layer() == l);
    const auto got = pipe.last_correction();
    for (int r = 0; r < S * H; ++r) {
      REQUIRE(got.counts[r] == acnt[r]);
      for (int i = 0; i < acnt[r]; ++i)
        REQUIRE(got.indices[static_cast<std::size_t>(r) * budget + i] == aidx[static_cast<std::size_t>(r) * extra + i]);
    }
    const double err = kvscout::relative_error({out.data(), out.size()}, {want_out.data(), want_out.size()});
    CAPTURE(err);
    REQUIRE(err <= 1e-5);  // the same rows; the sums in another order
    ++checked;
  };
  std::vector<float> hs;
  for (int t = 0; t < prompt; ++t) m.step(pipe, hs, m.embedding(100u + t), true);
  live = true;
  for (int t = 0; t < steps; ++t) m.step(pipe, hs, m.embedding(500u + t));
  REQUIRE(checked == steps * (L - 2));
  // The speculation misses some of the late top-k, and the correction found them: none of
  // them was already fetched (the selector's definition, checked in test_correction.cpp).
  INFO("speculated " << speculated_total << " rows, corrected " << added_total);
  REQUIRE(added_total > 0);
  std::int64_t rows = 0, corrected = 0;
  for (int l = 0; l < L; ++l) rows += pipe.stats().rows[l], corrected += pipe.stats().corrected[l];
  REQUIRE(corrected == added_total);
  REQUIRE(rows == speculated_total + added_total);
  REQUIRE(pipe.stats().bytes[2] == pipe.stats().rows[2] * 2 * D * static_cast<std::int64_t>(sizeof(T)));
}

TEST_CASE("a correction step needs a policy that scores the layer's own query",
          "[pipeline][correction][errors]") {
  kvscout::streaming_policy_host sp({{.num_kv_heads = H}, 4});
  kvscout::topk_selector_host::config sc{shape, 8, 8, {}};
  auto ws = kvscout::make_workspace<kvscout::topk_selector_host>(sc);
  kvscout::topk_selector_host sel(sc, ws.span());
  kvscout::host_pipeline_config pc{shape,
                                   2,
                                   8,
                                   1};
  pc.correction_capacity = 4;
  using pipe_t = kvscout::decode_pipeline_host<layout, kvscout::streaming_policy_host, kvscout::topk_selector_host>;
  REQUIRE_THROWS_WITH(build<pipe_t>(pc, sp, sel), Catch::Contains("correction_capacity = 4 needs a policy that scores"));
  pc.correction_capacity = -1;
  REQUIRE_THROWS_WITH(build<pipe_t>(pc, sp, sel), Catch::Contains("correction_capacity = -1 must be in [0, capacity = 8]"));
  pc.correction_capacity = 9;
  REQUIRE_THROWS_WITH(build<pipe_t>(pc, sp, sel), Catch::Contains("correction_capacity = 9 must be in [0, capacity = 8]"));
  pc.correction_capacity = 0;
  pipe_memory<pipe_t> mem(pc);
  const pipe_t plain(pc, sp, sel, mem.gather, mem.ws.span());
  REQUIRE(plain.last_correction().num_seqs == 0);  // no correction: an empty view, not a shape
  REQUIRE(plain.last_correction().counts.empty());
}

TEST_CASE("the late ranking alone runs as a policy that needs the query, fed by the pipeline's appends",
          "[pipeline][correction]") {
  // infinigen_query_scores_host: layer l's own query against the partial keys, selected inside
  // attend(). Its appends reach the wrapped policy: after the run, the partial key of the last
  // token is the projection of the key the cache holds.
  constexpr int budget = 10;
  model m(L, Hq, H, S, max_tokens, 93);
  const auto plans = calibrate(kvscout::rope_mode::rope_planes, 16);
  std::vector<kvscout::host_span<const float>> wq, bq(L);
  for (int l = 0; l < L; ++l) wq.push_back({m.wq[l].data(), m.wq[l].size()});
  owned_infinigen owned({shape_of(m.d)},
                        plans, wq, bq);
  infinigen_layers& ig = owned.policy;
  kvscout::infinigen_query_scores_host<infinigen_layers> late(ig);
  const kvscout::topk_selector_host::config sc{shape, budget, budget, {}};
  topk_pipeline<decltype(late)> tp({shape,
                                    2, budget, 1}, late, sc);
  auto& pipe = tp.pipe;
  // The selection the late ranking must make at each sparse layer, from the same scores.
  auto ows = kvscout::make_workspace<kvscout::topk_selector_host>(sc);
  kvscout::topk_selector_host ref_sel(sc, ows.span());
  std::vector<float> scores(static_cast<std::size_t>(S) * H * max_tokens);
  std::vector<int32_t> idx(static_cast<std::size_t>(S) * H * budget), cnt(S * H);
  int checked = 0;
  bool live = false;
  m.on_attend = [&](int l, const kvscout::score_context<kvscout::host_space>& ctx, const kvscout::current_token<T>&) {
    if (!live || l < 2) return;
    ig.score_query(l, ctx, {{scores.data(), scores.size()}, S, H, max_tokens});
    ref_sel.select({{scores.data(), scores.size()}, ctx.seq_lens, S, H, max_tokens},
                   {{idx.data(), idx.size()}, {cnt.data(), cnt.size()}, S, H, budget});
  };
  m.on_output = [&](int l, const std::vector<float>&) {
    if (!live || l < 2) return;
    const auto got = pipe.last_selection(l);
    for (int r = 0; r < S * H; ++r) {
      REQUIRE(got.counts[r] == cnt[r]);
      for (int i = 0; i < cnt[r]; ++i) REQUIRE(got.indices[static_cast<std::size_t>(r) * budget + i] == idx[static_cast<std::size_t>(r) * budget + i]);
    }
    ++checked;
  };
  std::vector<float> hs;
  for (int t = 0; t < prompt; ++t) m.step(pipe, hs, m.embedding(100u + t), true);
  live = true;
  for (int t = 0; t < steps; ++t) m.step(pipe, hs, m.embedding(500u + t));
  REQUIRE(checked == steps * (L - 2));
  // The appends went through: layer 2's partial key of the last token is its key's planes.
  const int t_last = prompt + steps - 1;
  const auto& pl = plans[2][0];
  for (int c = 0; c < pl.r; ++c) {
    const float k = kvscout::to_float(m.kc[2][(static_cast<std::size_t>(0) * max_tokens + t_last) * D + pl.channels[static_cast<std::size_t>(c)]]);
    REQUIRE(ig[2].keys().at(0, 0, c, t_last) == Approx(k).epsilon(2e-3).margin(2e-3));
  }
  REQUIRE(ig.num_layers() == L);
}

namespace {

// A second executor type: the host gather behind a wrapper that counts what it is asked to move
// (tests/common/counting_executor.hpp). It has no pool(), so a pipeline over it attends on the
// calling thread alone.
using counting_executor = kvtest::counting_executor<kvscout::gather_executor_host<layout>>;
static_assert(kvscout::prefetch_executor<counting_executor>);
static_assert(kvscout::host_step_executor<counting_executor, layout>);
static_assert(kvscout::host_step_executor<kvscout::gather_executor_host<layout>, layout>);
// An executor of another layout's rows, or no executor at all, does not make a pipeline.
static_assert(!kvscout::host_step_executor<counting_executor, kvscout::contiguous_layout<float, D, kvscout::hnd>>);
template <class E>
concept pipeline_with_executor = requires {
  typename kvscout::decode_pipeline_host<layout, kvscout::streaming_policy_host,
                                         kvscout::topk_selector_host, E>;
};
static_assert(pipeline_with_executor<counting_executor>);
static_assert(!pipeline_with_executor<int>);
static_assert(!pipeline_with_executor<kvscout::gather_executor_host<kvscout::contiguous_layout<float, D, kvscout::hnd>>>);
// The default executor is the host gather: the three-argument name is the same type.
static_assert(std::is_same_v<
              kvscout::decode_pipeline_host<layout, kvscout::streaming_policy_host, kvscout::topk_selector_host>,
              kvscout::decode_pipeline_host<layout, kvscout::streaming_policy_host, kvscout::topk_selector_host,
                                            kvscout::gather_executor_host<layout>>>);

}  // namespace

TEST_CASE("the pipeline drives any host prefetch_executor: a counting wrapper decodes the same bits",
          "[pipeline][executor]") {
  const int budget = 16;
  kvscout::topk_selector_host::config sc{shape, budget, budget, {}};
  auto sel_ws = kvscout::make_workspace<kvscout::topk_selector_host>(sc);
  kvscout::topk_selector_host sel(sc, sel_ws.span());
  kvscout::host_pipeline_config pc{shape,
                                   2,
                                   budget,
                                   2};
  const auto decode = [&](auto& pipe, model& m) {
    std::vector<float> hs;
    for (int t = 0; t < prompt; ++t) m.step(pipe, hs, m.embedding(100u + t), true);
    for (int t = 0; t < steps; ++t) m.step(pipe, hs, m.embedding(500u + t));
    return hs;
  };
  // The default: the host gather with 2 threads, which the attention shares.
  using gather_pipe = kvscout::decode_pipeline_host<layout, kvscout::streaming_policy_host,
                                                    kvscout::topk_selector_host>;
  model m1(L, Hq, H, S, max_tokens, 42);
  kvscout::streaming_policy_host p1({{.num_kv_heads = H}, 4});
  pipe_memory<gather_pipe> mem(pc);
  gather_pipe with_gather(pc, p1, sel, mem.gather, mem.ws.span());
  const std::vector<float> want = decode(with_gather, m1);
  // The counting wrapper, its workspace and the pipeline's: the caller's.
  using counting_pipe = kvscout::decode_pipeline_host<layout, kvscout::streaming_policy_host,
                                                      kvscout::topk_selector_host, counting_executor>;
  model m2(L, Hq, H, S, max_tokens, 42);
  kvscout::streaming_policy_host p2({{.num_kv_heads = H}, 4});
  auto exec_ws = kvscout::make_workspace<counting_executor>(pc.gather_config());
  counting_executor counting(pc.gather_config(), exec_ws.span());
  auto ws = kvscout::make_workspace<counting_pipe>(pc);
  counting_pipe with_counting(pc, p2, sel, counting, ws.span());
  const std::vector<float> got = decode(with_counting, m2);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    REQUIRE(std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(want[i]));
  }
  // Every speculated layer of every decode step went through the wrapper, and only those.
  REQUIRE(counting.submits == steps * (L - 2));
  std::int64_t rows = 0;
  for (int l = 0; l < L; ++l) rows += with_counting.stats().rows[l];
  REQUIRE(rows > 0);
  REQUIRE(counting.rows == rows);
  REQUIRE(rows == with_gather.stats().rows[2] + with_gather.stats().rows[3]);
}

TEST_CASE("the pipeline takes its buffers in the caller's workspace and checks it",
          "[pipeline][errors][workspace]") {
  kvscout::streaming_policy_host p({{.num_kv_heads = H}, 4});
  kvscout::topk_selector_host::config sc{shape, 8, 8, {}};
  auto sel_ws = kvscout::make_workspace<kvscout::topk_selector_host>(sc);
  kvscout::topk_selector_host sel(sc, sel_ws.span());
  using pipe_t = kvscout::decode_pipeline_host<layout, kvscout::streaming_policy_host, kvscout::topk_selector_host>;
  kvscout::host_pipeline_config pc{shape,
                                   2,
                                   8,
                                   1};
  pipe_memory<pipe_t> mem(pc);
  const std::size_t need = pipe_t::workspace_bytes(pc);
  SECTION("its size: the regions the header lists, each from a cache line") {
    const auto line = [](std::size_t n) { return (n + 63) / 64 * 64; };
    const std::size_t pairs = S * H, slots = pairs * 8;
    const std::size_t buffer = line(slots * 4) + line(pairs * 4) + 2 * line(slots * D * sizeof(T));
    const std::size_t without_reuse = line(pairs * max_tokens * 4) + line(pairs * 4) +
                                      line(pairs * (8 + 1) * 4) + 2 * buffer;
    REQUIRE(need == without_reuse + L * pairs * (8 + 1) * 4);
    REQUIRE(mem.ws.size() == need);
    pc.track_reuse = false;
    REQUIRE(pipe_t::workspace_bytes(pc) == without_reuse);
  }
  SECTION("too small, misaligned, null: refused, naming the value and what was expected") {
    kvscout::host_workspace big(need + 128, 64);
    REQUIRE_THROWS_WITH(pipe_t(pc, p, sel, mem.gather, {big.data(), need - 1}),
                        Catch::Contains("decode_pipeline_host: workspace holds " +
                                        std::to_string(need - 1) +
                                        " bytes, expected at least workspace_bytes(config) = " +
                                        std::to_string(need)));
    REQUIRE_THROWS_WITH(pipe_t(pc, p, sel, mem.gather, {big.data() + 32, need}),
                        Catch::Contains("decode_pipeline_host: workspace must be 64-byte aligned, "
                                        "got address"));
    REQUIRE_THROWS_WITH(pipe_t(pc, p, sel, mem.gather, {static_cast<std::byte*>(nullptr), need}),
                        Catch::Contains("decode_pipeline_host: workspace is null"));
    REQUIRE_NOTHROW(pipe_t(pc, p, sel, mem.gather, {big.data() + 64, need + 64}));
  }
  SECTION("an executor configured for another shape is refused when the pipeline is built") {
    kvscout::host_gather_config gc = pc.gather_config();
    gc.capacity = 16;
    auto gws = kvscout::make_workspace<kvscout::gather_executor_host<layout>>(gc);
    kvscout::gather_executor_host<layout> other(gc, gws.span());
    REQUIRE_THROWS_WITH(pipe_t(pc, p, sel, other, mem.ws.span()),
                        Catch::Contains("executor configured for [num_seqs, num_kv_heads, "
                                        "capacity] = [2, 2, 16], expected the pipeline's [2, 2, 8]"));
  }
  SECTION("what the workspace held before does not matter") {
    std::fill_n(mem.ws.data(), need, std::byte{0xff});
    const pipe_t pipe(pc, p, sel, mem.gather, mem.ws.span());
    const auto s0 = pipe.last_selection(2);
    for (int c : s0.counts) REQUIRE(c == 0);
  }
}

TEST_CASE("per-layer selectors give each layer its own budget", "[pipeline][budgets]") {
  // Layer 2 takes 4 rows, layer 3 takes 12, within one capacity of 16 (layer_budget_shares'
  // use: budgets that follow the attention).
  constexpr int cap = 16;
  using pipe_t =
      kvscout::decode_pipeline_host<layout, kvscout::streaming_policy_host, kvscout::topk_selector_host>;
  const kvscout::host_pipeline_config pc{shape, 2, cap, 1};
  const auto make = [](int budget) {
    return kvscout::topk_selector_host::config{shape, cap, budget, {}};
  };
  auto ws4 = kvscout::make_workspace<kvscout::topk_selector_host>(make(4));
  auto ws12 = kvscout::make_workspace<kvscout::topk_selector_host>(make(12));
  auto ws16 = kvscout::make_workspace<kvscout::topk_selector_host>(make(cap));
  kvscout::topk_selector_host sel4(make(4), ws4.span()), sel12(make(12), ws12.span()), sel16(make(cap), ws16.span());
  const auto decode = [&](std::vector<kvscout::topk_selector_host*> sels, std::vector<std::int64_t>& rows) {
    model m(L, Hq, H, S, max_tokens, 91);
    kvscout::streaming_policy_host p({{.num_kv_heads = H}, 4});
    pipe_memory<pipe_t> mem(pc);
    pipe_t pipe = sels.empty() ? pipe_t(pc, p, sel16, mem.gather, mem.ws.span())
                               : pipe_t(pc, p, std::move(sels), mem.gather, mem.ws.span());
    std::vector<float> hs;
    for (int t = 0; t < prompt; ++t) m.step(pipe, hs, m.embedding(100u + t), true);
    for (int t = 0; t < steps; ++t) m.step(pipe, hs, m.embedding(500u + t));
    rows = pipe.stats().rows;
    return hs;
  };
  std::vector<std::int64_t> rows_shared, rows_same, rows_split;
  const auto shared = decode({}, rows_shared);
  // One selector given per layer is the shared selector: the same bits.
  REQUIRE(decode({nullptr, nullptr, &sel16, &sel16}, rows_same) == shared);
  REQUIRE(rows_same == rows_shared);
  // Different budgets: every decode step moves S * H * budget rows at each speculated layer (the
  // rows are longer than 12 from the prompt on).
  const auto split = decode({nullptr, nullptr, &sel4, &sel12}, rows_split);
  REQUIRE(rows_split[2] == static_cast<std::int64_t>(steps) * S * H * 4);
  REQUIRE(rows_split[3] == static_cast<std::int64_t>(steps) * S * H * 12);
  REQUIRE(split != shared);
  // Refusals: one per layer, none null where speculated, each with the pipeline's shape.
  kvscout::streaming_policy_host p({{.num_kv_heads = H}, 4});
  pipe_memory<pipe_t> mem(pc);
  REQUIRE_THROWS_WITH(pipe_t(pc, p, std::vector<kvscout::topk_selector_host*>{&sel4, &sel4}, mem.gather, mem.ws.span()),
                      Catch::Contains("got 2 selectors, expected one per layer (num_layers = 4)"));
  REQUIRE_THROWS_WITH(pipe_t(pc, p, std::vector<kvscout::topk_selector_host*>{&sel4, &sel4, &sel4, nullptr}, mem.gather, mem.ws.span()),
                      Catch::Contains("layer 3 is speculated (skip_layers = 2) but its selector is null"));
  const kvscout::topk_selector_host::config other{shape, 8, 4, {}};
  auto wso = kvscout::make_workspace<kvscout::topk_selector_host>(other);
  kvscout::topk_selector_host sel_other(other, wso.span());
  REQUIRE_THROWS_WITH(
      pipe_t(pc, p, std::vector<kvscout::topk_selector_host*>{nullptr, nullptr, &sel4, &sel_other},
             mem.gather, mem.ws.span()),
      Catch::Contains("layer 3's selector configured for [num_seqs, num_kv_heads, max_tokens, "
                      "capacity] = [2, 2, 96, 8]"));
}

TEST_CASE(
    "a preset's step budgets: each layer's rows follow the cached length, the correction tops them "
    "up",
    "[pipeline][budgets][correction]") {
  auto p = kvscout::presets::kvscout_default(D);
  p.keep = {1, 2};  // a keep-set below the budgets at these lengths
  const std::vector<double> layer_shares{1.0, 1.0, 0.6, 1.4};
  const double budget = 0.4;
  const kvscout::presets::step_budgets b =
      kvscout::presets::budgets(p, shape, budget, layer_shares);
  REQUIRE(b.speculated[2] == budget * 0.75 * 0.6);
  REQUIRE(b.total[3] == (budget * 0.75 + budget * 0.25) * 1.4);
  model m(L, Hq, H, S, max_tokens, 91);
  const auto plans = calibrate(kvscout::rope_mode::rope_planes, 16);
  std::vector<kvscout::host_span<const float>> wq, bq(L);
  for (int l = 0; l < L; ++l) wq.push_back({m.wq[l].data(), m.wq[l].size()});
  owned_infinigen owned({shape_of(m.d)}, plans, wq, bq);
  kvscout::host_pipeline_config pc{
      .shape = shape, .skip_layers = 2, .capacity = b.capacity, .threads = 2};
  pc.correction_capacity = b.correction_capacity;
  pc.correction_shares = b.correction_shares();
  const kvscout::detail::layer_selectors selectors(shape, b);
  const std::vector<kvscout::topk_selector_host*>& per_layer = selectors.pointers();
  REQUIRE(per_layer.size() == L);
  REQUIRE((per_layer[0] == nullptr && per_layer[1] == nullptr));
  for (int l = 2; l < L; ++l) {
    REQUIRE(per_layer[static_cast<std::size_t>(l)]->configuration().budget_share ==
            b.speculated[static_cast<std::size_t>(l)]);
    REQUIRE(per_layer[static_cast<std::size_t>(l)]->configuration().capacity == b.capacity);
  }
  using pipe_t = kvscout::decode_pipeline_host<layout, infinigen_layers,
                                               kvscout::topk_selector_host>;
  pipe_memory<pipe_t> mem(pc);
  pipe_t pipe(pc, owned.policy, per_layer, mem.gather, mem.ws.span());
  std::vector<int32_t> lens;
  bool live = false;
  int checked = 0;
  std::int64_t added_total = 0;
  m.on_attend = [&](int, const kvscout::score_context<kvscout::host_space>& ctx,
                    const kvscout::current_token<T>&) {
    lens.assign(ctx.seq_lens.begin(), ctx.seq_lens.end());
  };
  m.on_output = [&](int l, const std::vector<float>&) {
    if (!live || l < 2) return;
    const double s = b.speculated[static_cast<std::size_t>(l)],
                 t = b.total[static_cast<std::size_t>(l)];
    const auto spec = pipe.last_selection(l);
    const auto added = pipe.last_correction();
    for (int r = 0; r < S * H; ++r) {
      const int len = lens[static_cast<std::size_t>(r / H)];
      CAPTURE(l, r, len, s, t);
      const int want_spec = std::min(len, std::max(3, static_cast<int>(std::ceil(s * len - 1e-9))));
      const int want_total = std::min(len, static_cast<int>(std::ceil(t * len - 1e-9)));
      REQUIRE(spec.counts[r] == want_spec);
      REQUIRE(added.counts[r] == std::clamp(want_total - want_spec, 0, b.correction_capacity));
      REQUIRE(want_total - want_spec <= b.correction_capacity);  // the capacity bound holds
      added_total += added.counts[r];
    }
    ++checked;
  };
  std::vector<float> hs;
  for (int t = 0; t < prompt; ++t) m.step(pipe, hs, m.embedding(100u + t), true);
  live = true;
  for (int t = 0; t < steps; ++t) m.step(pipe, hs, m.embedding(500u + t));
  REQUIRE(checked == steps * (L - 2));
  REQUIRE(added_total > 0);
  // A share per layer, or none; each a share of the rows.
  pc.correction_shares = {0.1, 0.2};
  REQUIRE_THROWS_WITH(
      pipe_t(pc, owned.policy, per_layer, mem.gather, mem.ws.span()),
      Catch::Contains("correction_shares holds 2 entries, expected none or one per layer"));
  pc.correction_shares = {0, 0, 0.5, 1.5};
  REQUIRE_THROWS_WITH(
      pipe_t(pc, owned.policy, per_layer, mem.gather, mem.ws.span()),
      Catch::Contains("correction_shares[3] = 1.5: expected a share of the cached rows in [0, 1]"));
}

TEST_CASE("presets::pipeline_host: a preset's pipeline in one call, the bits of its parts by hand",
          "[pipeline][presets]") {
  auto p = kvscout::presets::kvscout_default(D);
  p.keep = {1, 2};
  p.layer_bins = 40;
  const double budget = 0.3;
  const kvscout::decode_shape sh = shape_of(Hq * D);
  // Calibration on another prompt of the same weights, one call.
  model cm(L, Hq, H, 1, max_tokens, 1234);
  cm.collect = true;
  {
    kvscout::streaming_policy_host sp({{.num_kv_heads = H}, 4});
    topk_pipeline<kvscout::streaming_policy_host> tp(
        {{.num_layers = L, .num_seqs = 1, .num_kv_heads = H, .num_q_heads = Hq,
          .max_tokens = max_tokens, .scale = 0.125f}, L, 8, 1},
        sp, {{.num_seqs = 1, .num_kv_heads = H, .max_tokens = max_tokens}, 8, 8, {}});
    std::vector<float> hs;
    for (int t = 0; t < 64; ++t) cm.step(tp.pipe, hs, cm.embedding(9000u + t), true);
  }
  const kvscout::presets::calibration cal =
      kvscout::presets::calibrate(p, sh, cm.rope, cm.q_samples, cm.k_samples, 64);
  REQUIRE(!cal.correction_plans.empty());
  REQUIRE(!cal.layer_shares(p, budget).empty());

  model ma(L, Hq, H, S, max_tokens, 91), mb(L, Hq, H, S, max_tokens, 91);
  std::vector<kvscout::host_span<const float>> wq, bq(L);
  for (int l = 0; l < L; ++l) wq.push_back({ma.wq[l].data(), ma.wq[l].size()});
  kvscout::presets::pipeline_host<layout> owned(p, sh, cal, budget, wq, {}, 2);

  // The same parts by hand.
  using one_t = kvscout::infinigen_policy_host<kvscout::presets::partial_keys_t<2>>;
  using policy_t = kvscout::policy_layers<one_t>;
  const kvscout::presets::step_budgets b =
      kvscout::presets::budgets(p, sh, budget, cal.layer_shares(p, budget));
  policy_t policy(L);  // one policy per speculated layer, each from the preset's config
  for (int l = cal.first_layer; l < L; ++l) {
    const auto lu = static_cast<std::size_t>(l);
    policy.emplace(l, p.policy_config(sh), cal.plans[lu], cal.correction_plans[lu], wq[lu], bq[lu]);
  }
  const kvscout::detail::layer_selectors selectors(sh, b);
  const kvscout::host_pipeline_config pc{.shape = sh, .skip_layers = p.skip_layers,
                                         .capacity = b.capacity, .threads = 2,
                                         .correction_capacity = b.correction_capacity,
                                         .correction_shares = b.correction_shares()};
  using pipe_t = kvscout::decode_pipeline_host<layout, policy_t, kvscout::topk_selector_host>;
  pipe_memory<pipe_t> mem(pc);
  pipe_t pipe(pc, policy, selectors.pointers(), mem.gather, mem.ws.span());
  REQUIRE(owned.configuration().capacity == b.capacity);
  REQUIRE(owned.budgets().correction_capacity == b.correction_capacity);

  std::vector<float> ha, hb;
  for (int t = 0; t < prompt; ++t) {
    ma.step(owned.pipeline(), ha, ma.embedding(100u + t), true);
    mb.step(pipe, hb, mb.embedding(100u + t), true);
  }
  for (int t = 0; t < steps; ++t) {
    ma.step(owned.pipeline(), ha, ma.embedding(500u + t));
    mb.step(pipe, hb, mb.embedding(500u + t));
    REQUIRE(ha == hb);
  }
  // Sparse: the decode steps (the prompt runs dense, around the pipeline) moved fewer rows at each
  // speculated layer than a dense fetch of every cached row would have.
  const auto& st = owned.pipeline().stats();
  std::int64_t dense_rows = 0;
  for (int t = 0; t < steps; ++t) dense_rows += static_cast<std::int64_t>(S) * H * (prompt + t);
  for (int l = p.skip_layers; l < L; ++l) {
    CAPTURE(l);
    REQUIRE(st.rows[static_cast<std::size_t>(l)] > 0);
    REQUIRE(st.rows[static_cast<std::size_t>(l)] == pipe.stats().rows[static_cast<std::size_t>(l)]);
    REQUIRE(st.rows[static_cast<std::size_t>(l)] < dense_rows);
  }

  // What it does not build names the preset and what it expected.
  using float_keys = kvscout::presets::pipeline_host<layout, float>;
  REQUIRE_THROWS_WITH(float_keys(p, sh, cal, budget, wq, {}, 2),
                      Catch::Contains("kvscout_default keeps its partial keys at 2 bits") &&
                          Catch::Contains("partial_keys_t<2>"));
  const auto paper = kvscout::presets::infinigen_paper(D);
  REQUIRE_THROWS_WITH(kvscout::presets::pipeline_host<layout>(paper, sh, cal, budget, wq, {}, 2),
                      Catch::Contains("infinigen_paper selects by threshold"));

  // The speculation alone: float partial keys, no correction step, every layer the same share.
  const auto only = kvscout::presets::kvscout_speculation_only(D);
  const auto cal_only =
      kvscout::presets::calibrate(only, sh, cm.rope, cm.q_samples, cm.k_samples, 64);
  REQUIRE(cal_only.correction_plans.empty());
  kvscout::presets::pipeline_host<layout, float> spec_only(only, sh, cal_only, budget, wq, {}, 1);
  REQUIRE(spec_only.configuration().correction_capacity == 0);
  model mc(L, Hq, H, S, max_tokens, 91);
  std::vector<float> hc;
  for (int t = 0; t < prompt; ++t) mc.step(spec_only.pipeline(), hc, mc.embedding(100u + t), true);
  for (int t = 0; t < steps; ++t) mc.step(spec_only.pipeline(), hc, mc.embedding(500u + t));
  for (int l = only.skip_layers; l < L; ++l) {
    const std::int64_t rows = spec_only.pipeline().stats().rows[static_cast<std::size_t>(l)];
    REQUIRE((rows > 0 && rows < dense_rows));
  }
  REQUIRE_THROWS_WITH(
      (kvscout::presets::pipeline_host<layout>(only, sh, cal_only, budget, wq, {}, 1)),
      Catch::Contains("kvscout_speculation_only keeps its partial keys at 0 bits"));

  // Bad input: each refused by name, before anything is built.
  using default_host = kvscout::presets::pipeline_host<layout>;
  REQUIRE_THROWS_WITH(default_host(p, sh, cal_only, budget, wq, {}, 2),
                      Catch::Contains("kvscout_default corrects over 64 channels but the "
                                      "calibration has no correction plans"));
  auto other_skip = p;
  other_skip.skip_layers = 1;
  REQUIRE_THROWS_WITH(default_host(other_skip, sh, cal, budget, wq, {}, 2),
                      Catch::Contains("the calibration covers 4 layers from layer 2, expected the "
                                      "shape's 4 from kvscout_default's skip_layers = 1"));
  auto planned_dense = cal;  // plans for layer 1, below kvscout_default's skip_layers = 2
  planned_dense.plans[1] = planned_dense.plans[2];
  REQUIRE_THROWS_WITH(default_host(p, sh, planned_dense, budget, wq, {}, 2),
                      Catch::Contains("the calibration's layer 1 has plans; the layers from "
                                      "skip_layers = 2 on are speculated"));
  auto unplanned = cal;  // no plans for layer 3, a speculated layer
  unplanned.plans[3].clear();
  REQUIRE_THROWS_WITH(default_host(p, sh, unplanned, budget, wq, {}, 2),
                      Catch::Contains("the calibration's layer 3 has no plans"));
  kvscout::decode_shape wide_head = sh;
  wide_head.head_dim = 2 * D;
  REQUIRE_THROWS_WITH(default_host(p, wide_head, cal, budget, wq, {}, 2),
                      Catch::Contains("shape.head_dim = 128, expected the layout's head_dim 64"));
  std::vector<kvscout::host_span<const float>> short_wq = wq;
  short_wq[3] = short_wq[3].subspan(0, short_wq[3].size() - 1);
  REQUIRE_THROWS_WITH(default_host(p, sh, cal, budget, short_wq, {}, 2),
                      Catch::Contains("layer 3's W_Q has " + std::to_string(wq[3].size() - 1) +
                                      " elements, expected num_q_heads * head_dim * d_model"));
  REQUIRE_THROWS_WITH(
      default_host(p, sh, cal, budget, std::vector(wq.begin(), wq.end() - 1), {}, 2),
      Catch::Contains("3 W_Q and 0 b_Q spans, expected one per layer (4"));
  const std::vector<float> short_bias(5, 0.f);
  std::vector<kvscout::host_span<const float>> bad_bq(L);
  bad_bq[1] = {short_bias.data(), short_bias.size()};
  REQUIRE_THROWS_WITH(default_host(p, sh, cal, budget, wq, bad_bq, 2),
                      Catch::Contains("layer 1's b_Q has 5 elements, expected 0 or num_q_heads * "
                                      "head_dim = 384"));
  REQUIRE_THROWS_WITH(default_host(p, sh, cal, 0.0, wq, {}, 2),
                      Catch::Contains("budget = 0: expected a share of the"));
  REQUIRE_THROWS_WITH(default_host(p, sh, cal, budget, wq, {}, 0),
                      Catch::Contains("threads must be at least 1, got 0"));

  // W_Q in half: the same bits as the float weights it widens to exactly.
  std::vector<std::vector<kvscout::half>> wq_half(L);
  std::vector<kvscout::host_span<const kvscout::half>> wqh;
  std::vector<kvscout::host_span<const float>> wq_rounded;
  std::vector<std::vector<float>> rounded(L);
  for (int l = 0; l < L; ++l) {
    for (const float x : ma.wq[l]) wq_half[l].push_back(kvscout::from_float<kvscout::half>(x));
    for (const kvscout::half x : wq_half[l]) rounded[l].push_back(kvscout::to_float(x));
    wqh.push_back({wq_half[l].data(), wq_half[l].size()});
    wq_rounded.push_back({rounded[l].data(), rounded[l].size()});
  }
  kvscout::presets::pipeline_host<layout> from_half(p, sh, cal, budget, wqh, {}, 2);
  kvscout::presets::pipeline_host<layout> from_float(p, sh, cal, budget, wq_rounded, {}, 2);
  model mh(L, Hq, H, S, max_tokens, 91), mf(L, Hq, H, S, max_tokens, 91);
  std::vector<float> hh, hf;
  for (int t = 0; t < prompt; ++t) {
    mh.step(from_half.pipeline(), hh, mh.embedding(100u + t), true);
    mf.step(from_float.pipeline(), hf, mf.embedding(100u + t), true);
  }
  for (int t = 0; t < 2; ++t) {
    mh.step(from_half.pipeline(), hh, mh.embedding(500u + t));
    mf.step(from_float.pipeline(), hf, mf.embedding(500u + t));
    REQUIRE(hh == hf);
  }
}
