#pragma once
// Named speculation configurations: an infinigen_policy_host's knobs plus its selector, as one plain
// struct, so that a caller (and the accuracy harness, tools/accuracy/accuracy.cpp) names its method.
//
//   infinigen_paper(head_dim)   InfiniGen as its authors' code runs it (Lee et al., OSDI'24;
//                               github.com/snu-comparch/InfiniGen), from two of its paths: the
//                               post-RoPE skew of its Llama accuracy path, the alpha 4 and the
//                               query-only channels of its OPT speedup path.
//   kvscout_default(head_dim)   kvscout's own configuration, which is NOT the paper's.
//
// Their perplexity on SmolLM2-135M: docs/accuracy.md; the stage ablation between them:
// docs/accuracy_log.md.
//
//   const auto p = kvscout::presets::kvscout_default(head_dim);
//   kvscout::skew_options opt = p.skew(model_rope);       // per (layer, kv head): calibrate_skew
//   // plans below p.skip_layers stay empty (those layers attend densely)
//   kvscout::infinigen_config cfg{..., .aggregation = p.aggregation,
//                                 .query_aggregation = p.query_aggregation};
//   // p.selector: topk_selector_host{..., .budget = cap, .keep = p.keep}, or threshold_selector_host
//   //   {..., .alpha = p.alpha, .budget = cap, .rule = p.rule, .keep = p.keep}
//
// The budget (the cap per step and kv head) is the caller's: neither preset fixes it
// (infinigen_paper_budget is the reference runs' cap).

#include <optional>

#include "kvscout/core/error.hpp"
#include "kvscout/select/concepts.hpp"
#include "kvscout/select/threshold.hpp"
#include "kvscout/skew/plan.hpp"
#include "kvscout/score/concepts.hpp"

namespace kvscout::presets {

/// How a preset turns scores into a selection.
enum class selector_kind : int {
  topk = 0,       // topk_selector_host / _cuda: the best `cap` tokens per (sequence, kv head)
  threshold = 1,  // threshold_selector_host / _cuda: max - alpha, with `rule`, capped at `cap`
};

inline const char* to_string(selector_kind s) noexcept {
  switch (s) {
    case selector_kind::topk: return "topk";
    case selector_kind::threshold: return "threshold";
  }
  return "unknown selector_kind";
}

/// The knobs of one named speculation configuration (see the header comment).
struct speculation_preset {
  /// Short name, used as the harness's policy label: "infinigen_paper" or "kvscout_default".
  const char* name = "";
  /// What to call it in tables and plots.
  const char* label = "";
  /// How the partial query gets its position (skew/plan.hpp).
  rope_mode mode = rope_mode::post_rope_skew;
  /// r / head_dim as the configuration states it.
  double partial_ratio = 0.0;
  /// The partial dimension for the head_dim the preset was made for (skew_options::r).
  int r = 0;
  /// skew_options::union_with_keys: rank channels by the keys' magnitude too.
  bool union_with_keys = false;
  /// How the g query heads of a GQA group score one kv head (infinigen_config::aggregation).
  gqa_aggregation aggregation = gqa_aggregation::max_logit;
  /// The correction step's aggregation (infinigen_config::query_aggregation); empty: the speculation's.
  std::optional<gqa_aggregation> query_aggregation{};
  /// The correction step's partial dimension (0: r), its plans holding the speculation's r channels
  /// first (one cache read at two widths). Only a pipeline with a correction step reads it.
  int correction_r = 0;
  selector_kind selector = selector_kind::topk;
  /// threshold only: candidates score >= row max - alpha (threshold_selector_host::config).
  float alpha = 0.f;
  /// threshold only: how candidate counts become selections.
  threshold_rule rule = threshold_rule::infinigen_mean;
  /// Always selected, inside the cap (select/concepts.hpp).
  keep_set keep{};
  /// Layers [0, skip_layers) are not speculated: they attend to every cached token.
  int skip_layers = 0;

  /// The calibration options of this preset for a model's RoPE (calibrate_skew).
  [[nodiscard]] skew_options skew(const rope_config& rope) const {
    skew_options o;
    o.r = r;
    o.union_with_keys = union_with_keys;
    o.mode = mode;
    o.rope = rope;
    return o;
  }
  /// The correction step's channels: correction_r, or r where it is 0.
  [[nodiscard]] int correction_channels() const noexcept { return correction_r > 0 ? correction_r : r; }
  /// The calibration options of the correction step's plans: skew(rope) at correction_channels().
  /// calibrate_skew ranks the channels the same way at every r, so on the same samples these plans
  /// hold the speculation's channels (the library's nesting check accepts the pair).
  [[nodiscard]] skew_options correction_skew(const rope_config& rope) const {
    skew_options o = skew(rope);
    o.r = correction_channels();
    return o;
  }
};

/// InfiniGen's reference runs fetch at most this share of the cached tokens per step
/// (accuracy/perplexity/table2.sh: budget=0.2; speedup/scripts/*/run.sh: --max-num-kv 409 of about
/// 2048). A default for callers who want the paper's setting.
inline constexpr double infinigen_paper_budget = 0.2;

/// InfiniGen as its authors' code runs it, combining two of its configurations: the post-RoPE
/// skew of its Llama accuracy path (accuracy/) with the alpha 4 and query-only channels of its OPT
/// speedup path (speedup/); neither path runs exactly this set. Each field and its source (paths
/// in github.com/snu-comparch/InfiniGen):
///   mode            post_rope_skew, the paper's skewing (section 4.2; accuracy/setup/
///                   gen_llama_skewing_matrix.py, accuracy/src/modeling_llama_ours.py).
///   partial_ratio   0.2 (accuracy/setup/setup.sh: PARTIAL_RATIO=0.2; speedup/scripts/*/run.sh:
///                   --partial-weight-ratio 0.2; paper section 4.3).
///   r               int(head_dim * 0.2), truncated as Python's int() does
///                   (speedup/infinigen/infinigen/partial_weight_generation_controller.py): 128 -> 25, 64 -> 12.
///   union_with_keys false, as the system (same file). The Llama accuracy path also ORs in the keys'
///                   top columns (modeling_llama_ours_setup.py, r to 2r channels); kvscout keeps exactly r.
///   aggregation     max_logit, kvscout's choice: the paper's models have no GQA (every aggregation
///                   is the same for a group of one); a kv head's token ranks by its best query head.
///   selector, rule  threshold, infinigen_mean: each head counts the tokens within alpha of its
///                   maximum, every head fetches min(mean count, cap) tokens, its best by score
///                   (speedup/infinigen/infinigen/kv_selection_controller.py, speculate_attention;
///                   accuracy/src/modeling_llama_ours.py, kv_cache_mask; paper section 4.3). Where
///                   that code's threshold and cap differ: docs/accuracy_log.md, "How it is measured".
///   alpha           4 (speedup/scripts/*/run.sh: --alpha 4; accuracy/perplexity/table2.sh: 4 for
///                   OPT, 5 for the Llama-2 perplexity runs).
///   keep            none: the reference selects by score alone.
///   skip_layers     2: layers 0 and 1 attend densely, layer i >= 2 is speculated from layer i - 1's
///                   input (accuracy/perplexity/llama.py: previous_hidden_states set for i >= 2).
[[nodiscard]] inline speculation_preset infinigen_paper(int head_dim) {
  KVSCOUT_EXPECTS(head_dim > 0, "head_dim must be positive, got ", head_dim);
  speculation_preset p;
  p.name = "infinigen_paper";
  p.label = "InfiniGen (paper): post-RoPE skew, mean count";
  p.mode = rope_mode::post_rope_skew;
  p.partial_ratio = 0.2;
  // int(head_dim * 0.2) in Python's double arithmetic; at least one channel.
  const int r = static_cast<int>(static_cast<double>(head_dim) * 0.2);
  p.r = r > 0 ? r : 1;
  p.union_with_keys = false;
  p.aggregation = gqa_aggregation::max_logit;
  p.selector = selector_kind::threshold;
  p.alpha = 4.f;
  p.rule = threshold_rule::infinigen_mean;
  p.keep = {0, 0};
  p.skip_layers = 2;
  return p;
}

/// kvscout's own configuration, chosen by the accuracy harness on SmolLM2-135M (GQA, RoPE,
/// head_dim 64): InfiniGen's speculation (layer l's partial query from layer l - 1's input, scored
/// against partial keys), the rest changed. The perplexities behind each field: docs/accuracy_log.md,
/// "kvscout's defaults: what the harness chose", unless another section is named.
///   mode            rope_planes: whole RoPE planes, no skew (skew/plan.hpp); best at every budget
///                   on both texts.
///   partial_ratio   0.5, r = head_dim / 2 rounded down to whole planes (measured at head_dim 64 only).
///   union_with_keys false.
///   aggregation     max_logit (better than mean_logit).
///   query_aggregation sum_prob: the correction step's ranking, which has the layer's own query
///                   ("What limits the ranking").
///   correction_r    head_dim: the correction ranks over every channel, the speculation over its r
///                   (better on GPL-3, a small loss on pg19: "pg19: which part of the 2-bit, 64-channel
///                   ranking loses"). With quantized_keys<2> (group 32) at head_dim 64, all 64 channels
///                   take 32 bytes per token and kv head, half of 32 channels in fp16.
///   selector        exact top-k at the cap (better than the per-head threshold).
///   alpha, rule     unused (top-k); rule left at per_head, kvscout's threshold rule.
///   keep            4 sinks + 16 recent tokens, inside the cap (the harness's keep-set).
///   skip_layers     2, as InfiniGen.
[[nodiscard]] inline speculation_preset kvscout_default(int head_dim) {
  KVSCOUT_EXPECTS(head_dim >= 2 && head_dim % 2 == 0,
                  "kvscout_default: head_dim must be a positive even number, got ", head_dim);
  speculation_preset p;
  p.name = "kvscout_default";
  p.label = "kvscout default: RoPE planes";
  p.mode = rope_mode::rope_planes;
  p.partial_ratio = 0.5;
  p.r = head_dim / 4 * 2 > 0 ? head_dim / 4 * 2 : 2;
  p.union_with_keys = false;
  p.aggregation = gqa_aggregation::max_logit;
  p.query_aggregation = gqa_aggregation::sum_prob;
  p.correction_r = head_dim;
  p.selector = selector_kind::topk;
  p.alpha = 0.f;
  p.rule = threshold_rule::per_head;
  p.keep = {4, 16};
  p.skip_layers = 2;
  return p;
}

}  // namespace kvscout::presets
