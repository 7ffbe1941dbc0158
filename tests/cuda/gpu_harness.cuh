#pragma once
// A self-contained harness for GPU tests: no Catch2, so the tests build on GPU machines that
// have only nvcc and cmake. A test binary exits 0 (pass), 1 (fail) or 77 (skipped: no device;
// ctest's SKIP_RETURN_CODE).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "kvscout/core/error.hpp"

namespace gpu_test {

inline int& failures() {
  static int n = 0;
  return n;
}

#define GPU_CHECK(cond)                                                                  \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      ++::gpu_test::failures();                                                          \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);       \
    }                                                                                    \
  } while (0)

struct test_case {
  const char* name;
  std::function<void()> body;
};

/// Runs every case; returns the process exit code.
inline int run_all(const char* suite, const std::vector<test_case>& cases) {
  int count = 0;
  const cudaError_t st = cudaGetDeviceCount(&count);
  if (st != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    std::printf("SKIP %s: no CUDA device (%s)\n", suite,
                st != cudaSuccess ? cudaGetErrorString(st) : "device count is 0");
    return 77;
  }
  int failed_cases = 0;
  for (const auto& c : cases) {
    const int before = failures();
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.body();
    } catch (const std::exception& e) {
      ++failures();
      std::fprintf(stderr, "%s: unexpected exception: %s\n", c.name, e.what());
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const bool ok = failures() == before;
    failed_cases += ok ? 0 : 1;
    // The wall time with it, host references included: where a suite's time goes.
    std::printf("%s %s.%s (%.0f ms)\n", ok ? "PASS" : "FAIL", suite, c.name, ms);
  }
  std::printf("%d passed, %d failed\n", static_cast<int>(cases.size()) - failed_cases,
              failed_cases);
  return failed_cases == 0 ? 0 : 1;
}

/// Whether this is one of the SIMT emulator's reordered runs (KVSCOUT_SIMT_ORDER other than
/// forward: tests/simt/CMakeLists.txt runs every suite forward, reversed and shuffled). Suites
/// whose sweeps repeat one barrier structure many times narrow those sweeps there, and say so;
/// the forward run, and every run on a device, sweeps everything.
inline bool reordered_emulator_run() {
  const char* order = std::getenv("KVSCOUT_SIMT_ORDER");
  return order != nullptr && std::string(order) != "forward";
}

/// Whether f() throws a kvscout::error whose message contains `needle` (says what it got if not).
template <class F>
bool throws_with(F&& f, const std::string& needle) {
  try {
    f();
  } catch (const kvscout::error& e) {
    const bool ok = std::string(e.what()).find(needle) != std::string::npos;
    if (!ok) std::fprintf(stderr, "message lacks '%s': %s\n", needle.c_str(), e.what());
    return ok;
  }
  std::fprintf(stderr, "no kvscout::error (expected one naming '%s')\n", needle.c_str());
  return false;
}

}  // namespace gpu_test

// ---- small RAII helpers for tests (tests own their memory; the library never allocates) ----------
#include <cstddef>
#include <cstring>
#include <cuda_runtime.h>

#include "kvscout/core/cuda_check.hpp"

namespace gpu_test {

/// Device memory for a test, poisoned with 0xff bytes on allocation. Every fill and copy waits
/// for the device: cudaMemset / cudaMemcpy run on the legacy stream and may return early, and a
/// test's own streams must not overtake them.
template <class T>
class device_vector {
 public:
  explicit device_vector(std::size_t n) : n_(n) {
    KVSCOUT_CUDA_CHECK(cudaMalloc(&p_, bytes() ? bytes() : 1));
    KVSCOUT_CUDA_CHECK(cudaMemset(p_, 0xff, bytes() ? bytes() : 1));
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  explicit device_vector(const std::vector<T>& host) : device_vector(host.size()) { upload(host); }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  ~device_vector() { KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(p_)); }

  void upload(const std::vector<T>& host) {
    KVSCOUT_CUDA_CHECK(cudaMemcpy(p_, host.data(), std::min(host.size(), n_) * sizeof(T),
                                  cudaMemcpyHostToDevice));
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> host(n_);
    KVSCOUT_CUDA_CHECK(cudaMemcpy(host.data(), p_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  void poison() {
    KVSCOUT_CUDA_CHECK(cudaMemset(p_, 0xff, bytes() ? bytes() : 1));
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  T* data() const { return p_; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Pinned, mapped host memory (cudaHostAllocMapped): the host pointer and the device alias.
template <class T>
class pinned_vector {
 public:
  explicit pinned_vector(std::size_t n) : n_(n) {
    KVSCOUT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&p_), bytes() ? bytes() : 1,
                                     cudaHostAllocMapped));
    std::memset(static_cast<void*>(p_), 0xff, bytes());
    KVSCOUT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_), p_, 0));
  }
  pinned_vector(const pinned_vector&) = delete;
  pinned_vector& operator=(const pinned_vector&) = delete;
  ~pinned_vector() { KVSCOUT_CUDA_CHECK_NO_THROW(cudaFreeHost(p_)); }

  T* data() const { return p_; }         // host address
  T* device_data() const { return d_; }  // the same memory as the device sees it
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }
  T& operator[](std::size_t i) { return p_[i]; }

 private:
  T* p_ = nullptr;
  T* d_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace gpu_test
