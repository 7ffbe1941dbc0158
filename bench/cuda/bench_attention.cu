// GPU benchmark of the sparse decode attention (attention/decode.cuh) over rows already on the
// device, at the shapes of the GPU kernels issue's goals: one sequence, 8 KV heads, 32 query
// heads (GQA 4), head_dim 128, `density_pct` % of `tokens` tokens selected per head.
//
//   kind 0: fp16 rows, 1: bf16, 2: fp8 e4m3, 3: KIVI-2 records (fp16 scales, group 32, residual
//   128: the residual window's rows are read too), 4: KIVI-4.
//
// Each iteration is one planned call (plan_decode_attention_cuda for this device: split
// kernel and merge), timed with events. Counters: `bytes` = the K + V bytes the call reads (rows
// or records; KIVI's resident key parameters and residual window not counted), `GBps` over the
// time, `vs_d2d` = that rate over a device-to-device copy of the same bytes measured in the same
// run, `splits` and `blocks` the plan's. The rows are the same every iteration (no rotation): the
// smaller shapes fit in L2, as they do for the PyTorch SDPA anchor (scripts/gpu_anchors.py) run on
// the same shapes; the 25 % of 128k shape (134 MB) does not.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gpu_bench.cuh"
#include "kvscout/attention/decode.cuh"
#include "kvscout/kv/kivi.hpp"

namespace {

constexpr int kHeads = 8, kQHeads = 32, kDim = 128;

// Device bytes whose every 16-bit half and bf16 word and every fp8 byte is finite (each byte
// in [0, 0x3b]: the sign clear and the exponent below the top), so that any element type or
// KIVI record (codes, scales, zeros) read from them is a finite value.
std::byte* device_fill(std::size_t bytes, std::uint32_t seed) {
  std::vector<std::uint8_t> pattern(std::size_t(1) << 20);
  std::mt19937 rng(seed);
  for (auto& b : pattern) b = static_cast<std::uint8_t>(rng() % 0x3c);
  std::byte* d = nullptr;
  KVSCOUT_CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
  for (std::size_t at = 0; at < bytes; at += pattern.size())
    KVSCOUT_CUDA_CHECK(cudaMemcpy(d + at, pattern.data(), std::min(pattern.size(), bytes - at),
                                  cudaMemcpyHostToDevice));
  return d;
}

struct device_buffer {
  std::byte* p = nullptr;
  device_buffer() = default;
  device_buffer(std::size_t bytes, std::uint32_t seed) : p(device_fill(bytes, seed)) {}
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(p)); }
};

using kivi2 = kvscout::kivi_layout<kvscout::half, kDim, 2>;
using kivi4 = kvscout::kivi_layout<kvscout::half, kDim, 4>;

// One shape's rows, selection and buffers; built once per (tokens, density, kind).
struct attention_fixture {
  int tokens, rows;  // rows selected per head
  int kind;
  cudaStream_t stream{};
  std::vector<int32_t> lens;
  std::unique_ptr<device_buffer> k, v, sel_idx, sel_cnt, d_lens, k_params, k_res, v_res, q, out,
      ws, copy;
  std::size_t k_row = 0, v_row = 0;
  kvscout::decode_attention_plan plan;

  attention_fixture(int tokens_, int density, int kind_)
      : tokens(tokens_), rows(static_cast<int>(static_cast<long long>(tokens_) * density / 100)),
        kind(kind_), lens{tokens_} {
    KVSCOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const std::size_t slots = static_cast<std::size_t>(kHeads) * rows;
    std::vector<int32_t> idx(slots), cnt(kHeads, rows);
    int max_rows = rows;
    if (kind >= 3) {
      const kivi2 l = kivi2::padded(kHeads, tokens, lens.data(), 1, {.group = 32, .residual = 128});
      const int quantised = l.seq_len(0);  // the tokens a selection may name
      for (std::size_t i = 0; i < slots; ++i)
        idx[i] = static_cast<int32_t>(static_cast<long long>(i % rows) * quantised / rows);
      max_rows = rows + l.residual_len(0);
      k_row = kind == 3 ? l.k_row_bytes()
                        : kivi4::padded(kHeads, tokens, lens.data(), 1, {.group = 32,
                                                                         .residual = 128})
                              .k_row_bytes();
      v_row = kind == 3 ? l.v_row_bytes()
                        : kivi4::padded(kHeads, tokens, lens.data(), 1, {.group = 32,
                                                                         .residual = 128})
                              .v_row_bytes();
      k_params = std::make_unique<device_buffer>(l.required_k_params_bytes(), 5);
      k_res = std::make_unique<device_buffer>(l.required_residual_bytes(), 6);
      v_res = std::make_unique<device_buffer>(l.required_residual_bytes(), 7);
    } else {
      for (std::size_t i = 0; i < slots; ++i) idx[i] = static_cast<int32_t>(i % rows);
      k_row = v_row = static_cast<std::size_t>(kDim) * (kind == 2 ? 1 : 2);
    }
    k = std::make_unique<device_buffer>(slots * k_row, 1);
    v = std::make_unique<device_buffer>(slots * v_row, 2);
    sel_idx = std::make_unique<device_buffer>(slots * 4, 0);
    sel_cnt = std::make_unique<device_buffer>(kHeads * 4, 0);
    d_lens = std::make_unique<device_buffer>(4, 0);
    KVSCOUT_CUDA_CHECK(cudaMemcpy(sel_idx->p, idx.data(), slots * 4, cudaMemcpyHostToDevice));
    KVSCOUT_CUDA_CHECK(cudaMemcpy(sel_cnt->p, cnt.data(), kHeads * 4, cudaMemcpyHostToDevice));
    KVSCOUT_CUDA_CHECK(cudaMemcpy(d_lens->p, lens.data(), 4, cudaMemcpyHostToDevice));
    q = std::make_unique<device_buffer>(kQHeads * kDim * 2, 3);  // half queries
    out = std::make_unique<device_buffer>(kQHeads * kDim * 2, 4);
    copy = std::make_unique<device_buffer>(bytes(), 8);
    plan = kvscout::plan_decode_attention_cuda({.shape = {.num_seqs = 1, .num_kv_heads = kHeads,
                                                .num_q_heads = kQHeads, .head_dim = kDim},
                                                .max_rows = max_rows,
                                                .blocks_per_sm = kind >= 3 ? 2 : 0});
    ws = std::make_unique<device_buffer>(plan.workspace_bytes(), 9);
  }
  ~attention_fixture() { KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(stream)); }

  [[nodiscard]] std::size_t bytes() const {
    return static_cast<std::size_t>(kHeads) * rows * (k_row + v_row);
  }
  [[nodiscard]] kvscout::selection_view<kvscout::device_space> selection() const {
    const std::size_t slots = static_cast<std::size_t>(kHeads) * rows;
    return {{reinterpret_cast<const int32_t*>(sel_idx->p), slots},
            {reinterpret_cast<const int32_t*>(sel_cnt->p), static_cast<std::size_t>(kHeads)},
            1,
            kHeads,
            rows};
  }

  template <class Rows>
  void attend(const Rows& r) {
    const kvscout::attention_params p{.num_q_heads = kQHeads, .scale = 0.088f};
    kvscout::decode_attention_cuda(
        r, kvscout::current_token<typename Rows::element_type, kvscout::device_space>{},
        kvscout::device_span<const kvscout::half>(reinterpret_cast<const kvscout::half*>(q->p),
                                                  kQHeads * kDim),
        kvscout::device_span<kvscout::half>(reinterpret_cast<kvscout::half*>(out->p),
                                            kQHeads * kDim),
        p, plan, {ws->p, plan.workspace_bytes()}, {stream});
  }

  template <class L>
  void attend_kivi() {
    const L l = L::padded(kHeads, tokens, reinterpret_cast<const int32_t*>(d_lens->p), 1,
                          {.group = 32, .residual = 128});
    const std::size_t slots = static_cast<std::size_t>(kHeads) * rows;
    const L host_l = L::padded(kHeads, tokens, lens.data(), 1, {.group = 32, .residual = 128});
    kvscout::kivi_gathered_rows_cuda<L> r(
        l, selection(), {{k->p, slots * k_row}, {v->p, slots * v_row}},
        {{k_params->p, host_l.required_k_params_bytes()},
         {k_res->p, host_l.required_residual_bytes()},
         {v_res->p, host_l.required_residual_bytes()}});
    attend(r);
  }

  template <class T>
  void attend_rows() {
    const std::size_t elems = static_cast<std::size_t>(kHeads) * rows * kDim;
    kvscout::gathered_rows_cuda<T, kDim> r(selection(), {reinterpret_cast<const T*>(k->p), elems},
                                           {reinterpret_cast<const T*>(v->p), elems});
    attend(r);
  }

  void run() {
    switch (kind) {
      case 0: attend_rows<kvscout::half>(); break;
      case 1: attend_rows<kvscout::bfloat16>(); break;
      case 2: attend_rows<kvscout::fp8_e4m3>(); break;
      case 3: attend_kivi<kivi2>(); break;
      default: attend_kivi<kivi4>(); break;
    }
  }

  /// GB/s of a device-to-device copy of bytes(), median of 5.
  double d2d_gbps() {
    gpu_bench::event_timer t;
    std::vector<double> r;
    for (int i = 0; i < 5; ++i) {
      const std::size_t kb = static_cast<std::size_t>(kHeads) * rows * k_row;
      t.start(stream);
      KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(copy->p, k->p, kb, cudaMemcpyDeviceToDevice, stream));
      KVSCOUT_CUDA_CHECK(
          cudaMemcpyAsync(copy->p + kb, v->p, bytes() - kb, cudaMemcpyDeviceToDevice, stream));
      r.push_back(static_cast<double>(bytes()) / t.stop(stream) * 1e-9);
    }
    std::sort(r.begin(), r.end());
    return r[2];
  }
};

// One shape's buffers at a time (the 128k ones are 134 MB); the last is never destroyed: its
// cudaFree would run after main, when the runtime may be gone.
attention_fixture& fixture(int tokens, int density, int kind) {
  static attention_fixture* current = nullptr;
  if (current == nullptr || current->tokens != tokens ||
      current->rows != static_cast<int>(static_cast<long long>(tokens) * density / 100) ||
      current->kind != kind) {
    delete current;
    current = nullptr;
    current = new attention_fixture(tokens, density, kind);
  }
  return *current;
}

void BM_attention(benchmark::State& st) {
  auto& f = fixture(static_cast<int>(st.range(0)), static_cast<int>(st.range(1)),
                    static_cast<int>(st.range(2)));
  const double anchor = f.d2d_gbps();
  f.run();  // warm-up (and the first launch's module load)
  KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(f.stream));
  gpu_bench::event_timer t;
  for (auto _ : st) {
    t.start(f.stream);
    f.run();
    st.SetIterationTime(t.stop(f.stream));
  }
  const double b = static_cast<double>(f.bytes());
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations() * f.bytes()));
  st.counters["bytes"] = b;
  st.counters["d2d_GBps"] = anchor;
  st.counters["vs_d2d"] =
      benchmark::Counter(b * 1e-9 / anchor, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["splits"] = f.plan.splits;
  st.counters["blocks"] = static_cast<double>(f.plan.blocks());
}

}  // namespace

// The goals' shapes: fp16 at 10 % of 16k and 32k (vs torch SDPA), 25 % of 128k (vs the D2D
// rate); every row kind at 10 % of 32k (KIVI / fp8 time vs fp16's).
BENCHMARK(BM_attention)
    ->ArgNames({"tokens", "density_pct", "kind"})
    ->Args({16384, 10, 0})
    ->Args({32768, 10, 0})
    ->Args({32768, 10, 1})
    ->Args({32768, 10, 2})
    ->Args({32768, 10, 3})
    ->Args({32768, 10, 4})
    ->Args({131072, 25, 0})
    ->Args({131072, 25, 3})
    ->UseManualTime();

KVSCOUT_GPU_BENCHMARK_MAIN();
