#pragma once
// Host-side part of the CUDA selectors: launch shape, workspace sizes and every check the
// facades make before a launch. Host-compilable, so that the validation is tested without a GPU.
// The device selectors take the host selectors' config types unchanged.

#include <cstddef>
#include <cstdint>

#include "kvscout/core/error.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/select/detail/checks.hpp"
#include "kvscout/select/split_options.hpp"
#include "kvscout/select/threshold.hpp"
#include "kvscout/select/topk.hpp"

namespace kvscout::detail {

inline constexpr int select_block_threads = 256;
/// A tile is threads * items scores.
inline constexpr int select_items_per_thread = 8;
inline constexpr long long select_max_rows = 2147483647LL;

inline void check_select_rows(int num_seqs, int num_kv_heads) {
  const long long rows = static_cast<long long>(num_seqs) * num_kv_heads;
  KVSCOUT_EXPECTS(rows <= select_max_rows, "num_seqs * num_kv_heads = ", rows,
                  " exceeds the grid limit ", select_max_rows);
}

inline void check_topk_cuda_config(const topk_selector_host::config& cfg) {
  check_selector_config(cfg.shape.num_seqs, cfg.shape.num_kv_heads, cfg.shape.max_tokens,
                        cfg.capacity, "budget", cfg.budget, cfg.keep, cfg.budget_share);
  check_select_rows(cfg.shape.num_seqs, cfg.shape.num_kv_heads);
}

inline void check_threshold_cuda_config(const threshold_selector_host::config& cfg) {
  check_selector_config(cfg.shape.num_seqs, cfg.shape.num_kv_heads, cfg.shape.max_tokens,
                        cfg.capacity, "budget", cfg.budget, cfg.keep, cfg.budget_share);
  KVSCOUT_EXPECTS(cfg.alpha >= 0.f, "alpha must be a non-negative number, got ", cfg.alpha);
  KVSCOUT_EXPECTS(
      cfg.rule == threshold_rule::per_head || cfg.rule == threshold_rule::infinigen_mean, "rule ",
      cfg.rule, " is not one of infinigen_mean, per_head");
  check_select_rows(cfg.shape.num_seqs, cfg.shape.num_kv_heads);
}

/// A long row split over `chunks` blocks of chunk_tokens tokens (a multiple of
/// select_split_options::min_chunk_tokens) per row; chunks == 1: one block per row.
struct select_split {
  int chunks = 1;
  int chunk_tokens = 0;
};

inline constexpr int select_split_granule = select_block_threads * select_items_per_thread;

inline constexpr std::size_t select_split_state_bytes = 32;

/// About 4 blocks per SM, no chunk below min_chunk_tokens, at most 64 chunks; one block per row
/// where rows alone fill the device or a row is too short to split.
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

/// The most chunks any device splits a row into (workspace sizing: the SM count is not known yet).
inline int max_select_chunks(int stride, select_split_options opt) {
  const long long c = (static_cast<long long>(stride) + opt.min_chunk_tokens - 1) /
                      opt.min_chunk_tokens;
  return static_cast<int>(c < 1 ? 1 : (c > 64 ? 64 : c));
}

/// Per row a global histogram and the state, per chunk its (greater, equal) counts and maximum; 0
/// where no device could split.
inline std::size_t select_split_workspace_bytes(long long rows, int stride,
                                                select_split_options opt) {
  const int chunks = max_select_chunks(stride, opt);
  if (chunks <= 1 || rows <= 0) return 0;
  const std::size_t per_row = sizeof(std::uint32_t) * 2048 + select_split_state_bytes +
                              static_cast<std::size_t>(chunks) * (8 + 4);
  return (static_cast<std::size_t>(rows) * per_row + 255) / 256 * 256;
}

inline std::size_t topk_cuda_workspace_bytes(const topk_selector_host::config& cfg,
                                             select_split_options opt = {}) {
  check_topk_cuda_config(cfg);
  return select_split_workspace_bytes(
      static_cast<long long>(cfg.shape.num_seqs) * cfg.shape.num_kv_heads, cfg.shape.max_tokens,
      opt);
}

/// infinigen_mean keeps every row's candidate count between its two kernels (its rows are never
/// split); per_head needs the split kernels'.
inline std::size_t threshold_cuda_workspace_bytes(const threshold_selector_host::config& cfg,
                                                  select_split_options opt = {}) {
  check_threshold_cuda_config(cfg);
  if (cfg.rule == threshold_rule::per_head)
    return select_split_workspace_bytes(
        static_cast<long long>(cfg.shape.num_seqs) * cfg.shape.num_kv_heads, cfg.shape.max_tokens,
        opt);
  return sizeof(std::int32_t) * static_cast<std::size_t>(cfg.shape.num_seqs) *
         static_cast<std::size_t>(cfg.shape.num_kv_heads);
}

inline constexpr std::size_t device_selector_workspace_alignment = 16;

/// Size, null, alignment; its contents are not read.
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
