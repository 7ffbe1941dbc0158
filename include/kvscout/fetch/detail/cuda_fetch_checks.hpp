#pragma once
// Host-side half of the CUDA prefetch executors: workspace sizes, the validation of everything the
// host knows, and the copy-engine executor's run list. Plain C++, tested without a GPU.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/fetch/cuda_config.hpp"
#include "kvscout/fetch/detail/checks.hpp"
#include "kvscout/fetch/stores.hpp"
#include "kvscout/kv/concepts.hpp"

namespace kvscout {

namespace detail {

inline void check_fetch_shape(int num_seqs, int num_kv_heads, int capacity) {
  KVSCOUT_EXPECTS(num_seqs >= 0, "num_seqs must be non-negative, got ", num_seqs);
  KVSCOUT_EXPECTS(num_kv_heads > 0, "num_kv_heads must be positive, got ", num_kv_heads);
  KVSCOUT_EXPECTS(capacity >= 0, "capacity must be non-negative, got ", capacity);
}

inline void check_zero_copy_config(const zero_copy_config& cfg) {
  check_fetch_shape(cfg.shape.num_seqs, cfg.shape.num_kv_heads, cfg.capacity);
  KVSCOUT_EXPECTS(cfg.max_blocks >= 0,
                  "max_blocks must be non-negative (0: the default, 8 blocks), got ",
                  cfg.max_blocks);
  KVSCOUT_EXPECTS(cfg.threads_per_block >= 32 && cfg.threads_per_block <= 1024 &&
                      cfg.threads_per_block % 32 == 0,
                  "threads_per_block must be a multiple of 32 in [32, 1024], got ",
                  cfg.threads_per_block);
}

inline void check_copy_engine_config(const copy_engine_config& cfg) {
  check_fetch_shape(cfg.shape.num_seqs, cfg.shape.num_kv_heads, cfg.capacity);
}

inline void check_staged_config(const staged_config& cfg) {
  check_fetch_shape(cfg.shape.num_seqs, cfg.shape.num_kv_heads, cfg.capacity);
  KVSCOUT_EXPECTS(cfg.k_row_bytes > 0 && cfg.k_row_bytes % fetch_vector_bytes == 0,
                  "k_row_bytes must be a positive multiple of ", fetch_vector_bytes, ", got ",
                  cfg.k_row_bytes);
  KVSCOUT_EXPECTS(cfg.v_row_bytes > 0 && cfg.v_row_bytes % fetch_vector_bytes == 0,
                  "v_row_bytes must be a positive multiple of ", fetch_vector_bytes, ", got ",
                  cfg.v_row_bytes);
  KVSCOUT_EXPECTS(cfg.threads >= 1, "threads must be at least 1, got ", cfg.threads);
  KVSCOUT_EXPECTS(cfg.prefetch_rows >= 0, "prefetch_rows must be non-negative, got ",
                  cfg.prefetch_rows);
  KVSCOUT_EXPECTS(cfg.stages >= 1, "stages must be at least 1, got ", cfg.stages);
  KVSCOUT_EXPECTS(cfg.stores == gather_stores::automatic || cfg.stores == gather_stores::cached ||
                      cfg.stores == gather_stores::streaming,
                  "stores ", cfg.stores, " is not one of automatic, cached, streaming");
}

/// prefix[pairs + 1] int64, then destinations, sources and sizes of 2 * slots copies at most.
inline std::size_t copy_engine_workspace_bytes(const copy_engine_config& cfg) {
  check_copy_engine_config(cfg);
  const std::size_t pairs = fetch_pairs(cfg.shape.num_seqs, cfg.shape.num_kv_heads);
  const std::size_t copies = 2 * pairs * static_cast<std::size_t>(cfg.capacity);
  return (pairs + 1) * sizeof(std::int64_t) + copies * (2 * sizeof(void*) + sizeof(std::size_t));
}

/// [prefix[pairs + 1] int64, padded to 16 B][K rows, compact][V rows, compact], packed in
/// (sequence, kv_head, entry) order.
inline std::size_t staged_header_bytes(const staged_config& cfg) {
  const std::size_t pairs = fetch_pairs(cfg.shape.num_seqs, cfg.shape.num_kv_heads);
  const std::size_t h = (pairs + 1) * sizeof(std::int64_t);
  return (h + fetch_vector_bytes - 1) / fetch_vector_bytes * fetch_vector_bytes;
}
inline std::size_t staged_stage_bytes(const staged_config& cfg) {
  check_staged_config(cfg);
  const std::size_t slots = fetch_pairs(cfg.shape.num_seqs, cfg.shape.num_kv_heads) *
                            static_cast<std::size_t>(cfg.capacity);
  return staged_header_bytes(cfg) + slots * (cfg.k_row_bytes + cfg.v_row_bytes);
}
inline std::size_t staged_workspace_bytes(const staged_config& cfg) {
  return staged_stage_bytes(cfg) * static_cast<std::size_t>(cfg.stages);
}
inline std::size_t staged_device_workspace_bytes(const staged_config& cfg) {
  return staged_stage_bytes(cfg);
}

inline void check_workspace(const void* p, std::size_t size, std::size_t need,
                            std::size_t align, const char* what) {
  KVSCOUT_EXPECTS(size >= need, what, " holds ", size, " bytes, expected at least ", need);
  KVSCOUT_EXPECTS(p != nullptr || need == 0, what, " is null");
  KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(p) % align == 0, what, " at address ", p,
                  " must be ", align, "-byte aligned");
}

/// One K copy and one V copy per run of rows adjacent in the source and consecutive in the
/// selection; K and V copies alternate. Returns the number of copies. The arrays hold 2 * slots.
template <kv_layout L>
std::size_t build_copy_runs(const L& l, const std::byte* k_src, const std::byte* v_src,
                            std::byte* k_dst, std::byte* v_dst,
                            const selection_view<host_space>& sel, void** dsts,
                            const void** srcs, std::size_t* sizes) {
  const std::size_t kb = l.k_row_bytes(), vb = l.v_row_bytes();
  const std::size_t capacity = static_cast<std::size_t>(sel.capacity);
  std::size_t c = 0;
  for (int s = 0; s < sel.num_seqs; ++s) {
    for (int h = 0; h < sel.num_kv_heads; ++h) {
      const std::size_t r = sel.row(s, h);
      const int n = sel.counts[r];
      const std::int32_t* idx = sel.indices.data() + r * capacity;
      const std::size_t slot0 = r * capacity;
      for (int i = 0; i < n;) {
        const int t = idx[i];
        const int max_run = l.contiguous_rows(s, t, h, n - i);
        int run = 1;
        while (run < max_run && idx[i + run] == t + run) ++run;
        const std::size_t slot = slot0 + static_cast<std::size_t>(i);
        const std::size_t rows = static_cast<std::size_t>(run);
        dsts[c] = k_dst + slot * kb;
        srcs[c] = k_src + l.k_offset(s, t, h);
        sizes[c] = rows * kb;
        ++c;
        dsts[c] = v_dst + slot * vb;
        srcs[c] = v_src + l.v_offset(s, t, h);
        sizes[c] = rows * vb;
        ++c;
        i += run;
      }
    }
  }
  return c;
}

}  // namespace detail
}  // namespace kvscout
