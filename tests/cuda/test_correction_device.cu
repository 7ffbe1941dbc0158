// The correction step on the device (issue 32, part 1):
//   infinigen_policy_cuda::score_query against infinigen_policy_host::score_query (the host
//   reference), both RoPE modes that allow it, float and fp16 partial keys, group sizes 1 and 3,
//   sequences of several lengths and continuous-batching seq_ids;
//   correction_selector_cuda against correction_selector_host: the same indices and counts, on
//   scores with NaN, infinities and ties, random speculated sets, rows with few unspeculated rows;
//   bad input refused by name.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "gpu_harness.cuh"
#include "spec_append.cuh"
#include "../host/random_orthogonal.hpp"
#include "kvscout/core/device_status.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/select/correction.cuh"
#include "kvscout/select/correction.hpp"
#include "kvscout/score/infinigen.cuh"
#include "kvscout/score/infinigen.hpp"

namespace {

using kvscout::rope_mode;

static_assert(kvscout::query_scoring_policy_cuda<kvscout::infinigen_policy_cuda<>>);

kvscout::skew_plan plan_for(rope_mode mode, int D, int r, std::mt19937& rng) {
  const kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  std::vector<int> all(static_cast<std::size_t>(mode == rope_mode::rope_planes ? D / 2 : D));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  if (mode == rope_mode::rope_planes) {
    all.resize(static_cast<std::size_t>(r / 2));
    std::sort(all.begin(), all.end());
    return kvscout::rope_planes_plan(rope, all);
  }
  kvscout::skew_plan p;
  p.mode = mode;
  p.head_dim = D;
  p.r = r;
  p.rope = rope;
  p.A = kvtest::random_orthogonal(D, rng);  // tests/host/random_orthogonal.hpp
  all.resize(static_cast<std::size_t>(r));
  std::sort(all.begin(), all.end());
  p.channels = all;
  return p;
}

template <class PkT>
void score_query_case(rope_mode mode, int g, std::uint32_t seed,
                      std::optional<kvscout::gqa_aggregation> late = std::nullopt) {
  const int H = 2, Hq = H * g, D = 64, r = 16, dm = 48, S = 3;
  const std::vector<std::int32_t> lens{70, 0, 33};
  const int max_tokens = 80, stride = 75;
  const float scale = 0.125f;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<kvscout::skew_plan> plans;
  for (int h = 0; h < H; ++h) plans.push_back(plan_for(mode, D, r, rng));
  std::vector<float> w_q(static_cast<std::size_t>(Hq) * D * dm);
  for (auto& v : w_q) v = nd(rng) / 7.f;
  kvscout::infinigen_config hc{.shape = {.num_layers = 1, .num_seqs = S, .num_kv_heads = H,
                               .num_q_heads = Hq, .head_dim = D, .d_model = dm,
                               .max_tokens = max_tokens, .scale = scale},
                               .aggregation = kvscout::gqa_aggregation::max_logit};
  hc.query_aggregation = late;
  auto host = kvscout::infinigen_policy_host<PkT>::layers(hc, {plans}, {{w_q.data(), w_q.size()}}, {{}});
  kvscout::infinigen_config dc{{.num_seqs = S, .num_kv_heads = H, .num_q_heads = Hq,
                                    .head_dim = D, .d_model = dm, .max_tokens = max_tokens,
                                    .scale = scale}, r, mode, kvscout::gqa_aggregation::max_logit};
  dc.query_aggregation = late;  // the late ranking's own (sum_prob), the speculation's max_logit
  using spec = kvscout::infinigen_policy_cuda<PkT>;
  auto ws = kvscout::make_device_workspace<spec>(dc);
  spec dev(dc, plans, {w_q.data(), w_q.size()}, {}, ws.span());
  // Keys after RoPE, the same to both.
  gpu_test::append_same_keys(host, gpu_test::prefill_entries(lens), H, D,
                             [&](std::vector<float>& k) { for (auto& v : k) v = nd(rng); }, nullptr, dev);
  // The layer's own queries, and a batch whose rows name sequences 2, 0, 1.
  std::vector<float> q(static_cast<std::size_t>(S) * Hq * D);
  for (auto& v : q) v = nd(rng);
  const std::vector<std::int32_t> ids{2, 0, 1}, blens{lens[2], lens[0], lens[1]};
  std::vector<float> want(static_cast<std::size_t>(S) * H * stride, 0.f);
  host.score_query(0, {{}, {q.data(), q.size()}, {blens.data(), 3}, {blens.data(), 3}, {ids.data(), 3}},
                   {{want.data(), want.size()}, S, H, stride});
  gpu_test::device_vector<float> dq(q), out(want.size());
  gpu_test::device_vector<std::int32_t> dl(blens), di(ids);
  gpu_test::device_vector<int> status(std::vector<int>{0});
  const kvscout::score_context<kvscout::device_space> ctx{{}, {}, {dl.data(), 3}, lens[0], {di.data(), 3}};
  dev.score_query({dq.data(), dq.size()}, ctx, {{out.data(), out.size()}, S, H, stride},
                  {nullptr, status.data()});
  const std::vector<float> got = out.download();
  int bad = 0;
  for (int s = 0; s < S; ++s)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < stride; ++t) {
        const std::size_t i = (static_cast<std::size_t>(s) * H + h) * stride + t;
        if (t >= blens[static_cast<std::size_t>(s)]) {
          if (!std::isnan(got[i]) && bad++ < 5) std::fprintf(stderr, "written past len at %zu\n", i);
          continue;
        }
        const float tol = 1e-4f * (1.f + std::fabs(want[i])) + (sizeof(PkT) == 2 ? 2e-3f : 0.f);
        if (!(std::fabs(got[i] - want[i]) <= tol) && bad++ < 5)
          std::fprintf(stderr, "score (%d,%d,%d): device %g host %g\n", s, h, t, got[i], want[i]);
      }
  GPU_CHECK(bad == 0);
  GPU_CHECK(status.download()[0] == 0);
}

void score_query_matches_host() {
  for (const rope_mode mode : {rope_mode::post_rope_skew, rope_mode::rope_planes})
    for (const int g : {1, 3}) {
      score_query_case<float>(mode, g, 11u + static_cast<unsigned>(g));
      score_query_case<kvscout::half>(mode, g, 23u + static_cast<unsigned>(g));
      score_query_case<float>(mode, g, 37u + static_cast<unsigned>(g), kvscout::gqa_aggregation::sum_prob);
    }
}

// One speculator of one KV head in `mode` and a score_query call with a query of q_len floats:
// its refusal must name `needle`.
void score_query_refused(rope_mode mode, std::size_t q_len, const char* needle) {
  const int H = 1, D = 64, r = 16, dm = 32;
  std::mt19937 rng(5);
  std::vector<kvscout::skew_plan> plans{
      plan_for(mode == rope_mode::rope_planes ? mode : rope_mode::post_rope_skew, D, r, rng)};
  plans[0].mode = mode;
  std::vector<float> w_q(static_cast<std::size_t>(D) * dm, 0.01f);
  const kvscout::infinigen_config dc{{.num_seqs = 1, .num_kv_heads = H, .num_q_heads = H,
                                          .head_dim = D, .d_model = dm, .max_tokens = 16,
                                          .scale = 0.125f}, r, mode};
  using spec = kvscout::infinigen_policy_cuda<float>;
  auto ws = kvscout::make_device_workspace<spec>(dc);
  spec dev(dc, plans, {w_q.data(), w_q.size()}, {}, ws.span());
  gpu_test::device_vector<float> q(static_cast<std::size_t>(D)), out(16);
  gpu_test::device_vector<std::int32_t> lens(std::vector<std::int32_t>{4});
  const kvscout::score_context<kvscout::device_space> ctx{{}, {}, {lens.data(), 1}, 4};
  GPU_CHECK(gpu_test::throws_with(
      [&] { dev.score_query({q.data(), q_len}, ctx, {{out.data(), out.size()}, 1, H, 16}, {}); },
      needle));
}

void score_query_refuses() {
  score_query_refused(rope_mode::pre_rope_folded, 64, "pre_rope_folded");
}

void score_query_refuses_short_q() {
  score_query_refused(rope_mode::rope_planes, 63, "q holds 63 floats, expected [1, 1, 64]");
}

void selector_matches_host() {
  std::mt19937 rng(2026);
  const int S = 3, H = 2, stride = 900, cap = 48, spec_cap = 64;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int trial = 0; trial < 12; ++trial) {
    const int extra = 1 + static_cast<int>(rng() % cap);
    std::vector<std::int32_t> lens(S);
    for (auto& l : lens) l = static_cast<int>(rng() % (stride + 1));
    lens[0] = std::min(lens[0], extra + 10);  // few unspeculated rows
    if (trial == 0) lens[2] = stride;
    std::vector<float> scores(static_cast<std::size_t>(S) * H * stride);
    for (auto& v : scores) {
      const auto u = rng() % 100;
      v = u < 3 ? nan : u < 5 ? -INFINITY : u < 6 ? INFINITY : static_cast<float>(rng() % 50) * 0.5f - 7.f;
    }
    std::vector<std::int32_t> sidx(static_cast<std::size_t>(S) * H * spec_cap, 0), scnt(static_cast<std::size_t>(S) * H);
    for (int row = 0; row < S * H; ++row) {
      int c = 0;
      for (int t = 0; t < lens[static_cast<std::size_t>(row / H)] && c < spec_cap; ++t)
        if (rng() % 4 == 0) sidx[static_cast<std::size_t>(row) * spec_cap + c++] = t;
      scnt[static_cast<std::size_t>(row)] = c;
    }
    // Odd trials top each row up to a share of its length (total_share) instead.
    const double shares[] = {0.05, 0.2, 0.5, 1.0};
    const kvscout::correction_selector_host::config cfg{
        .shape = {.num_seqs = S, .num_kv_heads = H, .max_tokens = stride},
        .capacity = cap,
        .extra = extra,
        .total_share = trial % 2 == 1 ? shares[(trial / 2) % 4] : 0.0};
    // Host.
    auto hws = kvscout::make_workspace<kvscout::correction_selector_host>(cfg);
    kvscout::correction_selector_host hsel(cfg, hws.span());
    std::vector<std::int32_t> hidx(static_cast<std::size_t>(S) * H * cap, -1), hcnt(static_cast<std::size_t>(S) * H, -1);
    hsel.select({{scores.data(), scores.size()}, {lens.data(), lens.size()}, S, H, stride},
                {{sidx.data(), sidx.size()}, {scnt.data(), scnt.size()}, S, H, spec_cap},
                {{hidx.data(), hidx.size()}, {hcnt.data(), hcnt.size()}, S, H, cap});
    // Device.
    auto dws = kvscout::make_device_workspace<kvscout::correction_selector_cuda>(cfg);
    kvscout::correction_selector_cuda dsel(cfg, dws.span());
    gpu_test::device_vector<float> dsc(scores);
    gpu_test::device_vector<std::int32_t> dl(lens), dsi(sidx), dscnt(scnt), didx(hidx.size()), dcnt(hcnt.size());
    gpu_test::device_vector<int> status(std::vector<int>{0});
    dsel.select({dsc.data(), dsc.size()}, {dl.data(), dl.size()},
                {{dsi.data(), dsi.size()}, {dscnt.data(), dscnt.size()}, S, H, spec_cap},
                {{didx.data(), didx.size()}, {dcnt.data(), dcnt.size()}, S, H, cap}, {nullptr, status.data()});
    const std::vector<std::int32_t> gidx = didx.download(), gcnt = dcnt.download();
    const std::vector<float> masked = dsc.download();
    for (int row = 0; row < S * H; ++row) {
      GPU_CHECK(gcnt[static_cast<std::size_t>(row)] == hcnt[static_cast<std::size_t>(row)]);
      for (int i = 0; i < hcnt[static_cast<std::size_t>(row)] && i < gcnt[static_cast<std::size_t>(row)]; ++i)
        GPU_CHECK(gidx[static_cast<std::size_t>(row) * cap + i] == hidx[static_cast<std::size_t>(row) * cap + i]);
      for (int j = 0; j < scnt[static_cast<std::size_t>(row)]; ++j)  // the speculated rows, masked
        GPU_CHECK(std::isnan(masked[static_cast<std::size_t>(row) * stride + sidx[static_cast<std::size_t>(row) * spec_cap + j]]));
    }
    GPU_CHECK(status.download()[0] == 0);
  }
}

void selector_reports_bad_device_data() {
  // A speculated index past the row and a count past the capacity: skipped / clamped, reported.
  const int stride = 64, cap = 8;
  std::vector<float> scores(stride);
  for (int t = 0; t < stride; ++t) scores[static_cast<std::size_t>(t)] = static_cast<float>(t % 13);
  const kvscout::correction_selector_host::config cfg{{.num_seqs = 1, .num_kv_heads = 1,
                                                      .max_tokens = stride}, cap, 4};
  auto dws = kvscout::make_device_workspace<kvscout::correction_selector_cuda>(cfg);
  kvscout::correction_selector_cuda dsel(cfg, dws.span());
  gpu_test::device_vector<float> dsc(scores);
  gpu_test::device_vector<std::int32_t> dl(std::vector<std::int32_t>{40}), dsi(std::vector<std::int32_t>{3, 50}),
      dscnt(std::vector<std::int32_t>{5}), didx(cap), dcnt(1);
  gpu_test::device_vector<int> status(std::vector<int>{0});
  dsel.select({dsc.data(), dsc.size()}, {dl.data(), 1}, {{dsi.data(), 2}, {dscnt.data(), 1}, 1, 1, 2},
              {{didx.data(), didx.size()}, {dcnt.data(), 1}, 1, 1, cap}, {nullptr, status.data()});
  const int bits = status.download()[0];
  GPU_CHECK((bits & kvscout::device_status::bad_count) != 0);
  GPU_CHECK((bits & kvscout::device_status::bad_index) != 0);
  GPU_CHECK(dcnt.download()[0] == 4);
  // A row of the filter's branch (few unspeculated rows) whose speculated rows are out of order
  // and out of range: reported, and the output stays inside the row's slots with a count of at
  // most extra (the buffers past the row keep their poison).
  {
    const kvscout::correction_selector_host::config c2{{.num_seqs = 2, .num_kv_heads = 1,
                                                       .max_tokens = stride}, cap, 4};
    auto ws2 = kvscout::make_device_workspace<kvscout::correction_selector_cuda>(c2);
    kvscout::correction_selector_cuda sel2(c2, ws2.span());
    std::vector<float> two(static_cast<std::size_t>(2) * stride, 1.f);
    gpu_test::device_vector<float> dtwo(two);
    gpu_test::device_vector<std::int32_t> l2(std::vector<std::int32_t>{5, 5}),
        si2(std::vector<std::int32_t>{-5, 3, 2, 1, 1, 9}), sc2(std::vector<std::int32_t>{3, 3}),
        oi2(static_cast<std::size_t>(2) * cap + 8), oc2(2);  // 4 guard slots each side
    gpu_test::device_vector<int> st2(std::vector<int>{0});
    sel2.select({dtwo.data(), dtwo.size()}, {l2.data(), 2}, {{si2.data(), 6}, {sc2.data(), 2}, 2, 1, 3},
                {{oi2.data() + 4, static_cast<std::size_t>(2) * cap}, {oc2.data(), 2}, 2, 1, cap},
                {nullptr, st2.data()});
    GPU_CHECK((st2.download()[0] & kvscout::device_status::bad_index) != 0);
    const std::vector<std::int32_t> counts = oc2.download(), idx = oi2.download();
    GPU_CHECK(counts[0] >= 0 && counts[0] <= 4 && counts[1] >= 0 && counts[1] <= 4);
    for (int i = 0; i < 4; ++i) {  // the guards keep their poison
      GPU_CHECK(idx[static_cast<std::size_t>(i)] == -1);
      GPU_CHECK(idx[static_cast<std::size_t>(2) * cap + 4 + i] == -1);
    }
  }
  // Host-known errors are refused by name before any launch.
  GPU_CHECK(gpu_test::throws_with(
      [&] {
        (void)kvscout::correction_selector_cuda::workspace_bytes(
            {{.num_seqs = 1, .num_kv_heads = 1, .max_tokens = stride}, cap, 9});
      },
      "extra = 9 must be in [1, capacity = 8]"));
  GPU_CHECK(gpu_test::throws_with(
      [&] {
        dsel.select({dsc.data(), dsc.size()}, {dl.data(), 1}, {{dsi.data(), 2}, {dscnt.data(), 1}, 2, 1, 2},
                    {{didx.data(), didx.size()}, {dcnt.data(), 1}, 1, 1, cap}, {});
      },
      "speculated selection shape [num_seqs, num_kv_heads] = [2, 1]"));
}

}  // namespace

// One cache read at two widths: a speculator built with correction plans (r = 16 of correction_r
// = 32 channels) scores exactly as one built from the speculation plans alone (the same kernels
// over the cache's first 16 channels: bit for bit), and its score_query reads all 32 as the host
// policy with the same plans does.
template <class PkT>
void nested_case(rope_mode mode, int g, kvscout::gqa_aggregation agg, std::uint32_t seed) {
  const int H = 2, Hq = H * g, D = 64, r = 16, rc = 32, dm = 48, S = 2;
  const std::vector<std::int32_t> lens{70, 41};
  const int max_tokens = 80, stride = 75;
  const float scale = 0.125f;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<kvscout::skew_plan> wide, narrow;
  for (int h = 0; h < H; ++h) {
    wide.push_back(plan_for(mode, D, rc, rng));
    kvscout::skew_plan n = wide.back();
    if (mode == rope_mode::rope_planes) {
      std::vector<int> some;
      for (std::size_t j = 0; j < n.planes.size(); j += 2) some.push_back(n.planes[j]);
      n = kvscout::rope_planes_plan(n.rope, some);
    } else {
      std::vector<int> some;
      for (std::size_t j = 1; j < n.channels.size(); j += 2) some.push_back(n.channels[j]);
      n.channels = some;
      n.r = r;
    }
    narrow.push_back(n);
  }
  std::vector<float> w_q(static_cast<std::size_t>(Hq) * D * dm);
  for (auto& v : w_q) v = nd(rng) / 7.f;
  kvscout::infinigen_config hc{.shape = {.num_layers = 1, .num_seqs = S, .num_kv_heads = H,
                               .num_q_heads = Hq, .head_dim = D, .d_model = dm,
                               .max_tokens = max_tokens, .scale = scale},
                               .aggregation = agg};
  auto host = kvscout::infinigen_policy_host<PkT>::layers(hc, {narrow}, {wide}, {{w_q.data(), w_q.size()}}, {{}});
  kvscout::infinigen_config dc{{.num_seqs = S, .num_kv_heads = H, .num_q_heads = Hq,
                                    .head_dim = D, .d_model = dm, .max_tokens = max_tokens,
                                    .scale = scale}, r, mode, agg};
  using spec = kvscout::infinigen_policy_cuda<PkT>;
  auto ws_narrow = kvscout::make_device_workspace<spec>(dc);
  spec only(dc, narrow, {w_q.data(), w_q.size()}, {}, ws_narrow.span());
  dc.correction_r = rc;
  auto ws = kvscout::make_device_workspace<spec>(dc);
  spec dev(dc, narrow, wide, {w_q.data(), w_q.size()}, {}, ws.span());
  GPU_CHECK(dev.keys().r == rc && only.keys().r == r);
  gpu_test::append_same_keys(host, gpu_test::prefill_entries(lens), H, D,
                             [&](std::vector<float>& k) { for (auto& v : k) v = nd(rng); }, nullptr, only,
                             dev);
  // The speculation: bit for bit the narrow speculator's.
  std::vector<float> x(static_cast<std::size_t>(S) * dm);
  for (auto& v : x) v = nd(rng);
  const std::vector<std::int32_t> pos{lens[0] + 3, lens[1] + 3};
  gpu_test::device_vector<float> dx(x), a(static_cast<std::size_t>(S) * H * stride),
      b(static_cast<std::size_t>(S) * H * stride);
  gpu_test::device_vector<std::int32_t> dl(lens), dp(pos);
  gpu_test::device_vector<int> status(std::vector<int>{0});
  const kvscout::score_context<kvscout::device_space> sctx{{dx.data(), dx.size()}, {dp.data(), 2}, {dl.data(), 2}, lens[0]};
  dev.score(sctx, {{a.data(), a.size()}, S, H, stride}, {nullptr, status.data()});
  only.score(sctx, {{b.data(), b.size()}, S, H, stride}, {nullptr, status.data()});
  const std::vector<float> ga = a.download(), gb = b.download();
  int bad = 0;
  for (std::size_t i = 0; i < ga.size(); ++i) {
    const bool same = std::isnan(ga[i]) ? std::isnan(gb[i]) : ga[i] == gb[i];
    if (!same && bad++ < 5) std::fprintf(stderr, "score %zu: nested %g, narrow %g\n", i, ga[i], gb[i]);
  }
  // The correction: the host policy's score_query over the 32 channels.
  std::vector<float> q(static_cast<std::size_t>(S) * Hq * D);
  for (auto& v : q) v = nd(rng);
  std::vector<float> want(static_cast<std::size_t>(S) * H * stride, 0.f);
  host.score_query(0, {{}, {q.data(), q.size()}, {pos.data(), 2}, {lens.data(), 2}},
                   {{want.data(), want.size()}, S, H, stride});
  gpu_test::device_vector<float> dq(q), out(want.size());
  dev.score_query({dq.data(), dq.size()}, {{}, {}, {dl.data(), 2}, lens[0]},
                  {{out.data(), out.size()}, S, H, stride}, {nullptr, status.data()});
  const std::vector<float> got = out.download();
  for (int s = 0; s < S; ++s)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < lens[static_cast<std::size_t>(s)]; ++t) {
        const std::size_t i = (static_cast<std::size_t>(s) * H + h) * stride + t;
        const float tol = 1e-4f * (1.f + std::fabs(want[i])) + (sizeof(PkT) == 2 ? 2e-3f : 0.f);
        if (!(std::fabs(got[i] - want[i]) <= tol) && bad++ < 10)
          std::fprintf(stderr, "score_query (%d,%d,%d): device %g host %g\n", s, h, t, got[i], want[i]);
      }
  GPU_CHECK(bad == 0);
  GPU_CHECK(status.download()[0] == 0);
}

void nested_cache_matches_narrow_and_host() {
  for (const rope_mode mode : {rope_mode::post_rope_skew, rope_mode::rope_planes})
    for (const int g : {1, 3}) {
      nested_case<float>(mode, g, kvscout::gqa_aggregation::max_logit, 51u + static_cast<unsigned>(g));
      nested_case<kvscout::half>(mode, g, kvscout::gqa_aggregation::sum_prob, 61u + static_cast<unsigned>(g));
    }
}

// Correction plans and the config's correction_r must agree; the plans must nest.
void nested_cache_refuses() {
  std::mt19937 rng(9);
  const int D = 64, dm = 32;
  const kvscout::skew_plan wide = plan_for(rope_mode::rope_planes, D, 32, rng);
  const kvscout::skew_plan other = plan_for(rope_mode::rope_planes, D, 16, rng);
  std::vector<float> w_q(static_cast<std::size_t>(D) * dm, 0.01f);
  using spec = kvscout::infinigen_policy_cuda<float>;
  kvscout::infinigen_config dc{{.num_seqs = 1,
                                     .num_kv_heads = 1,
                                     .num_q_heads = 1,
                                     .head_dim = D,
                                     .d_model = dm,
                                     .max_tokens = 16,
                                     .scale = 0.125f},
                                    16,
                                    rope_mode::rope_planes};
  auto ws = kvscout::make_device_workspace<spec>(
      kvscout::infinigen_config{{.num_seqs = 1,
                                      .num_kv_heads = 1,
                                      .num_q_heads = 1,
                                      .head_dim = D,
                                      .d_model = dm,
                                      .max_tokens = 16,
                                      .scale = 0.125f},
                                     16,
                                     rope_mode::rope_planes,
                                     kvscout::gqa_aggregation::max_logit,
                                     std::nullopt,
                                     32});
  GPU_CHECK(gpu_test::throws_with(
      [&] { spec(dc, {other}, {wide}, {w_q.data(), w_q.size()}, {}, ws.span()); },
      "correction_r is 0"));
  dc.correction_r = 24;
  GPU_CHECK(gpu_test::throws_with(
      [&] { spec(dc, {other}, {wide}, {w_q.data(), w_q.size()}, {}, ws.span()); },
      "correction plan of kv head 0 has r = 32, the config's correction_r 24"));
  dc.correction_r = 32;
  std::vector<int> missing;
  for (int j = 0; j < D / 2; ++j)
    if (std::find(wide.planes.begin(), wide.planes.end(), j) == wide.planes.end()) missing.push_back(j);
  missing.resize(8);
  const kvscout::skew_plan outside = kvscout::rope_planes_plan(wide.rope, missing);
  GPU_CHECK(gpu_test::throws_with(
      [&] { spec(dc, {outside}, {wide}, {w_q.data(), w_q.size()}, {}, ws.span()); },
      "is not among the correction plan's 32 channels"));
  GPU_CHECK(gpu_test::throws_with(
      [&] { spec(dc, {other}, {w_q.data(), w_q.size()}, {}, ws.span()); },
      "correction_r = 32 needs correction plans"));
}

int main() {
  return gpu_test::run_all("correction_device",
                           {{"score_query_matches_host", score_query_matches_host},
                            {"score_query_refuses", score_query_refuses},
                            {"score_query_refuses_short_q", score_query_refuses_short_q},
                            {"nested_cache_matches_narrow_and_host", nested_cache_matches_narrow_and_host},
                            {"nested_cache_refuses", nested_cache_refuses},
                            {"selector_matches_host", selector_matches_host},
                            {"selector_reports_bad_device_data", selector_reports_bad_device_data}});
}
