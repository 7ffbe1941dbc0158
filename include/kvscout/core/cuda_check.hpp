#pragma once
// Checked CUDA runtime calls. Builds with a plain host compiler (only the CUDA runtime headers
// are needed); linking needs CUDA::cudart where these are called.
//
//   KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(...));           // throws kvscout::error on failure
//   KVSCOUT_CUDA_CHECK_NO_THROW(cudaEventDestroy(ev));  // for destructors: reports, returns
//
// On failure both forms call cudaGetLastError() so that a non-sticky error does not leak into the
// next, unrelated check (the same discipline as CUB's CubDebug).

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

/// Returns the status; prints one line to stderr on failure. Never throws.
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
