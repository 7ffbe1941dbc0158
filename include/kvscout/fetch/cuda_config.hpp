#pragma once
// The configs of the CUDA prefetch executors (fetch/zero_copy.cuh, fetch/copy_engine.cuh,
// fetch/staged.cuh). Plain C++ with the CUDA runtime's types, so host code can build them without
// the CUDA compiler.

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kvscout/fetch/stores.hpp"

namespace kvscout {

/// Zero-copy gather: a kernel reads the selected rows from mapped pinned host memory.
struct zero_copy_config {
  int num_seqs = 0;
  int num_kv_heads = 0;
  int capacity = 0;               // most rows selected per (sequence, kv_head)
  cudaStream_t stream = nullptr;  // the caller's stream; submit() enqueues on it
  int max_blocks = 0;             // grid bound; 0: 2 per SM of the current device (setup query)
  int threads_per_block = 256;    // a multiple of 32 in [32, 1024]
  int* device_status = nullptr;   // optional device int, see backend/cuda/device_status.hpp
};

/// Copy engine: one copy per run of adjacent rows, batched (cudaMemcpyBatchAsync) where the
/// runtime has it. The selection must be host-visible.
struct copy_engine_config {
  int num_seqs = 0;
  int num_kv_heads = 0;
  int capacity = 0;
  cudaStream_t stream = nullptr;  // must not be the legacy default stream for the batch API
  bool use_batch_api = true;      // false: one cudaMemcpyAsync per run
};

/// Staged: host threads gather into pinned staging, one bulk copy, a device scatter kernel.
/// The selection must be host-visible.
struct staged_config {
  int num_seqs = 0;
  int num_kv_heads = 0;
  int capacity = 0;
  std::size_t k_row_bytes = 0;    // the layout's k_row_bytes() / v_row_bytes() (sizes staging)
  std::size_t v_row_bytes = 0;
  cudaStream_t stream = nullptr;
  int threads = 1;                // gathering threads, the caller included
  int prefetch_rows = 8;          // software prefetch distance (0: off)
  int stages = 2;                 // staging buffers in rotation; submit() waits only for a stage
                                  // whose copy from `stages` submits ago is still running
  // How the host threads write the staging buffer: streaming by default, since nothing on the
  // host reads it again (the bulk copy reads it from memory); fetch/stores.hpp.
  gather_stores stores = gather_stores::streaming;
};

}  // namespace kvscout
