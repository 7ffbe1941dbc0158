#pragma once
// How the device decode attention spreads one call over the GPU: the launch plan, built on the
// host once per shape (not per step), and the workspace it needs. Plain C++, tested on the host.
//
// Flash-decoding: each (sequence, kv head, block of query heads) is read by `splits` blocks of
// `rows_per_split` rows; with splits > 1 the blocks write partial softmax states to the caller's
// workspace and a second kernel merges them. The plan picks splits so that the grid fills the
// SMs in one wave, with at most ceil(max_rows / min_rows_per_split) splits.
//
// max_rows is the most rows a (sequence, kv head) pair reads (the selection's capacity, plus the
// KIVI residual window and the current token where they apply). It shapes the split only: rows
// past it are read by the last split, so a larger count costs time, never rows.

#include <cstddef>

#include "kvscout/core/error.hpp"
#include "kvscout/core/shape.hpp"

namespace kvscout {

struct decode_attention_config {
  decode_shape shape{};  // num_seqs, num_kv_heads, num_q_heads, head_dim
  int max_rows = 0;
  // 0: plan_decode_attention_cuda in decode.cuh asks the current device.
  int num_sms = 0;
  // Blocks per SM at most (one wave, no tail); 0 = by the kernel's occupancy on sm_90. KIVI rows
  // with 4 heads a block need more registers: pass 2.
  int blocks_per_sm = 0;
  int min_rows_per_split = 32;   // at most ceil(max_rows / min_rows_per_split) splits
};

struct decode_attention_plan {
  int num_seqs = 0, num_kv_heads = 0, num_q_heads = 0, head_dim = 0;
  int splits = 1;          // blocks per (sequence, kv head, block of query heads)
  int rows_per_split = 0;  // rows of every split but the last (which takes the rest)
  int head_blocks = 1;     // blocks of query heads per (sequence, kv head): grid.z
  int heads_per_block = 1; // 1, 4 or 8

  [[nodiscard]] std::size_t blocks() const {
    return static_cast<std::size_t>(num_seqs) * num_kv_heads * splits * head_blocks;
  }
  /// Partial states: (m, l) then head_dim floats per (sequence, query head, split); 0 when
  /// splits == 1.
  [[nodiscard]] std::size_t ml_bytes() const {
    return splits == 1 ? 0
                       : (static_cast<std::size_t>(num_seqs) * num_q_heads * splits * 8 + 15) /
                             16 * 16;
  }
  [[nodiscard]] std::size_t workspace_bytes() const {
    return splits == 1 ? 0
                       : ml_bytes() + static_cast<std::size_t>(num_seqs) * num_q_heads * splits *
                                          head_dim * sizeof(float);
  }
};

inline decode_attention_plan plan_decode_attention(const decode_attention_config& sh) {
  KVSCOUT_EXPECTS(sh.shape.num_seqs >= 0 && sh.shape.num_kv_heads >= 1, "shape [num_seqs ",
                  sh.shape.num_seqs, ", num_kv_heads ", sh.shape.num_kv_heads, "] is invalid");
  KVSCOUT_EXPECTS(sh.shape.num_q_heads >= 1 && sh.shape.num_q_heads % sh.shape.num_kv_heads == 0,
                  "num_q_heads = ", sh.shape.num_q_heads,
                  " must be a positive multiple of num_kv_heads = ", sh.shape.num_kv_heads);
  KVSCOUT_EXPECTS(
      sh.shape.head_dim % 32 == 0 && sh.shape.head_dim >= 32 && sh.shape.head_dim <= 256,
      "head_dim = ", sh.shape.head_dim, " must be a multiple of 32 in [32, 256]");
  KVSCOUT_EXPECTS(sh.max_rows >= 0, "max_rows must be >= 0, got ", sh.max_rows);
  KVSCOUT_EXPECTS(sh.num_sms >= 1 && sh.blocks_per_sm >= 0 && sh.min_rows_per_split >= 1,
                  "num_sms = ", sh.num_sms, ", blocks_per_sm = ", sh.blocks_per_sm,
                  ", min_rows_per_split = ", sh.min_rows_per_split,
                  " must be positive (blocks_per_sm: or 0, by occupancy)");
  KVSCOUT_EXPECTS(static_cast<long long>(sh.shape.num_seqs) * sh.shape.num_kv_heads <= 0x7fffffffLL,
                  "num_seqs * num_kv_heads = ",
                  static_cast<long long>(sh.shape.num_seqs) * sh.shape.num_kv_heads,
                  " exceeds the grid limit");
  decode_attention_plan p;
  p.num_seqs = sh.shape.num_seqs;
  p.num_kv_heads = sh.shape.num_kv_heads;
  p.num_q_heads = sh.shape.num_q_heads;
  p.head_dim = sh.shape.head_dim;
  const int g = sh.shape.num_q_heads / sh.shape.num_kv_heads;
  p.heads_per_block = g <= 1 ? 1 : (g <= 4 ? 4 : 8);
  p.head_blocks = (g + p.heads_per_block - 1) / p.heads_per_block;
  const long long base =
      static_cast<long long>(sh.shape.num_seqs) * sh.shape.num_kv_heads * p.head_blocks;
  const int per_sm = sh.blocks_per_sm > 0 ? sh.blocks_per_sm : (p.heads_per_block <= 4 ? 3 : 2);
  const long long target = static_cast<long long>(sh.num_sms) * per_sm;
  // Rounded down: the grid fits one wave, where rounding up would leave a tail for a second.
  long long splits = base == 0 || base >= target ? 1 : target / base;
  const long long by_rows = (sh.max_rows + sh.min_rows_per_split - 1) / sh.min_rows_per_split;
  splits = splits < by_rows ? splits : by_rows;
  splits = splits < 1 ? 1 : (splits > 65535 ? 65535 : splits);  // grid.y
  p.rows_per_split = static_cast<int>((sh.max_rows + splits - 1) / splits);
  // No split left empty by the rounding.
  if (p.rows_per_split > 0) splits = (sh.max_rows + p.rows_per_split - 1) / p.rows_per_split;
  p.splits = static_cast<int>(splits);
  return p;
}

}  // namespace kvscout
