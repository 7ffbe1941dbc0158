#pragma once
// The CUDA examples' memory (device, uploaded and mapped pinned host blocks, freed when the
// cuda_memory goes out of scope; an engine has its own allocators) and their main(). Not part of
// the library.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/span.hpp"

namespace examples {

struct cuda_memory {
  std::vector<std::unique_ptr<void, cudaError_t (*)(void*)>> blocks;
  template <class T> kvscout::device_span<T> alloc(std::size_t n) {
    void* p = nullptr;
    KVSCOUT_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)));
    blocks.emplace_back(p, cudaFree);
    return {static_cast<T*>(p), n};
  }
  template <class T> kvscout::device_span<T> upload(const std::vector<T>& v) {
    const kvscout::device_span<T> d = alloc<T>(v.size());
    KVSCOUT_CUDA_CHECK(cudaMemcpy(d.data(), v.data(), d.size_bytes(), cudaMemcpyHostToDevice));
    return d;
  }
  // Pinned host memory mapped into the device's address space: the host's and the device's view.
  template <class T>
  std::pair<kvscout::host_span<T>, kvscout::device_span<T>> mapped(std::size_t n) {
    void *h = nullptr, *d = nullptr;
    const std::size_t bytes = std::max<std::size_t>(n, 1) * sizeof(T);
    KVSCOUT_CUDA_CHECK(cudaHostAlloc(&h, bytes, cudaHostAllocMapped));
    blocks.emplace_back(h, cudaFreeHost);
    KVSCOUT_CUDA_CHECK(cudaHostGetDevicePointer(&d, h, 0));
    return {{static_cast<T*>(h), n}, {static_cast<T*>(d), n}};
  }
};

template <class T> std::vector<T> download(kvscout::device_span<T> d) {
  std::vector<T> v(d.size());
  KVSCOUT_CUDA_CHECK(cudaMemcpy(v.data(), d.data(), d.size_bytes(), cudaMemcpyDeviceToHost));
  return v;
}

/// main() of a CUDA example: 77 (ctest: skipped) without a device, else run()'s exit code; an
/// exception is printed and exits 1.
template <class F> int run_example(const char* name, F&& run) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    std::printf("%s: no CUDA device found, nothing to run (skipped)\n", name);
    return 77;
  }
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace examples
