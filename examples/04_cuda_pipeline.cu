// A decode step over several layers on the CUDA backend with kvscout's best measured configuration
// (presets::kvscout_default) and the three streams an engine runs: while the compute stream works
// on layer i, a side stream speculates which cached tokens layer i + 1 will attend to (its
// InfiniGen policy and top-k selector at the layer's share of the budget) and a copy stream
// fetches only those K/V rows from host memory (zero-copy). On the compute stream, layer i's own
// query then tops its rows up (the correction step) and attention reads both sets. Layers 0 and 1
// attend densely. presets::pipeline_cuda owns every part (preset_pipeline.cuh); the same parts by
// hand: examples/02 (one layer) and pipeline/cuda_stages.cuh.
//
// The model's own work (its GEMMs, RoPE, appends) is stood in for by inputs drawn at random. The
// check: the same pipeline built with overlap off (every stage in line on the compute stream)
// must give the pipelined step's attention outputs bit for bit; on the host SIMT emulator
// (tests/simt), which runs the streams in forward, reverse and shuffled orders at each
// synchronisation, a missing wait shows. Exit code: 0 ok, 1 mismatch or error, 77 no CUDA device
// (ctest: skipped).

#include <cuda_runtime.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kvscout/kvscout.hpp"
#include "kvscout/preset_pipeline.cuh"  // presets::pipeline_cuda
#include "cuda_memory.cuh"              // the example's allocations (examples/)

namespace {

using kvscout::from_float, kvscout::half;
using examples::cuda_memory, examples::download;
using std::size_t;

constexpr int L = 6;  // layers; kvscout_default attends densely in layers 0 and 1
constexpr int S = 2, H = 2, Hq = 8, D = 64, d_model = 256;
constexpr int max_tokens = 512;  // cache slots per sequence
constexpr double budget = 0.10;  // a tenth of the cached rows per step, the correction's included
constexpr float scale = 0.125f;
using layout = kvscout::contiguous_layout<half, D, kvscout::hnd>;

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
  std::vector<float> w_q(size_t(Hq) * D * d_model);  // every layer's W_Q alike, 1 / sqrt(d_model)
  for (float& w : w_q) w = normal(rng) / 16.f;
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

  // ---- calibration: what presets::calibrate (calibrate.hpp) measures offline on a calibration
  // text's activations, stood in for here: for the speculation the 16 planes kvscout_default
  // keeps (r = 32), 0-15, which hold the large ones (0-7); every plane for the correction; and
  // each layer's attention mass curve (the per-layer shares) from 64 of its cached keys against
  // random queries.
  const auto p = kvscout::presets::kvscout_default(D);
  const kvscout::decode_shape shape{.num_layers = L, .num_seqs = S, .num_kv_heads = H,
                                    .num_q_heads = Hq, .head_dim = D, .d_model = d_model,
                                    .max_tokens = max_tokens, .scale = scale};
  const kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  std::vector<int> planes(D / 2);
  std::iota(planes.begin(), planes.end(), 0);
  constexpr int n = 64;  // calibration tokens
  kvscout::presets::calibration cal{.bins = p.layer_bins, .first_layer = p.skip_layers};
  std::vector<std::vector<float>> q_cal(L), k_cal(L);  // [L][n * Hq * D], [L][n * H * D]
  for (int i = 0; i < L; ++i) {
    for (int e = 0; e < n * Hq * D; ++e) q_cal[i].push_back(2.f * normal(rng));
    for (int e = 0; e < n * H * D; ++e) k_cal[i].push_back(kvscout::to_float(k_prefill[i][e]));
    cal.plans.emplace_back(), cal.correction_plans.emplace_back();  // empty: a dense layer
    if (i < p.skip_layers) continue;
    const std::vector<int> large(planes.begin(), planes.begin() + p.r / 2);
    cal.plans.back().assign(H, kvscout::rope_planes_plan(rope, large));
    cal.correction_plans.back().assign(H, kvscout::rope_planes_plan(rope, planes));
  }
  cal.mass_curves = kvscout::layer_mass_curves(shape, q_cal, k_cal, n, cal.bins, cal.first_layer);

  // ---- set-up: the streams, the status word and the preset's pipeline with every part owned ----
  cudaStream_t compute{}, side{}, copy{};
  for (cudaStream_t* st : {&compute, &side, &copy}) KVSCOUT_CUDA_CHECK(cudaStreamCreate(st));
  const auto status = mem.upload(std::vector<int>{0});
  const std::vector<kvscout::host_span<const float>> w_q_layers(L, {w_q.data(), w_q.size()});
  const kvscout::cuda_stage_lengths lengths{d_positions, d_lens, max_tokens};
  kvscout::presets::pipeline_cuda<layout> owned(p, shape, cal, budget, w_q_layers, {}, sources,
                                                lengths);
  const kvscout::cuda_pipeline_exec x{compute, side, copy, status.data()};

  // ---- prefill: each speculated layer's partial key cache takes its channels of the keys --------
  const auto d_seq_ids = mem.upload(seq_ids), d_token_ids = mem.upload(token_ids);
  const auto prefill = [&](kvscout::presets::pipeline_cuda<layout>& pipe) {
    for (int i = 0; i < L; ++i)  // a dense layer keeps none: a no-op
      pipe.append(i, mem.upload(k_prefill[i]), d_seq_ids, d_token_ids, int(seq_ids.size()),
                  {compute, status.data()});
  };
  prefill(owned);

  // ---- the model's per-layer inputs and outputs on the device ----------------------------------
  std::vector<kvscout::device_span<float>> d_x, d_q, out, ref;
  for (int i = 0; i < L; ++i) {
    d_x.push_back(mem.upload(in.x[i])), d_q.push_back(mem.upload(in.q[i]));
    out.push_back(mem.alloc<float>(in.q[i].size()));
    ref.push_back(mem.alloc<float>(in.q[i].size()));
  }
  const kvscout::current_token<half, kvscout::device_space> current{mem.upload(in.k_new),
                                                                    mem.upload(in.v_new)};

  // ---- the decode step: per layer, beside the model's own work, two calls ----------------------
  for (int i = 0; i < L; ++i) {
    owned.input_ready(i, d_x[i], x);               // side / copy streams: layer i + 1's rows
    owned.attend(i, d_q[i], current, out[i], x);  // compute: layer i's rows, correction, attention
  }
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());  // only to check the results

  // ---- the same pipeline with every stage in line on the compute stream: the reference ---------
  kvscout::presets::pipeline_cuda<layout> in_line(p, shape, cal, budget, w_q_layers, {}, sources,
                                                  lengths, {.overlap = false});
  prefill(in_line);
  for (int i = 0; i < L; ++i) {
    in_line.input_ready(i, d_x[i], x);
    in_line.attend(i, d_q[i], current, ref[i], x);
  }
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  int mismatches = 0;
  for (int i = 0; i < L; ++i) {
    const std::vector<float> a = download(out[i]), b = download(ref[i]);
    const bool same = std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    mismatches += same ? 0 : 1;
    const kvscout::presets::step_budgets& shares = owned.budgets();
    if (i < p.skip_layers)
      std::printf("layer %d (dense, every cached row): ", i);
    else
      std::printf("layer %d (%.1f%% of its rows by speculation, %.1f%% by correction): ", i,
                  100 * shares.speculated[i], 100 * (shares.total[i] - shares.speculated[i]));
    std::printf("pipelined attention %s the in-line step's\n", same ? "equals" : "DIFFERS FROM");
  }
  const int bits = download(status)[0];
  std::printf("device status: %s\n", kvscout::device_status::describe(bits).c_str());
  for (cudaStream_t st : {compute, side, copy}) KVSCOUT_CUDA_CHECK(cudaStreamDestroy(st));
  return mismatches == 0 && bits == 0 ? 0 : 1;
}

}  // namespace

int main() { return examples::run_example("04_cuda_pipeline", run); }
