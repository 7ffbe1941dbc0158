#pragma once
// The configs of the CUDA prefetch executors: plain C++, what is fixed at setup. The stream and
// the device status word are each submit()'s last argument.

#include <cstddef>

#include "kvscout/core/shape.hpp"
#include "kvscout/fetch/stores.hpp"

namespace kvscout {

namespace detail {
/// The zero-copy gather's default grid bound (zero_copy_config::max_blocks = 0).
inline constexpr int zero_copy_default_blocks = 8;
}  // namespace detail

struct zero_copy_config {
  decode_shape shape{};           // num_seqs, num_kv_heads
  int capacity = 0;               // most rows selected per (sequence, kv_head)
  // Grid bound: the SMs the gather may occupy. 0: 8 blocks, about the fewest that
  // keep the link busy without slowing concurrent compute. Raise it where no compute runs beside.
  int max_blocks = 0;
  int threads_per_block = 256;    // a multiple of 32 in [32, 1024]
};

/// The selection must be host-visible.
struct copy_engine_config {
  decode_shape shape{};           // num_seqs, num_kv_heads
  int capacity = 0;
  // false: one cudaMemcpyAsync per run. The legacy default stream never batches.
  bool use_batch_api = true;
};

/// The selection must be host-visible.
struct staged_config {
  decode_shape shape{};           // num_seqs, num_kv_heads
  int capacity = 0;
  std::size_t k_row_bytes = 0;    // the layout's k_row_bytes() / v_row_bytes() (sizes staging)
  std::size_t v_row_bytes = 0;
  int threads = 1;                // gathering threads, the caller included
  int prefetch_rows = 8;          // software prefetch distance (0: off)
  int stages = 2;                 // staging buffers in rotation; submit() waits only for a stage
                                  // whose copy from `stages` submits ago is still running
  // Streaming by default: nothing on the host reads the staging buffer again.
  gather_stores stores = gather_stores::streaming;
};

}  // namespace kvscout
