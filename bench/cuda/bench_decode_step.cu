// One decode step on the GPU, end to end: a stack of Llama-3-8B-shaped decoder layers (d_model
// 4096, 32 query heads, 8 KV heads, head_dim 128, MLP 14336, RoPE theta 500000, fp16 weights,
// cuBLAS GEMMs) whose KV cache lives in pinned host memory, decoded seven ways in the same run
// (bench/cuda/decode_step.cuh says what each does):
//
//   decode_step/<layout>/ctx:<tokens>/batch:<B>/way:<way>
//     kvscout            speculation + top-k + zero-copy fetch overlapped, sparse attention; the
//                        whole step one CUDA graph, replayed
//     kvscout_row_cache  the same with the device row cache (two graphs, even and odd steps)
//     kvscout_corrected  kvscout plus the correction step on the critical path: up to a quarter of
//                        the budget more rows per (sequence, kv head), chosen by layer i's own
//                        query, fetched once it exists, attended with the speculated rows (graph);
//                        the added rows count in link_MB_per_token. Not for KIVI layouts
//     compute_only       kvscout's step without the fetch (rows already on the device): the floor
//     flexgen            every layer's whole K / V over the copy engine, behind the previous
//                        layer's compute, dense attention (graph)
//     infinigen          InfiniGen's path: selection read back, host gather into pinned staging,
//                        copy (eager: it waits on the host by design)
//     resident           the whole cache on the device, dense attention (graph): the upper bound
//   Counters: us_per_layer; tok_per_s (the batch) and tok_per_s_seq (one sequence); ms_per_token_32L
//   (the step scaled to 32 layers); link_MB_per_token (bytes over the link per token of one
//   sequence through 32 layers); link_frac (of a full fetch's bytes); hit_rate (row cache);
//   hidden (share of the fetch time, from events, that the step did not add over its floor:
//   compute_only for the sparse ways, resident for flexgen); fetch_bound_us (the step's link bytes
//   over h2d_GBps, the contiguous pinned H2D rate measured in the same run); vs_bound (step time
//   over max(fetch_bound_us, compute_only)); host_us_per_layer (host time to launch the graph,
//   or to enqueue the eager step, per layer).
//   Sequences of a batch of 8 hold 100 % down to 75 % of ctx tokens; the budget is 10 % of the
//   longest (so shorter sequences move a larger share of their rows: link_frac says how much).
//   <layout>: contiguous (HND fp16), paged16 (16-token pages, block table, pages shuffled),
//   kivi2 / kivi4 (KIVI's layout, G = 32, R = 128, K codes and V records fetched, the key
//   parameters and residual windows resident; the sparse ways only, no append).
//   Eight layers; layers share 2 cache sets where one per layer would not fit (caches of 128k x 8).
//
//   gemm_under_fetch/<executor>/<granularity>/batch:<B>
//     one layer's four GEMMs (qkv, o, gate+up, down) timed alone and while a fetch of 10 % of a
//     32k-token, 8-head fp16 cache runs on another stream without pause: zero_copy over 4 / 8 / 16
//     / 32 blocks or all SMs, or the copy engine (one copy per run of rows); selected single rows
//     or whole 16-token pages. Counters: gemm_slowdown (time under the fetch / alone),
//     fetch_vs_h2d (the fetch's rate during the GEMMs over the contiguous H2D rate).
//
// `tiny` rows: a 3-layer, d_model 256 model at 512 tokens, for the emulator's smoke test.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "decode_step.cuh"
#include "gpu_bench.cuh"
#include "kvscout/fetch/copy_engine.cuh"

namespace {

using decode_step::decode_way;
using kvscout::half;
constexpr int kD = 128;
using contiguous = kvscout::contiguous_layout<half, kD, kvscout::hnd>;
using paged = kvscout::paged_layout<half, kD, kvscout::hnd, kvscout::block_table, 16>;
using kivi2 = kvscout::kivi_layout<half, kD, 2>;
using kivi4 = kvscout::kivi_layout<half, kD, 4>;

struct case_spec {
  bool tiny = false;
  int ctx = 0;
  int batch = 1;
};

decode_step::stack_config config_for(const case_spec& c) {
  decode_step::stack_config cfg;
  if (c.tiny) cfg.model = {.d_model = 256, .q_heads = 4, .kv_heads = 2, .mlp = 512, .layers = 3};
  for (int s = 0; s < c.batch; ++s)
    cfg.lens.push_back(c.batch == 1 ? c.ctx : c.ctx - c.ctx / 4 * s / (c.batch - 1));
  // One cache per layer unless the layers' caches would pass 24 GiB of pinned memory.
  const double per_layer = static_cast<double>(c.batch) * c.ctx * cfg.model.kv_heads * kD * 2 * 2;
  cfg.distinct_caches = per_layer * cfg.model.layers > 24.0 * (1ull << 30) ? 2 : 0;
  cfg.staged_threads = static_cast<int>(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
  return cfg;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// One stack at a time (the largest hold tens of GB): replaced when a row asks for another.
struct holder {
  virtual ~holder() = default;
};
template <class L>
struct suite : holder {
  decode_step::decode_stack<L> stack;
  double h2d_gbps = 0;
  std::map<int, double> floor_s;  // floors by kind (floor_kind), measured on demand
  explicit suite(const case_spec& c) : stack(config_for(c)) {
    h2d_gbps = decode_step::h2d_anchor_gbps(stack.compute_stream());  // 64 MiB, every suite
    // One eager step of each cheap way first: every kernel and cuBLAS path is loaded before any
    // capture.
    stack.step(decode_way::compute_only);
    if constexpr (!decode_step::decode_stack<L>::kivi) {
      stack.step(decode_way::resident);
      stack.step(decode_way::kvscout_corrected);  // the correction's kernels, too
    }
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  }

};
std::unique_ptr<holder> g_suite;
std::string g_suite_key;

template <class L>
suite<L>& get_suite(const std::string& layout_name, const case_spec& c) {
  const std::string key = layout_name + "/" + std::to_string(c.tiny) + "/" + std::to_string(c.ctx) + "/" + std::to_string(c.batch);
  if (key != g_suite_key) {
    g_suite.reset();  // free the previous one first
    g_suite_key.clear();
    g_suite = std::make_unique<suite<L>>(c);
    g_suite_key = key;
  }
  return static_cast<suite<L>&>(*g_suite);
}

bool capturable(decode_way w) { return w != decode_way::infinigen; }

/// Graphs of one step of way w (two for the row cache: even and odd steps), uploaded and replayed
/// once untimed, so a timed replay pays neither the upload nor a first launch.
template <class L>
std::vector<cudaGraphExec_t> ready_graphs(decode_step::decode_stack<L>& s, decode_way w) {
  std::vector<cudaGraphExec_t> g;
  g.push_back(s.capture(w));
  if (w == decode_way::kvscout_cache) g.push_back(s.capture(w));
  for (auto e : g) {
    KVSCOUT_CUDA_CHECK(cudaGraphUpload(e, s.compute_stream()));
    KVSCOUT_CUDA_CHECK(cudaGraphLaunch(e, s.compute_stream()));
  }
  KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(s.compute_stream()));
  return g;
}

// Runs `reps` steps of way w (graphs unless eager), returns the median seconds per step.
template <class L>
double time_steps(decode_step::decode_stack<L>& s, decode_way w, int reps, bool eager) {
  std::vector<cudaGraphExec_t> g;
  if (!eager) g = ready_graphs(s, w);
  gpu_bench::event_timer t;
  std::vector<double> r;
  for (int i = 0; i < reps; ++i) {
    t.start(s.compute_stream());
    if (g.empty()) {
      s.step(w);
    } else {
      KVSCOUT_CUDA_CHECK(cudaGraphLaunch(g[static_cast<std::size_t>(i) % g.size()], s.compute_stream()));
    }
    r.push_back(t.stop(s.compute_stream()));
  }
  for (auto e : g) KVSCOUT_CUDA_CHECK(cudaGraphExecDestroy(e));
  return median(r);
}

// The floor a way's hidden share and vs_bound are measured against, in the same run: the step
// without its fetch, replayed as the way itself is (a graph, or eager for infinigen).
enum floor_kind { compute_graph, compute_eager, resident_graph };
floor_kind floor_of(decode_way w) {
  if (w == decode_way::flexgen) return resident_graph;
  if (w == decode_way::infinigen) return compute_eager;
  return compute_graph;
}

template <class L>
void bm_step_body(benchmark::State& st, const std::string& layout_name, const case_spec& c,
                  decode_way w) {
  auto& su = get_suite<L>(layout_name, c);
  auto& s = su.stack;
  const int layers = s.layers();
  const bool sparse = w == decode_way::kvscout || w == decode_way::kvscout_cache ||
                      w == decode_way::kvscout_corrected || w == decode_way::compute_only ||
                      w == decode_way::infinigen;
  const bool moves = w != decode_way::compute_only && w != decode_way::resident;
  // Rows selected per step, counted on the device in an untimed step.
  double rows_step = 0;
  if (sparse) {
    s.reset_counters();
    s.step(w == decode_way::compute_only ? decode_way::kvscout : w, true);
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    rows_step = static_cast<double>(s.rows_per_step());
  }
  const floor_kind fk = floor_of(w);
  if (moves && !su.floor_s.count(fk)) {
    su.floor_s[fk] = fk == resident_graph ? time_steps(s, decode_way::resident, 5, false)
                                          : time_steps(s, decode_way::compute_only, 5, fk == compute_eager);
  }
  const double fetch_sum = moves ? s.fetch_seconds(w) : 0;

  std::vector<cudaGraphExec_t> g;
  if (capturable(w)) g = ready_graphs(s, w);
  s.reset_counters();  // the row cache's hits: counted over the timed steps
  gpu_bench::event_timer t;
  double host_s = 0, time_sum = 0;
  long long n = 0;
  for (auto _ : st) {
    t.start(s.compute_stream());
    const auto h0 = std::chrono::steady_clock::now();
    if (g.empty()) {
      s.step(w);
    } else {
      KVSCOUT_CUDA_CHECK(cudaGraphLaunch(g[static_cast<std::size_t>(n) % g.size()], s.compute_stream()));
    }
    host_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - h0).count();
    const double dt = t.stop(s.compute_stream());
    st.SetIterationTime(dt);
    time_sum += dt;
    ++n;
  }
  for (auto e : g) KVSCOUT_CUDA_CHECK(cudaGraphExecDestroy(e));
  KVSCOUT_EXPECTS(s.device_status() == 0, "device status ", s.device_status(), " after a step of ",
                  decode_step::way_name(w));
  const double hit_rate = w == decode_way::kvscout_cache && n > 0 && rows_step > 0
                              ? static_cast<double>(s.cache_hits()) / (rows_step * static_cast<double>(n))
                              : 0;

  const double B = s.batch();
  const double full_bytes = static_cast<double>(s.layer_bytes()) * layers;
  double link_bytes = sparse ? rows_step * (1 - hit_rate) * static_cast<double>(s.row_pair_bytes()) : full_bytes;
  if (!moves) link_bytes = 0;
  const double t_step = n > 0 ? time_sum / static_cast<double>(n) : 0;  // mean seconds per step
  const double t32 = t_step * 32.0 / layers;                             // a 32-layer model's step
  st.counters["us_per_layer"] = t_step * 1e6 / layers;
  st.counters["ms_per_token_32L"] = t32 * 1e3;
  st.counters["tok_per_s_32L"] = t32 > 0 ? B / t32 : 0;
  st.counters["tok_per_s_seq_32L"] = t32 > 0 ? 1 / t32 : 0;
  st.counters["link_MB_per_token"] = link_bytes * 32.0 / layers / B * 1e-6;
  st.counters["link_frac"] = full_bytes > 0 ? link_bytes / full_bytes : 0;
  st.counters["hit_rate"] = hit_rate;
  st.counters["h2d_GBps"] = su.h2d_gbps;
  st.counters["host_us_per_layer"] = n > 0 ? host_s / static_cast<double>(n) * 1e6 / layers : 0;
  st.counters["layers"] = layers;
  st.counters["batch"] = B;
  if (moves) {
    const double floor = su.floor_s[fk];
    const double bound = link_bytes / (su.h2d_gbps * 1e9);
    st.counters["floor_us"] = floor * 1e6;
    st.counters["fetch_sum_us"] = fetch_sum * 1e6;
    // The share of the fetch time the step did not add over its floor (1: all hidden).
    if (fetch_sum > 0) st.counters["hidden"] = std::clamp(1 - (t_step - floor) / fetch_sum, 0.0, 1.0);
    st.counters["fetch_bound_us"] = bound * 1e6;
    // The step over its limit: max(link bytes / H2D rate, the step without its fetch).
    if (std::max(bound, floor) > 0) st.counters["vs_bound"] = t_step / std::max(bound, floor);
  }
}

// An exception would end the whole run (Google Benchmark does not catch): report it on this row,
// drop the suite (its state is unknown) and go on.
template <class L>
void bm_step(benchmark::State& st, std::string layout_name, case_spec c, decode_way w) {
  try {
    bm_step_body<L>(st, layout_name, c, w);
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
    g_suite.reset();
    g_suite_key.clear();
    (void)cudaGetLastError();
  }
}

// ---- the GEMMs beside a fetch ----------------------------------------------------------------------

struct gemm_fixture {
  static constexpr int kHeads = 8, kTokens = 32768, dm = 4096, q = 32, kv = 8, mlp = 14336;
  decode_step::arena a;
  cublasHandle_t blas{};
  cudaStream_t compute{}, copy{};
  half *wqkv, *wo, *wgu, *wdown, *x;
  float *y32;
  half *y16;
  int batch;
  contiguous host_l{}, dev_l{};
  std::int32_t len = kTokens;
  std::int32_t* d_len = nullptr;
  std::byte *hk, *hv, *dk, *dv;
  std::size_t cache_bytes = 0;
  double h2d = 0, gemm_alone = 0;

  explicit gemm_fixture(int B) : batch(B) {
    KVSCOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    KVSCOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
    DECODE_STEP_CUBLAS(cublasCreate(&blas));
    DECODE_STEP_CUBLAS(cublasSetStream(blas, compute));
    DECODE_STEP_CUBLAS(cublasSetWorkspace(blas, a.device<std::byte>(std::size_t{32} << 20), std::size_t{32} << 20));
    auto fill = [&](half* p, std::size_t n, int seed) {
      kvscout::detail::launch(decode_step::detail::fill_half, decode_step::detail::grid_for(n, 256), 256, 0,
                              compute, p, n, static_cast<std::uint64_t>(seed), 0.02f);
    };
    wqkv = a.device<half>(std::size_t{(q + 2 * kv) * kD} * dm);
    wo = a.device<half>(std::size_t{dm} * q * kD);
    wgu = a.device<half>(std::size_t{2} * mlp * dm);
    wdown = a.device<half>(std::size_t{dm} * mlp);
    x = a.device<half>(std::size_t{64} * mlp);
    y32 = a.device<float>(std::size_t{64} * 2 * mlp);
    y16 = a.device<half>(std::size_t{64} * 2 * mlp);
    fill(wqkv, std::size_t{(q + 2 * kv) * kD} * dm, 1);
    fill(wo, std::size_t{dm} * q * kD, 2);
    fill(wgu, std::size_t{2} * mlp * dm, 3);
    fill(wdown, std::size_t{dm} * mlp, 4);
    fill(x, std::size_t{64} * mlp, 5);
    host_l = contiguous::padded(kHeads, kTokens, &len, 1);
    d_len = a.upload(std::vector<std::int32_t>{len});
    dev_l = contiguous::padded(kHeads, kTokens, d_len, 1);
    cache_bytes = host_l.required_bytes();
    std::tie(hk, dk) = a.mapped(cache_bytes);
    std::tie(hv, dv) = a.mapped(cache_bytes);
    std::memset(hk, 1, cache_bytes);
    std::memset(hv, 2, cache_bytes);
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    gemm_alone = time_gemms(20);
    h2d = decode_step::h2d_anchor_gbps(copy);
  }
  ~gemm_fixture() {
    cublasDestroy(blas);
    KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(compute));
    KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(copy));
  }
  void gemms() {
    decode_step::gemm_rows(blas, wqkv, (q + 2 * kv) * kD, dm, x, batch, y32, CUDA_R_32F, 0.f);
    decode_step::gemm_rows(blas, wo, dm, q * kD, x, batch, y32, CUDA_R_32F, 1.f);
    decode_step::gemm_rows(blas, wgu, 2 * mlp, dm, x, batch, y16, CUDA_R_16F, 0.f);
    decode_step::gemm_rows(blas, wdown, dm, mlp, x, batch, y32, CUDA_R_32F, 1.f);
  }
  double time_gemms(int reps) {
    gpu_bench::event_timer t;
    std::vector<double> r;
    for (int i = 0; i < reps; ++i) {
      t.start(compute);
      gemms();
      r.push_back(t.stop(compute));
    }
    return median(r);
  }
};

// Selections of 10 % of the 32k tokens of each head: single rows at random, or whole 16-token
// pages at random (runs of 16 adjacent rows).
struct fetch_selection {
  std::vector<std::int32_t> idx, cnt;
  std::int32_t *d_idx = nullptr, *d_cnt = nullptr;
  int capacity = 0;
  fetch_selection(decode_step::arena& a, bool pages) {
    const int T = gemm_fixture::kTokens, H = gemm_fixture::kHeads;
    capacity = T / 10 / 16 * 16;
    std::mt19937 rng(pages ? 5 : 3);
    for (int h = 0; h < H; ++h) {
      std::vector<std::int32_t> pick;
      if (pages) {
        std::vector<std::int32_t> p(T / 16);
        std::iota(p.begin(), p.end(), 0);
        std::shuffle(p.begin(), p.end(), rng);
        for (int i = 0; i < capacity / 16; ++i)
          for (int j = 0; j < 16; ++j) pick.push_back(p[i] * 16 + j);
      } else {
        std::vector<std::int32_t> t(T);
        std::iota(t.begin(), t.end(), 0);
        std::shuffle(t.begin(), t.end(), rng);
        pick.assign(t.begin(), t.begin() + capacity);
      }
      std::sort(pick.begin(), pick.end());
      idx.insert(idx.end(), pick.begin(), pick.end());
      cnt.push_back(capacity);
    }
    d_idx = a.upload(idx);
    d_cnt = a.upload(cnt);
  }
  std::size_t bytes() const { return static_cast<std::size_t>(gemm_fixture::kHeads) * capacity * 2 * kD * sizeof(half); }
};

// executor: 0 = zero_copy (blocks: 0 = all SMs x 2), 1 = copy engine.
void bm_gemm_under_fetch_body(benchmark::State& st, int executor, int blocks, bool pages, int batch) {
  static std::map<int, std::unique_ptr<gemm_fixture>> fixtures;
  if (!fixtures.count(batch)) {
    fixtures.clear();  // one at a time
    fixtures[batch] = std::make_unique<gemm_fixture>(batch);
  }
  gemm_fixture& f = *fixtures[batch];
  fetch_selection sel(f.a, pages);
  const int H = gemm_fixture::kHeads;
  std::byte* dst_k = f.a.device<std::byte>(static_cast<std::size_t>(H) * sel.capacity * kD * 2);
  std::byte* dst_v = f.a.device<std::byte>(static_cast<std::size_t>(H) * sel.capacity * kD * 2);
  const kvscout::gather_destination<kvscout::device_space> dst{
      {dst_k, static_cast<std::size_t>(H) * sel.capacity * kD * 2},
      {dst_v, static_cast<std::size_t>(H) * sel.capacity * kD * 2}};
  int sms = 0, dev = 0;
  KVSCOUT_CUDA_CHECK(cudaGetDevice(&dev));
  KVSCOUT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  std::function<void()> fetch;
  std::unique_ptr<kvscout::zero_copy_executor_cuda<contiguous>> zc;
  std::unique_ptr<kvscout::copy_engine_executor_cuda<contiguous>> ce;
  std::vector<std::byte> ce_ws;
  if (executor == 0) {
    zc = std::make_unique<kvscout::zero_copy_executor_cuda<contiguous>>(
        kvscout::zero_copy_config{.shape = {.num_seqs = 1, .num_kv_heads = H},
                                  .capacity = sel.capacity,
                                  .max_blocks = blocks == 0 ? 2 * sms : blocks});
    const kvscout::kv_view<contiguous, kvscout::device_space> src{f.dev_l, {f.dk, f.cache_bytes}, {f.dv, f.cache_bytes}};
    const kvscout::selection_view<kvscout::device_space> dsel{
        {sel.d_idx, sel.idx.size()}, {sel.d_cnt, sel.cnt.size()}, 1, H, sel.capacity};
    fetch = [&, src, dsel] { (void)zc->submit(src, dsel, dst, {f.copy}); };
  } else {
    const kvscout::copy_engine_config cfg{.shape = {.num_seqs = 1, .num_kv_heads = H},
                                          .capacity = sel.capacity};
    ce_ws.resize(kvscout::copy_engine_executor_cuda<contiguous>::workspace_bytes(cfg));
    ce = std::make_unique<kvscout::copy_engine_executor_cuda<contiguous>>(cfg, kvscout::host_span<std::byte>(ce_ws.data(), ce_ws.size()));
    const kvscout::kv_view<contiguous, kvscout::host_space> src{f.host_l, {f.hk, f.cache_bytes}, {f.hv, f.cache_bytes}};
    const kvscout::selection_view<kvscout::host_space> hsel{
        {sel.idx.data(), sel.idx.size()}, {sel.cnt.data(), sel.cnt.size()}, 1, H, sel.capacity};
    fetch = [&, src, hsel] { (void)ce->submit(src, hsel, dst, {f.copy}); };
  }
  // One fetch alone (a warm one: the second of two), to size the window: `reps` fetches back to
  // back, and enough GEMM sets on the compute stream, started first, to cover all of them.
  gpu_bench::event_timer ft;
  fetch();
  ft.start(f.copy);
  fetch();
  const double one = std::max(1e-6, ft.stop(f.copy));
  const int reps = std::max(2, static_cast<int>(4.0 * f.gemm_alone / one) + 2);
  const int sets = std::min(4000, static_cast<int>(1.5 * reps * one / f.gemm_alone) + 4);
  std::vector<cudaEvent_t> ge(static_cast<std::size_t>(sets) + 1);
  for (auto& e : ge) KVSCOUT_CUDA_CHECK(cudaEventCreate(&e));
  cudaEvent_t f0{}, f1{};
  KVSCOUT_CUDA_CHECK(cudaEventCreate(&f0));
  KVSCOUT_CUDA_CHECK(cudaEventCreate(&f1));
  double rate_sum = 0, slow_sum = 0, covered = 1;
  long long n = 0;
  for (auto _ : st) {
    // GEMM sets first, each ended by an event; the fetches wait for the first set to start.
    KVSCOUT_CUDA_CHECK(cudaEventRecord(ge[0], f.compute));
    for (int m = 1; m <= sets; ++m) {
      f.gemms();
      KVSCOUT_CUDA_CHECK(cudaEventRecord(ge[static_cast<std::size_t>(m)], f.compute));
    }
    KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(f.copy, ge[0], 0));
    KVSCOUT_CUDA_CHECK(cudaEventRecord(f0, f.copy));
    for (int i = 0; i < reps; ++i) fetch();
    KVSCOUT_CUDA_CHECK(cudaEventRecord(f1, f.copy));
    KVSCOUT_CUDA_CHECK(cudaEventSynchronize(f1));
    KVSCOUT_CUDA_CHECK(cudaEventSynchronize(ge[static_cast<std::size_t>(sets)]));
    // The GEMM sets that ran wholly inside the fetch window, and their median time.
    std::vector<double> inside;
    for (int m = 1; m <= sets; ++m) {
      float a = 0, b = 0, d = 0;
      KVSCOUT_CUDA_CHECK(cudaEventElapsedTime(&a, f0, ge[static_cast<std::size_t>(m) - 1]));
      KVSCOUT_CUDA_CHECK(cudaEventElapsedTime(&b, ge[static_cast<std::size_t>(m)], f1));
      KVSCOUT_CUDA_CHECK(cudaEventElapsedTime(&d, ge[static_cast<std::size_t>(m) - 1], ge[static_cast<std::size_t>(m)]));
      if (a >= 0 && b >= 0) inside.push_back(d * 1e-3);
    }
    float w = 0, tail = 0;
    KVSCOUT_CUDA_CHECK(cudaEventElapsedTime(&w, f0, f1));
    KVSCOUT_CUDA_CHECK(cudaEventElapsedTime(&tail, f1, ge[static_cast<std::size_t>(sets)]));
    if (tail < 0) covered = 0;  // the GEMMs ended before the fetches: part of the window ran alone
    const double t_set = inside.empty() ? f.gemm_alone : median(inside);
    st.SetIterationTime(t_set);
    slow_sum += t_set / f.gemm_alone;
    rate_sum += static_cast<double>(sel.bytes()) * reps / (w * 1e-3) * 1e-9;
    ++n;
  }
  for (auto e : ge) KVSCOUT_CUDA_CHECK(cudaEventDestroy(e));
  KVSCOUT_CUDA_CHECK(cudaEventDestroy(f0));
  KVSCOUT_CUDA_CHECK(cudaEventDestroy(f1));
  st.counters["gemm_alone_us"] = f.gemm_alone * 1e6;
  st.counters["gemm_slowdown"] = n > 0 ? slow_sum / static_cast<double>(n) : 0;
  st.counters["fetch_GBps"] = n > 0 ? rate_sum / static_cast<double>(n) : 0;
  st.counters["fetch_vs_h2d"] = n > 0 ? rate_sum / static_cast<double>(n) / f.h2d : 0;
  st.counters["h2d_GBps"] = f.h2d;
  st.counters["fetch_alone_vs_h2d"] = static_cast<double>(sel.bytes()) / one * 1e-9 / f.h2d;
  st.counters["covered"] = covered;  // 1: the GEMMs ran through the whole fetch window
  st.counters["blocks"] = executor == 0 ? (blocks == 0 ? 2 * sms : blocks) : 0;
}

void bm_gemm_under_fetch(benchmark::State& st, int executor, int blocks, bool pages, int batch) {
  try {
    bm_gemm_under_fetch_body(st, executor, blocks, pages, batch);
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
    (void)cudaGetLastError();
  }
}

void register_all() {
  const decode_way all[] = {decode_way::kvscout, decode_way::kvscout_cache,
                            decode_way::kvscout_corrected, decode_way::compute_only,
                            decode_way::flexgen, decode_way::infinigen, decode_way::resident};
  const std::vector<decode_way> sparse = {decode_way::kvscout, decode_way::kvscout_cache,
                                          decode_way::compute_only, decode_way::infinigen};
  auto add = [&](auto fn, const std::string& layout, case_spec c) {
    const bool q = layout.rfind("kivi", 0) == 0;  // KIVI: the sparse ways (decode_step.cuh)
    for (decode_way w : q ? sparse : std::vector<decode_way>(std::begin(all), std::end(all))) {
      const std::string name = "decode_step/" + layout + (c.tiny ? "/tiny" : "") + "/ctx:" +
                               std::to_string(c.ctx) + "/batch:" + std::to_string(c.batch) +
                               "/way:" + decode_step::way_name(w);
      benchmark::RegisterBenchmark(name.c_str(), [fn, layout, c, w](benchmark::State& st) { fn(st, layout, c, w); })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
  };
  add(bm_step<contiguous>, "contiguous", {true, 512, 2});
  add(bm_step<paged>, "paged16", {true, 512, 2});
  add(bm_step<kivi2>, "kivi2", {true, 512, 2});
  for (int batch : {1, 8})
    for (int ctx : {8192, 32768, 131072}) add(bm_step<contiguous>, "contiguous", {false, ctx, batch});
  for (int batch : {1, 8}) add(bm_step<paged>, "paged16", {false, 32768, batch});
  for (int ctx : {32768, 131072}) {
    add(bm_step<kivi2>, "kivi2", {false, ctx, 1});
    add(bm_step<kivi4>, "kivi4", {false, ctx, 1});
  }

  for (int batch : {1, 8})
    for (bool pages : {false, true}) {
      const std::string g = std::string(pages ? "pages" : "rows") + "/batch:" + std::to_string(batch);
      for (int blocks : {4, 8, 16, 32, 0}) {
        const std::string name = "gemm_under_fetch/zero_copy_blocks:" +
                                 (blocks == 0 ? std::string("all") : std::to_string(blocks)) + "/" + g;
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { bm_gemm_under_fetch(st, 0, blocks, pages, batch); })
            ->UseManualTime()->Iterations(5)->Unit(benchmark::kMicrosecond);
      }
      const std::string name = "gemm_under_fetch/copy_engine/" + g;
      // One copy per run: single rows take ~75 ms a fetch (0.0035 of H2D on 2026-12-04): 2 iterations.
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { bm_gemm_under_fetch(st, 1, 0, pages, batch); })
          ->UseManualTime()->Iterations(pages ? 5 : 2)->Unit(benchmark::kMicrosecond);
    }
}

}  // namespace

int main(int argc, char** argv) {
  if (!::gpu_bench::have_device()) {
    std::printf("SKIP %s: no CUDA device\n", argv[0]);
    return 0;
  }
  register_all();
  ::benchmark::Initialize(&argc, argv);
  if (::benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  ::benchmark::RunSpecifiedBenchmarks();
  g_suite.reset();
  ::benchmark::Shutdown();
  return 0;
}
