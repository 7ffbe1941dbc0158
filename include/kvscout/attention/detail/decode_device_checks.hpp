#pragma once
// Host-side half of the CUDA decode attention: validation of everything the host knows. Plain C++,
// tested without a GPU.

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvscout/attention/decode.hpp"
#include "kvscout/attention/device_plan.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

namespace detail {

inline constexpr int decode_device_max_group = 8;

template <int D>
inline constexpr bool decode_device_head_dim_ok = D % 32 == 0 && D >= 32 && D <= 256;

inline constexpr int decode_device_warps = 4;

/// Elements of a row one lane reads: the fewest lanes per row (a power of two dividing head_dim, at
/// most 32) that give each lane 16 bytes or 8 elements, whichever comes first.
template <class T, int D>
inline constexpr int decode_lane_elems = [] {
  int lanes = 32;
  while (lanes > 1 && (D % lanes != 0 ||
                       ((D / lanes) * static_cast<int>(sizeof(T)) < 16 && D / lanes < 8)))
    lanes /= 2;
  return D / lanes;
}();

inline void check_decode_cuda(int num_seqs, int num_kv_heads, int head_dim,
                              const attention_params& p, std::size_t q_size,
                              const void* q_data, std::size_t out_size, const void* out_data,
                              bool cur_present, std::size_t cur_k_size, std::size_t cur_v_size,
                              bool cur_v_null) {
  const int Hq = p.num_q_heads;
  KVSCOUT_EXPECTS(num_kv_heads >= 1, "num_kv_heads must be positive, got ", num_kv_heads);
  KVSCOUT_EXPECTS(Hq >= 1 && Hq % num_kv_heads == 0, "num_q_heads = ", Hq,
                  " must be a positive multiple of num_kv_heads = ", num_kv_heads);
  check_attention_scales(p);
  const std::size_t q_elems = static_cast<std::size_t>(num_seqs) * Hq * head_dim;
  KVSCOUT_EXPECTS(q_size >= q_elems, "q holds ", q_size, " elements, expected [", num_seqs, ", ",
                  Hq, ", ", head_dim, "] = ", q_elems);
  KVSCOUT_EXPECTS(out_size >= q_elems, "out holds ", out_size, " elements, expected ", q_elems);
  KVSCOUT_EXPECTS(q_elems == 0 || (q_data != nullptr && out_data != nullptr), "q or out is null");
  const std::size_t cur_elems = static_cast<std::size_t>(num_seqs) * num_kv_heads * head_dim;
  if (cur_present) {
    KVSCOUT_EXPECTS(!cur_v_null, "current token K is given but V is null");
    KVSCOUT_EXPECTS(cur_k_size >= cur_elems && cur_v_size >= cur_elems,
                    "current token K / V hold ", cur_k_size, " / ", cur_v_size,
                    " elements, expected [", num_seqs, ", ", num_kv_heads, ", ", head_dim,
                    "] = ", cur_elems);
  }
  KVSCOUT_EXPECTS(static_cast<long long>(num_seqs) * num_kv_heads <= 0x7fffffffLL,
                  "num_seqs * num_kv_heads = ", static_cast<long long>(num_seqs) * num_kv_heads,
                  " exceeds the grid limit");
}

inline void check_decode_plan(const decode_attention_plan& plan, int num_seqs, int num_kv_heads,
                              int num_q_heads, int head_dim, std::size_t workspace_bytes,
                              const void* workspace) {
  KVSCOUT_EXPECTS(plan.num_seqs == num_seqs && plan.num_kv_heads == num_kv_heads &&
                      plan.num_q_heads == num_q_heads && plan.head_dim == head_dim,
                  "the plan is for [num_seqs ", plan.num_seqs, ", num_kv_heads ",
                  plan.num_kv_heads, ", num_q_heads ", plan.num_q_heads, ", head_dim ",
                  plan.head_dim, "], the call is [", num_seqs, ", ", num_kv_heads, ", ",
                  num_q_heads, ", ", head_dim, "]");
  const int g = num_q_heads / num_kv_heads;
  KVSCOUT_EXPECTS((plan.heads_per_block == 1 || plan.heads_per_block == 4 ||
                   plan.heads_per_block == 8) &&
                      plan.head_blocks == (g + plan.heads_per_block - 1) / plan.heads_per_block,
                  "plan.heads_per_block = ", plan.heads_per_block, " and head_blocks = ",
                  plan.head_blocks, " do not cover a group of ", g,
                  " query heads (expected 1, 4 or 8 heads a block)");
  KVSCOUT_EXPECTS(plan.splits >= 1 && plan.splits <= 65535 && plan.rows_per_split >= 0 &&
                      (plan.splits == 1 || plan.rows_per_split >= 1),
                  "plan.splits = ", plan.splits, " / rows_per_split = ", plan.rows_per_split,
                  " are invalid (splits in [1, 65535], rows_per_split >= 1 when split)");
  KVSCOUT_EXPECTS(workspace_bytes >= plan.workspace_bytes(), "the workspace holds ",
                  workspace_bytes, " bytes, the plan (", plan.splits, " splits) needs ",
                  plan.workspace_bytes());
  KVSCOUT_EXPECTS(plan.workspace_bytes() == 0 ||
                      (workspace != nullptr &&
                       reinterpret_cast<std::uintptr_t>(workspace) % 16 == 0),
                  "the workspace at ", workspace, " must be non-null and 16-byte aligned");
}

/// The width of load_row_part's loads: 16 or 8 bytes where E * sizeof(T) is a multiple of that,
/// else one element.
template <class T, int E>
inline constexpr std::size_t row_part_alignment =
    (E * sizeof(T)) % 16 == 0 ? 16 : ((E * sizeof(T)) % 8 == 0 ? 8 : sizeof(T));

/// A misaligned vector load of the current token's rows would fault the whole context.
inline void check_current_token_alignment(const void* k, const void* v, std::size_t align) {
  const auto ka = reinterpret_cast<std::uintptr_t>(k), va = reinterpret_cast<std::uintptr_t>(v);
  KVSCOUT_EXPECTS(ka % align == 0 && va % align == 0, "the current token's K / V must start on ",
                  align, "-byte boundaries (its rows are read with ", align,
                  "-byte loads), got addresses with remainders ", ka % align, " / ", va % align);
}

inline void check_gathered_cuda(const selection_view<device_space>& sel, std::size_t k_bytes,
                                const void* k, std::size_t v_bytes, const void* v,
                                std::size_t k_row_bytes, std::size_t v_row_bytes) {
  KVSCOUT_EXPECTS(sel.num_seqs >= 0 && sel.num_kv_heads >= 1 && sel.capacity >= 0,
                  "selection shape [", sel.num_seqs, ", ", sel.num_kv_heads, ", ", sel.capacity,
                  "] is invalid");
  const std::size_t pairs = static_cast<std::size_t>(sel.num_seqs) * sel.num_kv_heads;
  const std::size_t slots = pairs * static_cast<std::size_t>(sel.capacity);
  KVSCOUT_EXPECTS(sel.counts.size() >= pairs && (pairs == 0 || sel.counts.data() != nullptr),
                  "selection counts holds ", sel.counts.size(), " entries, expected ", pairs);
  KVSCOUT_EXPECTS(sel.indices.size() >= slots && (slots == 0 || sel.indices.data() != nullptr),
                  "selection indices holds ", sel.indices.size(), " entries, expected ", slots);
  KVSCOUT_EXPECTS(k_bytes >= slots * k_row_bytes && v_bytes >= slots * v_row_bytes,
                  "gathered K / V rows hold ", k_bytes, " / ", v_bytes,
                  " bytes, expected at least ", slots * k_row_bytes, " / ", slots * v_row_bytes,
                  " (", slots, " rows)");
  KVSCOUT_EXPECTS(slots == 0 || (k != nullptr && v != nullptr), "gathered K or V is null");
  KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(k) % 16 == 0 &&
                      reinterpret_cast<std::uintptr_t>(v) % 16 == 0,
                  "gathered K / V at ", k, " / ", v, " must be 16-byte aligned");
}

}  // namespace detail
}  // namespace kvscout
