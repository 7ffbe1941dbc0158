#pragma once
// A preset's host pipeline with its parts owned: the InfiniGen policy, one top-k selector per
// speculated layer, the gather and every workspace, built from the preset, the shape, the
// calibration and the budget. The same parts by hand: docs/speculation.md.
//
//   const auto p = kvscout::presets::kvscout_default(64);
//   const auto cal = kvscout::presets::calibrate(p, shape, rope, q, k, n);  // calibrate.hpp
//   kvscout::presets::pipeline_host<layout> owned(p, shape, cal, 0.10, w_q, b_q, /*threads=*/2);
//   auto& pipe = owned.pipeline();  // the decode_pipeline_host
//   pipe.speculate(i + 1, ctx, kv[i + 1]);  pipe.attend(i, ctx, kv[i], cur, out);  ...

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kvscout/core/detail/checked_size.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/pipeline/host_pipeline.hpp"
#include "kvscout/presets.hpp"
#include "kvscout/score/infinigen.hpp"
#include "kvscout/select/topk.hpp"

namespace kvscout::detail {

/// pipeline_host's and pipeline_cuda's checks of their inputs (`who` names the caller), then the
/// preset's budgets at `budget` with the calibration's layer shares.
template <class Layout, class PkT, class In>
presets::step_budgets preset_pipeline_budgets(const char* who, const presets::speculation_preset& p,
                                              const decode_shape& shape,
                                              const presets::calibration& cal, double budget,
                                              const std::vector<host_span<const In>>& w_q,
                                              const std::vector<host_span<const In>>& b_q) {
  KVSCOUT_EXPECTS(p.selector == presets::selector_kind::topk, who, ": ", p.name, " selects by ",
                  to_string(p.selector), "; it builds top-k selectors only (build ", p.name,
                  "'s parts by hand: docs/speculation.md)");
  constexpr bool quantized = is_quantized_keys_v<PkT>;
  int bits = 0;
  if constexpr (quantized) bits = PkT::bits;
  KVSCOUT_EXPECTS(p.key_bits == bits, who, ": ", p.name,
                  " keeps its partial keys at ", p.key_bits,
                  " bits (0: the element type), the pipeline's PkT at ", bits, ": use ", who,
                  "<Layout, presets::partial_keys_t<", p.key_bits, ">>");
  KVSCOUT_EXPECTS(shape.head_dim == Layout::head_dim, who, ": shape.head_dim = ", shape.head_dim,
                  ", expected the layout's head_dim ", Layout::head_dim);
  const auto L = static_cast<std::size_t>(shape.num_layers);
  KVSCOUT_EXPECTS(
      cal.plans.size() == L && cal.first_layer == std::min(p.skip_layers, shape.num_layers), who,
      ": the calibration covers ", cal.plans.size(), " layers from layer ", cal.first_layer,
      ", expected the shape's ", shape.num_layers, " from ", p.name,
      "'s skip_layers = ", p.skip_layers, " (presets::calibrate(p, shape, ...) of this preset and shape)");
  for (std::size_t l = 0; l < std::min(L, cal.plans.size()); ++l)
    KVSCOUT_EXPECTS(cal.plans[l].empty() == (static_cast<int>(l) < cal.first_layer), who,
                    ": the calibration's layer ", l, cal.plans[l].empty() ? " has no" : " has",
                    " plans; the layers from skip_layers = ", p.skip_layers,
                    " on are speculated and need them, the ones before take none");
  const bool wide = p.policy_config(shape).correction_r > 0;
  KVSCOUT_EXPECTS(!wide || cal.correction_plans.size() == L, who, ": ", p.name,
                  " corrects over ", p.correction_channels(),
                  " channels but the calibration has no correction plans (calibrate with ",
                  "presets::calibrate(p, ...) of this preset)");
  const std::size_t rows = checked_size("W_Q elements of a layer", shape.num_q_heads,
                                        shape.head_dim, shape.d_model);
  const auto bias = static_cast<std::size_t>(shape.num_q_heads) * shape.head_dim;
  KVSCOUT_EXPECTS(w_q.size() == L && (b_q.empty() || b_q.size() == L), who, ": ", w_q.size(),
                  " W_Q and ", b_q.size(), " b_Q spans, expected one per layer (", shape.num_layers,
                  "; no b_Q spans: no biases)");
  for (std::size_t l = 0; l < L; ++l) {
    KVSCOUT_EXPECTS(w_q[l].size() == rows, who, ": layer ", l, "'s W_Q has ", w_q[l].size(),
                    " elements, expected num_q_heads * head_dim * d_model = ", rows);
    KVSCOUT_EXPECTS(b_q.empty() || b_q[l].empty() || b_q[l].size() == bias, who, ": layer ", l,
                    "'s b_Q has ", b_q.empty() ? 0 : b_q[l].size(),
                    " elements, expected 0 or num_q_heads * head_dim = ", bias);
  }
  return presets::budgets(p, shape, budget, cal.layer_shares(p, budget));
}

/// The preset's InfiniGen policies (P: infinigen_policy_host or _cuda), one per speculated layer,
/// with the correction's plans only where the preset corrects over more channels than it speculates.
template <class P, class In>
policy_layers<P> preset_policy_layers(const presets::speculation_preset& p,
                                      const decode_shape& shape, const presets::calibration& cal,
                                      const std::vector<host_span<const In>>& w_q,
                                      const std::vector<host_span<const In>>& b_q) {
  std::vector<host_span<const In>> bias = b_q;
  if (bias.empty()) bias.resize(static_cast<std::size_t>(shape.num_layers));
  const infinigen_config cfg = p.policy_config(shape);
  return build_infinigen_layers<P, In>(cfg, cal.plans,
                                       cfg.correction_r > 0 ? cal.correction_plans
                                                            : std::vector<std::vector<skew_plan>>{},
                                       w_q, bias);
}

}  // namespace kvscout::detail

namespace kvscout::presets {

/// PkT: the policy's partial-key format, which must be the preset's (partial_keys_t<key_bits>).
/// The presets that select by top-k (kvscout_default, kvscout_speculation_only); infinigen_paper's
/// threshold selector is built by hand. Neither copyable nor movable (the pipeline holds its parts
/// by reference): hold it in place or through a unique_ptr. The budget is fixed at construction.
template <kv_layout Layout, partial_key_format PkT = partial_keys_t<2>>
class pipeline_host {
 public:
  using policy_type = policy_layers<infinigen_policy_host<PkT>>;  // one per speculated layer
  using pipeline_type = decode_pipeline_host<Layout, policy_type, topk_selector_host>;

  /// cal: presets::calibrate(p, shape, ...) of this preset and shape. w_q: each layer's W_Q
  /// [num_q_heads * head_dim, d_model]; b_q: each layer's bias [num_q_heads * head_dim], or no
  /// entries (no biases); float, half or bfloat16. threads: the gather's and attention's, the
  /// caller's included.
  template <compute_element In>
  pipeline_host(const speculation_preset& p, const decode_shape& shape, const calibration& cal,
                double budget, const std::vector<host_span<const In>>& w_q,
                const std::vector<host_span<const In>>& b_q, int threads = 1)
      : budgets_(detail::preset_pipeline_budgets<Layout, PkT>("pipeline_host", p, shape, cal,
                                                              budget, w_q, b_q)),
        policy_(detail::preset_policy_layers<infinigen_policy_host<PkT>>(p, shape, cal, w_q, b_q)),
        selectors_(shape, budgets_),
        cfg_{.shape = shape,
             .skip_layers = p.skip_layers,
             .capacity = budgets_.capacity,
             .threads = threads,
             .correction_capacity = budgets_.correction_capacity,
             .correction_shares = budgets_.correction_shares()},
        gather_ws_(make_workspace<gather_executor_host<Layout>>(cfg_.gather_config())),
        gather_(cfg_.gather_config(), gather_ws_.span()),
        pipe_ws_(make_workspace<pipeline_type>(cfg_)),
        pipe_(cfg_, policy_, selectors_.pointers(), gather_, pipe_ws_.span()) {}
  pipeline_host(const pipeline_host&) = delete;
  pipeline_host& operator=(const pipeline_host&) = delete;

  /// The decode_pipeline_host: speculate, attend, append, stats.
  [[nodiscard]] pipeline_type& pipeline() noexcept { return pipe_; }
  [[nodiscard]] const pipeline_type& pipeline() const noexcept { return pipe_; }
  [[nodiscard]] policy_type& policy() noexcept { return policy_; }
  [[nodiscard]] const policy_type& policy() const noexcept { return policy_; }
  [[nodiscard]] const step_budgets& budgets() const noexcept { return budgets_; }
  [[nodiscard]] const host_pipeline_config& configuration() const noexcept { return cfg_; }

 private:
  step_budgets budgets_;
  policy_type policy_;
  detail::layer_selectors selectors_;
  host_pipeline_config cfg_;
  host_workspace gather_ws_;
  gather_executor_host<Layout> gather_;
  host_workspace pipe_ws_;
  pipeline_type pipe_;
};

}  // namespace kvscout::presets
