#pragma once
// The InfiniGen policy's config and the checks of its plans, one for both backends: each of
// infinigen_policy_host and infinigen_policy_cuda serves one layer (shape.num_layers unused) at one
// partial width r (and correction_r), in one RoPE mode.

#include <cstddef>
#include <optional>
#include <vector>

#include "kvscout/core/error.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/score/concepts.hpp"
#include "kvscout/score/detail/aggregate.hpp"
#include "kvscout/score/policy_layers.hpp"
#include "kvscout/skew/plan.hpp"

namespace kvscout {

struct infinigen_config {
  decode_shape shape{};
  int r = 0;  // partial dimension of every plan
  rope_mode mode = rope_mode::post_rope_skew;  // every plan's mode
  gqa_aggregation aggregation = gqa_aggregation::max_logit;
  /// score_query's aggregation (the correction step's late ranking); empty: `aggregation`.
  std::optional<gqa_aggregation> query_aggregation{};
  /// The channels score_query reads, where more than r (0: r); the cache then holds them, the
  /// speculation's first.
  int correction_r = 0;

  [[nodiscard]] gqa_aggregation late_aggregation() const noexcept {
    return query_aggregation.value_or(aggregation);
  }
  [[nodiscard]] int key_r() const noexcept { return correction_r > 0 ? correction_r : r; }
};

namespace detail {
/// The checks of a config that both backends' policies make (each adds its own limits).
inline void check_infinigen_config(const infinigen_config& c) {
  KVSCOUT_EXPECTS(c.shape.head_dim > 0 && c.shape.d_model > 0,
                  "head_dim and d_model must be positive, got ", c.shape.head_dim, " and ",
                  c.shape.d_model);
  check_gqa(c.shape.num_q_heads, c.shape.num_kv_heads);
  const int g = c.shape.num_q_heads / c.shape.num_kv_heads;
  KVSCOUT_EXPECTS(g <= max_group, "GQA group of ", g, " query heads exceeds ", max_group);
  check_scale(c.shape.scale);
  check_aggregation(c.aggregation, "aggregation");
  check_aggregation(c.late_aggregation(), "query_aggregation");
  KVSCOUT_EXPECTS(c.r >= 1 && c.r <= c.shape.head_dim, "r = ", c.r,
                  " must be in [1, head_dim = ", c.shape.head_dim, "]");
  KVSCOUT_EXPECTS(
      c.correction_r == 0 || (c.correction_r >= c.r && c.correction_r <= c.shape.head_dim),
      "correction_r = ", c.correction_r, " must be 0 (r) or in [r = ", c.r,
      ", head_dim = ", c.shape.head_dim, "]");
  KVSCOUT_EXPECTS(c.mode == rope_mode::post_rope_skew || c.mode == rope_mode::rope_planes ||
                      c.mode == rope_mode::pre_rope_folded,
                  "unsupported rope_mode ", static_cast<int>(c.mode),
                  "; supported: post_rope_skew, rope_planes, pre_rope_folded");
  if (c.mode == rope_mode::rope_planes) {
    KVSCOUT_EXPECTS(c.r % 2 == 0, "rope_planes needs an even r (whole planes), got ", c.r);
    KVSCOUT_EXPECTS(c.key_r() % 2 == 0,
                    "rope_planes needs an even correction_r (whole planes), got ", c.correction_r);
  }
}

/// One plan per kv head, consistent with the config; W_Q and b_Q sizes (make_partial_query_weights
/// checks their values).
template <class In = float>
void check_infinigen_plans(const infinigen_config& c,
                                const std::vector<skew_plan>& plans, host_span<const In> w_q,
                                host_span<const In> b_q,
                                const std::vector<skew_plan>* correction_plans = nullptr) {
  KVSCOUT_EXPECTS(static_cast<int>(plans.size()) == c.shape.num_kv_heads, "got ", plans.size(),
                  " skew plans, expected one per kv head (", c.shape.num_kv_heads, ")");
  for (std::size_t h = 0; h < plans.size(); ++h) {
    const skew_plan& p = plans[h];
    check_plan(p);
    KVSCOUT_EXPECTS(p.mode == c.mode, "plan of kv head ", h, " has mode ", to_string(p.mode),
                    ", the config ", to_string(c.mode));
    KVSCOUT_EXPECTS(p.r == c.r, "plan of kv head ", h, " has r = ", p.r, ", the config ", c.r);
    KVSCOUT_EXPECTS(p.head_dim == c.shape.head_dim, "plan of kv head ", h, " has head_dim ",
                    p.head_dim, ", the config ", c.shape.head_dim);
    KVSCOUT_EXPECTS(p.rope.head_dim == plans[0].rope.head_dim &&
                        p.rope.theta == plans[0].rope.theta && p.rope.style == plans[0].rope.style,
                    "plan of kv head ", h, " has another RoPE configuration than kv head 0");
  }
  if (correction_plans != nullptr) {
    KVSCOUT_EXPECTS(static_cast<int>(correction_plans->size()) == c.shape.num_kv_heads, "got ",
                    correction_plans->size(), " correction plans, expected one per kv head (",
                    c.shape.num_kv_heads, ")");
    KVSCOUT_EXPECTS(c.correction_r > 0, "correction plans were given but the config's "
                    "correction_r is 0; set it to their r");
    for (std::size_t h = 0; h < correction_plans->size(); ++h) {
      const skew_plan& p = (*correction_plans)[h];
      check_plan(p);
      KVSCOUT_EXPECTS(p.r == c.correction_r, "correction plan of kv head ", h, " has r = ", p.r,
                      ", the config's correction_r ", c.correction_r);
    }
  } else {
    KVSCOUT_EXPECTS(c.correction_r == 0 || c.correction_r == c.r, "the config's correction_r = ",
                    c.correction_r, " needs correction plans of that r (none were given)");
  }
  const std::size_t w_need =
      static_cast<std::size_t>(c.shape.num_q_heads) * c.shape.head_dim * c.shape.d_model;
  KVSCOUT_EXPECTS(w_q.size() == w_need, "W_Q holds ", w_q.size(),
                  " elements, expected num_q_heads * head_dim * d_model = ", w_need);
  const std::size_t b_need = static_cast<std::size_t>(c.shape.num_q_heads) * c.shape.head_dim;
  KVSCOUT_EXPECTS(b_q.empty() || b_q.size() == b_need, "b_Q holds ", b_q.size(),
                  " elements, expected 0 or num_q_heads * head_dim = ", b_need);
}

/// What infinigen_policy_host::layers and infinigen_policy_cuda::layers build: one P per layer that
/// has plans, each layer's r, mode and correction_r its plans' own.
template <class P, class In>
policy_layers<P> build_infinigen_layers(const infinigen_config& cfg,
                                        const std::vector<std::vector<skew_plan>>& plans,
                                        const std::vector<std::vector<skew_plan>>& correction_plans,
                                        const std::vector<host_span<const In>>& w_q,
                                        const std::vector<host_span<const In>>& b_q) {
  const auto L = static_cast<std::size_t>(cfg.shape.num_layers);
  KVSCOUT_EXPECTS(cfg.shape.num_layers > 0, "infinigen policy layers(): shape.num_layers = ",
                  cfg.shape.num_layers, " must be positive");
  KVSCOUT_EXPECTS(plans.size() == L && w_q.size() == L && b_q.size() == L,
                  "expected one entry per layer (", cfg.shape.num_layers, ") in plans (",
                  plans.size(), "), w_q (", w_q.size(), ") and b_q (", b_q.size(), ")");
  KVSCOUT_EXPECTS(correction_plans.empty() || correction_plans.size() == L,
                  "expected no correction plans or one entry per layer (", cfg.shape.num_layers,
                  ") in correction_plans, got ", correction_plans.size());
  policy_layers<P> out(cfg.shape.num_layers);
  for (std::size_t l = 0; l < L; ++l) {
    const std::vector<skew_plan>* wide =
        correction_plans.empty() || correction_plans[l].empty() ? nullptr : &correction_plans[l];
    KVSCOUT_EXPECTS(!(plans[l].empty() && wide), "layer ", l,
                    " has correction plans but no speculation plans; the correction reads the "
                    "speculated layers' caches");
    if (plans[l].empty()) continue;
    KVSCOUT_EXPECTS(cfg.correction_r == 0 || wide != nullptr, "layer ", l,
                    ": the config's correction_r = ", cfg.correction_r,
                    " needs correction plans, and the layer has none (0: each layer's own)");
    infinigen_config c = cfg;
    const skew_plan& p = plans[l][0];
    KVSCOUT_EXPECTS(cfg.r == 0 || (p.r == cfg.r && p.mode == cfg.mode), "layer ", l,
                    "'s plans have r = ", p.r, " and mode ", to_string(p.mode), ", the config r = ",
                    cfg.r, " and mode ", to_string(cfg.mode), " (r = 0: the plans' own)");
    c.r = p.r;
    c.mode = p.mode;
    c.correction_r = wide ? (*wide)[0].r : 0;
    KVSCOUT_EXPECTS(cfg.correction_r == 0 || wide == nullptr || c.correction_r == cfg.correction_r,
                    "layer ", l, "'s correction plans have r = ", c.correction_r,
                    ", the config correction_r = ", cfg.correction_r, " (0: the plans' own)");
    with_layer_context(static_cast<int>(l), [&] {
      if (wide)
        out.emplace(static_cast<int>(l), c, plans[l], *wide, w_q[l], b_q[l]);
      else
        out.emplace(static_cast<int>(l), c, plans[l], w_q[l], b_q[l]);
    });
  }
  return out;
}

}  // namespace detail

}  // namespace kvscout
