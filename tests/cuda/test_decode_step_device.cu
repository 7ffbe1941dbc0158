// One decode step through decode_pipeline_cuda with kvscout's own kernels (pipeline/cuda_stages.cuh):
// device speculation + top-k on the side stream, zero-copy fetch from mapped host caches on the
// copy stream, sparse attention on the compute stream, overlapped, then the same step captured in
// a CUDA graph. Checked against the host backend layer by layer:
//   - the device selection of every speculated layer equals the host's (infinigen_policy_host +
//     topk_selector_host on the same inputs), except for tokens whose host score ties the cut
//     within float rounding;
//   - the device attention output equals decode_attention_host over the rows the host gathers for
//     the device's selection (so this checks the wiring and the ordering, not only each kernel);
//   - the graph replay gives the same bits as the eager step.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpu_harness.cuh"
#include "host_gather_reference.cuh"
#include "pipeline_world.cuh"
#include "kvscout/core/workspace.hpp"
#include "kvscout/attention/decode.cuh"
#include "kvscout/attention/decode.hpp"
#include "kvscout/attention/rows.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/pipeline/cuda_pipeline.hpp"
#include "kvscout/pipeline/cuda_stages.cuh"
#include "kvscout/select/topk.cuh"
#include "kvscout/select/topk.hpp"
#include "kvscout/score/infinigen.hpp"

namespace {

using kvscout::half;
constexpr int L = 4, skip = 1, S = 2, H = 2, g = 2, Hq = H * g, D = 64, dm = 128, r = 16;
constexpr int max_tokens = 512, budget = 32;
using layout = kvscout::contiguous_layout<half, D, kvscout::hnd>;
const float scale = 0.125f;
const kvscout::keep_set keep{4, 8};

struct shape {
  static constexpr int L = ::L, skip = ::skip, S = ::S, H = ::H, Hq = ::Hq, D = ::D, dm = ::dm,
                       r = ::r, max_tokens = ::max_tokens;
};
struct world : gpu_test::pipeline_world<shape> {
  world() : pipeline_world(2024, {300, 170}) {}
};
using speculators = gpu_test::pipeline_speculators<world>;
using gpu_test::dspan;

// The host's selection and scores of layer l, from x of layer l - 1.
struct host_selection {
  std::vector<int32_t> idx, cnt;
  std::vector<float> scores;
};

host_selection host_select(const world& w, int l) {
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
  std::vector<int32_t> lens(w.lens_init), pos(w.lens_init);
  host_selection out;
  out.scores.assign(static_cast<std::size_t>(S) * H * max_tokens, 0.f);
  policy.score(l, {.x = {&w.x[static_cast<std::size_t>(l - 1) * S * dm], static_cast<std::size_t>(S) * dm},
                   .q = {}, .positions = {pos.data(), pos.size()}, .seq_lens = {lens.data(), lens.size()}},
               {{out.scores.data(), out.scores.size()}, S, H, max_tokens});
  kvscout::topk_selector_host::config sc{{.num_seqs = S, .num_kv_heads = H,
                                         .max_tokens = max_tokens}, budget, budget, keep};
  auto ws = kvscout::make_workspace<kvscout::topk_selector_host>(sc);
  kvscout::topk_selector_host sel(sc, ws.span());
  out.idx.assign(static_cast<std::size_t>(S) * H * budget, -1);
  out.cnt.assign(S * H, -1);
  sel.select({{out.scores.data(), out.scores.size()}, {lens.data(), lens.size()}, S, H, max_tokens},
             {{out.idx.data(), out.idx.size()}, {out.cnt.data(), out.cnt.size()}, S, H, budget});
  return out;
}

void step_matches_host() {
  world w;
  cudaStream_t compute{}, side{}, copy{};
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&compute));
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&side));
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&copy));

  // ---- device set-up: speculators (partial key caches filled from the host caches) ------------
  kvscout::infinigen_config dc{{.num_seqs = S, .num_kv_heads = H, .num_q_heads = Hq,
                                    .head_dim = D, .d_model = dm, .max_tokens = max_tokens,
                                    .scale = scale}, r, kvscout::rope_mode::rope_planes,
                                    kvscout::gqa_aggregation::max_logit};
  const speculators specs(w, dc, compute);
  const std::vector<speculators::spec_t*>& spec_ptrs = specs.per_layer;

  // ---- selector, executor, buffers --------------------------------------------------------------
  kvscout::topk_selector_cuda::config sc{{.num_seqs = S, .num_kv_heads = H,
                                         .max_tokens = max_tokens}, budget, budget, keep};
  gpu_test::device_vector<std::byte> sel_ws(std::max<std::size_t>(1, kvscout::topk_selector_cuda::workspace_bytes(sc)));
  kvscout::topk_selector_cuda selector(sc, {sel_ws.data(), kvscout::topk_selector_cuda::workspace_bytes(sc)});
  gpu_test::device_vector<int> status(1);
  KVSCOUT_CUDA_CHECK(cudaMemset(status.data(), 0, sizeof(int)));
  kvscout::zero_copy_executor_cuda<layout> fetch({.shape = {.num_seqs = S, .num_kv_heads = H},
                                                  .capacity = budget});
  std::vector<kvscout::kv_view<layout, kvscout::device_space>> sources;
  const std::size_t cache_bytes = static_cast<std::size_t>(S) * H * max_tokens * D * sizeof(half);
  for (int l = 0; l < L; ++l)
    sources.push_back({w.dev_layout,
                       {reinterpret_cast<const std::byte*>(w.k[l]->device_data()), cache_bytes},
                       {reinterpret_cast<const std::byte*>(w.v[l]->device_data()), cache_bytes}});
  gpu_test::device_vector<float> scores(static_cast<std::size_t>(S) * H * max_tokens);
  std::vector<int32_t> pos_host(w.lens_init);
  gpu_test::device_vector<int32_t> positions(pos_host), dev_lens(w.lens_init);
  const std::size_t slots_n = static_cast<std::size_t>(S) * H * budget;
  gpu_test::device_vector<float> x_slot0(static_cast<std::size_t>(S) * dm), x_slot1(x_slot0.size());
  // Buffer sets: two (by slot) for the eager / graph step, two per layer for the row cache.
  std::vector<std::unique_ptr<gpu_test::device_vector<int32_t>>> idx_store, cnt_store;
  std::vector<std::unique_ptr<gpu_test::device_vector<half>>> row_store;
  auto make_set = [&]() {
    idx_store.push_back(std::make_unique<gpu_test::device_vector<int32_t>>(slots_n));
    cnt_store.push_back(std::make_unique<gpu_test::device_vector<int32_t>>(S * H));
    row_store.push_back(std::make_unique<gpu_test::device_vector<half>>(slots_n * D));
    auto& rk = *row_store.back();
    row_store.push_back(std::make_unique<gpu_test::device_vector<half>>(slots_n * D));
    auto& rv = *row_store.back();
    return kvscout::cuda_stage_buffers{
        {{idx_store.back()->data(), slots_n}, {cnt_store.back()->data(), static_cast<std::size_t>(S * H)}, S, H, budget},
        {{reinterpret_cast<std::byte*>(rk.data()), rk.bytes()}, {reinterpret_cast<std::byte*>(rv.data()), rv.bytes()}}};
  };
  std::vector<kvscout::cuda_stage_buffers> slot_sets, layer_sets;
  for (int i = 0; i < 2; ++i) slot_sets.push_back(make_set());
  for (int i = 0; i < 2 * L; ++i) layer_sets.push_back(make_set());
  gpu_test::device_vector<unsigned long long> hits(1);
  KVSCOUT_CUDA_CHECK(cudaMemset(hits.data(), 0, sizeof(unsigned long long)));
  using stages_t = kvscout::infinigen_stages_cuda<layout, kvscout::topk_selector_cuda>;
  const kvscout::score_buffer<kvscout::device_space> score_buf{{scores.data(), scores.size()}, S, H, max_tokens};
  const kvscout::cuda_stage_lengths lengths{dspan<const int32_t>(positions), dspan<const int32_t>(dev_lens), max_tokens};
  const std::array<kvscout::device_span<const float>, 2> x_in{dspan<const float>(x_slot0), dspan<const float>(x_slot1)};
  stages_t slot_stages(spec_ptrs, selector, fetch, sources, score_buf, lengths, x_in, slot_sets);
  stages_t cache_stages(spec_ptrs, selector, fetch, sources, score_buf, lengths, x_in, layer_sets,
                        kvscout::cuda_stage_buffering::row_cache, hits.data());
  kvscout::decode_pipeline_cuda slot_pipe({.shape = {.num_layers = L}, .skip_layers = skip},
                                          kvscout::stages_ref_cuda<stages_t>{&slot_stages});
  kvscout::decode_pipeline_cuda cache_pipe({.shape = {.num_layers = L}, .skip_layers = skip},
                                           kvscout::stages_ref_cuda<stages_t>{&cache_stages});
  using pipe_t = decltype(slot_pipe);
  // The stages' policy, selector and fetch report into status.
  const kvscout::cuda_pipeline_exec px{compute, side, copy, status.data()};

  // Per-layer inputs and records on the device.
  gpu_test::device_vector<float> x_all(w.x), q_all(w.q);
  gpu_test::device_vector<half> kc_all(w.k_cur), vc_all(w.v_cur);
  gpu_test::device_vector<float> out_all(static_cast<std::size_t>(L) * S * Hq * D);
  gpu_test::device_vector<int32_t> rec_idx(static_cast<std::size_t>(L) * slots_n), rec_cnt(static_cast<std::size_t>(L) * S * H);
  float* x_slots[2] = {x_slot0.data(), x_slot1.data()};

  auto enqueue_step = [&](pipe_t& pipe, stages_t& stages) {
    for (int i = 0; i < L; ++i) {
      // x_i is what layer i + 1 is speculated from: into slot(i + 1).
      KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(x_slots[pipe_t::slot(i + 1)],
                                         x_all.data() + static_cast<std::size_t>(i) * S * dm,
                                         sizeof(float) * S * dm, cudaMemcpyDeviceToDevice, compute));
      pipe.input_ready(i, px);
      pipe.wait_rows(i, px);
      if (i < skip) continue;
      const kvscout::cuda_stage_buffers& buf = stages.buffers(i, pipe_t::slot(i));
      const auto sel = buf.selection.view();
      const kvscout::gathered_rows_cuda<half, D> rows(sel, buf.rows);  // the executor's bytes
      const std::size_t cur = static_cast<std::size_t>(i) * S * H * D;
      kvscout::decode_attention_cuda(
          rows, kvscout::current_token<half, kvscout::device_space>{{kc_all.data() + cur, static_cast<std::size_t>(S) * H * D},
                                                    {vc_all.data() + cur, static_cast<std::size_t>(S) * H * D}},
          {q_all.data() + static_cast<std::size_t>(i) * S * Hq * D, static_cast<std::size_t>(S) * Hq * D},
          {out_all.data() + static_cast<std::size_t>(i) * S * Hq * D, static_cast<std::size_t>(S) * Hq * D},
          {Hq, scale}, {compute, status.data()});
      KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(rec_idx.data() + static_cast<std::size_t>(i) * slots_n, sel.indices.data(),
                                         slots_n * sizeof(int32_t), cudaMemcpyDeviceToDevice, compute));
      KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(rec_cnt.data() + static_cast<std::size_t>(i) * S * H, sel.counts.data(),
                                         S * H * sizeof(int32_t), cudaMemcpyDeviceToDevice, compute));
    }
    stages.next_step();
  };

  enqueue_step(slot_pipe, slot_stages);
  KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(compute));
  GPU_CHECK(status.download()[0] == 0);
  const std::vector<int32_t> d_idx = rec_idx.download(), d_cnt = rec_cnt.download();
  const std::vector<float> d_out = out_all.download();
  // Speculated layers' records that differ from this eager step's, bit for bit: the outputs, and
  // the indices / counts where given.
  const auto differing_layers = [&](const std::vector<float>& o, const std::vector<int32_t>* idx,
                                    const std::vector<int32_t>* cnt) {
    int n = 0;
    for (int l = skip; l < L; ++l) {
      const std::size_t qo = static_cast<std::size_t>(l) * S * Hq * D;
      const std::size_t io = static_cast<std::size_t>(l) * slots_n, co = static_cast<std::size_t>(l) * S * H;
      n += std::memcmp(&o[qo], &d_out[qo], sizeof(float) * S * Hq * D) != 0;
      if (idx != nullptr) n += std::memcmp(&(*idx)[io], &d_idx[io], sizeof(int32_t) * slots_n) != 0;
      if (cnt != nullptr) n += std::memcmp(&(*cnt)[co], &d_cnt[co], sizeof(int32_t) * S * H) != 0;
    }
    return n;
  };

  // ---- check every speculated layer against the host ---------------------------------------------
  int selection_mismatches = 0, tie_differences = 0, attention_failures = 0;
  double worst_attention = 0;
  for (int l = skip; l < L; ++l) {
    const host_selection hs = host_select(w, l);
    const int32_t* li = d_idx.data() + static_cast<std::size_t>(l) * slots_n;
    const int32_t* lc = d_cnt.data() + static_cast<std::size_t>(l) * S * H;
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h) {
        const int row = s * H + h;
        if (lc[row] != hs.cnt[row]) {
          ++selection_mismatches;
          std::fprintf(stderr, "layer %d (s %d, h %d): device count %d, host %d\n", l, s, h, lc[row], hs.cnt[row]);
          continue;
        }
        const int32_t* a = li + static_cast<std::size_t>(row) * budget;
        const int32_t* b = hs.idx.data() + static_cast<std::size_t>(row) * budget;
        std::vector<int32_t> diff;
        std::set_symmetric_difference(a, a + lc[row], b, b + lc[row], std::back_inserter(diff));
        if (diff.empty()) continue;
        // Allowed only where the host scores of the differing tokens tie within float rounding.
        const float* row_scores = hs.scores.data() + static_cast<std::size_t>(row) * max_tokens;
        float lo = INFINITY, hi = -INFINITY;
        for (int32_t t : diff) lo = std::min(lo, row_scores[t]), hi = std::max(hi, row_scores[t]);
        if (hi - lo <= 1e-4f * (1.f + std::abs(hi))) {
          ++tie_differences;
        } else {
          ++selection_mismatches;
          std::fprintf(stderr, "layer %d (s %d, h %d): %zu tokens differ, scores %g .. %g\n", l, s, h,
                       diff.size(), lo, hi);
        }
      }
    // Attention: the host over the rows the host gathers for the device's selection.
    std::vector<int32_t> sel_i(li, li + slots_n), sel_c(lc, lc + S * H);
    const kvscout::selection_view<kvscout::host_space> hv{{sel_i.data(), sel_i.size()}, {sel_c.data(), sel_c.size()}, S, H, budget};
    const auto [gk, gv] = gpu_test::host_gather_rows(w.host_layout, w.k[l]->data(), w.v[l]->data(), cache_bytes, hv);
    const kvscout::gathered_rows_host<half, D> rows(hv, {gk.data(), gk.size()}, {gv.data(), gv.size()});
    const std::size_t cur = static_cast<std::size_t>(l) * S * H * D, qo = static_cast<std::size_t>(l) * S * Hq * D;
    std::vector<float> ref(static_cast<std::size_t>(S) * Hq * D);
    kvscout::decode_attention_host(rows, kvscout::current_token<half>{{&w.k_cur[cur], static_cast<std::size_t>(S) * H * D},
                                                                      {&w.v_cur[cur], static_cast<std::size_t>(S) * H * D}},
                                   {&w.q[qo], ref.size()}, {ref.data(), ref.size()}, {Hq, scale});
    for (std::size_t e = 0; e < ref.size(); ++e) {
      const double err = std::abs(static_cast<double>(d_out[qo + e]) - ref[e]);
      worst_attention = std::max(worst_attention, err);
      if (!(err <= 2e-5 + 2e-4 * std::abs(ref[e]))) ++attention_failures;
    }
  }
  std::printf("decode step: %d selection mismatches, %d rows differing only on tied scores, "
              "%d attention elements out of tolerance (worst %.3g)\n",
              selection_mismatches, tie_differences, attention_failures, worst_attention);
  GPU_CHECK(selection_mismatches == 0);
  GPU_CHECK(attention_failures == 0);

  // ---- the same step captured in a graph gives the same bits -------------------------------------
  out_all.poison();
  rec_idx.poison();
  // cudaMemset runs on the legacy stream, which the non-blocking streams do not wait for.
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  cudaGraph_t graph{};
  KVSCOUT_CUDA_CHECK(cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal));
  enqueue_step(slot_pipe, slot_stages);
  KVSCOUT_CUDA_CHECK(cudaStreamEndCapture(compute, &graph));
  cudaGraphExec_t exec{};
  KVSCOUT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  KVSCOUT_CUDA_CHECK(cudaGraphLaunch(exec, compute));
  KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(compute));
  const std::vector<float> g_out = out_all.download();
  const std::vector<int32_t> g_idx = rec_idx.download();
  GPU_CHECK(differing_layers(g_out, &g_idx, nullptr) == 0);
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaGraphExecDestroy(exec));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaGraphDestroy(graph));

  // ---- the row cache: the first step fetches everything, the second (same inputs, so the same
  // selections) finds every row in the device cache; both give the eager step's bits -------------
  std::int64_t selected_rows = 0;
  for (int l = skip; l < L; ++l)
    for (int e = 0; e < S * H; ++e) selected_rows += d_cnt[static_cast<std::size_t>(l) * S * H + e];
  // One step through a row-cache pipeline: the speculated layers whose outputs differ from the
  // eager step's, and the rows the device cache served.
  const auto cached_step = [&](pipe_t& pipe, stages_t& stages) {
    out_all.poison();
    KVSCOUT_CUDA_CHECK(cudaMemset(hits.data(), 0, sizeof(unsigned long long)));
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());  // the memsets before the non-blocking streams
    enqueue_step(pipe, stages);
    KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(compute));
    return std::make_pair(differing_layers(out_all.download(), nullptr, nullptr), hits.download()[0]);
  };
  for (int step = 0; step < 2; ++step) {
    const auto [diffs, h] = cached_step(cache_pipe, cache_stages);
    std::printf("row cache, step %d: %llu of %lld rows served from the device\n", step, h,
                static_cast<long long>(selected_rows));
    GPU_CHECK(diffs == 0);
    GPU_CHECK(h == (step == 0 ? 0ull : static_cast<unsigned long long>(selected_rows)));
  }

  // ---- continuous batching: speculators that hold three sequences, the batch's rows naming
  // theirs through cuda_stage_lengths::seq_ids = {2, 0}; sequence 1 holds other keys, so stages
  // that dropped the ids would score batch row 0 against batch row 1's keys. The selections and
  // outputs are the eager step's, bit for bit; with the row cache, cached_rows decides the hits.
  {
    kvscout::infinigen_config dc3 = dc;
    dc3.shape.num_seqs = 3;
    const int slot_of[S] = {2, 0};
    const speculators specs3(w, dc3, compute, {slot_of[0], slot_of[1]}, 1);  // sequence 1: the decoy
    const std::vector<speculators::spec_t*>& ptrs3 = specs3.per_layer;
    gpu_test::device_vector<int32_t> ids(std::vector<int32_t>{slot_of[0], slot_of[1]});
    gpu_test::device_vector<int32_t> prev_rows(std::vector<int32_t>{0, 1});
    kvscout::cuda_stage_lengths lengths3 = lengths;
    lengths3.seq_ids = dspan<const int32_t>(ids);
    stages_t id_stages(ptrs3, selector, fetch, sources, score_buf, lengths3, x_in, slot_sets);
    kvscout::decode_pipeline_cuda id_pipe({.shape = {.num_layers = L}, .skip_layers = skip},
                                          kvscout::stages_ref_cuda<stages_t>{&id_stages});
    out_all.poison();
    rec_idx.poison();
    rec_cnt.poison();
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    enqueue_step(id_pipe, id_stages);
    KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(compute));
    GPU_CHECK(status.download()[0] == 0);
    const std::vector<float> s_out = out_all.download();
    const std::vector<int32_t> s_idx = rec_idx.download(), s_cnt = rec_cnt.download();
    const int id_diffs = differing_layers(s_out, &s_idx, &s_cnt);
    std::printf("seq_ids {2, 0}: %d layer records differ from the identity batch\n", id_diffs);
    GPU_CHECK(id_diffs == 0);

    // The row cache over rows named by seq_ids: cached_rows {0, 1} (each row held its sequence at
    // the previous step) serves every row from the device; {-1, -1} (new sequences) serves none.
    kvscout::cuda_stage_lengths cached3 = lengths3;
    cached3.cached_rows = dspan<const int32_t>(prev_rows);
    stages_t id_cache_stages(ptrs3, selector, fetch, sources, score_buf, cached3, x_in, layer_sets,
                             kvscout::cuda_stage_buffering::row_cache, hits.data());
    kvscout::decode_pipeline_cuda id_cache_pipe({.shape = {.num_layers = L}, .skip_layers = skip},
                                                kvscout::stages_ref_cuda<stages_t>{&id_cache_stages});
    const std::vector<int32_t> row_maps[3] = {{0, 1}, {0, 1}, {-1, -1}};
    const unsigned long long want_hits[3] = {0ull, static_cast<unsigned long long>(selected_rows), 0ull};
    for (int step = 0; step < 3; ++step) {
      prev_rows.upload(row_maps[step]);
      const auto [diffs, h] = cached_step(id_cache_pipe, id_cache_stages);
      std::printf("seq_ids row cache, step %d (cached_rows {%d, %d}): %llu of %lld rows served "
                  "from the device\n", step, row_maps[step][0], row_maps[step][1], h,
                  static_cast<long long>(selected_rows));
      GPU_CHECK(diffs == 0);
      GPU_CHECK(h == want_hits[step]);
    }
  }
  GPU_CHECK(status.download()[0] == 0);
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(compute));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(side));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(copy));
}

}  // namespace

int main() {
  return gpu_test::run_all("decode_step_device", {{"step_matches_host", step_matches_host}});
}
