#pragma once
// Host-side part of the CUDA selectors (select/topk.cuh, select/threshold.cuh): launch shape,
// workspace sizes and every check the facades make before a launch. Host-compilable, so that the
// validation is tested on machines without a GPU (tests/host/test_cuda_facades.cpp).
//
// The device selectors take the host selectors' config types unchanged (the same fields mean the
// same thing), so an engine switches backends without touching its configuration.

#include <cstddef>
#include <cstdint>

#include "kvscout/core/error.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/select/detail/checks.hpp"
#include "kvscout/select/threshold.hpp"
#include "kvscout/select/topk.hpp"

namespace kvscout::detail {

/// Threads of a selection block; one block selects one (sequence, kv_head) row.
inline constexpr int select_block_threads = 256;
/// Scores per thread and tile of the ordered compaction (a tile is threads * items scores).
inline constexpr int select_items_per_thread = 8;
/// Grid limit: rows (num_seqs * num_kv_heads) are the grid's x dimension.
inline constexpr long long select_max_rows = 2147483647LL;

inline void check_select_rows(int num_seqs, int num_kv_heads) {
  const long long rows = static_cast<long long>(num_seqs) * num_kv_heads;
  KVSCOUT_EXPECTS(rows <= select_max_rows, "num_seqs * num_kv_heads = ", rows,
                  " exceeds the grid limit ", select_max_rows);
}

/// The checks of topk_selector_host's config, and the device's grid limit.
inline void check_topk_cuda_config(const topk_selector_host::config& cfg) {
  check_selector_config(cfg.num_seqs, cfg.num_kv_heads, cfg.stride, cfg.capacity, "budget",
                        cfg.budget, cfg.keep);
  check_select_rows(cfg.num_seqs, cfg.num_kv_heads);
}

/// The checks of threshold_selector_host's config, and the device's grid limit.
inline void check_threshold_cuda_config(const threshold_selector_host::config& cfg) {
  check_selector_config(cfg.num_seqs, cfg.num_kv_heads, cfg.stride, cfg.capacity, "max_count",
                        cfg.max_count, cfg.keep);
  KVSCOUT_EXPECTS(cfg.alpha >= 0.f, "alpha must be a non-negative number, got ", cfg.alpha);
  KVSCOUT_EXPECTS(
      cfg.rule == threshold_rule::per_head || cfg.rule == threshold_rule::infinigen_mean, "rule ",
      cfg.rule, " is not one of infinigen_mean, per_head");
  check_select_rows(cfg.num_seqs, cfg.num_kv_heads);
}

/// Device workspace of the top-k selector: none (every row is selected inside one block, in
/// shared memory).
inline std::size_t topk_cuda_workspace_bytes(const topk_selector_host::config& cfg) {
  check_topk_cuda_config(cfg);
  return 0;
}

/// Device workspace of the threshold selector: infinigen_mean keeps every row's candidate count
/// ([num_seqs * num_kv_heads] int32, -1 for empty rows) between its two kernels; per_head needs
/// none.
inline std::size_t threshold_cuda_workspace_bytes(const threshold_selector_host::config& cfg) {
  check_threshold_cuda_config(cfg);
  if (cfg.rule == threshold_rule::per_head) return 0;
  return sizeof(std::int32_t) * static_cast<std::size_t>(cfg.num_seqs) *
         static_cast<std::size_t>(cfg.num_kv_heads);
}

/// The device selectors' workspace alignment.
inline constexpr std::size_t device_selector_workspace_alignment = 16;

/// Checks a caller-owned device workspace (size, null, alignment; its contents are not read).
inline void check_device_workspace(span<std::byte, device_space> workspace, std::size_t need) {
  KVSCOUT_EXPECTS(workspace.size() >= need, "workspace holds ", workspace.size(),
                  " bytes, expected at least workspace_bytes(config) = ", need);
  KVSCOUT_EXPECTS(workspace.data() != nullptr || need == 0, "workspace is null but ", need,
                  " bytes are needed");
  KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(workspace.data()) %
                          device_selector_workspace_alignment == 0,
                  "workspace must be ", device_selector_workspace_alignment,
                  "-byte aligned, got address ",
                  static_cast<const void*>(workspace.data()));
}

}  // namespace kvscout::detail
