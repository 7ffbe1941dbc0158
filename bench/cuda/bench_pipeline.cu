// The decode step with and without overlap (pipeline/cuda_pipeline.hpp).
//
// A synthetic model of one decode step over L = 32 layers, with real memory traffic on every
// engine: each layer's compute streams its weights from device memory (a read of W bytes, as a
// memory-bound GEMV does), speculation reads a partial key cache (P bytes) on the side stream,
// and the fetch copies F bytes of selected rows from pinned host memory on the copy stream.
// overlap = 1: the pipeline's schedule (fetch of layer i behind compute of layer i - 1);
// overlap = 0: the same work in line on one stream. The ratio serial / overlapped is the speed-up
// the schedule buys; the lower bound on a step is max(compute, fetch) summed over layers.

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "gpu_bench.cuh"
#include "kvscout/core/detail/launch.cuh"
#include "kvscout/pipeline/cuda_pipeline.hpp"

namespace {

// Sums a buffer with 16-byte loads (the result is written so the reads are not elided).
__global__ void stream_read(const int4* __restrict__ p, std::size_t n, int* sink) {
  int acc = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff) *sink = acc;
}

struct synthetic_stages {
  const int4* partial_keys;
  std::size_t partial_bytes;
  const std::byte* host_rows;  // pinned
  std::byte* device_rows;      // [2][fetch_bytes]
  std::size_t fetch_bytes;
  int* sink;
  int grid;
  void speculate(int, int, const kvscout::cuda_exec& x) {
    kvscout::detail::launch(stream_read, grid / 4, 256, 0, x.stream, partial_keys, partial_bytes / 16, sink);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
  }
  void fetch(int layer, int slot, const kvscout::cuda_exec& x) {
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(device_rows + slot * fetch_bytes,
                                       host_rows + layer * fetch_bytes, fetch_bytes,
                                       cudaMemcpyHostToDevice, x.stream));
  }
};

void bm_pipeline_step(benchmark::State& st) {
  const bool overlap = st.range(0) != 0;
  const std::size_t fetch_bytes = static_cast<std::size_t>(st.range(1)) << 20;  // MiB per layer
#if defined(KVSCOUT_SIMT_HOST)
  // The host SIMT emulator's smoke run (tests/simt) checks the schedule, not bandwidth: 16 GiB of
  // reads per step took 17 s of CPU there under ASan.
  const std::size_t weight_bytes = std::size_t{4} << 20;
  const std::size_t partial_bytes = std::size_t{1} << 20;
#else
  const std::size_t weight_bytes = std::size_t{400} << 20;                       // per layer
  // 128 MiB: larger than the L2 of an H100 / H200 (50 to 60 MB), so speculation reads HBM.
  const std::size_t partial_bytes = std::size_t{128} << 20;
#endif
  const int L = 32;
  int dev = 0, sms = 0;
  KVSCOUT_CUDA_CHECK(cudaGetDevice(&dev));
  KVSCOUT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  int4 *weights, *partial;
  std::byte *host, *rows;
  int* sink;
  KVSCOUT_CUDA_CHECK(cudaMalloc(&weights, weight_bytes * 2));  // two layers' worth, alternated
  KVSCOUT_CUDA_CHECK(cudaMalloc(&partial, partial_bytes));
  KVSCOUT_CUDA_CHECK(cudaMalloc(&rows, 2 * fetch_bytes));
  KVSCOUT_CUDA_CHECK(cudaMalloc(&sink, sizeof(int)));
  KVSCOUT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), L * fetch_bytes, 0));
  KVSCOUT_CUDA_CHECK(cudaMemset(weights, 1, weight_bytes * 2));
  KVSCOUT_CUDA_CHECK(cudaMemset(partial, 1, partial_bytes));
  cudaStream_t compute, side, copy;
  KVSCOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  KVSCOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  KVSCOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
  {
    kvscout::decode_pipeline_cuda pipe(
        {.shape = {.num_layers = L}, .skip_layers = 2, .overlap = overlap},
        synthetic_stages{partial, partial_bytes, host, rows, fetch_bytes, sink, sms * 4});
    const kvscout::cuda_pipeline_exec x = overlap ? kvscout::cuda_pipeline_exec{compute, side, copy}
                                                  : kvscout::cuda_pipeline_exec{compute, compute, compute};
    gpu_bench::event_timer timer;
    for (auto _ : st) {
      timer.start(compute);
      for (int i = 0; i < L; ++i) {
        pipe.input_ready(i, x);
        pipe.wait_rows(i, x);
        kvscout::detail::launch(stream_read, sms * 4, 256, 0, compute,
                                weights + (i % 2) * (weight_bytes / 16), weight_bytes / 16, sink);
      }
      st.SetIterationTime(timer.stop(compute));
    }
  }
  st.counters["fetch_MiB_per_layer"] = static_cast<double>(st.range(1));
  st.counters["overlap"] = overlap ? 1 : 0;
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(compute));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(side));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(copy));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(weights));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(partial));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(rows));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(sink));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaFreeHost(host));
}
BENCHMARK(bm_pipeline_step)
    ->ArgNames({"overlap", "fetch_MiB"})
    ->ArgsProduct({{0, 1}, {2, 8, 32}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

KVSCOUT_GPU_BENCHMARK_MAIN();
