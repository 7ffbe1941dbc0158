#pragma once
// The configs of the CUDA prefetch executors (fetch/zero_copy.cuh, fetch/copy_engine.cuh,
// fetch/staged.cuh). Plain C++, so host code can build them without the CUDA compiler. They hold
// what is fixed at setup; the stream and the device status word are each submit()'s last
// argument (cuda_exec, core/exec.hpp).

#include <cstddef>

#include "kvscout/fetch/stores.hpp"

namespace kvscout {

/// Zero-copy gather: a kernel reads the selected rows from mapped pinned host memory.
/// The zero-copy gather's default grid bound (zero_copy_config::max_blocks = 0).
inline constexpr int zero_copy_default_blocks = 8;

struct zero_copy_config {
  int num_seqs = 0;
  int num_kv_heads = 0;
  int capacity = 0;               // most rows selected per (sequence, kv_head)
  // Grid bound: the SMs the gather may occupy (one block each). 0: zero_copy_default_blocks (8),
  // about the fewest that keep the link busy without slowing concurrent compute (H200 figures:
  // docs/cuda_fetch.md). Raise it where no compute runs beside the fetch.
  int max_blocks = 0;
  int threads_per_block = 256;    // a multiple of 32 in [32, 1024]
};

/// Copy engine: one copy per run of adjacent rows, batched (cudaMemcpyBatchAsync) where the
/// runtime has it. The selection must be host-visible.
struct copy_engine_config {
  int num_seqs = 0;
  int num_kv_heads = 0;
  int capacity = 0;
  // false: one cudaMemcpyAsync per run. The batch API needs a stream other than the legacy
  // default stream (submit()'s cuda_exec::stream); with that one the copies go one by one.
  bool use_batch_api = true;
};

/// Staged: host threads gather into pinned staging, one bulk copy, a device scatter kernel.
/// The selection must be host-visible.
struct staged_config {
  int num_seqs = 0;
  int num_kv_heads = 0;
  int capacity = 0;
  std::size_t k_row_bytes = 0;    // the layout's k_row_bytes() / v_row_bytes() (sizes staging)
  std::size_t v_row_bytes = 0;
  int threads = 1;                // gathering threads, the caller included
  int prefetch_rows = 8;          // software prefetch distance (0: off)
  int stages = 2;                 // staging buffers in rotation; submit() waits only for a stage
                                  // whose copy from `stages` submits ago is still running
  // How the host threads write the staging buffer: streaming by default, since nothing on the
  // host reads it again (the bulk copy reads it from memory); fetch/stores.hpp.
  gather_stores stores = gather_stores::streaming;
};

}  // namespace kvscout
