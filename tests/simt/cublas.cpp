// The subset of cuBLAS that kvscout's decode-step benchmark calls (bench/cuda/decode_step.cuh),
// for the host SIMT emulator: the real cublas_v2.h declares it, this file defines it, and the
// emulator's binaries link it instead of libcublas. A GEMM is one operation on the handle's stream
// (queued, captured into graphs and ordered by event waits like a kernel), computed in double and
// rounded once to C's type: a reference, not a model of cuBLAS's rounding.
//
// Supported: cublasCreate / Destroy / SetStream / SetWorkspace / SetMathMode /
// GetStatusString, and cublasGemmEx with A and B in CUDA_R_16F or CUDA_R_32F, C in CUDA_R_16F or
// CUDA_R_32F, compute CUBLAS_COMPUTE_32F (or _FAST_16F / _FAST_TF32), host pointer mode, any
// transpose of A and B. Anything else returns CUBLAS_STATUS_NOT_SUPPORTED.

#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "kvscout/core/dtype.hpp"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

double load(const void* p, cudaDataType t, std::int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return kvscout::to_float(static_cast<const kvscout::half*>(p)[i]);
}
void store(void* p, cudaDataType t, std::int64_t i, double v) {
  if (t == CUDA_R_32F) {
    static_cast<float*>(p)[i] = static_cast<float>(v);
  } else {
    static_cast<kvscout::half*>(p)[i] = kvscout::from_float<kvscout::half>(static_cast<float>(v));
  }
}
bool supported(cudaDataType t) { return t == CUDA_R_16F || t == CUDA_R_32F; }

}  // namespace

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext{};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void*, size_t) {
  return handle == nullptr ? CUBLAS_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t) {
  return handle == nullptr ? CUBLAS_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS (other)";
  }
}

// C (m x n, column-major, ldc) = alpha op(A) op(B) + beta C; op(A) is m x k, op(B) k x n.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!supported(Atype) || !supported(Btype) || !supported(Ctype)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_16F &&
      computeType != CUBLAS_COMPUTE_32F_FAST_TF32)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (transa == CUBLAS_OP_C || transb == CUBLAS_OP_C) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
  if (m < 0 || n < 0 || k < 0 || alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (lda < (ta ? k : m) || ldb < (tb ? n : k) || ldc < m || lda < 1 || ldb < 1 || ldc < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  if ((k > 0 && (A == nullptr || B == nullptr)) || C == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const double a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  kvscout_simt::detail::enqueue(handle->stream, [=] {
    // op(A) as m rows of k and op(B) as n columns of k, widened once: the dot products then read
    // both contiguously (the same products, summed in the same order, as indexing A and B).
    std::vector<double> a_rows(static_cast<std::size_t>(m) * k), b_cols(static_cast<std::size_t>(n) * k);
    for (int i = 0; i < m; ++i)
      for (int p = 0; p < k; ++p)
        a_rows[static_cast<std::size_t>(i) * k + p] =
            load(A, Atype, ta ? std::int64_t{p} + std::int64_t{i} * lda : std::int64_t{i} + std::int64_t{p} * lda);
    for (int j = 0; j < n; ++j)
      for (int p = 0; p < k; ++p)
        b_cols[static_cast<std::size_t>(j) * k + p] =
            load(B, Btype, tb ? std::int64_t{j} + std::int64_t{p} * ldb : std::int64_t{p} + std::int64_t{j} * ldb);
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        const double* ar = a_rows.data() + static_cast<std::size_t>(i) * k;
        const double* bc = b_cols.data() + static_cast<std::size_t>(j) * k;
        double acc = 0;
        for (int p = 0; p < k; ++p) acc += ar[p] * bc[p];
        const std::int64_t ci = std::int64_t{i} + std::int64_t{j} * ldc;
        const double old = b == 0.0 ? 0.0 : b * load(C, Ctype, ci);  // beta 0: C not read
        store(C, Ctype, ci, a * acc + old);
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}
