#pragma once
// Named speculation configurations: an infinigen_policy_host's knobs plus its selector, as one
// plain struct, so that a caller (and tools/accuracy/accuracy.cpp) names its method.
//   infinigen_paper(head_dim)   InfiniGen as its authors' code runs it (Lee et al., OSDI'24).
//   kvscout_default(head_dim)   kvscout's own configuration, which is NOT the paper's.
// Their perplexity: docs/accuracy.md. The budget (the cap per step and kv head) is the caller's:
// neither preset fixes it.
//
//   const auto p = kvscout::presets::kvscout_default(head_dim);
//   kvscout::skew_options opt = p.skew(model_rope);       // per (layer, kv head): calibrate_skew
//   // plans below p.skip_layers stay empty (those layers attend densely)
//   kvscout::infinigen_config cfg{.shape = shape, .aggregation = p.aggregation,
//                                 .query_aggregation = p.query_aggregation};
//   // p.selector: topk_selector_host{..., .budget = cap, .keep = p.keep}, or
//   //   threshold_selector_host{..., .alpha = p.alpha, .budget = cap, .rule = p.rule, ...}

#include <optional>

#include "kvscout/core/error.hpp"
#include "kvscout/select/concepts.hpp"
#include "kvscout/select/threshold.hpp"
#include "kvscout/skew/plan.hpp"
#include "kvscout/score/concepts.hpp"

namespace kvscout::presets {

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

struct speculation_preset {
  /// The harness's policy label: "infinigen_paper" or "kvscout_default".
  const char* name = "";
  const char* label = "";
  rope_mode mode = rope_mode::post_rope_skew;
  double partial_ratio = 0.0;
  int r = 0;
  bool union_with_keys = false;
  gqa_aggregation aggregation = gqa_aggregation::max_logit;
  /// The correction step's aggregation; empty: the speculation's.
  std::optional<gqa_aggregation> query_aggregation{};
  /// The correction step's partial dimension (0: r); its plans hold the speculation's r channels
  /// first (one cache read at two widths). Only a pipeline with a correction step reads it.
  int correction_r = 0;
  selector_kind selector = selector_kind::topk;
  /// threshold only: candidates score >= row max - alpha.
  float alpha = 0.f;
  threshold_rule rule = threshold_rule::infinigen_mean;
  /// Always selected, inside the cap.
  keep_set keep{};
  /// Layers [0, skip_layers) are not speculated: they attend to every cached token.
  int skip_layers = 0;

  [[nodiscard]] skew_options skew(const rope_config& rope) const {
    skew_options o;
    o.r = r;
    o.union_with_keys = union_with_keys;
    o.mode = mode;
    o.rope = rope;
    return o;
  }
  [[nodiscard]] int correction_channels() const noexcept { return correction_r > 0 ? correction_r : r; }
  /// calibrate_skew ranks the channels the same way at every r, so on the same samples these plans
  /// hold the speculation's channels (the library's nesting check accepts the pair).
  [[nodiscard]] skew_options correction_skew(const rope_config& rope) const {
    skew_options o = skew(rope);
    o.r = correction_channels();
    return o;
  }
};

/// InfiniGen's reference runs fetch at most this share of the cached tokens per step.
inline constexpr double infinigen_paper_budget = 0.2;

/// InfiniGen as its authors' code runs it (paths in github.com/snu-comparch/InfiniGen): the
/// post-RoPE skew of its Llama accuracy path with the alpha 4 and query-only channels of its OPT
/// speedup path; neither path runs exactly this set. Each field's source in the reference's code:
/// docs/speculation.md.
///   r               int(head_dim * 0.2), truncated as Python's int() does: 128 -> 25, 64 -> 12.
///   union_with_keys false, as the system; the Llama accuracy path also ORs in the keys' top
///                   columns (r to 2r channels), kvscout keeps exactly r.
///   aggregation     max_logit, kvscout's choice: the paper's models have no GQA.
///   selector, rule  threshold, infinigen_mean: each head counts the tokens within alpha of its
///                   maximum, every head fetches min(mean count, cap) tokens, its best by score.
///   skip_layers     2: layer i >= 2 is speculated from layer i - 1's input.
[[nodiscard]] inline speculation_preset infinigen_paper(int head_dim) {
  KVSCOUT_EXPECTS(head_dim > 0, "head_dim must be positive, got ", head_dim);
  speculation_preset p;
  p.name = "infinigen_paper";
  p.label = "InfiniGen (paper): post-RoPE skew, mean count";
  p.mode = rope_mode::post_rope_skew;
  p.partial_ratio = 0.2;
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
/// head_dim 64): InfiniGen's speculation, the rest changed (docs/accuracy_log.md).
///   mode            rope_planes: whole RoPE planes, no skew.
///   partial_ratio   0.5, r = head_dim / 2 rounded down to whole planes.
///   query_aggregation sum_prob: the correction step's ranking, which has the layer's own query.
///   correction_r    head_dim: the correction ranks over every channel, the speculation over its r.
///   selector        exact top-k at the cap; alpha and rule unused.
///   keep            4 sinks + 16 recent tokens, inside the cap.
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
