#pragma once
// The host InfiniGen policy's memory (score/infinigen.hpp): its scratch, the sizes of its partial
// key caches and partial W_Q rows (each piece at memory_alignment) and where the rows are written.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kvscout/cache/partial_key_store.hpp"
#include "kvscout/core/detail/checked_size.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/rope.hpp"
#include "kvscout/score/concepts.hpp"
#include "kvscout/score/detail/aggregate.hpp"
#include "kvscout/score/infinigen_config.hpp"
#include "kvscout/skew/partial_query.hpp"
#include "kvscout/skew/plan.hpp"

namespace kvscout::detail {

template <partial_key_format PkT, compute_element WT>
struct infinigen_host_memory {
  using config = infinigen_config;
  using key_store = detail::partial_key_store<PkT>;
  static constexpr bool quantized = is_quantized_keys_v<PkT>;
  static constexpr std::size_t memory_alignment = 64;
  static constexpr int query_block = 8;  // sequences scored per block (score())

  /// Scratch of one score() / score_query() / append(), sized for r = head_dim.
  [[nodiscard]] static std::size_t scratch_bytes(const config& cfg) {
    return aligned(sizeof(rope_table) * query_block +
                   sizeof(float) * detail::checked_size(
                                       "infinigen_policy_host's scratch floats (query_block x "
                                       "num_q_heads x head_dim)",
                                       query_block, cfg.shape.num_q_heads, cfg.shape.head_dim) +
                   sizeof(float) * 3 * static_cast<std::size_t>(cfg.shape.head_dim) +
                   sum_prob_bytes(cfg) + quantized_bytes(cfg));
  }
  /// The workspace: the scratch, the partial key cache (cfg.key_r() channels), then every query
  /// head's partial W_Q rows, each piece at memory_alignment. Checks the config.
  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg) {
    check_config(cfg);
    const char* what = "infinigen_policy_host workspace bytes";
    return detail::checked_sum(
        what, detail::checked_sum(what, scratch_bytes(cfg), key_layer_bytes(cfg, cfg.key_r())),
        detail::checked_size("infinigen_policy_host partial W_Q bytes", cfg.shape.num_q_heads,
                             head_weight_sizes(cfg).total()));
  }
  static std::size_t aligned(std::size_t b) {
    return detail::checked_sum("infinigen_policy_host memory bytes", b, memory_alignment - 1) /
           memory_alignment * memory_alignment;
  }
  static std::size_t key_layer_bytes(const config& cfg, int r) {
    return aligned(key_store::memory_bytes(cfg.shape.num_seqs, cfg.shape.num_kv_heads, r,
                                           cfg.shape.max_tokens));
  }
  struct weight_sizes {
    std::size_t weight = 0, bias = 0, rotation = 0, planes = 0;  // elements
    [[nodiscard]] std::size_t total() const {
      return aligned(detail::checked_size("infinigen_policy_host partial W_Q rows in bytes", weight,
                                          sizeof(WT))) +
             aligned(sizeof(float) * bias) + aligned(sizeof(float) * rotation) +
             aligned(sizeof(int) * planes);
    }
  };
  static weight_sizes head_weight_sizes(const config& cfg) {
    const bool skew = cfg.mode == rope_mode::post_rope_skew;
    const int rows = skew ? cfg.shape.head_dim : cfg.r;
    return {detail::checked_size("infinigen_policy_host partial W_Q rows (rows x d_model)", rows,
                                 cfg.shape.d_model),
            static_cast<std::size_t>(rows),
            skew ? static_cast<std::size_t>(cfg.shape.head_dim) * cfg.r : 0,
            cfg.mode == rope_mode::rope_planes ? static_cast<std::size_t>(cfg.r / 2) : 0};
  }
  // Writes w into memory at `at`, the rows narrowed to WT; returns the view and advances `at`.
  static detail::partial_query_weights_view<WT> place_weights(const partial_query_weights& w,
                                                              const weight_sizes& z,
                                                              std::byte* base, std::size_t& at) {
    KVSCOUT_EXPECTS(w.weight.size() == z.weight && w.bias.size() == z.bias &&
                        w.rotation.size() == z.rotation && w.planes.size() == z.planes,
                    "infinigen_policy_host: partial weights of an unexpected size");
    const auto take = [&](std::size_t bytes) {
      std::byte* p = base + at;
      at += aligned(bytes);
      return p;
    };
    WT* rows = reinterpret_cast<WT*>(take(sizeof(WT) * z.weight));
    for (std::size_t i = 0; i < z.weight; ++i) rows[i] = from_float<WT>(w.weight[i]);
    float* bias = reinterpret_cast<float*>(take(sizeof(float) * z.bias));
    std::copy(w.bias.begin(), w.bias.end(), bias);
    float* rot = reinterpret_cast<float*>(take(sizeof(float) * z.rotation));
    std::copy(w.rotation.begin(), w.rotation.end(), rot);
    int* planes = reinterpret_cast<int*>(take(sizeof(int) * z.planes));
    std::copy(w.planes.begin(), w.planes.end(), planes);
    return {{static_cast<const detail::partial_query_shape&>(w)},
            {rows, z.weight},
            {bias, z.bias},
            {rot, z.rotation},
            {planes, z.planes}};
  }
  static std::size_t sum_prob_bytes(const config& cfg) {
    if (cfg.aggregation != gqa_aggregation::sum_prob &&
        cfg.late_aggregation() != gqa_aggregation::sum_prob)
      return 0;
    return sizeof(float) *
           detail::checked_size("infinigen_policy_host's sum_prob rows (group x max_tokens)",
                                cfg.shape.num_q_heads / cfg.shape.num_kv_heads,
                                cfg.shape.max_tokens);
  }
  static std::size_t quantized_bytes(const config& cfg) {
    if constexpr (quantized)
      return sizeof(float) *
             static_cast<std::size_t>(cfg.shape.num_q_heads / cfg.shape.num_kv_heads) *
             static_cast<std::size_t>(cfg.shape.head_dim);
    else
      return 0;
  }
  static void check_config(const config& cfg) {
    // One layer: shape.num_layers is not read.
    detail::check_policy_sizes("infinigen_policy_host", 1, cfg.shape.num_seqs,
                               cfg.shape.num_kv_heads, cfg.shape.max_tokens);
    detail::check_infinigen_config(cfg);
    KVSCOUT_EXPECTS(
        cfg.mode == rope_mode::pre_rope_folded || cfg.shape.head_dim <= 2 * rope_table::max_planes,
        "head_dim ", cfg.shape.head_dim, " exceeds the RoPE modes' limit ",
        2 * rope_table::max_planes);
  }
};

}  // namespace kvscout::detail
