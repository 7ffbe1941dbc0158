// GPU benchmarks of the CUDA prefetch executors (the sparse decode attention over the fetched
// rows: bench_attention.cu).
//
// Fetch: one sequence, 8 KV heads, 16384 tokens in a contiguous HND cache in mapped pinned host
// memory; fp16 rows of 256 B (head_dim 128) or fp32 rows of 512 B; 5 / 10 / 25 % of the tokens
// of every head selected at random. Each executor's rate is the selected K + V bytes over the
// event-timed submit; the anchor is a contiguous pinned host-to-device cudaMemcpyAsync of the
// same number of bytes, measured in the same run: counter `vs_h2d` = executor GB/s / anchor GB/s.
// Selections rotate over enough seeds that the moved bytes exceed twice the L2.
//
// Run on an H200 on 2026-12-04 (docs/performance.md); see docs/cuda_fetch.md.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gpu_bench.cuh"
#include "kvscout/fetch/copy_engine.cuh"
#include "kvscout/fetch/staged.cuh"
#include "kvscout/fetch/zero_copy.cuh"
#include "kvscout/kv/contiguous.hpp"

namespace {

constexpr int kHeads = 8, kTokens = 16384;

template <class T>
struct fetch_fixture {
  using layout = kvscout::contiguous_layout<T, 128, kvscout::hnd>;
  static constexpr std::size_t row = 128 * sizeof(T);
  std::int32_t len = kTokens;
  std::int32_t* d_len = nullptr;
  layout host_l{}, dev_l{};
  std::byte *k = nullptr, *v = nullptr, *k_dev = nullptr, *v_dev = nullptr;  // mapped pinned
  std::size_t bytes = 0;
  int capacity = 0, copies = 1;
  std::vector<std::vector<std::int32_t>> idx;  // per rotation: [heads, capacity]
  std::vector<std::int32_t> counts;
  std::int32_t *d_idx = nullptr, *d_counts = nullptr;
  std::byte *dst_k = nullptr, *dst_v = nullptr, *anchor_src = nullptr;
  cudaStream_t stream{};

  explicit fetch_fixture(double density) {
    host_l = layout::padded(kHeads, kTokens, &len, 1);
    KVSCOUT_CUDA_CHECK(cudaMalloc(&d_len, sizeof(std::int32_t)));
    KVSCOUT_CUDA_CHECK(cudaMemcpy(d_len, &len, sizeof len, cudaMemcpyHostToDevice));
    dev_l = layout::padded(kHeads, kTokens, d_len, 1);
    bytes = host_l.required_bytes();
    KVSCOUT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&k), bytes, cudaHostAllocMapped));
    KVSCOUT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&v), bytes, cudaHostAllocMapped));
    std::memset(k, 1, bytes);
    std::memset(v, 2, bytes);
    KVSCOUT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&k_dev), k, 0));
    KVSCOUT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&v_dev), v, 0));
    capacity = std::max(1, static_cast<int>(density * kTokens));
    const std::size_t moved = static_cast<std::size_t>(kHeads) * capacity * 2 * row;
    copies = gpu_bench::rotation_copies(moved);
    std::mt19937 rng(7);
    std::vector<std::int32_t> all(kTokens);
    for (int c = 0; c < copies; ++c) {
      std::vector<std::int32_t> sel;
      for (int h = 0; h < kHeads; ++h) {
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        std::sort(all.begin(), all.begin() + capacity);
        sel.insert(sel.end(), all.begin(), all.begin() + capacity);
      }
      idx.push_back(std::move(sel));
    }
    counts.assign(kHeads, capacity);
    const std::size_t slots = static_cast<std::size_t>(kHeads) * capacity;
    KVSCOUT_CUDA_CHECK(cudaMalloc(&d_idx, copies * slots * sizeof(std::int32_t)));
    for (int c = 0; c < copies; ++c)
      KVSCOUT_CUDA_CHECK(cudaMemcpy(d_idx + c * slots, idx[c].data(), slots * 4, cudaMemcpyHostToDevice));
    KVSCOUT_CUDA_CHECK(cudaMalloc(&d_counts, kHeads * sizeof(std::int32_t)));
    KVSCOUT_CUDA_CHECK(cudaMemcpy(d_counts, counts.data(), kHeads * 4, cudaMemcpyHostToDevice));
    KVSCOUT_CUDA_CHECK(cudaMalloc(&dst_k, slots * row));
    KVSCOUT_CUDA_CHECK(cudaMalloc(&dst_v, slots * row));
    KVSCOUT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&anchor_src), 2 * slots * row, 0));
    std::memset(anchor_src, 3, 2 * slots * row);
    KVSCOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  fetch_fixture(const fetch_fixture&) = delete;
  fetch_fixture& operator=(const fetch_fixture&) = delete;
  // Runs at exit (the fixtures are static): errors are not checked, as the CUDA runtime may be
  // shutting down. Without it the sanitized emulator build reported every buffer as leaked.
  ~fetch_fixture() {
    cudaStreamDestroy(stream);
    for (std::byte* p : {k, v, anchor_src}) cudaFreeHost(p);
    for (void* p : {static_cast<void*>(d_len), static_cast<void*>(d_idx),
                    static_cast<void*>(d_counts), static_cast<void*>(dst_k),
                    static_cast<void*>(dst_v)}) {
      cudaFree(p);
    }
  }
  std::size_t moved_bytes() const { return static_cast<std::size_t>(kHeads) * capacity * 2 * row; }
  kvscout::selection_view<kvscout::host_space> host_sel(int c) const {
    return {{idx[c].data(), idx[c].size()}, {counts.data(), counts.size()}, 1, kHeads, capacity};
  }
  kvscout::selection_view<kvscout::device_space> dev_sel(int c) const {
    const std::size_t slots = static_cast<std::size_t>(kHeads) * capacity;
    return {{d_idx + c * slots, slots}, {d_counts, counts.size()}, 1, kHeads, capacity};
  }
  kvscout::gather_destination<kvscout::device_space> dst() const {
    const std::size_t n = static_cast<std::size_t>(kHeads) * capacity * row;
    return {{dst_k, n}, {dst_v, n}};
  }
  // The anchor: GB/s of one contiguous pinned H2D copy of moved_bytes(), median of 5.
  double anchor_gbps() {
    gpu_bench::event_timer t;
    std::vector<double> r;
    for (int i = 0; i < 5; ++i) {
      t.start(stream);
      KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(dst_k, anchor_src, moved_bytes() / 2, cudaMemcpyHostToDevice, stream));
      KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(dst_v, anchor_src + moved_bytes() / 2, moved_bytes() / 2,
                                         cudaMemcpyHostToDevice, stream));
      r.push_back(static_cast<double>(moved_bytes()) / t.stop(stream) * 1e-9);
    }
    std::sort(r.begin(), r.end());
    return r[2];
  }
};
// Fixtures live for the whole process (pinned allocations are slow): one per (type, density).
template <class T>
fetch_fixture<T>& fixture(int density_pct) {
  static std::map<int, std::unique_ptr<fetch_fixture<T>>> m;
  auto& p = m[density_pct];
  if (!p) p = std::make_unique<fetch_fixture<T>>(density_pct / 100.0);
  return *p;
}

template <class T>
void report(benchmark::State& st, fetch_fixture<T>& f, double anchor) {
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations() * f.moved_bytes()));
  st.counters["row_B"] = static_cast<double>(f.row);
  st.counters["h2d_GBps"] = anchor;
  st.counters["GBps"] = benchmark::Counter(static_cast<double>(f.moved_bytes()) * 1e-9,
                                           benchmark::Counter::kIsIterationInvariantRate);
  // The ratio is computed from the mean iteration time once the run is over.
  st.counters["vs_h2d"] = benchmark::Counter(static_cast<double>(f.moved_bytes()) * 1e-9 / anchor,
                                             benchmark::Counter::kIsIterationInvariantRate);
}

template <class T>
void bm_anchor_h2d(benchmark::State& st) {
  auto& f = fixture<T>(static_cast<int>(st.range(0)));
  gpu_bench::event_timer t;
  for (auto _ : st) {
    t.start(f.stream);
    const std::size_t half_bytes = f.moved_bytes() / 2;  // the K rows, then the V rows
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(f.dst_k, f.anchor_src, half_bytes, cudaMemcpyHostToDevice, f.stream));
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(f.dst_v, f.anchor_src + half_bytes, half_bytes,
                                       cudaMemcpyHostToDevice, f.stream));
    st.SetIterationTime(t.stop(f.stream));
  }
  report(st, f, f.anchor_gbps());
}

template <class T>
void bm_zero_copy(benchmark::State& st) {
  auto& f = fixture<T>(static_cast<int>(st.range(0)));
  using E = kvscout::zero_copy_executor_cuda<typename fetch_fixture<T>::layout>;
  // range(1): the SM budget (config.max_blocks; 0 = the default, zero_copy_default_blocks).
  E ex({.shape = {.num_seqs = 1, .num_kv_heads = kHeads}, .capacity = f.capacity,
        .max_blocks = static_cast<int>(st.range(1))});
  const double anchor = f.anchor_gbps();
  gpu_bench::event_timer t;
  int c = 0;
  for (auto _ : st) {
    t.start(f.stream);
    ex.submit({f.dev_l, {f.k_dev, f.bytes}, {f.v_dev, f.bytes}}, f.dev_sel(c), f.dst(), {f.stream});
    st.SetIterationTime(t.stop(f.stream));
    c = (c + 1) % f.copies;
  }
  report(st, f, anchor);
}

// Zero copy with the row cache: the previous step's selection shares `reuse_pct` % of its rows
// with this one (the SmolLM2 demo measures 80 %: docs/cuda_pipeline.md), and its rows are in
// device memory. GBps / vs_h2d count every selected byte delivered (cached or not), so they are
// an effective rate; link_share is the share of the rows that crossed the link.
template <class T>
void bm_zero_copy_row_cache(benchmark::State& st) {
  auto& f = fixture<T>(static_cast<int>(st.range(0)));
  const int reuse_pct = static_cast<int>(st.range(1));
  using E = kvscout::zero_copy_executor_cuda<typename fetch_fixture<T>::layout>;
  E ex({.shape = {.num_seqs = 1, .num_kv_heads = kHeads}, .capacity = f.capacity});
  const std::size_t slots = static_cast<std::size_t>(kHeads) * f.capacity;
  // Previous selections: per rotation and head, keep reuse_pct % of the current tokens and
  // replace the rest with tokens not selected now.
  std::mt19937 rng(11);
  std::vector<std::int32_t> prev(static_cast<std::size_t>(f.copies) * slots);
  for (int c = 0; c < f.copies; ++c)
    for (int h = 0; h < kHeads; ++h) {
      const std::int32_t* cur = &f.idx[c][static_cast<std::size_t>(h) * f.capacity];
      std::vector<char> taken(kTokens, 0);
      for (int i = 0; i < f.capacity; ++i) taken[cur[i]] = 1;
      std::vector<std::int32_t> row(cur, cur + f.capacity);
      std::shuffle(row.begin(), row.end(), rng);
      const int keep = f.capacity * reuse_pct / 100;
      for (int i = keep; i < f.capacity; ++i) {
        std::int32_t t;
        do t = static_cast<std::int32_t>(rng() % kTokens); while (taken[t]);
        taken[t] = 1;
        row[i] = t;
      }
      std::sort(row.begin(), row.end());
      std::copy(row.begin(), row.end(), prev.begin() + (static_cast<std::ptrdiff_t>(c) * kHeads + h) * f.capacity);
    }
  std::int32_t* d_prev = nullptr;
  std::byte *pk = nullptr, *pv = nullptr;
  KVSCOUT_CUDA_CHECK(cudaMalloc(&d_prev, prev.size() * sizeof(std::int32_t)));
  KVSCOUT_CUDA_CHECK(cudaMemcpy(d_prev, prev.data(), prev.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  KVSCOUT_CUDA_CHECK(cudaMalloc(&pk, static_cast<std::size_t>(f.copies) * slots * f.row));
  KVSCOUT_CUDA_CHECK(cudaMalloc(&pv, static_cast<std::size_t>(f.copies) * slots * f.row));
  auto prev_sel = [&](int c) {
    return kvscout::selection_view<kvscout::device_space>{
        {d_prev + static_cast<std::size_t>(c) * slots, slots}, {f.d_counts, f.counts.size()}, 1, kHeads, f.capacity};
  };
  auto prev_rows = [&](int c) {
    const std::size_t n = slots * f.row;
    return kvscout::gather_destination<kvscout::device_space>{{pk + c * n, n}, {pv + c * n, n}};
  };
  const kvscout::kv_view<typename fetch_fixture<T>::layout, kvscout::device_space> src{
      f.dev_l, {f.k_dev, f.bytes}, {f.v_dev, f.bytes}};
  for (int c = 0; c < f.copies; ++c) ex.submit(src, prev_sel(c), prev_rows(c), {f.stream});  // untimed: fill
  KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(f.stream));
  const double anchor = f.anchor_gbps();
  gpu_bench::event_timer t;
  int c = 0;
  for (auto _ : st) {
    t.start(f.stream);
    ex.submit(src, f.dev_sel(c), f.dst(), kvscout::row_cache_view{prev_sel(c), prev_rows(c)},
              {f.stream});
    st.SetIterationTime(t.stop(f.stream));
    c = (c + 1) % f.copies;
  }
  report(st, f, anchor);
  st.counters["reuse_pct"] = reuse_pct;
  st.counters["link_share"] = 1.0 - (f.capacity * reuse_pct / 100) / static_cast<double>(f.capacity);
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(d_prev));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(pk));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(pv));
}

template <class T, bool Batch>
void bm_copy_engine(benchmark::State& st) {
  auto& f = fixture<T>(static_cast<int>(st.range(0)));
  using E = kvscout::copy_engine_executor_cuda<typename fetch_fixture<T>::layout>;
  kvscout::copy_engine_config cfg{.shape = {.num_seqs = 1, .num_kv_heads = kHeads},
                                  .capacity = f.capacity, .use_batch_api = Batch};
  std::vector<std::byte> ws(E::workspace_bytes(cfg));
  E ex(cfg, {ws.data(), ws.size()});
  const double anchor = f.anchor_gbps();
  gpu_bench::event_timer t;
  int c = 0;
  for (auto _ : st) {
    t.start(f.stream);  // includes the host's run building and API calls
    ex.submit({f.host_l, {f.k, f.bytes}, {f.v, f.bytes}}, f.host_sel(c), f.dst(), {f.stream});
    st.SetIterationTime(t.stop(f.stream));
    c = (c + 1) % f.copies;
  }
  report(st, f, anchor);
  st.counters["copies"] = static_cast<double>(ex.last_copy_count());
}

template <class T>
void bm_staged(benchmark::State& st) {
  auto& f = fixture<T>(static_cast<int>(st.range(0)));
  using E = kvscout::staged_executor_cuda<typename fetch_fixture<T>::layout>;
  kvscout::staged_config cfg{.shape = {.num_seqs = 1, .num_kv_heads = kHeads},
                             .capacity = f.capacity, .k_row_bytes = f.row, .v_row_bytes = f.row,
                             .threads = static_cast<int>(st.range(1))};
  std::byte *pinned = nullptr, *dev = nullptr;
  KVSCOUT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), E::workspace_bytes(cfg), 0));
  KVSCOUT_CUDA_CHECK(cudaMalloc(&dev, E::device_workspace_bytes(cfg)));
  {
    E ex(cfg, {pinned, E::workspace_bytes(cfg)}, {dev, E::device_workspace_bytes(cfg)});
    const double anchor = f.anchor_gbps();
    gpu_bench::event_timer t;
    int c = 0;
    for (auto _ : st) {
      t.start(f.stream);  // includes the host gather
      ex.submit({f.host_l, {f.k, f.bytes}, {f.v, f.bytes}}, f.host_sel(c), f.dst(), {f.stream});
      st.SetIterationTime(t.stop(f.stream));
      c = (c + 1) % f.copies;
    }
    report(st, f, anchor);
  }
  KVSCOUT_CUDA_CHECK(cudaFreeHost(pinned));
  KVSCOUT_CUDA_CHECK(cudaFree(dev));
}

void densities(benchmark::internal::Benchmark* b) {
  for (int d : {5, 10, 25}) b->Args({d});
}
void densities_threads(benchmark::internal::Benchmark* b) {
  for (int d : {5, 10, 25})
    for (int th : {1, 4}) b->Args({d, th});
}

}  // namespace

// 256-byte rows (fp16, head_dim 128) and 512-byte rows (fp32, head_dim 128).
BENCHMARK(bm_anchor_h2d<kvscout::half>)->Apply(densities)->UseManualTime();
BENCHMARK(bm_anchor_h2d<float>)->Apply(densities)->UseManualTime();
// The SM budget: the default (8), 16, 32, and two blocks per SM of an H200 (264; the old
// default).
BENCHMARK(bm_zero_copy<kvscout::half>)
    ->ArgNames({"density_pct", "blocks"})
    ->ArgsProduct({{5, 10, 25}, {0, 16, 32, 264}})
    ->UseManualTime();
BENCHMARK(bm_zero_copy<float>)
    ->ArgNames({"density_pct", "blocks"})
    ->ArgsProduct({{10}, {0, 264}})
    ->UseManualTime();
BENCHMARK(bm_zero_copy_row_cache<kvscout::half>)
    ->ArgNames({"density_pct", "reuse_pct"})
    ->ArgsProduct({{5, 10, 25}, {50, 80}})
    ->UseManualTime();
BENCHMARK(bm_copy_engine<kvscout::half, true>)->Apply(densities)->UseManualTime();
BENCHMARK(bm_copy_engine<float, true>)->Apply(densities)->UseManualTime();
BENCHMARK(bm_copy_engine<kvscout::half, false>)->Apply(densities)->UseManualTime();
BENCHMARK(bm_staged<kvscout::half>)->Apply(densities_threads)->UseManualTime();
BENCHMARK(bm_staged<float>)->Apply(densities_threads)->UseManualTime();

KVSCOUT_GPU_BENCHMARK_MAIN();
