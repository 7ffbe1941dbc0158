#pragma once
// Named speculation configurations: an infinigen_policy_host's knobs, its selector and how a step's
// rows are budgeted, as one plain struct, so that a caller (and tools/accuracy/accuracy.cpp) names
// its method.
//   infinigen_paper(head_dim)           InfiniGen as its authors' code runs it (OSDI'24).
//   kvscout_default(head_dim)           kvscout's best measured configuration, NOT the paper's:
//                                       speculation, a correction step, per-layer budget shares
//                                       and 2-bit partial keys.
//   kvscout_speculation_only(head_dim)  the same speculation without the other three.
// Their perplexity: docs/accuracy.md. The budget (a share of the cached rows per step) is the
// caller's: no preset fixes it.
//
//   const auto p = kvscout::presets::kvscout_default(head_dim);
//   const auto cal = kvscout::presets::calibrate(p, shape, rope, q, k, n);  // calibrate.hpp
//   const auto b = kvscout::presets::budgets(p, shape, 0.10, cal.layer_shares(p, 0.10));
//   // the policies: infinigen_policy_host<presets::partial_keys_t<2>>::layers(
//   //   p.policy_config(shape), cal.plans, cal.correction_plans, w_q, b_q)
//   // layer l's selector: b.selector_config(shape, l); the pipeline: b.capacity,
//   //   b.correction_capacity and b.correction_shares

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "kvscout/core/error.hpp"
#include "kvscout/cache/quantized_partial_key_cache.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/score/infinigen_config.hpp"
#include "kvscout/select/budgets.hpp"
#include "kvscout/select/concepts.hpp"
#include "kvscout/select/topk.hpp"
#include "kvscout/select/threshold.hpp"
#include "kvscout/skew/plan.hpp"
#include "kvscout/score/concepts.hpp"

namespace kvscout {
namespace presets {
enum class selector_kind : int {
  topk = 0,       // topk_selector_host / _cuda: the best `cap` tokens per (sequence, kv head)
  threshold = 1,  // threshold_selector_host / _cuda: max - alpha, with `rule`, capped at `cap`
};
}  // namespace presets

inline const char* to_string(presets::selector_kind s) noexcept {
  switch (s) {
    case presets::selector_kind::topk: return "topk";
    case presets::selector_kind::threshold: return "threshold";
  }
  return "unknown selector_kind";
}

namespace presets {

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
  /// The share of each step's rows left to the correction step (0: none): the speculation selects
  /// (1 - correction_share) of the budget, the correction tops each row up to the whole budget
  /// with the layer's own query.
  double correction_share = 0;
  /// The partial keys' bits per channel: 0, the element type; 2, 4 or 8: quantized_keys<bits>
  /// (partial_keys_t<key_bits>).
  int key_bits = 0;
  /// Per-layer budget shares from mass curves (layer_budget_shares with this rule and
  /// layer_floor as min_share); empty: every layer the same share.
  std::optional<layer_budget_rule> layer_rule{};
  double layer_floor = 0;
  /// Mass-curve bins (the shares move in steps of 1 / layer_bins of the budget).
  int layer_bins = 400;

  [[nodiscard]] skew_options skew(const rope_config& rope) const {
    skew_options o;
    o.r = r;
    o.union_with_keys = union_with_keys;
    o.mode = mode;
    o.rope = rope;
    return o;
  }
  [[nodiscard]] int correction_channels() const noexcept { return correction_r > 0 ? correction_r : r; }
  /// The policy's config on both backends: the correction's channels only with a correction step.
  [[nodiscard]] infinigen_config policy_config(const decode_shape& shape) const {
    return {.shape = shape,
            .r = r,
            .mode = mode,
            .aggregation = aggregation,
            .query_aggregation = query_aggregation,
            .correction_r =
                correction_share > 0 && correction_channels() > r ? correction_channels() : 0};
  }
  /// The speculation's share of the cached rows at `budget` for a layer of share layer_share.
  [[nodiscard]] double speculated_share(double budget, double layer_share = 1) const {
    return budget * (1 - correction_share) * layer_share;
  }
  /// The rows of a step in all, the correction's included: its part plus the speculation's.
  [[nodiscard]] double total_share(double budget, double layer_share = 1) const {
    return (budget * (1 - correction_share) + budget * correction_share) * layer_share;
  }
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

/// kvscout's speculation alone, chosen by the accuracy harness on SmolLM2-135M (GQA, RoPE,
/// head_dim 64): InfiniGen's speculation, the rest changed (docs/accuracy_log.md).
///   mode            rope_planes: whole RoPE planes, no skew.
///   partial_ratio   0.5, r = head_dim / 2 rounded down to whole planes.
///   query_aggregation sum_prob: a correction step's ranking, which has the layer's own query.
///   correction_r    head_dim: a correction ranks over every channel, the speculation over its r.
///   selector        exact top-k at the cap; alpha and rule unused.
///   keep            4 sinks + 16 recent tokens, inside the cap.
[[nodiscard]] inline speculation_preset kvscout_speculation_only(int head_dim) {
  KVSCOUT_EXPECTS(head_dim >= 2 && head_dim % 2 == 0,
                  "kvscout presets: head_dim must be a positive even number, got ", head_dim);
  speculation_preset p;
  p.name = "kvscout_speculation_only";
  p.label = "kvscout speculation only: RoPE planes";
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

/// kvscout's best measured configuration (docs/accuracy.md): kvscout_speculation_only plus
///   correction_share 0.25   a quarter of each step's rows chosen with the layer's own query,
///                           over all head_dim channels, by sum_prob
///   key_bits 2              the partial keys at 2 bits (quantized_keys<2>, groups of 32 tokens)
///   layer_rule coverage     per-layer budget shares from mass curves, each layer at least
///   layer_floor 0.5         half its even share
[[nodiscard]] inline speculation_preset kvscout_default(int head_dim) {
  speculation_preset p = kvscout_speculation_only(head_dim);
  p.name = "kvscout_default";
  p.label = "kvscout default: RoPE planes, correction, layer shares, 2-bit keys";
  p.correction_share = 0.25;
  p.key_bits = 2;
  p.layer_rule = layer_budget_rule::coverage;
  p.layer_floor = 0.5;
  return p;
}

/// What presets::calibrate (kvscout/calibrate.hpp) measures on a calibration text, once.
struct calibration {
  std::vector<std::vector<skew_plan>> plans{};  // [layer][kv head], empty below skip_layers
  std::vector<std::vector<skew_plan>>
      correction_plans{};             // the same at correction_channels(), or empty
  std::vector<double> mass_curves{};  // [num_layers, bins] (layer_mass_curves)
  int bins = 0;
  int first_layer = 0;

  /// Per-layer shares of `budget` by p's layer_rule (mean 1 from first_layer); empty without one.
  [[nodiscard]] std::vector<double> layer_shares(const speculation_preset& p, double budget) const {
    if (!p.layer_rule) return {};
    KVSCOUT_EXPECTS(bins > 0 && !mass_curves.empty(), p.name,
                    " shares the budget by layer: its calibration has no mass curves");
    const int L = static_cast<int>(mass_curves.size()) / bins;
    std::vector<double> out(static_cast<std::size_t>(L));
    layer_budget_shares({mass_curves.data(), mass_curves.size()}, L, bins, first_layer, budget,
                        *p.layer_rule, {out.data(), out.size()}, p.layer_floor);
    return out;
  }
};

/// The partial-key format of key_bits: partial_keys_t<0> = float, else quantized_keys<bits>.
template <int Bits>
using partial_keys_t = std::conditional_t<Bits == 0, float, quantized_keys<(Bits == 0 ? 2 : Bits)>>;

/// What a step's parts need to run a preset at `budget`, a share of the cached rows per step.
struct step_budgets {
  std::vector<double> speculated;  // [num_layers]: layer l's selector budget_share (0 below skip)
  std::vector<double> total;    // [num_layers]: layer l's rows in all, its correction's total_share
  int capacity = 0;             // the most rows a speculation selects per (sequence, kv head)
  int correction_capacity = 0;  // the most rows a correction adds (0: no correction step)
  keep_set keep{};

  /// Layer l's top-k selector, host or CUDA (the CUDA one takes the same config).
  [[nodiscard]] topk_selector_host::config selector_config(const decode_shape& shape,
                                                           int layer) const {
    KVSCOUT_EXPECTS(layer >= 0 && static_cast<std::size_t>(layer) < speculated.size(), "layer ",
                    layer, " is outside [0, ", speculated.size(), ")");
    return {.shape = shape,
            .capacity = capacity,
            .budget = capacity,
            .keep = keep,
            .budget_share = speculated[static_cast<std::size_t>(layer)]};
  }
  /// The host pipeline's per-layer correction totals (empty without a correction step).
  [[nodiscard]] std::vector<double> correction_shares() const {
    return correction_capacity > 0 ? total : std::vector<double>{};
  }
};

/// layer_shares: [num_layers] (speculation_preset's layer_rule; mean 1 from skip_layers) or empty.
[[nodiscard]] inline step_budgets budgets(const speculation_preset& p, const decode_shape& shape,
                                          double budget,
                                          const std::vector<double>& layer_shares = {}) {
  const int L = shape.num_layers, T = shape.max_tokens;
  KVSCOUT_EXPECTS(L > 0 && T > 0, "budgets: num_layers and max_tokens must be positive, got ", L,
                  " and ", T);
  KVSCOUT_EXPECTS(budget > 0 && budget <= 1, "budget = ", budget,
                  ": expected a share of the cached rows in (0, 1]");
  KVSCOUT_EXPECTS(
      p.selector == selector_kind::topk, p.name,
      ": budgets() sizes top-k selectors; a threshold preset caps rows with its own rule");
  KVSCOUT_EXPECTS(p.correction_share >= 0 && p.correction_share < 1, p.name,
                  ": correction_share = ", p.correction_share,
                  ", expected a share of the budget in [0, 1)");
  KVSCOUT_EXPECTS(p.keep.sinks >= 0 && p.keep.recent >= 0 && p.keep.sinks < (1 << 30) &&
                      p.keep.recent < (1 << 30),
                  p.name, ": keep = {", p.keep.sinks, ", ", p.keep.recent,
                  "}, expected sinks and recent in [0, 2^30)");
  KVSCOUT_EXPECTS(layer_shares.empty() || layer_shares.size() == static_cast<std::size_t>(L),
                  "got ", layer_shares.size(), " layer shares, expected none or one per layer (", L,
                  ")");
  step_budgets b;
  b.keep = p.keep;
  b.speculated.assign(static_cast<std::size_t>(L), 0.0);
  b.total.assign(static_cast<std::size_t>(L), 0.0);
  int extra = 0;
  b.capacity = std::min(T, std::max(1, p.keep.sinks + p.keep.recent));
  for (int l = std::min(p.skip_layers, L); l < L; ++l) {
    const double share = layer_shares.empty() ? 1.0 : layer_shares[static_cast<std::size_t>(l)];
    KVSCOUT_EXPECTS(share >= 0 && std::isfinite(share), "layer_shares[", l, "] = ", share,
                    ": expected a finite non-negative share");
    double s = p.speculated_share(budget, share);
    const double t = p.total_share(budget, share);
    // A layer of share 0 keeps its keep-set alone; budget_share 0 would mean a fixed budget.
    if (s == 0) s = std::numeric_limits<double>::denorm_min();
    KVSCOUT_EXPECTS(t <= 1, "layer ", l, ": budget ", budget, " x layer share ", share, " = ", t,
                    " is more than every cached row");
    b.speculated[static_cast<std::size_t>(l)] = s;
    b.total[static_cast<std::size_t>(l)] = t;
    b.capacity = std::max(b.capacity, detail::row_budget(T, s, p.keep, T));
    // ceil is subadditive: ceil(t n) - ceil(s n) <= ceil((t - s) n) <= ceil((t - s) T).
    if (p.correction_share > 0) extra = std::max(extra, detail::row_budget(T, t - s, {}, T) + 1);
  }
  b.correction_capacity = p.correction_share > 0 ? std::max(1, std::min(extra, b.capacity)) : 0;
  return b;
}


}  // namespace presets

namespace detail {
/// One top-k selector per speculated layer, each at its layer's budget_share, with their
/// workspaces: what decode_pipeline_host's per-layer constructor takes (pointers()).
class layer_selectors {
 public:
  layer_selectors(const decode_shape& shape, const presets::step_budgets& b)
      : ptrs_(static_cast<std::size_t>(shape.num_layers), nullptr) {
    KVSCOUT_EXPECTS(b.speculated.size() == ptrs_.size(), "step_budgets for ", b.speculated.size(),
                    " layers, expected the shape's num_layers = ", shape.num_layers);
    ws_.reserve(ptrs_.size());
    sels_.reserve(ptrs_.size());
    for (int l = 0; l < shape.num_layers; ++l) {
      if (b.speculated[static_cast<std::size_t>(l)] == 0) continue;  // a dense layer
      const auto cfg = b.selector_config(shape, l);
      ws_.push_back(make_workspace<topk_selector_host>(cfg));
      ptrs_[static_cast<std::size_t>(l)] = &sels_.emplace_back(cfg, ws_.back().span());
    }
  }
  layer_selectors(const layer_selectors&) = delete;
  layer_selectors& operator=(const layer_selectors&) = delete;

  /// [num_layers]: layer l's selector, null for the dense layers.
  [[nodiscard]] const std::vector<topk_selector_host*>& pointers() const noexcept { return ptrs_; }

 private:
  std::vector<host_workspace> ws_;
  std::vector<topk_selector_host> sels_;  // never reallocated: its pointers are handed out
  std::vector<topk_selector_host*> ptrs_;
};
}  // namespace detail

}  // namespace kvscout
