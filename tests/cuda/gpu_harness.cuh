#pragma once
// A self-contained harness for GPU tests: no Catch2, so the tests build on GPU machines that
// have only nvcc and cmake. A test binary exits 0 (pass), 1 (fail) or 77 (skipped: no device;
// ctest's SKIP_RETURN_CODE).

#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

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
    try {
      c.body();
    } catch (const std::exception& e) {
      ++failures();
      std::fprintf(stderr, "%s: unexpected exception: %s\n", c.name, e.what());
    }
    const bool ok = failures() == before;
    failed_cases += ok ? 0 : 1;
    std::printf("%s %s.%s\n", ok ? "PASS" : "FAIL", suite, c.name);
  }
  std::printf("%d passed, %d failed\n", static_cast<int>(cases.size()) - failed_cases,
              failed_cases);
  return failed_cases == 0 ? 0 : 1;
}

}  // namespace gpu_test
