// One decode step of one attention layer on the CUDA backend, with the layer's KV cache offloaded
// to host memory (pinned and mapped, so the GPU can read it over the link). Following InfiniGen,
// the step guesses which cached tokens layer i will attend to and moves only their K/V rows:
//
//   1. speculate  infinigen_policy_cuda: a partial query (r of head_dim channels) from the
//                 hidden state, scored against a partial key cache that stays on the device
//   2. select     topk_selector_cuda: the best `budget` tokens per (sequence, KV head); indices
//                 and counts stay on the device, nothing is read back
//   3. fetch      zero_copy_executor_cuda: the GPU reads only the selected rows from host memory
//   4. attend     decode_attention_cuda over the fetched rows and the new token
//
// All memory is allocated at set-up, each part sized by its own workspace query; the step only
// enqueues work on one stream, so it could be captured in a CUDA graph. An engine runs 1-3 on side
// streams during layer i-1 (pipeline/cuda_stages.cuh, docs/cuda_pipeline.md). The result is checked
// against the host backend on the same selection. Exit code: 0 ok, 1 mismatch or error, 77 no CUDA
// device (ctest: skipped). Built by g++ for the host SIMT emulator (tests/simt, KVSCOUT_SIMT_HOST),
// the emulator is the device, so it runs on any machine.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "kvscout/kvscout.hpp"  // every host-compilable part; the CUDA parts one by one:
#include "kvscout/attention/decode.cuh"
#include "kvscout/fetch/zero_copy.cuh"
#include "kvscout/pipeline/cuda_stages.cuh"  // cuda_stage_memory: the step's buffers
#include "kvscout/select/topk.cuh"
#include "kvscout/score/infinigen.cuh"
#include "cuda_memory.cuh"  // the example's allocations (examples/)

namespace {

using kvscout::from_float, kvscout::half, kvscout::to_float;
using std::size_t;

// A small model shape: 2 sequences, 2 KV heads of 4 query heads each (GQA), head_dim 64.
constexpr int S = 2, H = 2, Hq = 8, D = 64, d_model = 256;
constexpr int max_tokens = 1024;  // cache slots per sequence
constexpr int r = 16;             // partial dimension: 8 of the 32 RoPE planes
constexpr int budget = 64;        // rows fetched per (sequence, KV head), keep-set included
constexpr float scale = 0.125f;   // 1 / sqrt(head_dim)
using layout = kvscout::contiguous_layout<half, D, kvscout::hnd>;  // [S, H, max_tokens, D]

using examples::cuda_memory, examples::download;

int run() {
  std::mt19937 rng(2025);
  std::normal_distribution<float> normal(0.f, 1.f);
  cuda_memory mem;

  // ---- layer i's offloaded KV cache, in mapped pinned host memory -------------------------------
  const std::vector<int32_t> lens = {1000, 613};  // cached tokens per sequence
  const kvscout::device_span<int32_t> d_lens = mem.upload(lens);
  const layout host_layout = layout::padded(H, max_tokens, lens.data(), S);
  const layout dev_layout = layout::padded(H, max_tokens, d_lens.data(), S);  // device-read lengths
  const size_t cache_n = size_t(S) * H * max_tokens * D;
  const auto [k_host, k_dev] = mem.mapped<half>(cache_n);
  const auto [v_host, v_dev] = mem.mapped<half>(cache_n);
  // The prefill: the model's K / V of the cached tokens, [tokens, H, D] (keys after RoPE, with a
  // few large channels, 0-7 and 32-39, i.e. RoPE planes 0-7, as real keys have), each token's
  // sequence and position; the engine writes them into its cache (k_offset: the layout's address
  // math, in bytes).
  std::vector<half> k_prefill;
  std::vector<int32_t> seq_ids, token_ids;
  for (int s = 0; s < S; ++s)
    for (int t = 0; t < lens[s]; ++t) {
      seq_ids.push_back(s);
      token_ids.push_back(t);
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < D; ++c) {
          k_prefill.push_back(from_float<half>(normal(rng) * (c % 32 < 8 ? 3.f : 1.f)));
          k_host[host_layout.k_offset(s, t, h) / sizeof(half) + c] = k_prefill.back();
          v_host[host_layout.v_offset(s, t, h) / sizeof(half) + c] = from_float<half>(normal(rng));
        }
    }

  // ---- the layer's weights and this step's inputs -----------------------------------------------
  const kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  std::vector<float> w_q(size_t(Hq) * D * d_model), x(size_t(S) * d_model);
  for (float& w : w_q) w = normal(rng) / 16.f;  // 1 / sqrt(d_model)
  for (float& e : x) e = normal(rng);
  // The attention query, RoPE(W_Q x) at the new token's position. An engine computes it from
  // layer i's own input; this example reuses x, the hidden state the speculation reads.
  std::vector<float> q(size_t(S) * Hq * D, 0.f);
  for (int s = 0; s < S; ++s)
    for (int qh = 0; qh < Hq; ++qh) {
      float* head = &q[(size_t(s) * Hq + qh) * D];
      for (int d = 0; d < D; ++d)
        for (int c = 0; c < d_model; ++c)
          head[d] += w_q[(size_t(qh) * D + d) * d_model + c] * x[size_t(s) * d_model + c];
      kvscout::apply_rope(head, lens[s], rope);
    }
  // The new token's K / V: attention reads them directly (appending them is another step).
  std::vector<half> k_new(size_t(S) * H * D), v_new(k_new.size());
  for (half& e : k_new) e = from_float<half>(normal(rng));
  for (half& e : v_new) e = from_float<half>(normal(rng));
  // The RoPE planes the partial query keeps, per KV head: calibrate_skew ranks them offline on
  // real activations; here planes 0-7, where the keys are large.
  const std::vector<kvscout::skew_plan> plans(
      H, kvscout::rope_planes_plan(rope, {0, 1, 2, 3, 4, 5, 6, 7}));

  // ---- set-up: ask each part for its workspace size, allocate once, build the views -------------
  cudaStream_t stream{};
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&stream));
  using speculator_t = kvscout::infinigen_policy_cuda<float>;
  // The step's dimensions, once; every part's config holds them and adds its own settings.
  const kvscout::decode_shape shape{.num_seqs = S, .num_kv_heads = H, .num_q_heads = Hq,
                                    .head_dim = D, .d_model = d_model, .max_tokens = max_tokens,
                                    .scale = scale};
  const kvscout::infinigen_config spec_cfg{.shape = shape, .r = r,
                                                .mode = kvscout::rope_mode::rope_planes};
  speculator_t spec(spec_cfg, plans, {w_q.data(), w_q.size()}, {},
                    mem.alloc<std::byte>(speculator_t::workspace_bytes(spec_cfg)));
  // Prefill: the speculator's partial key cache takes its r channels of the prefill's keys (on the
  // device in an engine; uploaded here).
  spec.append(mem.upload(k_prefill), mem.upload(seq_ids), mem.upload(token_ids),
              int(seq_ids.size()), {stream});  // the execution argument (core/exec.hpp)

  // Top-k keeps 4 attention sinks and the 16 most recent tokens, and fills the budget by score.
  const kvscout::topk_selector_cuda::config sel_cfg{.shape = shape, .capacity = budget,
                                                    .budget = budget, .keep = {4, 16}};
  kvscout::topk_selector_cuda selector(
      sel_cfg, mem.alloc<std::byte>(kvscout::topk_selector_cuda::workspace_bytes(sel_cfg)));
  // Kernels flag bad device data (say, an index past a length) in a status word that kvscout never
  // reads back. Every device call takes it, with its stream, as its last argument: one cuda_exec.
  // The zero-copy executor needs no workspace (its workspace_bytes is 0).
  const kvscout::device_span<int> status = mem.upload(std::vector<int>{0});
  const kvscout::cuda_exec exec{stream, status.data()};
  kvscout::zero_copy_executor_cuda<layout> fetch({.shape = shape, .capacity = budget});

  const auto d_x = mem.upload(x), d_q = mem.upload(q), out = mem.alloc<float>(q.size());
  const auto d_positions = mem.upload(lens);  // the new token's position is its sequence length
  // The score buffer, the selection and the fetched rows, carved from one allocation.
  const size_t kv_row = D * sizeof(half);  // a K row's bytes, and a V row's
  const size_t step_bytes = kvscout::cuda_stage_memory::bytes(shape, budget, kv_row, kv_row);
  const kvscout::cuda_stage_memory m = kvscout::cuda_stage_memory::carve(
      shape, budget, kv_row, kv_row, mem.alloc<std::byte>(step_bytes));
  const auto& [selection, fetched] = m.set[0];  // what the selector writes, where rows land
  const kvscout::kv_view<layout, kvscout::device_space> source{  // the host cache, GPU view
      dev_layout, kvscout::as_bytes(k_dev), kvscout::as_bytes(v_dev)};
  const kvscout::gathered_rows_cuda<half, D> rows(selection.view(), fetched);
  const kvscout::current_token<half, kvscout::device_space> current{mem.upload(k_new), mem.upload(v_new)};
  // Attention splits each (sequence, KV head)'s rows over blocks (flash-decoding), planned once
  // for this shape and device, with a workspace for the blocks' partial softmax states.
  const kvscout::decode_attention_plan plan = kvscout::plan_decode_attention_cuda(
      {.shape = shape, .max_rows = budget + 1});  // the selected rows and the current token
  const kvscout::device_span<std::byte> attention_ws = mem.alloc<std::byte>(plan.workspace_bytes());

  // ---- the decode step: four enqueues on one stream; no allocation, no host synchronisation -----
  spec.score({d_x, d_positions, d_lens, max_tokens}, m.scores, exec);
  selector.select(m.scores.view(d_lens), selection, exec);
  (void)fetch.submit(source, selection.view(), fetched, exec);  // an event recorded on `stream`
  kvscout::decode_attention_cuda(rows, current, d_q, out, {Hq, scale}, plan, attention_ws, exec);
  KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(stream));  // only to look at the results

  // ---- what crossed the link --------------------------------------------------------------------
  const std::vector<int32_t> idx = download(selection.indices), cnt = download(selection.counts);
  long long fetched_rows = 0, total_rows = 0;
  for (int c : cnt) fetched_rows += c;
  for (int n : lens) total_rows += static_cast<long long>(n) * H;
  const long long row_bytes = 2LL * D * sizeof(half);  // a K row and a V row
  const double share = 100.0 * double(fetched_rows) / double(total_rows);
  std::printf("rows fetched: %lld of %lld cached rows (%.1f%%), %d per (sequence, KV head)\n",
              fetched_rows, total_rows, share, budget);
  std::printf("bytes moved:  %lld of %lld for a dense fetch (%.1f%%)\n", fetched_rows * row_bytes,
              total_rows * row_bytes, share);

  // ---- the host backend on the device's selection: gather the rows, then attention --------------
  const kvscout::selection_view<kvscout::host_space> host_sel{
      {idx.data(), idx.size()}, {cnt.data(), cnt.size()}, S, H, budget};
  using gather_t = kvscout::gather_executor_host<layout>;
  const kvscout::host_gather_config gather_cfg{.shape = shape, .capacity = budget};
  const kvscout::host_workspace gather_ws = kvscout::make_workspace<gather_t>(gather_cfg);
  gather_t gather(gather_cfg, gather_ws.span());
  std::vector<half> gk(size_t(S) * H * budget * D), gv(gk.size());
  gather.submit({host_layout, kvscout::as_bytes(k_host), kvscout::as_bytes(v_host)}, host_sel,
                {kvscout::as_writable_bytes(kvscout::host_span<half>(gk.data(), gk.size())),
                 kvscout::as_writable_bytes(kvscout::host_span<half>(gv.data(), gv.size()))})
      .wait();
  std::vector<float> ref(q.size());
  kvscout::decode_attention_host(
      kvscout::gathered_rows_host<half, D>(host_sel, {gk.data(), gk.size()}, {gv.data(), gv.size()}),
      kvscout::current_token<half>{{k_new.data(), k_new.size()}, {v_new.data(), v_new.size()}},
      {q.data(), q.size()}, {ref.data(), ref.size()}, {Hq, scale});
  const std::vector<float> got = download(out);
  double max_err = 0;
  for (size_t e = 0; e < ref.size(); ++e)
    max_err = std::max(max_err, std::abs(double(got[e]) - ref[e]));
  const double tolerance = 1e-4;  // the device sums in another order: float rounding differs
  const int bits = download(status)[0];
  std::printf("attention, device vs host: max abs error %.3g (tolerance %.0e)\n", max_err,
              tolerance);
  std::printf("device status: %s\n", kvscout::device_status::describe(bits).c_str());
  KVSCOUT_CUDA_CHECK(cudaStreamDestroy(stream));
  return max_err <= tolerance && bits == 0 ? 0 : 1;
}

}  // namespace

int main() { return examples::run_example("02_cuda_decode_step", run); }
