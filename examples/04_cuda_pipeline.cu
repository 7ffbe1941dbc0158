// A decode step over several layers on the CUDA backend, with the three streams an engine runs:
// while the compute stream works on layer i, a side stream speculates which cached tokens layer
// i + 1 will attend to (infinigen_policy_cuda, topk_selector_cuda) and a copy stream fetches
// only those K/V rows from host memory (zero_copy_executor_cuda). decode_pipeline_cuda orders
// the streams with events; speculation_stages_cuda binds the parts to it. Layers 0 and 1 attend
// densely, as InfiniGen's do; the others attend over the fetched rows and the new token.
//
// The model's own work (its GEMMs, RoPE, appends) is stood in for by inputs drawn at random: the
// compute stream copies layer i's input into the pipeline's slot where the model would write it.
// The check: the same parts run in line on one stream, layer by layer, must give the pipelined
// step's attention outputs bit for bit; on the host SIMT emulator (tests/simt), which runs the
// streams in forward, reverse and shuffled orders at each synchronisation, a missing wait shows.
// Exit code: 0 ok, 1 mismatch or error, 77 no CUDA device (ctest: skipped).

#include <cuda_runtime.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "kvscout/kvscout.hpp"
#include "kvscout/attention/decode.cuh"
#include "kvscout/pipeline/cuda_stages.cuh"
#include "kvscout/select/topk.cuh"
#include "cuda_memory.cuh"  // the example's allocations (examples/)

namespace {

using kvscout::from_float, kvscout::half;
using examples::cuda_memory, examples::download;
using std::size_t;

constexpr int L = 6, skip = 2;                        // layers; [0, skip) attend densely
constexpr int S = 2, H = 2, Hq = 8, D = 64, d_model = 256;
constexpr int max_tokens = 512, r = 16, budget = 48;  // cache slots, partial dim, rows per head
constexpr float scale = 0.125f;
using layout = kvscout::contiguous_layout<half, D, kvscout::hnd>;
using policy = kvscout::infinigen_policy_cuda<float>;
using stages_t = kvscout::infinigen_stages_cuda<layout, kvscout::topk_selector_cuda>;

struct model_inputs {  // what the model computes per layer; random here
  std::vector<std::vector<float>> x, q;  // [L][S * d_model], [L][S * Hq * D]
  std::vector<half> k_new, v_new;        // the new token's K / V (every layer alike)
};

int run() {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  cuda_memory mem;
  const std::vector<int32_t> lens = {500, 301};
  const auto d_lens = mem.upload(lens), d_positions = mem.upload(lens);
  const kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  // The RoPE planes the partial query keeps, per KV head (calibrate_skew ranks them on real
  // activations; here planes 0-7, where the keys are large).
  const std::vector<kvscout::skew_plan> plans(
      H, kvscout::rope_planes_plan(rope, {0, 1, 2, 3, 4, 5, 6, 7}));
  std::vector<float> w_q(size_t(Hq) * D * d_model);  // every layer's W_Q alike, 1 / sqrt(d_model)
  for (float& w : w_q) w = normal(rng) / 16.f;
  const kvscout::host_span<const float> w_q_span(w_q.data(), w_q.size());
  model_inputs in;
  for (int i = 0; i < L; ++i) {
    in.x.emplace_back(size_t(S) * d_model);
    in.q.emplace_back(size_t(S) * Hq * D);
    for (float& e : in.x.back()) e = normal(rng);
    for (float& e : in.q.back()) e = normal(rng);
  }
  for (int e = 0; e < S * H * D; ++e) in.k_new.push_back(from_float<half>(normal(rng)));
  in.v_new = in.k_new;

  // Each layer's KV cache, in mapped pinned host memory (the device's view for the fetches), and
  // the prefill that fills it: each layer's K / V of the cached tokens, [tokens, H, D] (keys after
  // RoPE, with large RoPE planes 0-7 as real keys have), each token's sequence and position.
  const layout lay = layout::padded(H, max_tokens, d_lens.data(), S);
  const layout host_lay = layout::padded(H, max_tokens, lens.data(), S);
  const size_t cache_n = size_t(S) * H * max_tokens * D;
  std::vector<kvscout::kv_view<layout, kvscout::device_space>> sources;
  std::vector<std::vector<half>> k_prefill(L);  // [L][tokens * H * D]
  std::vector<int32_t> seq_ids, token_ids;      // [tokens], every layer alike
  for (int s = 0; s < S; ++s)
    for (int t = 0; t < lens[s]; ++t) seq_ids.push_back(s), token_ids.push_back(t);
  for (int i = 0; i < L; ++i) {
    const auto [k_host, k_dev] = mem.mapped<half>(cache_n);
    const auto [v_host, v_dev] = mem.mapped<half>(cache_n);
    for (size_t n = 0; n < seq_ids.size(); ++n)
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < D; ++c) {
          const int s = seq_ids[n], t = token_ids[n];  // k_offset: address math, in bytes
          k_prefill[i].push_back(from_float<half>(normal(rng) * (c % 32 < 8 ? 3.f : 1.f)));
          k_host[host_lay.k_offset(s, t, h) / sizeof(half) + c] = k_prefill[i].back();
          v_host[host_lay.v_offset(s, t, h) / sizeof(half) + c] = from_float<half>(normal(rng));
        }
    sources.push_back({lay, kvscout::as_bytes(k_dev), kvscout::as_bytes(v_dev)});
  }

  // ---- set-up: the parts, their workspaces and buffers, the stages and the pipeline ------------
  cudaStream_t compute{}, side{}, copy{};
  for (cudaStream_t* st : {&compute, &side, &copy}) KVSCOUT_CUDA_CHECK(cudaStreamCreate(st));
  const auto status = mem.upload(std::vector<int>{0});
  const kvscout::decode_shape shape{.num_layers = L, .num_seqs = S, .num_kv_heads = H,
                                    .num_q_heads = Hq, .head_dim = D, .d_model = d_model,
                                    .max_tokens = max_tokens, .scale = scale};
  const kvscout::infinigen_config spec_cfg{.shape = shape, .r = r,
                                                .mode = kvscout::rope_mode::rope_planes};
  std::deque<policy> policies;            // one per speculated layer, never moved
  std::vector<policy*> spec(L, nullptr);  // null: a dense layer
  for (int i = skip; i < L; ++i)
    spec[i] = &policies.emplace_back(spec_cfg, plans, w_q_span, kvscout::host_span<const float>{},
                                     mem.alloc<std::byte>(policy::workspace_bytes(spec_cfg)));
  const kvscout::topk_selector_cuda::config sel_cfg{.shape = shape, .capacity = budget,
                                                    .budget = budget, .keep = {4, 16}};
  kvscout::topk_selector_cuda selector(
      sel_cfg, mem.alloc<std::byte>(kvscout::topk_selector_cuda::workspace_bytes(sel_cfg)));
  kvscout::zero_copy_executor_cuda<layout> fetch({.shape = shape, .capacity = budget});
  // The score buffer, the two layer-input slots and two sets of selected rows, in one allocation.
  const size_t row = lay.k_row_bytes();  // the V rows are as long
  const size_t bytes = kvscout::cuda_stage_memory::bytes(shape, budget, row, row);
  const kvscout::cuda_stage_memory m =
      kvscout::cuda_stage_memory::carve(shape, budget, row, row, mem.alloc<std::byte>(bytes));
  stages_t stages(spec, selector, fetch, sources, m.scores, {d_positions, d_lens, max_tokens},
                  m.inputs(), m.sets());
  kvscout::decode_pipeline_cuda pipe({.shape = shape, .skip_layers = skip},
                                     kvscout::stages_ref_cuda<stages_t>{&stages});
  const kvscout::cuda_pipeline_exec x{compute, side, copy, status.data()};
  const kvscout::decode_attention_plan plan = kvscout::plan_decode_attention_cuda(
      {.shape = shape, .max_rows = max_tokens + 1});  // dense: every cached row and the new one
  const auto attention_ws = mem.alloc<std::byte>(plan.workspace_bytes());

  // ---- prefill: each speculator's partial key cache takes its channels of the layer's keys ------
  const auto d_seq_ids = mem.upload(seq_ids), d_token_ids = mem.upload(token_ids);
  for (int i = skip; i < L; ++i)
    spec[i]->append(mem.upload(k_prefill[i]), d_seq_ids, d_token_ids, int(seq_ids.size()),
                    {compute, status.data()});

  // ---- the model's per-layer inputs and outputs on the device ----------------------------------
  std::vector<kvscout::device_span<float>> d_x, d_q, out, ref;
  for (int i = 0; i < L; ++i) {
    d_x.push_back(mem.upload(in.x[i])), d_q.push_back(mem.upload(in.q[i]));
    out.push_back(mem.alloc<float>(in.q[i].size()));
    ref.push_back(mem.alloc<float>(in.q[i].size()));
  }
  const kvscout::current_token<half, kvscout::device_space> current{mem.upload(in.k_new),
                                                                    mem.upload(in.v_new)};
  // Layer i's attention: over its fetched rows (rows), or its whole cache in place (null).
  const auto attend = [&](int i, const kvscout::cuda_stage_buffers* rows,
                          kvscout::device_span<float> o, cudaStream_t st) {
    const kvscout::cuda_exec ex{st, status.data()};
    if (rows == nullptr)
      kvscout::decode_attention_cuda(kvscout::layout_rows_cuda<layout>(sources[i]), current,
                                     d_q[i], o, {Hq, scale}, plan, attention_ws, ex);
    else
      kvscout::decode_attention_cuda(
          kvscout::gathered_rows_cuda<half, D>(rows->selection.view(), rows->rows), current,
          d_q[i], o, {Hq, scale}, plan, attention_ws, ex);
  };

  // ---- the decode step: per layer, the model's input, two pipeline calls, the attention --------
  for (int i = 0; i < L; ++i) {
    // x_i, the input the speculation of layer i + 1 reads (the model writes it in place).
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(m.x[pipe.slot(i + 1)].data(), d_x[i].data(),
                                       d_x[i].size_bytes(), cudaMemcpyDeviceToDevice, compute));
    pipe.input_ready(i, x);  // side stream: speculate layer i + 1; copy stream: fetch its rows
    pipe.wait_rows(i, x);    // the compute stream waits for layer i's rows
    attend(i, pipe.sparse(i) ? &stages.buffers(i, pipe.slot(i)) : nullptr, out[i], compute);
  }
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());  // only to check the results

  // ---- the same parts in line on one stream: the reference ------------------------------------
  const kvscout::cuda_stage_memory in_line =
      kvscout::cuda_stage_memory::carve(shape, budget, row, row, mem.alloc<std::byte>(bytes));
  const kvscout::cuda_stage_buffers& line = in_line.set[0];
  const kvscout::cuda_exec one{compute, status.data()};
  for (int i = 0; i < L; ++i) {
    if (i < skip) {
      attend(i, nullptr, ref[i], compute);
      continue;
    }
    spec[i]->score({d_x[i - 1], d_positions, d_lens, max_tokens}, in_line.scores, one);
    selector.select(in_line.scores.view(d_lens), line.selection, one);
    (void)fetch.submit(sources[i], line.selection.view(), line.rows, one);
    attend(i, &line, ref[i], compute);
  }
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  int mismatches = 0;
  for (int i = 0; i < L; ++i) {
    const std::vector<float> a = download(out[i]), b = download(ref[i]);
    const bool same = std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    mismatches += same ? 0 : 1;
    std::printf("layer %d (%s): pipelined attention %s the in-line step's\n", i,
                pipe.sparse(i) ? "fetched rows" : "dense", same ? "equals" : "DIFFERS FROM");
  }
  const int bits = download(status)[0];
  std::printf("rows fetched per speculated layer: %d of up to %d cached per (sequence, KV head)\n",
              budget, max_tokens);
  std::printf("device status: %s\n", kvscout::device_status::describe(bits).c_str());
  for (cudaStream_t st : {compute, side, copy}) KVSCOUT_CUDA_CHECK(cudaStreamDestroy(st));
  return mismatches == 0 && bits == 0 ? 0 : 1;
}

}  // namespace

int main() { return examples::run_example("04_cuda_pipeline", run); }
