// The correction step as a stage of the CUDA pipeline (issue 32; pipeline/cuda_stages.cuh):
// one decode step through decode_pipeline_cuda with InfiniGen speculation + top-k on the side
// stream, the zero-copy fetch on the copy stream, and on the compute stream, after wait_rows(i),
// correct(i): score_query of layer i's own query, correction_selector_cuda against the slot's
// selection, the fetch of the added rows; then attention over joined_rows_cuda of both sets.
// Checked layer by layer against the host:
//   - the added rows equal correction_selector_host over the host's late scores
//     (infinigen_policy_host::score_query) and the device's speculated selection, except for tokens
//     whose host late scores tie within float rounding; none is a speculated row;
//   - the attention output equals decode_attention_host over joined_rows_host of the speculated and
//     added rows the host gathers from the cache;
//   - the step captured in a CUDA graph gives the same bits; with the row cache, too;
//   - stages without correction parts, or with bad ones, are refused by name;
//   - the stages over an engine's own device executor (issue 33: a wrapper of the zero-copy one
//     that counts its submits and has no row cache) give the same bits; row_cache buffering with
//     it is refused by name.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "../common/counting_executor.hpp"
#include "gpu_harness.cuh"
#include "host_gather_reference.cuh"
#include "pipeline_world.cuh"
#include "kvscout/attention/decode.cuh"
#include "kvscout/attention/decode.hpp"
#include "kvscout/attention/rows.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/pipeline/cuda_pipeline.hpp"
#include "kvscout/pipeline/cuda_stages.cuh"
#include "kvscout/select/correction.cuh"
#include "kvscout/select/correction.hpp"
#include "kvscout/select/topk.cuh"
#include "kvscout/score/infinigen.hpp"

namespace {

using kvscout::half;
constexpr int L = 3, skip = 1, S = 2, H = 2, g = 2, Hq = H * g, D = 64, dm = 64, r = 16;
constexpr int max_tokens = 256, budget = 16, extra = 8;
using layout = kvscout::contiguous_layout<half, D, kvscout::hnd>;
const float scale = 0.125f;
const kvscout::keep_set keep{2, 4};

struct shape {
  static constexpr int L = ::L, skip = ::skip, S = ::S, H = ::H, Hq = ::Hq, D = ::D, dm = ::dm,
                       r = ::r, max_tokens = ::max_tokens;
};
struct world : gpu_test::pipeline_world<shape> {
  world() : pipeline_world(4242, {200, 90}, 2.f) {}
};
using speculators = gpu_test::pipeline_speculators<world>;
using gpu_test::dspan;

// The host's late scores of layer l: infinigen_policy_host::score_query on layer l's query.
std::vector<float> host_late_scores(const world& w, int l) {
  std::vector<kvscout::host_span<const float>> wq, bq(L);
  for (int i = 0; i < L; ++i) wq.push_back({w.w_q[i].data(), w.w_q[i].size()});
  const kvscout::infinigen_config pc{.shape = {.num_layers = L, .num_seqs = S, .num_kv_heads = H,
                                     .num_q_heads = Hq, .head_dim = D, .d_model = dm,
                                     .max_tokens = max_tokens, .scale = scale},
                                     .aggregation = kvscout::gqa_aggregation::max_logit};
  auto policy = kvscout::infinigen_policy_host<float>::layers(pc, w.plans, wq, bq);
  for (int s = 0; s < S; ++s)
    for (int t = 0; t < w.lens_init[s]; ++t) {
      const auto kr = w.key_row(l, s, t);
      policy.append(l, s, t, kr.data(), kr.data());
    }
  std::vector<float> out(static_cast<std::size_t>(S) * H * max_tokens, 0.f);
  policy.score_query(l, {.x = {}, .q = {&w.q[static_cast<std::size_t>(l) * S * Hq * D],
                                        static_cast<std::size_t>(S) * Hq * D},
                         .positions = {w.lens_init.data(), w.lens_init.size()},
                         .seq_lens = {w.lens_init.data(), w.lens_init.size()}},
                     {{out.data(), out.size()}, S, H, max_tokens});
  return out;
}

// An engine's own device executor: the zero-copy gather behind a wrapper that counts its submits
// and has no row cache (submit without a row_cache_view only; tests/common/counting_executor.hpp).
using counting_executor = kvtest::counting_executor<kvscout::zero_copy_executor_cuda<layout>>;
static_assert(kvscout::device_step_executor<counting_executor>);
static_assert(!kvscout::row_caching_executor<counting_executor>);
static_assert(kvscout::row_caching_executor<kvscout::zero_copy_executor_cuda<layout>>);

using stages_t = kvscout::infinigen_stages_cuda<layout, kvscout::topk_selector_cuda>;
// infinigen_stages_cuda is speculation_stages_cuda over the InfiniGen policy.
using zero_copy_t = kvscout::zero_copy_executor_cuda<layout>;
static_assert(std::is_same_v<kvscout::infinigen_stages_cuda<layout, kvscout::topk_selector_cuda,
                                                            kvscout::half, kvscout::half, zero_copy_t>,
                             kvscout::speculation_stages_cuda<
                                 layout, kvscout::infinigen_policy_cuda<kvscout::half, kvscout::half>,
                                 kvscout::topk_selector_cuda, zero_copy_t>>);
using correction_t = kvscout::cuda_stage_correction<stages_t::executor_type>;
using counting_stages_t =
    kvscout::infinigen_stages_cuda<layout, kvscout::topk_selector_cuda, float, float, counting_executor>;

// Device buffers for selections and rows of one capacity.
struct buffer_store {
  std::vector<std::unique_ptr<gpu_test::device_vector<int32_t>>> ints;
  std::vector<std::unique_ptr<gpu_test::device_vector<half>>> rows;
  kvscout::cuda_stage_buffers make(int capacity) {
    const std::size_t n = static_cast<std::size_t>(S) * H * capacity;
    ints.push_back(std::make_unique<gpu_test::device_vector<int32_t>>(n));
    auto& idx = *ints.back();
    ints.push_back(std::make_unique<gpu_test::device_vector<int32_t>>(S * H));
    auto& cnt = *ints.back();
    rows.push_back(std::make_unique<gpu_test::device_vector<half>>(n * D));
    auto& rk = *rows.back();
    rows.push_back(std::make_unique<gpu_test::device_vector<half>>(n * D));
    auto& rv = *rows.back();
    return {{{idx.data(), n}, {cnt.data(), static_cast<std::size_t>(S * H)}, S, H, capacity},
            {{reinterpret_cast<std::byte*>(rk.data()), rk.bytes()},
             {reinterpret_cast<std::byte*>(rv.data()), rv.bytes()}}};
  }
};

// per_layer: each speculated layer its own correction selector, topping its rows up to its own
// share of the cached length (total_share; layer 1 adds 4 rows to sequence 0, layer 2 the cap of
// 8, sequence 1's 90 tokens add none), as presets::step_budgets gives them.
void corrected_step(bool per_layer) {
  world w;
  cudaStream_t compute{}, side{}, copy{};
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&compute));
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&side));
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&copy));
  const kvscout::infinigen_config dc{{.num_seqs = S, .num_kv_heads = H, .num_q_heads = Hq,
                                          .head_dim = D, .d_model = dm, .max_tokens = max_tokens,
                                          .scale = scale}, r, kvscout::rope_mode::rope_planes,
                                          kvscout::gqa_aggregation::max_logit};
  const speculators specs(w, dc, compute);

  const kvscout::topk_selector_cuda::config sc{{.num_seqs = S, .num_kv_heads = H,
                                               .max_tokens = max_tokens}, budget, budget, keep};
  gpu_test::device_vector<std::byte> sel_ws(std::max<std::size_t>(1, kvscout::topk_selector_cuda::workspace_bytes(sc)));
  kvscout::topk_selector_cuda selector(sc, {sel_ws.data(), kvscout::topk_selector_cuda::workspace_bytes(sc)});
  const kvscout::correction_selector_cuda::config cc{{.num_seqs = S, .num_kv_heads = H,
                                                     .max_tokens = max_tokens}, extra, extra};
  const std::size_t cwb = kvscout::correction_selector_cuda::workspace_bytes(cc);
  gpu_test::device_vector<std::byte> corr_ws(std::max<std::size_t>(1, cwb));
  kvscout::correction_selector_cuda corr(cc, {corr_ws.data(), cwb});
  std::vector<kvscout::correction_selector_cuda::config> ccs(L, cc);  // each layer's
  std::vector<std::unique_ptr<gpu_test::device_vector<std::byte>>> layer_ws;
  std::vector<std::unique_ptr<kvscout::correction_selector_cuda>> layer_corr;
  std::vector<kvscout::correction_selector_cuda*> by_layer;
  if (per_layer) {
    by_layer.assign(L, nullptr);
    for (int l = skip; l < L; ++l) {
      ccs[static_cast<std::size_t>(l)].total_share = l == 1 ? 0.1 : 0.12;
      layer_ws.push_back(std::make_unique<gpu_test::device_vector<std::byte>>(cwb));
      layer_corr.push_back(std::make_unique<kvscout::correction_selector_cuda>(
          ccs[static_cast<std::size_t>(l)],
          kvscout::device_span<std::byte>{layer_ws.back()->data(), cwb}));
      by_layer[static_cast<std::size_t>(l)] = layer_corr.back().get();
    }
  }
  kvscout::zero_copy_executor_cuda<layout> fetch({.shape = {.num_seqs = S, .num_kv_heads = H},
                                                  .capacity = budget});
  kvscout::zero_copy_executor_cuda<layout> corr_fetch({.shape = {.num_seqs = S, .num_kv_heads = H},
                                                       .capacity = extra});
  gpu_test::device_vector<int> status(std::vector<int>{0});
  std::vector<kvscout::kv_view<layout, kvscout::device_space>> sources;
  for (int l = 0; l < L; ++l)
    sources.push_back({w.dev_layout,
                       {reinterpret_cast<const std::byte*>(w.k[l]->device_data()), w.cache_bytes},
                       {reinterpret_cast<const std::byte*>(w.v[l]->device_data()), w.cache_bytes}});
  gpu_test::device_vector<float> scores(static_cast<std::size_t>(S) * H * max_tokens), late(scores.size());
  gpu_test::device_vector<int32_t> positions(w.lens_init), dev_lens(w.lens_init);
  gpu_test::device_vector<float> x_slot0(static_cast<std::size_t>(S) * dm), x_slot1(x_slot0.size());
  buffer_store store;
  std::vector<kvscout::cuda_stage_buffers> slot_sets, layer_sets;
  for (int i = 0; i < 2; ++i) slot_sets.push_back(store.make(budget));
  for (int i = 0; i < 2 * L; ++i) layer_sets.push_back(store.make(budget));
  const correction_t correction{&corr, &corr_fetch, {{late.data(), late.size()}, S, H, max_tokens},
                                {store.make(extra), store.make(extra)}, by_layer};
  gpu_test::device_vector<unsigned long long> hits(std::vector<unsigned long long>{0});
  const kvscout::score_buffer<kvscout::device_space> score_buf{{scores.data(), scores.size()}, S, H, max_tokens};
  const kvscout::cuda_stage_lengths lengths{dspan<const int32_t>(positions), dspan<const int32_t>(dev_lens), max_tokens};
  const std::array<kvscout::device_span<const float>, 2> x_in{dspan<const float>(x_slot0), dspan<const float>(x_slot1)};
  stages_t stages(specs.per_layer, selector, fetch, sources, score_buf, lengths, x_in, slot_sets,
                  kvscout::cuda_stage_buffering::slots, nullptr, correction);
  stages_t cache_stages(specs.per_layer, selector, fetch, sources, score_buf, lengths, x_in, layer_sets,
                        kvscout::cuda_stage_buffering::row_cache, hits.data(), correction);
  GPU_CHECK(stages.has_correction() && cache_stages.has_correction());
  kvscout::decode_pipeline_cuda pipe({.shape = {.num_layers = L}, .skip_layers = skip},
                                     kvscout::stages_ref_cuda<stages_t>{&stages});
  kvscout::decode_pipeline_cuda cache_pipe({.shape = {.num_layers = L}, .skip_layers = skip},
                                           kvscout::stages_ref_cuda<stages_t>{&cache_stages});

  gpu_test::device_vector<float> x_all(w.x), q_all(w.q);
  gpu_test::device_vector<half> kc_all(w.k_cur), vc_all(w.v_cur);
  gpu_test::device_vector<float> out_all(static_cast<std::size_t>(L) * S * Hq * D);
  const std::size_t spec_n = static_cast<std::size_t>(S) * H * budget, add_n = static_cast<std::size_t>(S) * H * extra;
  gpu_test::device_vector<int32_t> rec_idx(L * spec_n), rec_cnt(L * S * H), rec_add(L * add_n), rec_add_cnt(L * S * H);
  float* x_slots[2] = {x_slot0.data(), x_slot1.data()};
  const std::size_t qn = static_cast<std::size_t>(S) * Hq * D, cn = static_cast<std::size_t>(S) * H * D;

  const kvscout::cuda_pipeline_exec px{compute, side, copy, status.data()};  // the stages report into status
  auto enqueue_step = [&](auto& p, auto& st) {
    for (int i = 0; i < L; ++i) {
      KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(x_slots[p.slot(i + 1)], x_all.data() + static_cast<std::size_t>(i) * S * dm,
                                         sizeof(float) * S * dm, cudaMemcpyDeviceToDevice, compute));
      p.input_ready(i, px);
      p.wait_rows(i, px);
      if (i < skip) continue;
      const kvscout::device_span<const float> q{q_all.data() + i * qn, qn};
      st.correct(i, p.slot(i), q, {compute, status.data()});
      const kvscout::cuda_stage_buffers& spec = st.buffers(i, p.slot(i));
      const kvscout::cuda_stage_buffers& add = st.added(i, p.slot(i));
      const kvscout::joined_rows_cuda rows(
          kvscout::gathered_rows_cuda<half, D>(spec.selection.view(), spec.rows),
          kvscout::gathered_rows_cuda<half, D>(add.selection.view(), add.rows));
      kvscout::decode_attention_cuda(
          rows, kvscout::current_token<half, kvscout::device_space>{{kc_all.data() + i * cn, cn}, {vc_all.data() + i * cn, cn}},
          q, kvscout::device_span<float>{out_all.data() + i * qn, qn}, {Hq, scale}, {compute, status.data()});
      const auto copy_rec = [&](int32_t* dst, const int32_t* src, std::size_t n) {
        KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(int32_t), cudaMemcpyDeviceToDevice, compute));
      };
      copy_rec(rec_idx.data() + i * spec_n, spec.selection.indices.data(), spec_n);
      copy_rec(rec_cnt.data() + i * S * H, spec.selection.counts.data(), S * H);
      copy_rec(rec_add.data() + i * add_n, add.selection.indices.data(), add_n);
      copy_rec(rec_add_cnt.data() + i * S * H, add.selection.counts.data(), S * H);
    }
    st.next_step();
  };

  enqueue_step(pipe, stages);
  KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(compute));
  GPU_CHECK(status.download()[0] == 0);
  const std::vector<int32_t> d_idx = rec_idx.download(), d_cnt = rec_cnt.download();
  const std::vector<int32_t> d_add = rec_add.download(), d_add_cnt = rec_add_cnt.download();
  const std::vector<float> d_out = out_all.download();

  int add_mismatches = 0, tie_differences = 0, overlaps = 0, attention_failures = 0;
  long long added_rows = 0;
  double worst = 0;
  for (int l = skip; l < L; ++l) {
    // ---- the added rows against the host's correction over the device's speculated rows ------
    const std::vector<float> late_h = host_late_scores(w, l);
    std::vector<int32_t> sp_i(d_idx.begin() + l * spec_n, d_idx.begin() + (l + 1) * spec_n);
    std::vector<int32_t> sp_c(d_cnt.begin() + l * S * H, d_cnt.begin() + (l + 1) * S * H);
    const kvscout::selection_view<kvscout::host_space> spec_v{{sp_i.data(), sp_i.size()}, {sp_c.data(), sp_c.size()}, S, H, budget};
    const auto hws = kvscout::make_workspace<kvscout::correction_selector_host>(
        ccs[static_cast<std::size_t>(l)]);
    kvscout::correction_selector_host host_corr(ccs[static_cast<std::size_t>(l)], hws.span());
    std::vector<int32_t> h_add(add_n, -1), h_add_cnt(S * H, -1);
    host_corr.select({{late_h.data(), late_h.size()}, {w.lens_init.data(), w.lens_init.size()}, S, H, max_tokens}, spec_v,
                     {{h_add.data(), h_add.size()}, {h_add_cnt.data(), h_add_cnt.size()}, S, H, extra});
    const int32_t* da = d_add.data() + l * add_n;
    const int32_t* dac = d_add_cnt.data() + l * S * H;
    for (int row = 0; row < S * H; ++row) {
      added_rows += dac[row];
      if (dac[row] != h_add_cnt[row]) {
        ++add_mismatches;
        std::fprintf(stderr, "layer %d row %d: device adds %d rows, host %d\n", l, row, dac[row], h_add_cnt[row]);
        continue;
      }
      const int32_t* a = da + static_cast<std::size_t>(row) * extra;
      const int32_t* b = h_add.data() + static_cast<std::size_t>(row) * extra;
      std::vector<int32_t> as(a, a + dac[row]), bs(b, b + dac[row]), diff;
      std::sort(as.begin(), as.end());
      std::set_symmetric_difference(as.begin(), as.end(), bs.begin(), bs.end(), std::back_inserter(diff));
      const int32_t* sp = sp_i.data() + static_cast<std::size_t>(row) * budget;
      for (int32_t t : as) overlaps += std::binary_search(sp, sp + sp_c[row], t) ? 1 : 0;
      if (diff.empty()) continue;
      const float* rs = late_h.data() + static_cast<std::size_t>(row) * max_tokens;
      float lo = INFINITY, hi = -INFINITY;
      for (int32_t t : diff) lo = std::min(lo, rs[t]), hi = std::max(hi, rs[t]);
      if (hi - lo <= 1e-4f * (1.f + std::abs(hi))) {
        ++tie_differences;
      } else {
        ++add_mismatches;
        std::fprintf(stderr, "layer %d row %d: %zu added rows differ, late scores %g .. %g\n", l, row,
                     diff.size(), lo, hi);
      }
    }
    // ---- attention: the host over the speculated and added rows it gathers from the cache ----
    std::vector<int32_t> ad_i(da, da + add_n), ad_c(dac, dac + S * H);
    const kvscout::selection_view<kvscout::host_space> add_v{{ad_i.data(), ad_i.size()}, {ad_c.data(), ad_c.size()}, S, H, extra};
    const auto gs = gpu_test::host_gather_rows(w.host_layout, w.k[l]->data(), w.v[l]->data(), w.cache_bytes, spec_v);
    const auto ga = gpu_test::host_gather_rows(w.host_layout, w.k[l]->data(), w.v[l]->data(), w.cache_bytes, add_v);
    const kvscout::gathered_rows_host<half, D> rs(spec_v, {gs.k.data(), gs.k.size()}, {gs.v.data(), gs.v.size()});
    const kvscout::gathered_rows_host<half, D> ra(add_v, {ga.k.data(), ga.k.size()}, {ga.v.data(), ga.v.size()});
    const kvscout::joined_rows_host<decltype(rs), decltype(ra)> both(rs, ra);
    std::vector<float> ref(qn);
    kvscout::decode_attention_host(both, kvscout::current_token<half>{{&w.k_cur[l * cn], cn}, {&w.v_cur[l * cn], cn}},
                                   {&w.q[l * qn], qn}, {ref.data(), ref.size()}, {Hq, scale});
    for (std::size_t e = 0; e < qn; ++e) {
      const double err = std::abs(static_cast<double>(d_out[l * qn + e]) - ref[e]);
      worst = std::max(worst, err);
      if (!(err <= 2e-5 + 2e-4 * std::abs(ref[e]))) ++attention_failures;
    }
  }
  std::printf("corrected step: %lld rows added, %d added-row mismatches, %d rows differing only on "
              "tied late scores, %d added rows already speculated, %d attention elements out of "
              "tolerance (worst %.3g)\n",
              added_rows, add_mismatches, tie_differences, overlaps, attention_failures, worst);
  GPU_CHECK(added_rows >= static_cast<long long>(L - skip) * S * H);  // the step adds rows
  if (per_layer) {  // rows (sequence, head): 0 and 1 are sequence 0's (200 tokens), 2 and 3 (90)
    const int want[L][S * H] = {{0, 0, 0, 0}, {4, 4, 0, 0}, {8, 8, 0, 0}};
    for (int l = skip; l < L; ++l)
      for (int row = 0; row < S * H; ++row)
        GPU_CHECK(d_add_cnt[static_cast<std::size_t>(l * S * H + row)] == want[l][row]);
  }
  GPU_CHECK(add_mismatches == 0);
  GPU_CHECK(overlaps == 0);
  GPU_CHECK(attention_failures == 0);

  // ---- the step captured in a graph, and through the row cache: the same bits --------------
  const auto same_records = [&]() {
    int n = 0;
    for (int l = skip; l < L; ++l) {
      const std::vector<float> o = out_all.download();
      const std::vector<int32_t> a = rec_add.download();
      n += std::memcmp(&o[l * qn], &d_out[l * qn], sizeof(float) * qn) != 0;
      n += std::memcmp(&a[l * add_n], &d_add[l * add_n], sizeof(int32_t) * add_n) != 0;
    }
    return n;
  };
  out_all.poison();
  rec_add.poison();
  cudaGraph_t graph{};
  KVSCOUT_CUDA_CHECK(cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal));
  enqueue_step(pipe, stages);
  KVSCOUT_CUDA_CHECK(cudaStreamEndCapture(compute, &graph));
  cudaGraphExec_t exec{};
  KVSCOUT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  KVSCOUT_CUDA_CHECK(cudaGraphLaunch(exec, compute));
  KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(compute));
  const int graph_diffs = same_records();
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaGraphExecDestroy(exec));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaGraphDestroy(graph));
  int cache_diffs = 0;
  for (int step = 0; step < 2; ++step) {
    out_all.poison();
    rec_add.poison();
    enqueue_step(cache_pipe, cache_stages);
    KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(compute));
    cache_diffs += same_records();
  }
  std::printf("graph replay: %d layer records differ; row cache (2 steps): %d; %llu rows served "
              "from the device\n", graph_diffs, cache_diffs, hits.download()[0]);
  GPU_CHECK(graph_diffs == 0);
  GPU_CHECK(cache_diffs == 0);
  GPU_CHECK(status.download()[0] == 0);

  // ---- any device_step_executor (issue 33): an engine's own gives the same bits -----------
  {
    const kvscout::zero_copy_config own_cfg{.shape = {.num_seqs = S, .num_kv_heads = H},
                                            .capacity = budget};
    static_assert(counting_executor::workspace_alignment == 1);
    counting_executor own_fetch(own_cfg, {nullptr, counting_executor::workspace_bytes(own_cfg)});  // 0
    counting_executor own_corr_fetch({.shape = {.num_seqs = S, .num_kv_heads = H},
                                      .capacity = extra});
    const kvscout::cuda_stage_correction<counting_executor> own_corr{
        &corr, &own_corr_fetch, correction.scores, correction.sets, correction.per_layer};
    counting_stages_t own(specs.per_layer, selector, own_fetch, sources, score_buf, lengths, x_in,
                          slot_sets, kvscout::cuda_stage_buffering::slots, nullptr, own_corr);
    kvscout::decode_pipeline_cuda own_pipe({.shape = {.num_layers = L}, .skip_layers = skip},
                                           kvscout::stages_ref_cuda<counting_stages_t>{&own});
    out_all.poison();
    rec_add.poison();
    for (auto& buf : store.rows) buf->poison();  // every fetched row must come from this run
    enqueue_step(own_pipe, own);
    KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(compute));
    const int own_diffs = same_records();
    std::printf("own executor: %d layer records differ; %d + %d submits\n", own_diffs,
                own_fetch.submits, own_corr_fetch.submits);
    GPU_CHECK(own_diffs == 0);
    GPU_CHECK(own_fetch.submits == L - skip && own_corr_fetch.submits == L - skip);
    GPU_CHECK(status.download()[0] == 0);
    GPU_CHECK(gpu_test::throws_with(
        [&] {
          counting_stages_t c(specs.per_layer, selector, own_fetch, sources, score_buf, lengths, x_in,
                              layer_sets, kvscout::cuda_stage_buffering::row_cache, hits.data());
        },
        "row_cache buffering needs an executor whose submit takes a row_cache_view"));
  }

  // ---- refusals, by name ------------------------------------------------------------------
  stages_t plain(specs.per_layer, selector, fetch, sources, score_buf, lengths, x_in, slot_sets);
  GPU_CHECK(!plain.has_correction());
  const kvscout::device_span<const float> q1{q_all.data() + qn, qn};
  GPU_CHECK(gpu_test::throws_with([&] { plain.correct(1, 1, q1, {compute, status.data()}); },
                                  "built without correction parts"));
  GPU_CHECK(gpu_test::throws_with([&] { (void)plain.added(1, 1); }, "built without correction parts"));
  GPU_CHECK(gpu_test::throws_with([&] { stages.correct(0, 0, q1, {compute, status.data()}); },
                                  "layer 0 has no speculation policy"));
  GPU_CHECK(gpu_test::throws_with([&] { stages.correct(1, 2, q1, {compute, status.data()}); },
                                  "slot 2 is not 0 or 1"));
  const auto build = [&](correction_t c) {
    stages_t s(specs.per_layer, selector, fetch, sources, score_buf, lengths, x_in, slot_sets,
               kvscout::cuda_stage_buffering::slots, nullptr, c);
  };
  correction_t shared = correction;
  shared.scores = score_buf;
  GPU_CHECK(gpu_test::throws_with([&] { build(shared); }, "overlaps the speculation's score buffer"));
  shared.scores = correction.scores;
  shared.scores.scores = {scores.data() + S * H * max_tokens - 1, late.size()};  // one float shared
  GPU_CHECK(gpu_test::throws_with([&] { build(shared); }, "overlaps the speculation's score buffer"));
  correction_t no_selector = correction;
  no_selector.selector = nullptr;
  GPU_CHECK(gpu_test::throws_with([&] { build(no_selector); }, "selector is null"));
  correction_t no_fetch = correction;
  no_fetch.fetch = nullptr;
  GPU_CHECK(gpu_test::throws_with([&] { build(no_fetch); }, "cuda_stage_correction::fetch is null"));
  correction_t wrong_cap = correction;
  wrong_cap.sets[1] = slot_sets[1];  // capacity budget, not extra
  GPU_CHECK(gpu_test::throws_with([&] { build(wrong_cap); }, "correction set 1 has capacity 16"));
  correction_t short_stride = correction;
  short_stride.scores.stride = max_tokens - 1;
  GPU_CHECK(gpu_test::throws_with([&] { build(short_stride); }, "late-score buffer"));
  // A query of the wrong size: score_query names it.
  GPU_CHECK(gpu_test::throws_with(
      [&] { stages.correct(1, 1, {q_all.data(), qn - 1}, {compute, status.data()}); }, "q holds 511 floats"));
  // Joined rows of two shapes.
  const kvscout::selection_view<kvscout::device_space> other{
      correction.sets[0].selection.indices, correction.sets[0].selection.counts, 1, H, extra};
  GPU_CHECK(gpu_test::throws_with(
      [&] {
        (void)kvscout::joined_rows_cuda(
            kvscout::gathered_rows_cuda<half, D>(slot_sets[0].selection.view(), slot_sets[0].rows),
            kvscout::gathered_rows_cuda<half, D>(other, correction.sets[0].rows));
      },
      "joined rows of shapes"));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(compute));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(side));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(copy));
}

}  // namespace

int main() {
  return gpu_test::run_all("correction_pipeline_device",
                           {{"corrected_step_matches_host", [] { corrected_step(false); }},
                            {"per_layer_totals_match_host", [] { corrected_step(true); }}});
}
