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
#include "kvscout/select/split_options.hpp"
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
  check_selector_config(cfg.num_seqs, cfg.num_kv_heads, cfg.stride, cfg.capacity, "budget",
                        cfg.budget, cfg.keep);
  KVSCOUT_EXPECTS(cfg.alpha >= 0.f, "alpha must be a non-negative number, got ", cfg.alpha);
  KVSCOUT_EXPECTS(
      cfg.rule == threshold_rule::per_head || cfg.rule == threshold_rule::infinigen_mean, "rule ",
      cfg.rule, " is not one of infinigen_mean, per_head");
  check_select_rows(cfg.num_seqs, cfg.num_kv_heads);
}

/// A long row split over several blocks (select/detail/radix_select_split.cuh): `chunks` blocks
/// of chunk_tokens tokens (a multiple of select_split_options::min_chunk_tokens) per row;
/// chunks == 1: one block per row (radix_select.cuh).
struct select_split {
  int chunks = 1;
  int chunk_tokens = 0;
};

/// The compaction's tile: the default chunk granule, so that every chunk starts a whole tile.
inline constexpr int select_split_granule = select_block_threads * select_items_per_thread;

/// Bytes of the split kernels' per-row state (radix_select_split.cuh: select_split_row).
inline constexpr std::size_t select_split_state_bytes = 32;

/// The split for `rows` rows of up to `stride` tokens on num_sms SMs: about 4 blocks per SM,
/// no chunk below min_chunk_tokens (rounded up to a multiple of it), at most 64 chunks; one
/// block per row where rows alone fill the device or a row is too short to split.
inline select_split plan_select_split(long long rows, int stride, select_split_options opt) {
  KVSCOUT_EXPECTS(opt.num_sms >= 1 && opt.min_chunk_tokens >= 1, "select_split_options: num_sms = ",
                  opt.num_sms, " and min_chunk_tokens = ", opt.min_chunk_tokens,
                  " must be positive");
  const long long target = 4LL * opt.num_sms;
  if (rows <= 0 || rows * 2 >= target || stride <= opt.min_chunk_tokens) return {1, stride};
  const long long want = (target + rows - 1) / rows;
  long long chunk = (stride + want - 1) / want;
  chunk = (chunk + opt.min_chunk_tokens - 1) / opt.min_chunk_tokens * opt.min_chunk_tokens;
  long long chunks = (stride + chunk - 1) / chunk;
  if (chunks > 64) {
    chunks = 64;
    chunk = (stride + 63) / 64;
    chunk = (chunk + opt.min_chunk_tokens - 1) / opt.min_chunk_tokens * opt.min_chunk_tokens;
    chunks = (stride + chunk - 1) / chunk;
  }
  if (chunks <= 1) return {1, stride};
  return {static_cast<int>(chunks), static_cast<int>(chunk)};
}

/// The most chunks any device splits a row into for these options (workspace sizing: the SM
/// count is not known yet).
inline int max_select_chunks(int stride, select_split_options opt) {
  const long long c = (static_cast<long long>(stride) + opt.min_chunk_tokens - 1) /
                      opt.min_chunk_tokens;
  return static_cast<int>(c < 1 ? 1 : (c > 64 ? 64 : c));
}

/// Workspace of the split kernels: per row a global histogram, the state, and per chunk its
/// (greater, equal) counts and its maximum; 0 where no device could split (one chunk at most).
inline std::size_t select_split_workspace_bytes(long long rows, int stride,
                                                select_split_options opt) {
  const int chunks = max_select_chunks(stride, opt);
  if (chunks <= 1 || rows <= 0) return 0;
  const std::size_t per_row = sizeof(std::uint32_t) * 2048 + select_split_state_bytes +
                              static_cast<std::size_t>(chunks) * (8 + 4);
  return (static_cast<std::size_t>(rows) * per_row + 255) / 256 * 256;
}

/// Device workspace of the top-k selector: the split kernels' (none where rows are never split).
inline std::size_t topk_cuda_workspace_bytes(const topk_selector_host::config& cfg,
                                             select_split_options opt = {}) {
  check_topk_cuda_config(cfg);
  return select_split_workspace_bytes(static_cast<long long>(cfg.num_seqs) * cfg.num_kv_heads,
                                      cfg.stride, opt);
}

/// Device workspace of the threshold selector: infinigen_mean keeps every row's candidate count
/// ([num_seqs * num_kv_heads] int32, -1 for empty rows) between its two kernels (its rows are
/// never split); per_head the split kernels'.
inline std::size_t threshold_cuda_workspace_bytes(const threshold_selector_host::config& cfg,
                                                  select_split_options opt = {}) {
  check_threshold_cuda_config(cfg);
  if (cfg.rule == threshold_rule::per_head)
    return select_split_workspace_bytes(static_cast<long long>(cfg.num_seqs) * cfg.num_kv_heads,
                                        cfg.stride, opt);
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
