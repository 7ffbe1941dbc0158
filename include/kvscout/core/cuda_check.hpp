#pragma once
// Checked CUDA runtime calls (CUDA runtime headers only). KVSCOUT_CUDA_CHECK throws kvscout::error
// on failure; KVSCOUT_CUDA_CHECK_NO_THROW, for destructors, reports and returns. Both call
// cudaGetLastError() on failure so that a non-sticky error does not leak into the next check.

#include <cuda_runtime_api.h>

#include <cstdio>

#include "kvscout/core/error.hpp"

namespace kvscout::detail {

inline void cuda_check(cudaError_t status, const char* expr, const char* function,
                       const char* file, int line) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear the error state unless it is sticky
  throw_error(function, file, line, "CUDA call `", expr, "` failed with ",
              cudaGetErrorName(status), " (", static_cast<int>(status),
              "): ", cudaGetErrorString(status));
}

inline cudaError_t cuda_check_no_throw(cudaError_t status, const char* expr, const char* file,
                                       int line) noexcept {
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "kvscout: CUDA call `%s` failed with %s at %s:%d\n", expr,
                 cudaGetErrorName(status), file, line);
  }
  return status;
}

}  // namespace kvscout::detail

#define KVSCOUT_CUDA_CHECK(expr) \
  ::kvscout::detail::cuda_check((expr), #expr, __func__, __FILE__, __LINE__)

#define KVSCOUT_CUDA_CHECK_NO_THROW(expr) \
  ::kvscout::detail::cuda_check_no_throw((expr), #expr, __FILE__, __LINE__)
