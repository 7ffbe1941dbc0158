// streaming_policy_cuda (score/streaming.cuh) and a policy other than InfiniGen in the CUDA
// pipeline's stages (speculation_stages_cuda, pipeline/cuda_stages.cuh):
//   - its scores equal streaming_policy_host's bit for bit, lengths clamped on the device (and
//     reported as device_status::bad_length) and
//     nothing written past a row's length;
//   - bad calls throw kvscout::error naming the bad value and leave the scores as they were;
//   - through decode_pipeline_cuda with top-k and the zero-copy executor, every speculated layer
//     selects the sinks and the most recent tokens (worked out here from the lengths alone), and
//     the rows fetched from the mapped host caches are the bytes the host gather copies for the
//     same selection; the stages hand the policy the call's status word and their sequence ids.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu_harness.cuh"
#include "host_gather_reference.cuh"
#include "kvscout/core/device_status.hpp"
#include "kvscout/core/configured.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/pipeline/cuda_pipeline.hpp"
#include "kvscout/pipeline/cuda_stages.cuh"
#include "kvscout/select/topk.cuh"
#include "kvscout/score/streaming.cuh"
#include "kvscout/score/streaming.hpp"

namespace {

using kvscout::half;

static_assert(kvscout::configured<kvscout::streaming_policy_cuda>);
// One config for both backends.
static_assert(std::is_same_v<kvscout::streaming_policy_cuda::config,
                             kvscout::streaming_policy_host::config>);

template <class T>
kvscout::device_span<T> dspan(const gpu_test::device_vector<std::remove_const_t<T>>& v) {
  return {v.data(), v.size()};
}

using gpu_test::throws_with;

// The host policy's scores for these lengths, [S, H, stride], untouched entries left as `fill`.
std::vector<float> host_scores(int H, int sinks, const std::vector<int32_t>& lens, int stride,
                               float fill) {
  const int S = static_cast<int>(lens.size());
  std::vector<float> out(static_cast<std::size_t>(S) * H * stride, fill);
  kvscout::streaming_policy_host p({.shape = {.num_kv_heads = H}, .sinks = sinks});
  p.score(0, {.x = {}, .q = {}, .positions = {}, .seq_lens = {lens.data(), lens.size()}},
          {{out.data(), out.size()}, S, H, stride});
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      std::fprintf(stderr, "element %zu: device %g, expected %g\n", i, a[i], b[i]);
      return false;
    }
  }
  return true;
}

float poison_value() {
  const unsigned bits = 0xffffffffu;  // what device_vector::poison writes: a NaN
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void scores_match_host() {
  constexpr int H = 3, stride = 1400;
  // A row longer than a block's 1024 tokens, a row shorter than the sinks, an empty row.
  const std::vector<int32_t> lens = {1300, 3, 0, 517};
  const int S = static_cast<int>(lens.size());
  for (int sinks : {0, 4, 2000}) {
    kvscout::streaming_policy_cuda p({.shape = {.num_kv_heads = H}, .sinks = sinks});
    gpu_test::device_vector<float> scores(static_cast<std::size_t>(S) * H * stride);
    gpu_test::device_vector<int32_t> dl(lens);
    gpu_test::device_vector<int> status(std::vector<int>{0});
    scores.poison();
    p.score({.x = {}, .positions = {}, .seq_lens = dspan<const int32_t>(dl), .max_seq_len = 1300},
            {{scores.data(), scores.size()}, S, H, stride}, {nullptr, status.data()});
    GPU_CHECK(same_bits(scores.download(), host_scores(H, sinks, lens, stride, poison_value())));
    GPU_CHECK(status.download()[0] == 0);  // 1300 = max_seq_len is a good length
  }
  // Lengths beyond max_seq_len are clamped to it, negative ones to 0: the device's lengths are
  // never trusted for addressing.
  {
    kvscout::streaming_policy_cuda p({.shape = {.num_kv_heads = H}, .sinks = 4});
    const std::vector<int32_t> bad = {5000, -7, 600, 100};
    gpu_test::device_vector<float> scores(static_cast<std::size_t>(S) * H * stride);
    gpu_test::device_vector<int32_t> dl(bad);
    gpu_test::device_vector<int> status(std::vector<int>{0});
    scores.poison();
    p.score({.x = {}, .positions = {}, .seq_lens = dspan<const int32_t>(dl), .max_seq_len = 600},
            {{scores.data(), scores.size()}, S, H, stride}, {nullptr, status.data()});
    GPU_CHECK(same_bits(scores.download(),
                        host_scores(H, 4, {600, 0, 600, 100}, stride, poison_value())));
    GPU_CHECK(status.download()[0] == kvscout::device_status::bad_length);  // and reported
  }
  // A negative length alone raises it too.
  {
    kvscout::streaming_policy_cuda p({.shape = {.num_kv_heads = H}, .sinks = 4});
    gpu_test::device_vector<float> scores(static_cast<std::size_t>(S) * H * stride);
    gpu_test::device_vector<int32_t> dl(std::vector<int32_t>{600, -1, 0, 100});
    gpu_test::device_vector<int> status(std::vector<int>{0});
    p.score({.x = {}, .positions = {}, .seq_lens = dspan<const int32_t>(dl), .max_seq_len = 600},
            {{scores.data(), scores.size()}, S, H, stride}, {nullptr, status.data()});
    GPU_CHECK(status.download()[0] == kvscout::device_status::bad_length);
  }
}

void bad_input_throws() {
  using policy = kvscout::streaming_policy_cuda;
  GPU_CHECK(throws_with([] { policy p({.shape = {.num_kv_heads = 0}, .sinks = 4}); },
                        "num_kv_heads must be positive, got 0"));
  GPU_CHECK(throws_with([] { policy p({.shape = {.num_kv_heads = 2}, .sinks = -1}); },
                        "sinks must be non-negative, got -1"));
  constexpr int S = 2, H = 2, stride = 64;
  policy p({.shape = {.num_kv_heads = H}, .sinks = 4});
  gpu_test::device_vector<float> scores(static_cast<std::size_t>(S) * H * stride);
  gpu_test::device_vector<int32_t> dl(std::vector<int32_t>{40, 50});
  scores.poison();
  const kvscout::score_context<kvscout::device_space> ctx{{}, {}, dspan<const int32_t>(dl), 50};
  const kvscout::score_buffer<kvscout::device_space> out{{scores.data(), scores.size()}, S, H, stride};
  auto with = [&](kvscout::score_context<kvscout::device_space> c, kvscout::score_buffer<kvscout::device_space> o) {
    return [&p, c, o] { p.score(c, o, {}); };
  };
  GPU_CHECK(throws_with(with(ctx, {out.scores, S, 3, stride}), "score buffer has 3 kv heads, the config 2"));
  GPU_CHECK(throws_with(with(ctx, {out.scores, 0, H, stride}), "score buffer num_seqs = 0"));
  GPU_CHECK(throws_with(with({{}, {}, ctx.seq_lens, 65}, out), "max_seq_len = 65 exceeds the score buffer's stride 64"));
  GPU_CHECK(throws_with(with({{}, {}, ctx.seq_lens, -1}, out), "max_seq_len = -1"));
  GPU_CHECK(throws_with(with(ctx, {{scores.data(), scores.size() - 1}, S, H, stride}),
                        "score buffer holds 255 floats, expected num_seqs * num_kv_heads * stride = 256"));
  GPU_CHECK(throws_with(with({{}, {}, {dl.data(), 1}, 50}, out), "seq_lens holds 1 entries, expected num_seqs = 2"));
  GPU_CHECK(throws_with(with({{}, {}, {}, 50}, out), "seq_lens holds 0 entries"));
  // Nothing was written by the calls that threw.
  const std::vector<float> after = scores.download();
  GPU_CHECK(std::all_of(after.begin(), after.end(), [](float v) { return std::isnan(v); }));
}

// ---- the pipeline with the streaming policy -----------------------------------------------------

constexpr int L = 3, skip = 1, S = 2, H = 2, D = 64, max_tokens = 512, budget = 32, sinks = 4;
using layout = kvscout::contiguous_layout<half, D, kvscout::hnd>;

// streaming_policy_cuda that records the sequence ids the stages hand it (it reads none itself).
struct seq_id_spy : kvscout::streaming_policy_cuda {
  using kvscout::streaming_policy_cuda::streaming_policy_cuda;
  kvscout::device_span<const int32_t> seen{};
  void score(const kvscout::score_context<kvscout::device_space>& ctx, const kvscout::score_buffer<kvscout::device_space>& out,
             const kvscout::cuda_exec& exec) {
    seen = ctx.seq_ids;
    kvscout::streaming_policy_cuda::score(ctx, out, exec);
  }
};
static_assert(kvscout::speculation_policy_cuda<seq_id_spy>);
static_assert(!kvscout::query_scoring_policy_cuda<kvscout::streaming_policy_cuda>);

// The stages over it, and a reference to them, are what decode_pipeline_cuda drives; an executor
// is not.
using streaming_stages = kvscout::speculation_stages_cuda<layout, kvscout::streaming_policy_cuda,
                                                          kvscout::topk_selector_cuda>;
static_assert(kvscout::pipeline_stages_cuda<streaming_stages>);
static_assert(kvscout::pipeline_stages_cuda<kvscout::stages_ref_cuda<streaming_stages>>);
static_assert(!kvscout::pipeline_stages_cuda<kvscout::zero_copy_executor_cuda<layout>>);

// per_layer_budgets: layer 2 has its own selector, of budget 12 (capacity still `budget`): the
// stages' per-layer selectors (cuda_stage_selectors).
void pipeline_selects(bool per_layer_budgets) {
  constexpr int budget2 = 12;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  const std::vector<int32_t> lens_init = {300, 20};  // the second is shorter than the budget
  gpu_test::pinned_vector<int32_t> lens(S);  // layout metadata: host and device read it
  for (int s = 0; s < S; ++s) lens[s] = lens_init[s];
  const layout host_layout = layout::padded(H, max_tokens, lens.data(), S);
  const layout dev_layout = layout::padded(H, max_tokens, lens.device_data(), S);
  const std::size_t cache = static_cast<std::size_t>(S) * H * max_tokens * D;
  std::vector<std::unique_ptr<gpu_test::pinned_vector<half>>> k, v;
  for (int l = 0; l < L; ++l) {
    k.push_back(std::make_unique<gpu_test::pinned_vector<half>>(cache));
    v.push_back(std::make_unique<gpu_test::pinned_vector<half>>(cache));
    for (std::size_t i = 0; i < cache; ++i) {
      (*k.back())[i] = kvscout::from_float<half>(nd(rng));
      (*v.back())[i] = kvscout::from_float<half>(nd(rng));
    }
  }
  cudaStream_t compute{}, side{}, copy{};
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&compute));
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&side));
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&copy));

  seq_id_spy policy({.shape = {.num_kv_heads = H}, .sinks = sinks});
  std::vector<seq_id_spy*> per_layer(L, &policy);  // one object, every layer
  per_layer[0] = nullptr;                                               // below skip_layers
  // No keep-set: what is selected is the policy's scores alone.
  kvscout::topk_selector_cuda::config sc{{.num_seqs = S, .num_kv_heads = H,
                                         .max_tokens = max_tokens}, budget, budget, {0, 0}};
  gpu_test::device_vector<std::byte> sel_ws(
      std::max<std::size_t>(1, kvscout::topk_selector_cuda::workspace_bytes(sc)));
  kvscout::topk_selector_cuda selector(sc, {sel_ws.data(), kvscout::topk_selector_cuda::workspace_bytes(sc)});
  kvscout::topk_selector_cuda::config sc2{{.num_seqs = S, .num_kv_heads = H,
                                          .max_tokens = max_tokens}, budget, budget2, {0, 0}};
  gpu_test::device_vector<std::byte> sel_ws2(
      std::max<std::size_t>(1, kvscout::topk_selector_cuda::workspace_bytes(sc2)));
  kvscout::topk_selector_cuda selector2(sc2, {sel_ws2.data(), kvscout::topk_selector_cuda::workspace_bytes(sc2)});
  using selectors_t = kvscout::cuda_stage_selectors<kvscout::topk_selector_cuda>;
  const selectors_t selectors =
      per_layer_budgets ? selectors_t(std::vector<kvscout::topk_selector_cuda*>{nullptr, &selector, &selector2})
                        : selectors_t(selector);
  const auto budget_of = [&](int l) { return per_layer_budgets && l == 2 ? budget2 : budget; };
  gpu_test::device_vector<int> status(1);
  KVSCOUT_CUDA_CHECK(cudaMemset(status.data(), 0, sizeof(int)));
  kvscout::zero_copy_executor_cuda<layout> fetch({.shape = {.num_seqs = S, .num_kv_heads = H},
                                                  .capacity = budget});
  const std::size_t cache_bytes = cache * sizeof(half);
  std::vector<kvscout::kv_view<layout, kvscout::device_space>> sources;
  for (int l = 0; l < L; ++l)
    sources.push_back({dev_layout,
                       {reinterpret_cast<const std::byte*>(k[l]->device_data()), cache_bytes},
                       {reinterpret_cast<const std::byte*>(v[l]->device_data()), cache_bytes}});
  gpu_test::device_vector<float> scores(static_cast<std::size_t>(S) * H * max_tokens);
  gpu_test::device_vector<int32_t> dev_lens(lens_init);
  gpu_test::device_vector<int32_t> seq_ids(std::vector<int32_t>{1, 0});  // handed to the policy
  gpu_test::device_vector<float> x0(8), x1(8);  // the policy reads no input; the stages want slots
  const std::size_t slots_n = static_cast<std::size_t>(S) * H * budget;
  std::vector<std::unique_ptr<gpu_test::device_vector<int32_t>>> ints;
  std::vector<std::unique_ptr<gpu_test::device_vector<half>>> halves;
  std::vector<kvscout::cuda_stage_buffers> sets;
  for (int b = 0; b < 2; ++b) {
    auto& idx = *ints.emplace_back(std::make_unique<gpu_test::device_vector<int32_t>>(slots_n));
    auto& cnt = *ints.emplace_back(std::make_unique<gpu_test::device_vector<int32_t>>(S * H));
    auto& rk = *halves.emplace_back(std::make_unique<gpu_test::device_vector<half>>(slots_n * D));
    auto& rv = *halves.emplace_back(std::make_unique<gpu_test::device_vector<half>>(slots_n * D));
    sets.push_back({{{idx.data(), slots_n}, {cnt.data(), static_cast<std::size_t>(S * H)}, S, H, budget},
                    {{reinterpret_cast<std::byte*>(rk.data()), rk.bytes()},
                     {reinterpret_cast<std::byte*>(rv.data()), rv.bytes()}}});
  }
  using stages_t =
      kvscout::speculation_stages_cuda<layout, seq_id_spy, kvscout::topk_selector_cuda>;
  stages_t stages(per_layer, selectors, fetch, sources,
                  {{scores.data(), scores.size()}, S, H, max_tokens},
                  {dspan<const int32_t>(dev_lens), dspan<const int32_t>(dev_lens), max_tokens,
                   dspan<const int32_t>(seq_ids)},
                  {dspan<const float>(x0), dspan<const float>(x1)}, sets);
  // A row cache over rows named by seq_ids needs to know which row held each sequence before.
  bool refused = false;
  try {
    stages_t cached(per_layer, selector, fetch, sources,
                    {{scores.data(), scores.size()}, S, H, max_tokens},
                    {dspan<const int32_t>(dev_lens), dspan<const int32_t>(dev_lens), max_tokens,
                     dspan<const int32_t>(seq_ids)},
                    {dspan<const float>(x0), dspan<const float>(x1)}, sets,
                    kvscout::cuda_stage_buffering::row_cache);
  } catch (const kvscout::error& e) {
    refused = std::string(e.what()).find("row_cache buffering with seq_ids needs cached_rows") !=
              std::string::npos;
  }
  GPU_CHECK(refused);
  if (per_layer_budgets) {  // one selector per layer, none null where a policy is
    const auto refusal = [&](std::vector<kvscout::topk_selector_cuda*> sels, const char* what) {
      try {
        stages_t bad(per_layer, selectors_t(std::move(sels)), fetch, sources,
                     {{scores.data(), scores.size()}, S, H, max_tokens},
                     {dspan<const int32_t>(dev_lens), dspan<const int32_t>(dev_lens), max_tokens,
                      dspan<const int32_t>(seq_ids)},
                     {dspan<const float>(x0), dspan<const float>(x1)}, sets);
      } catch (const kvscout::error& e) {
        return std::string(e.what()).find(what) != std::string::npos;
      }
      return false;
    };
    GPU_CHECK(refusal({&selector, &selector}, "got 2 selectors, expected one per layer (3 layers)"));
    GPU_CHECK(refusal({&selector, &selector, nullptr}, "layer 2 has a speculation policy but a null selector"));
    // A selector of another capacity than the buffer sets' is refused when the stages are built.
    kvscout::topk_selector_cuda::config sc3{{.num_seqs = S, .num_kv_heads = H,
                                            .max_tokens = max_tokens}, budget2, budget2, {0, 0}};
    gpu_test::device_vector<std::byte> sel_ws3(
        std::max<std::size_t>(1, kvscout::topk_selector_cuda::workspace_bytes(sc3)));
    kvscout::topk_selector_cuda selector3(sc3, {sel_ws3.data(), kvscout::topk_selector_cuda::workspace_bytes(sc3)});
    GPU_CHECK(refusal({nullptr, &selector, &selector3},
                      "layer 2's selector configured for [num_seqs, num_kv_heads, max_tokens, "
                      "capacity] = [2, 2, 512, 12]"));
  }
  kvscout::decode_pipeline_cuda pipe({.shape = {.num_layers = L}, .skip_layers = skip},
                                     kvscout::stages_ref_cuda<stages_t>{&stages});
  // The policy, the selector and the fetch report into status.
  const kvscout::cuda_pipeline_exec x{compute, side, copy, status.data()};
  using pipe_t = decltype(pipe);

  // Per layer, on the compute stream once the rows are there: the selection and the rows.
  gpu_test::device_vector<int32_t> rec_idx(L * slots_n), rec_cnt(L * S * H);
  gpu_test::device_vector<half> rec_k(L * slots_n * D), rec_v(L * slots_n * D);
  for (int i = 0; i < L; ++i) {
    pipe.input_ready(i, x);
    pipe.wait_rows(i, x);
    if (i < skip) continue;
    const kvscout::cuda_stage_buffers& buf = stages.buffers(i, pipe_t::slot(i));
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(rec_idx.data() + i * slots_n, buf.selection.indices.data(),
                                       slots_n * sizeof(int32_t), cudaMemcpyDeviceToDevice, compute));
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(rec_cnt.data() + i * S * H, buf.selection.counts.data(),
                                       S * H * sizeof(int32_t), cudaMemcpyDeviceToDevice, compute));
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(rec_k.data() + i * slots_n * D, buf.rows.k.data(),
                                       slots_n * D * sizeof(half), cudaMemcpyDeviceToDevice, compute));
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(rec_v.data() + i * slots_n * D, buf.rows.v.data(),
                                       slots_n * D * sizeof(half), cudaMemcpyDeviceToDevice, compute));
  }
  KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(compute));
  GPU_CHECK(status.download()[0] == 0);
  const std::vector<int32_t> d_idx = rec_idx.download(), d_cnt = rec_cnt.download();
  const std::vector<half> d_k = rec_k.download(), d_v = rec_v.download();

  int wrong_selections = 0, wrong_rows = 0;
  for (int l = skip; l < L; ++l) {
    const int32_t* li = d_idx.data() + l * slots_n;
    const int32_t* lc = d_cnt.data() + l * S * H;
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h) {
        // The sinks and the budget - sinks most recent tokens, or every token of a short row.
        const int n = lens_init[s], b = budget_of(l);
        std::vector<int32_t> want;
        for (int t = 0; t < n; ++t)
          if (n <= b || t < sinks || t >= n - (b - sinks)) want.push_back(t);
        const int row = s * H + h;
        const bool ok = lc[row] == static_cast<int>(want.size()) &&
                        std::equal(want.begin(), want.end(), li + row * budget);
        if (!ok) {
          ++wrong_selections;
          std::fprintf(stderr, "layer %d (s %d, h %d): count %d, expected %zu\n", l, s, h, lc[row],
                       want.size());
        }
      }
    // The rows: what the host gather copies for the device's selection, byte for byte.
    std::vector<int32_t> sel_i(li, li + slots_n), sel_c(lc, lc + S * H);
    const kvscout::selection_view<kvscout::host_space> hv{{sel_i.data(), sel_i.size()}, {sel_c.data(), sel_c.size()}, S, H, budget};
    const auto [gk, gv] = gpu_test::host_gather_rows(host_layout, k[l]->data(), v[l]->data(), cache_bytes, hv);
    for (int row = 0; row < S * H; ++row) {
      const std::size_t off = static_cast<std::size_t>(row) * budget * D;
      const std::size_t bytes = static_cast<std::size_t>(sel_c[row]) * D * sizeof(half);
      wrong_rows += std::memcmp(&d_k[l * slots_n * D + off], &gk[off], bytes) != 0;
      wrong_rows += std::memcmp(&d_v[l * slots_n * D + off], &gv[off], bytes) != 0;
    }
  }
  std::printf("streaming through the pipeline: %d wrong selections, %d wrong row blocks\n",
              wrong_selections, wrong_rows);
  GPU_CHECK(wrong_selections == 0);
  GPU_CHECK(wrong_rows == 0);
  GPU_CHECK(policy.seen.data() == seq_ids.data() && policy.seen.size() == 2);  // the stages' ids
  // The stages hand the call's execution argument (its status word) to the policy and to the
  // selector; each reports a length past its own bound.
  std::vector<int32_t> too_long = lens_init;
  too_long[0] = max_tokens + 5;  // past the selector's stride (max_tokens)
  dev_lens.upload(too_long);
  stages.set_max_seq_len(0);  // the policy launches nothing: only the selector reads lengths
  stages.speculate(skip, 0, {compute, status.data()});
  KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(compute));
  GPU_CHECK(status.download()[0] == kvscout::device_status::bad_length);
  status.upload(std::vector<int>{0});
  too_long[0] = max_tokens - 1;  // within the stride, past the policy's bound below
  dev_lens.upload(too_long);
  stages.set_max_seq_len(max_tokens - 2);
  stages.speculate(skip, 0, {compute, status.data()});
  KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(compute));
  GPU_CHECK(status.download()[0] == kvscout::device_status::bad_length);
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(compute));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(side));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(copy));
}

}  // namespace

int main() {
  return gpu_test::run_all("streaming_device", {{"scores_match_host", scores_match_host},
                                                {"bad_input_throws", bad_input_throws},
                                                {"pipeline_selects_sinks_and_recent",
                                                 [] { pipeline_selects(false); }},
                                                {"pipeline_per_layer_budgets",
                                                 [] { pipeline_selects(true); }}});
}
