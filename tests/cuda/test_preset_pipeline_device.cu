// presets::pipeline_cuda (preset_pipeline.cuh): kvscout_default's device parts, owned and built
// from the preset, the shape, a calibration, the budget, W_Q and the layers' host caches. On a
// three-layer model (layer 0 dense, layers 1 and 2 speculated, correction step, per-layer shares,
// 2-bit partial keys):
//   - one step through it gives the same bits as the same parts composed by hand as the docs
//     compose them (presets::budgets, the policies' layers(), per-layer top-k and correction
//     selectors, the stages with their correction parts, decode_pipeline_cuda, attention over the
//     joined rows or the whole cache);
//   - the same bits with overlap off (everything in line on the compute stream);
//   - each (sequence, kv head) of a speculated layer holds the rows its budgets give: the
//     speculation's row_budget at the layer's share, then the correction's top-up to the layer's
//     total share;
//   - bad input is refused by name.

#include <array>
#include <cmath>
#include <cstdio>
#include <deque>
#include <optional>
#include <random>
#include <vector>

#include "gpu_harness.cuh"
#include "pipeline_world.cuh"
#include "kvscout/preset_pipeline.cuh"
#include "kvscout/select/budgets.hpp"

namespace {

using kvscout::half;
namespace presets = kvscout::presets;
struct dims {
  static constexpr int L = 5, skip = 1, S = 2, H = 2, Hq = 4, D = 64, dm = 64, r = 32,
                       max_tokens = 256;
};
using world_t = gpu_test::pipeline_world<dims>;
using layout = world_t::layout;
using pk_t = presets::partial_keys_t<2>;
using owner_t = presets::pipeline_cuda<layout, pk_t>;
using gpu_test::dspan;
constexpr int L = dims::L, S = dims::S, H = dims::H, Hq = dims::Hq, D = dims::D, dm = dims::dm;
constexpr double budget = 0.3;  // enough that the correction adds rows beyond the keep-set

const kvscout::decode_shape shape{.num_layers = L, .num_seqs = S, .num_kv_heads = H,
                                  .num_q_heads = Hq, .head_dim = D, .d_model = dm,
                                  .max_tokens = dims::max_tokens, .scale = 0.125f};

// kvscout_default with layer 1 speculated too (skip_layers 1): two speculated layers, both slots.
presets::speculation_preset preset() {
  presets::speculation_preset p = presets::kvscout_default(D);
  p.skip_layers = dims::skip;
  return p;
}

// What presets::calibrate measures, from the world: its RoPE-plane plans, all 32 planes for the
// correction, and mass curves of each layer's cached keys against random queries.
presets::calibration calibrate(world_t& w, const presets::speculation_preset& p) {
  presets::calibration cal;
  cal.plans = w.plans;
  cal.correction_plans.resize(L);
  std::vector<int> all(D / 2);
  for (int i = 0; i < D / 2; ++i) all[static_cast<std::size_t>(i)] = i;
  const kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::interleaved};
  for (int l = dims::skip; l < L; ++l)
    cal.correction_plans[l].assign(H, kvscout::rope_planes_plan(rope, all));
  constexpr int n = 64;
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<std::vector<float>> q(L), k(L);
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < n; ++t) {
      const std::vector<float> kr = w.key_row(l, 0, t);
      k[l].insert(k[l].end(), kr.begin(), kr.end());
      for (int e = 0; e < Hq * D; ++e) q[l].push_back(nd(w.rng));
    }
  cal.bins = p.layer_bins;
  cal.first_layer = dims::skip;
  cal.mass_curves = kvscout::layer_mass_curves(shape, q, k, n, cal.bins, dims::skip);
  return cal;
}

struct inputs {
  world_t w{7031, {200, 90}, 2.f};
  presets::speculation_preset p = preset();
  presets::calibration cal = calibrate(w, p);
  std::vector<kvscout::host_span<const float>> w_q;
  std::vector<kvscout::kv_view<layout, kvscout::device_space>> sources;
  gpu_test::device_vector<int32_t> lens{w.lens_init};
  gpu_test::device_vector<float> x{w.x}, q{w.q};
  gpu_test::device_vector<half> kc{w.k_cur}, vc{w.v_cur};
  gpu_test::device_vector<int> status{std::vector<int>{0}};
  kvscout::cuda_stage_lengths lengths{dspan<const int32_t>(lens), dspan<const int32_t>(lens),
                                      dims::max_tokens};
  inputs() {
    for (int l = 0; l < L; ++l) {
      w_q.push_back({w.w_q[l].data(), w.w_q[l].size()});
      sources.push_back(
          {w.dev_layout,
           {reinterpret_cast<const std::byte*>(w.k[l]->device_data()), w.cache_bytes},
           {reinterpret_cast<const std::byte*>(w.v[l]->device_data()), w.cache_bytes}});
    }
  }
  static constexpr std::size_t xn = std::size_t(S) * dm, qn = std::size_t(S) * Hq * D,
                               cn = std::size_t(S) * H * D;
  kvscout::device_span<const float> x_of(int l) const { return {x.data() + l * xn, xn}; }
  kvscout::device_span<const float> q_of(int l) const { return {q.data() + l * qn, qn}; }
  kvscout::current_token<half, kvscout::device_space> cur(int l) const {
    return {{kc.data() + l * cn, cn}, {vc.data() + l * cn, cn}};
  }
  // The prefill's keys of layer l, [tokens, H, D], with each token's sequence and position.
  template <class Append>
  void prefill(Append&& append) const {
    std::vector<float> keys;
    std::vector<int32_t> sid, tid;
    for (int l = dims::skip; l < L; ++l) {
      keys.clear(), sid.clear(), tid.clear();
      for (int s = 0; s < S; ++s)
        for (int t = 0; t < w.lens_init[s]; ++t) {
          const std::vector<float> kr = w.key_row(l, s, t);
          keys.insert(keys.end(), kr.begin(), kr.end());
          sid.push_back(s), tid.push_back(t);
        }
      const gpu_test::device_vector<float> dk(keys);
      const gpu_test::device_vector<int32_t> ds(sid), dt(tid);
      append(l, dspan<const float>(dk), dspan<const int32_t>(ds), dspan<const int32_t>(dt),
             static_cast<int>(sid.size()));
      KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
};

std::vector<int32_t> download(kvscout::device_span<int32_t> d) {
  std::vector<int32_t> h(d.size());
  KVSCOUT_CUDA_CHECK(cudaMemcpy(h.data(), d.data(), d.size_bytes(), cudaMemcpyDeviceToHost));
  return h;
}

struct streams {
  cudaStream_t compute{}, side{}, copy{};
  streams() {
    for (cudaStream_t* s : {&compute, &side, &copy}) KVSCOUT_CUDA_CHECK(cudaStreamCreate(s));
  }
  ~streams() {
    for (cudaStream_t s : {compute, side, copy}) KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(s));
  }
};

// Two steps through the owner, enqueued back to back with no synchronisation between layers or
// steps (so every slot and buffer set is reused while the side streams run ahead): each step's
// [L, S, Hq, D] outputs, and the rows each speculated layer held at the first step, copied on the
// compute stream after its attention.
struct step_result {
  std::vector<float> out, again;
  std::vector<std::vector<int32_t>> spec_counts, added_counts;  // [layer][S * H]
};
step_result owner_step(inputs& in, bool overlap) {
  streams st;
  owner_t owned(in.p, shape, in.cal, budget, in.w_q, {}, in.sources, in.lengths,
                {.overlap = overlap});
  in.prefill([&](int l, auto k, auto s, auto t, int n) {
    owned.append(l, k, s, t, n, {st.compute, in.status.data()});
  });
  gpu_test::device_vector<float> out(std::size_t(L) * inputs::qn), again(out.size());
  gpu_test::device_vector<int32_t> spec(std::size_t(L) * S * H), added(spec.size());
  const kvscout::cuda_pipeline_exec x{st.compute, st.side, st.copy, in.status.data()};
  for (gpu_test::device_vector<float>* o : {&out, &again})
    for (int i = 0; i < L; ++i) {
      owned.input_ready(i, in.x_of(i), x);
      owned.attend(i, in.q_of(i), in.cur(i), {o->data() + i * inputs::qn, inputs::qn}, x);
      if (!owned.pipeline().sparse(i) || o != &out) continue;
      const int b = owner_t::pipeline_type::slot(i);
      const auto record = [&](int32_t* dst, kvscout::device_span<int32_t> src) {
        KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.size_bytes(),
                                           cudaMemcpyDeviceToDevice, st.compute));
      };
      record(spec.data() + i * S * H, owned.stages().buffers(i, b).selection.counts);
      record(added.data() + i * S * H, owned.stages().added(i, b).selection.counts);
    }
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  GPU_CHECK(in.status.download()[0] == 0);
  step_result r{out.download(), again.download(), {}, {}};
  const std::vector<int32_t> sc = spec.download(), ac = added.download();
  for (int i = 0; i < L; ++i) {
    r.spec_counts.emplace_back(sc.begin() + i * S * H, sc.begin() + (i + 1) * S * H);
    r.added_counts.emplace_back(ac.begin() + i * S * H, ac.begin() + (i + 1) * S * H);
  }
  return r;
}

// The same parts by hand, as docs/cuda_pipeline.md composes them.
std::vector<float> by_hand_step(inputs& in) {
  streams st;
  const presets::speculation_preset& p = in.p;
  const presets::step_budgets b = presets::budgets(p, shape, budget, in.cal.layer_shares(p, budget));
  std::vector<kvscout::host_span<const float>> no_bias(L);
  auto policies = kvscout::infinigen_policy_cuda<pk_t>::layers(
      p.policy_config(shape), in.cal.plans, in.cal.correction_plans, in.w_q, no_bias);
  in.prefill([&](int l, auto k, auto s, auto t, int n) {
    policies[l].append(k, s, t, n, {st.compute, in.status.data()});
  });
  std::deque<kvscout::device_workspace> ws;
  std::deque<kvscout::topk_selector_cuda> sel;
  std::deque<kvscout::correction_selector_cuda> corr;
  std::vector<kvscout::topk_selector_cuda*> sel_at(L, nullptr);
  std::vector<kvscout::correction_selector_cuda*> corr_at(L, nullptr);
  for (int l = dims::skip; l < L; ++l) {
    const auto sc = b.selector_config(shape, l);
    ws.emplace_back(kvscout::topk_selector_cuda::workspace_bytes(sc), 256);
    sel_at[l] = &sel.emplace_back(sc, ws.back().span());
    const kvscout::correction_selector_cuda::config cc{
        .shape = shape, .capacity = b.correction_capacity, .extra = b.correction_capacity,
        .total_share = b.total[l]};
    ws.emplace_back(kvscout::correction_selector_cuda::workspace_bytes(cc), 256);
    corr_at[l] = &corr.emplace_back(cc, ws.back().span());
  }
  kvscout::zero_copy_executor_cuda<layout> fetch({.shape = shape, .capacity = b.capacity});
  kvscout::zero_copy_executor_cuda<layout> corr_fetch({.shape = shape,
                                                       .capacity = b.correction_capacity});
  const std::size_t row = in.w.host_layout.k_row_bytes();
  const auto carve = [&](int cap) {
    ws.emplace_back(kvscout::cuda_stage_memory::bytes(shape, cap, row, row), 256);
    return kvscout::cuda_stage_memory::carve(shape, cap, row, row, ws.back().span());
  };
  const kvscout::cuda_stage_memory m = carve(b.capacity), cm = carve(b.correction_capacity);
  using stages_t = owner_t::stages_type;
  stages_t stages(policies.pointers(), sel_at, fetch, in.sources, m.scores, in.lengths, m.inputs(),
                  m.sets(), kvscout::cuda_stage_buffering::slots, nullptr,
                  {corr_at[dims::skip], &corr_fetch, cm.scores, cm.set, corr_at});
  kvscout::decode_pipeline_cuda pipe({.shape = shape, .skip_layers = dims::skip},
                                     kvscout::stages_ref_cuda<stages_t>{&stages});
  const auto sparse = kvscout::plan_decode_attention_cuda(
      {.shape = shape, .max_rows = b.capacity + b.correction_capacity + 1});
  const auto dense = kvscout::plan_decode_attention_cuda({.shape = shape,
                                                          .max_rows = dims::max_tokens + 1});
  gpu_test::device_vector<std::byte> aws(std::max(sparse.workspace_bytes(), dense.workspace_bytes()));
  gpu_test::device_vector<float> out(std::size_t(L) * inputs::qn);
  const kvscout::cuda_pipeline_exec x{st.compute, st.side, st.copy, in.status.data()};
  const kvscout::cuda_exec ex{st.compute, in.status.data()};
  const kvscout::attention_params ap{Hq, shape.scale};
  for (int i = 0; i < L; ++i) {
    const auto slot = m.x[pipe.slot(i + 1)];
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(slot.data(), in.x_of(i).data(), slot.size_bytes(),
                                       cudaMemcpyDeviceToDevice, st.compute));
    pipe.input_ready(i, x);
    pipe.wait_rows(i, x);
    const kvscout::device_span<float> o{out.data() + i * inputs::qn, inputs::qn};
    if (!pipe.sparse(i)) {
      kvscout::decode_attention_cuda(kvscout::layout_rows_cuda<layout>(in.sources[i]), in.cur(i),
                                     in.q_of(i), o, ap, dense, dspan<std::byte>(aws), ex);
      continue;
    }
    stages.correct(i, pipe.slot(i), in.q_of(i), ex);
    const auto& got = stages.buffers(i, pipe.slot(i));
    const auto& add = stages.added(i, pipe.slot(i));
    kvscout::decode_attention_cuda(
        kvscout::joined_rows_cuda(
            kvscout::gathered_rows_cuda<half, D>(got.selection.view(), got.rows),
            kvscout::gathered_rows_cuda<half, D>(add.selection.view(), add.rows)),
        in.cur(i), in.q_of(i), o, ap, sparse, dspan<std::byte>(aws), ex);
  }
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  GPU_CHECK(in.status.download()[0] == 0);
  return out.download();
}

void matches_parts_by_hand() {
  inputs in;
  const step_result owned = owner_step(in, true);
  const std::vector<float> hand = by_hand_step(in);
  GPU_CHECK(owned.out == hand);
  GPU_CHECK(owned.again == owned.out);  // the second step, over reused slots: the same bits
  const step_result in_line = owner_step(in, false);
  GPU_CHECK(in_line.out == owned.out && in_line.again == owned.out);
  bool finite = true;
  for (float v : owned.out) finite = finite && std::isfinite(v);
  GPU_CHECK(finite);

  // The rows each (sequence, kv head) held: the budgets' counts at its cached length.
  const auto b = presets::budgets(in.p, shape, budget, in.cal.layer_shares(in.p, budget));
  GPU_CHECK(b.total[1] != b.total[4]);  // the layer shares differ, so each layer's own is used
  for (int l = dims::skip; l < L; ++l)
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h) {
        const int len = in.w.lens_init[s], row = s * H + h;
        const int spec = kvscout::detail::row_budget(b.capacity, b.speculated[l], b.keep, len);
        const int add = kvscout::detail::correction_extra(b.correction_capacity, b.total[l], len, spec);
        GPU_CHECK(owned.spec_counts[l][row] == spec);
        GPU_CHECK(owned.added_counts[l][row] == add);
        GPU_CHECK(add > 0);
      }
}

void refuses_bad_input() {
  inputs in;
  using gpu_test::throws_with;
  const auto build = [&](const presets::speculation_preset& p, const presets::calibration& cal) {
    owner_t o(p, shape, cal, budget, in.w_q, {}, in.sources, in.lengths);
  };
  presets::speculation_preset paper = presets::infinigen_paper(D);
  paper.skip_layers = dims::skip;
  GPU_CHECK(throws_with([&] { build(paper, in.cal); },
                        "pipeline_cuda: infinigen_paper selects by threshold"));
  GPU_CHECK(throws_with(
      [&] {
        presets::pipeline_cuda<layout, float> o(in.p, shape, in.cal, budget, in.w_q, {},
                                                in.sources, in.lengths);
      },
      "keeps its partial keys at 2 bits (0: the element type), the pipeline's PkT at 0"));
  presets::calibration short_cal = in.cal;
  short_cal.plans.resize(2);
  GPU_CHECK(throws_with([&] { build(in.p, short_cal); }, "the calibration covers 2 layers"));
  presets::calibration narrow = in.cal;  // layer 2's plans at r 16, the preset's r is 32
  std::mt19937 rng(5);
  narrow.plans[2].assign(H, gpu_test::plane_plan(rng, D, 16));
  GPU_CHECK(throws_with([&] { build(in.p, narrow); }, "layer 2's plans have r = 16"));
  GPU_CHECK(throws_with(
      [&] { owner_t o(in.p, shape, in.cal, 0.0, in.w_q, {}, in.sources, in.lengths); },
      "budget = 0"));
  std::vector<kvscout::host_span<const float>> short_w = in.w_q;
  short_w[1] = {short_w[1].data(), short_w[1].size() - 1};
  GPU_CHECK(throws_with(
      [&] { owner_t o(in.p, shape, in.cal, budget, short_w, {}, in.sources, in.lengths); },
      "layer 1's W_Q has 16383 elements"));
  std::vector<kvscout::kv_view<layout, kvscout::device_space>> two(in.sources.begin(),
                                                                   in.sources.begin() + 2);
  GPU_CHECK(throws_with(
      [&] { owner_t o(in.p, shape, in.cal, budget, in.w_q, {}, two, in.lengths); },
      "2 sources, expected one host cache per layer (5)"));
  kvscout::cuda_stage_lengths long_lens = in.lengths;
  long_lens.max_seq_len = dims::max_tokens + 1;
  GPU_CHECK(throws_with(
      [&] { owner_t o(in.p, shape, in.cal, budget, in.w_q, {}, in.sources, long_lens); },
      "max_seq_len = 257 is more than shape.max_tokens = 256"));

  streams st;
  owner_t owned(in.p, shape, in.cal, budget, in.w_q, {}, in.sources, in.lengths);
  const kvscout::cuda_pipeline_exec x{st.compute, st.side, st.copy, in.status.data()};
  GPU_CHECK(throws_with([&] { owned.input_ready(5, in.x_of(0), x); },
                        "layer 5 is out of range [-1, 5)"));
  GPU_CHECK(throws_with([&] { owned.input_ready(0, {in.x.data(), inputs::xn - 1}, x); },
                        "the input holds 127 floats, expected [num_seqs, d_model] = 128"));
  presets::calibration dense_planned = in.cal;  // plans for layer 0, which is not speculated
  dense_planned.plans[0] = dense_planned.plans[1];
  GPU_CHECK(throws_with([&] { build(in.p, dense_planned); },
                        "the calibration's layer 0 has plans; the layers from skip_layers = 1"));
  GPU_CHECK(throws_with([&] { owned.set_max_seq_len(dims::max_tokens + 1); },
                        "max_seq_len = 257 is more than shape.max_tokens = 256"));
  GPU_CHECK(throws_with(
      [&] {  // layer 1's rows were never launched: input_ready(0) was not called this step
        gpu_test::device_vector<float> out(inputs::qn);
        owned.attend(1, in.q_of(1), in.cur(1), dspan<float>(out), x);
      },
      "wait_rows(1)"));
  owned.input_ready(0, in.x_of(0), x);  // launches layer 1 into slot 1
  owned.input_ready(1, in.x_of(1), x);  // layer 2 into slot 0
  GPU_CHECK(throws_with([&] { owned.input_ready(2, in.x_of(2), x); },
                        "slot 1 still holds layer 1's rows; call attend(1) first"));
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

int main() {
  return gpu_test::run_all("preset_pipeline_device",
                           {{"matches_parts_by_hand", matches_parts_by_hand},
                            {"refuses_bad_input", refuses_bad_input}});
}
