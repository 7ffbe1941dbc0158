// Device speculation and selection for one layer of a Llama-7B-shaped model: 32 KV heads,
// 32 query heads (g = 1), head_dim 128, r = 32 (post_rope_skew, fp16 partial keys), d_model 4096,
// one sequence of {8k, 32k, 128k} cached tokens, budget 10 % of the tokens.
//
//   spec/<n>        infinigen_policy_cuda::score: partial-query GEMV (32 MiB of fp16 W_Q rows),
//                   RoPE + skew, scoring of 32 x n partial keys
//   spec_q4/<n>, spec_q2/<n>  the same over quantised partial keys (quantized_keys<4> / <2>,
//                   groups of 32: codes, and a float min and step per channel and group), every
//                   group complete; bytes/s counts the codes and the min / step read
//   topk/<n>        topk_selector_cuda::select on 32 rows of n scores (each row split over
//                   several blocks: counter `chunks`)
//   threshold/<n>   threshold_selector_cuda::select, per_head, alpha 4 (cap = budget)
//   spec_topk/<n>   both, back to back on one stream (what a decode step does per layer)
//   streaming/<n>   streaming_policy_cuda::score (sinks 4): writes 32 x n scores, reads nothing
//                   but the length; the counter x_vs_memset is cudaMemsetAsync of the same bytes
//                   into buffers rotated the same way (not the kernel's), timed in the same run,
//                   over the kernel's time (1: as fast as a memset)
//   cub_sort/<n>    the anchor: cub::DeviceSegmentedRadixSort::SortPairsDescending of the same
//                   32 x n scores with their token indices (a full sort per row, 32-bit keys;
//                   nothing else: no keep-set, no compaction); the top 10 % would be its first
//                   n / 10 entries. topk/<n> also times the same sort inside its own run and
//                   reports the ratio as the counter x_vs_cub_sort (> 1: top-k is faster).
// Counters: tokens/s (rows * n scored or selected per second), bytes/s (partial keys + W_Q
// read by spec; scores read once by selection). Inputs rotate over copies that together exceed
// twice the L2 size (gpu_bench::rotation_copies, at most 64 copies), timed with CUDA events
// (UseManualTime).

#include <cub/device/device_segmented_radix_sort.cuh>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gpu_bench.cuh"
#include "kvscout/core/detail/launch.cuh"
#include "kvscout/select/threshold.cuh"
#include "kvscout/select/topk.cuh"
#include "kvscout/score/infinigen.cuh"
#include "kvscout/score/streaming.cuh"

namespace {

constexpr int H = 32, Hq = 32, D = 128, R = 32, d_model = 4096;
using pk_type = kvscout::half;
using w_type = kvscout::half;  // W_Q in the model's dtype, as an fp16 engine holds it
using spec = kvscout::infinigen_policy_cuda<pk_type, w_type>;

template <class T>
struct device_buffer {
  T* p = nullptr;
  std::size_t n = 0;
  explicit device_buffer(std::size_t count) : n(count) {
    KVSCOUT_CUDA_CHECK(cudaMalloc(&p, sizeof(T) * (count ? count : 1)));
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(p)); }
  void upload(const std::vector<T>& v) {
    KVSCOUT_CUDA_CHECK(cudaMemcpy(p, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice));
  }
};

/// Deterministic pseudo-random fill (a hash of the index), on the device.
template <class T>
__global__ void fill_random(T* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = static_cast<float>(h >> 8) * (1.f / 16777216.f);  // [0, 1)
    p[i] = kvscout::from_float<T>(4.f * u - 2.f);
  }
}

template <class T>
void fill(T* p, std::size_t n, std::uint32_t seed) {
  kvscout::detail::launch(fill_random<T>, 1024, 256, 0, nullptr, p, n, seed);
  KVSCOUT_CUDA_CHECK(cudaGetLastError());
}

kvscout::infinigen_config spec_config(int n) {
  return {.shape = {.num_seqs = 1,
                    .num_kv_heads = H,
                    .num_q_heads = Hq,
                    .head_dim = D,
                    .d_model = d_model,
                    .max_tokens = n,
                    .scale = 1.f / std::sqrt(static_cast<float>(D))},
          .r = R,
          .mode = kvscout::rope_mode::post_rope_skew,
          .aggregation = kvscout::gqa_aggregation::max_logit};
}

/// Bytes of partial keys one score() reads for n tokens of every kv head.
template <class PkT>
double key_bytes_read(int n) {
  if constexpr (kvscout::detail::is_quantized_keys_v<PkT>)
    return static_cast<double>(H) * R * (static_cast<double>(n) * PkT::bits / 8 + 8.0 * (n / PkT::group));
  else
    return static_cast<double>(H) * n * R * sizeof(PkT);
}

/// One speculator with its own workspace, keys filled (a copy for the L2 rotation); quantised
/// keys: random tiles (codes, min and step), every group complete.
template <class Spec>
struct spec_copy {
  device_buffer<std::byte> ws;
  std::unique_ptr<Spec> sp;
  spec_copy(const kvscout::infinigen_config& cfg, const std::vector<kvscout::skew_plan>& plans,
            const std::vector<float>& w_q, std::uint32_t seed)
      : ws(Spec::workspace_bytes(cfg)) {
    sp = std::make_unique<Spec>(cfg, plans, kvscout::host_span<const float>(w_q.data(), w_q.size()),
                                kvscout::host_span<const float>{},
                                kvscout::device_span<std::byte>(ws.p, ws.n));
    const auto keys = sp->keys();
    if constexpr (Spec::quantized) {
      fill(keys.tile_data.data(), keys.tile_data.size(), seed);
      const std::vector<std::int32_t> counts(keys.counts.size(), cfg.shape.max_tokens);
      KVSCOUT_CUDA_CHECK(cudaMemcpy(keys.counts.data(), counts.data(), sizeof(std::int32_t) * counts.size(),
                                    cudaMemcpyHostToDevice));
    } else {
      fill(keys.data.data(), keys.data.size(), seed);
    }
  }
};

template <class Spec = spec>
struct spec_fixture {
  int n;
  std::vector<std::unique_ptr<spec_copy<Spec>>> copies;
  device_buffer<float> x;
  device_buffer<std::int32_t> pos, lens;
  device_buffer<float> scores;

  explicit spec_fixture(int tokens)
      : n(tokens), x(d_model), pos(1), lens(1), scores(static_cast<std::size_t>(H) * tokens) {
    const auto cfg = spec_config(n);
    kvscout::skew_plan plan;  // identity skew, the first r channels: the values do not matter
    plan.mode = kvscout::rope_mode::post_rope_skew;
    plan.head_dim = D;
    plan.r = R;
    plan.rope = {D, 10000.f, kvscout::rope_style::split_half};
    plan.A.assign(static_cast<std::size_t>(D) * D, 0.f);
    for (int d = 0; d < D; ++d) plan.A[static_cast<std::size_t>(d) * D + d] = 1.f;
    for (int i = 0; i < R; ++i) plan.channels.push_back(i * (D / R));
    const std::vector<kvscout::skew_plan> plans(H, plan);
    std::vector<float> w_q(static_cast<std::size_t>(Hq) * D * d_model);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 1.f / 64.f);
    for (auto& v : w_q) v = nd(rng);
    const auto key_bytes = static_cast<std::size_t>(key_bytes_read<typename Spec::key_format>(n));
    const int k = gpu_bench::rotation_copies(key_bytes);
    for (int c = 0; c < k; ++c) copies.push_back(std::make_unique<spec_copy<Spec>>(cfg, plans, w_q, 7u + c));
    fill(x.p, x.n, 3u);
    pos.upload({n});
    lens.upload({n});
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void score(int copy, cudaStream_t stream) {
    copies[static_cast<std::size_t>(copy) % copies.size()]->sp->score(
        {{x.p, x.n}, {pos.p, 1}, {lens.p, 1}, n}, {{scores.p, scores.n}, 1, H, n}, {stream});
  }
  kvscout::score_view<kvscout::device_space> view() const {
    return {{scores.p, scores.n}, {lens.p, 1}, 1, H, n};
  }
};

/// Rotated copies of a [H, n] score matrix, one sequence of length n.
struct score_fixture {
  int n;
  int copies;
  device_buffer<float> scores;
  device_buffer<std::int32_t> lens;
  device_buffer<std::int32_t> indices, counts;
  explicit score_fixture(int tokens)
      : n(tokens),
        copies(gpu_bench::rotation_copies(sizeof(float) * static_cast<std::size_t>(H) * tokens)),
        scores(static_cast<std::size_t>(copies) * H * tokens),
        lens(1),
        indices(static_cast<std::size_t>(H) * (tokens / 10)),
        counts(H) {
    fill(scores.p, scores.n, 11u);
    lens.upload({n});
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  kvscout::score_view<kvscout::device_space> view(int copy) const {
    const std::size_t row = static_cast<std::size_t>(H) * n;
    return {{scores.p + static_cast<std::size_t>(copy % copies) * row, row}, {lens.p, 1}, 1, H, n};
  }
  kvscout::selection_buffers<kvscout::device_space> out() const {
    return {{indices.p, indices.n}, {counts.p, counts.n}, 1, H, n / 10};
  }
};

/// The CUB anchor: a segmented descending radix sort of [H, n] scores with their indices.
struct cub_sort {
  int n;
  device_buffer<float> keys_out;
  device_buffer<std::int32_t> values_in, values_out, offsets;
  std::size_t temp_bytes = 0;
  std::unique_ptr<device_buffer<std::byte>> temp;
  explicit cub_sort(int tokens)
      : n(tokens),
        keys_out(static_cast<std::size_t>(H) * tokens),
        values_in(static_cast<std::size_t>(H) * tokens),
        values_out(static_cast<std::size_t>(H) * tokens),
        offsets(H + 1) {
    std::vector<std::int32_t> iota(static_cast<std::size_t>(H) * n), off(H + 1);
    for (std::size_t i = 0; i < iota.size(); ++i) iota[i] = static_cast<std::int32_t>(i % n);
    for (int h = 0; h <= H; ++h) off[h] = h * n;
    values_in.upload(iota);
    offsets.upload(off);
    KVSCOUT_CUDA_CHECK(run(nullptr, nullptr));
    temp = std::make_unique<device_buffer<std::byte>>(temp_bytes);
  }
  cudaError_t run(const float* keys_in, cudaStream_t stream) {
    return cub::DeviceSegmentedRadixSort::SortPairsDescending(
        temp ? temp->p : nullptr, temp_bytes, keys_in, keys_out.p, values_in.p, values_out.p,
        H * n, H, offsets.p, offsets.p + 1, 0, 32, stream);
  }
};

void set_counters(benchmark::State& st, double tokens, double bytes) {
  st.counters["tokens_per_s"] = benchmark::Counter(tokens, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["bytes_per_s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate,
                                                  benchmark::Counter::kIs1024);
}

template <class Spec = spec>
void bm_spec(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0));
  spec_fixture<Spec> f(n);
  gpu_bench::event_timer timer;
  int copy = 0;
  for (auto _ : st) {
    timer.start(nullptr);
    f.score(copy++, nullptr);
    st.SetIterationTime(timer.stop(nullptr));
  }
  set_counters(st, static_cast<double>(H) * n,
               key_bytes_read<typename Spec::key_format>(n) + sizeof(w_type) * Hq * D * d_model);
}

void bm_topk(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0));
  score_fixture f(n);
  cub_sort anchor(n);
  const kvscout::topk_selector_cuda::config cfg{{.num_seqs = 1, .num_kv_heads = H, .max_tokens = n},
                                                n / 10, n / 10, {4, 64}};
  device_buffer<std::byte> ws(kvscout::topk_selector_cuda::workspace_bytes(cfg));
  kvscout::topk_selector_cuda sel(cfg, {ws.p, ws.n});
  gpu_bench::event_timer timer;
  double ours = 0, cub_time = 0;
  int copy = 0;
  for (auto _ : st) {
    timer.start(nullptr);
    sel.select(f.view(copy), f.out(), {});
    const double t = timer.stop(nullptr);
    st.SetIterationTime(t);
    ours += t;
    // The anchor, same run, same (next) input copy; not part of the reported time.
    timer.start(nullptr);
    KVSCOUT_CUDA_CHECK(anchor.run(f.view(copy + 1).scores.data(), nullptr));
    cub_time += timer.stop(nullptr);
    ++copy;
  }
  set_counters(st, static_cast<double>(H) * n, 4.0 * H * n);
  st.counters["cub_sort_us"] = 1e6 * cub_time / static_cast<double>(st.iterations());
  st.counters["x_vs_cub_sort"] = ours > 0 ? cub_time / ours : 0.0;
  st.counters["chunks"] = sel.split().chunks;
}

void bm_threshold(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0));
  score_fixture f(n);
  const kvscout::threshold_selector_cuda::config cfg{{.num_seqs = 1, .num_kv_heads = H,
                                                     .max_tokens = n}, n / 10, 4.f, n / 10,
                                                     kvscout::threshold_rule::per_head, {4, 64}};
  device_buffer<std::byte> ws(kvscout::threshold_selector_cuda::workspace_bytes(cfg));
  kvscout::threshold_selector_cuda sel(cfg, {ws.p, ws.n});
  gpu_bench::event_timer timer;
  int copy = 0;
  for (auto _ : st) {
    timer.start(nullptr);
    sel.select(f.view(copy++), f.out(), {});
    st.SetIterationTime(timer.stop(nullptr));
  }
  set_counters(st, static_cast<double>(H) * n, 4.0 * H * n);
}

void bm_spec_topk(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0));
  spec_fixture<> f(n);
  device_buffer<std::int32_t> indices(static_cast<std::size_t>(H) * (n / 10)), counts(H);
  const kvscout::topk_selector_cuda::config cfg{{.num_seqs = 1, .num_kv_heads = H, .max_tokens = n},
                                                n / 10, n / 10, {4, 64}};
  device_buffer<std::byte> ws(kvscout::topk_selector_cuda::workspace_bytes(cfg));
  kvscout::topk_selector_cuda sel(cfg, {ws.p, ws.n});
  const kvscout::selection_buffers<kvscout::device_space> out{{indices.p, indices.n}, {counts.p, counts.n}, 1, H, n / 10};
  gpu_bench::event_timer timer;
  int copy = 0;
  for (auto _ : st) {
    timer.start(nullptr);
    f.score(copy++, nullptr);
    sel.select(f.view(), out, {});
    st.SetIterationTime(timer.stop(nullptr));
  }
  set_counters(st, static_cast<double>(H) * n,
               static_cast<double>(H) * n * (R * sizeof(pk_type) + 8.0) +
                   sizeof(w_type) * Hq * D * d_model);
}

void bm_streaming(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0));
  score_fixture f(n);  // its rotated score buffers are the kernel's destinations
  const kvscout::streaming_policy_cuda policy({.shape = {.num_kv_heads = H}, .sinks = 4});
  const std::size_t row = static_cast<std::size_t>(H) * n;
  device_buffer<float> anchor_out(f.scores.n);  // the memset's, rotated alike
  auto dst = [&](int copy) { return f.scores.p + static_cast<std::size_t>(copy % f.copies) * row; };
  auto anchor_dst = [&](int copy) {
    return anchor_out.p + static_cast<std::size_t>(copy % f.copies) * row;
  };
  gpu_bench::event_timer timer;
  double ours = 0, memset_time = 0;
  int copy = 0;
  for (auto _ : st) {
    timer.start(nullptr);
    policy.score({{}, {}, {f.lens.p, 1}, n}, {{dst(copy), row}, 1, H, n}, {});
    const double t = timer.stop(nullptr);
    st.SetIterationTime(t);
    ours += t;
    // The anchor, same run, its own rotated buffers; not part of the reported time.
    timer.start(nullptr);
    KVSCOUT_CUDA_CHECK(cudaMemsetAsync(anchor_dst(copy), 0, row * sizeof(float), nullptr));
    memset_time += timer.stop(nullptr);
    ++copy;
  }
  set_counters(st, static_cast<double>(H) * n, 4.0 * H * n);
  st.counters["memset_us"] = 1e6 * memset_time / static_cast<double>(st.iterations());
  st.counters["x_vs_memset"] = ours > 0 ? memset_time / ours : 0.0;
}

void bm_cub_sort(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0));
  score_fixture f(n);
  cub_sort anchor(n);
  gpu_bench::event_timer timer;
  int copy = 0;
  for (auto _ : st) {
    timer.start(nullptr);
    KVSCOUT_CUDA_CHECK(anchor.run(f.view(copy++).scores.data(), nullptr));
    st.SetIterationTime(timer.stop(nullptr));
  }
  set_counters(st, static_cast<double>(H) * n, 16.0 * H * n);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int n : {8192, 32768, 131072}) b->Arg(n);
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(bm_spec<spec>)->Name("spec")->Apply(sizes);
BENCHMARK(bm_spec<kvscout::infinigen_policy_cuda<kvscout::quantized_keys<4>, w_type>>)->Name("spec_q4")->Apply(sizes);
BENCHMARK(bm_spec<kvscout::infinigen_policy_cuda<kvscout::quantized_keys<2>, w_type>>)->Name("spec_q2")->Apply(sizes);
BENCHMARK(bm_topk)->Name("topk")->Apply(sizes);
BENCHMARK(bm_threshold)->Name("threshold")->Apply(sizes);
BENCHMARK(bm_spec_topk)->Name("spec_topk")->Apply(sizes);
BENCHMARK(bm_streaming)->Name("streaming")->Apply(sizes);
BENCHMARK(bm_cub_sort)->Name("cub_sort")->Apply(sizes);

}  // namespace

KVSCOUT_GPU_BENCHMARK_MAIN();
