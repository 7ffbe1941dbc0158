#pragma once
// Shared pieces of the GPU benchmarks: event timing for UseManualTime(), a rotation over several
// input copies so that repeated iterations do not run out of L2, and a main() that skips cleanly
// where there is no device.
//
//   static void bm(benchmark::State& st) {
//     gpu_bench::event_timer t;
//     for (auto _ : st) { t.start(stream); launch(...); st.SetIterationTime(t.stop(stream)); }
//   }
//   BENCHMARK(bm)->UseManualTime();
//   KVSCOUT_GPU_BENCHMARK_MAIN();

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>

#include "kvscout/core/cuda_check.hpp"

namespace gpu_bench {

/// Seconds between start() and stop() on a stream, measured with CUDA events.
class event_timer {
 public:
  event_timer() {
    KVSCOUT_CUDA_CHECK(cudaEventCreate(&a_));
    KVSCOUT_CUDA_CHECK(cudaEventCreate(&b_));
  }
  event_timer(const event_timer&) = delete;
  event_timer& operator=(const event_timer&) = delete;
  ~event_timer() {
    KVSCOUT_CUDA_CHECK_NO_THROW(cudaEventDestroy(a_));
    KVSCOUT_CUDA_CHECK_NO_THROW(cudaEventDestroy(b_));
  }
  void start(cudaStream_t s) { KVSCOUT_CUDA_CHECK(cudaEventRecord(a_, s)); }
  double stop(cudaStream_t s) {
    KVSCOUT_CUDA_CHECK(cudaEventRecord(b_, s));
    KVSCOUT_CUDA_CHECK(cudaEventSynchronize(b_));
    float ms = 0.f;
    KVSCOUT_CUDA_CHECK(cudaEventElapsedTime(&ms, a_, b_));
    return ms * 1e-3;
  }

 private:
  cudaEvent_t a_{}, b_{};
};

/// How many copies of an input of `bytes` keep the rotation above twice the device's L2.
inline int rotation_copies(std::size_t bytes) {
  int dev = 0, l2 = 0;
  KVSCOUT_CUDA_CHECK(cudaGetDevice(&dev));
  KVSCOUT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const std::size_t need = 2 * static_cast<std::size_t>(l2);
  const std::size_t n = bytes ? (need + bytes - 1) / bytes : 1;
  return static_cast<int>(n < 1 ? 1 : (n > 64 ? 64 : n));
}

inline bool have_device() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  return ok;
}

}  // namespace gpu_bench

#define KVSCOUT_GPU_BENCHMARK_MAIN()                                        \
  int main(int argc, char** argv) {                                         \
    if (!::gpu_bench::have_device()) {                                      \
      std::printf("SKIP %s: no CUDA device\n", argv[0]);                    \
      return 0;                                                             \
    }                                                                       \
    ::benchmark::Initialize(&argc, argv);                                   \
    if (::benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;     \
    ::benchmark::RunSpecifiedBenchmarks();                                  \
    ::benchmark::Shutdown();                                                \
    return 0;                                                               \
  }
