#pragma once
// A preset's host pipeline with its parts owned: the InfiniGen policy, one top-k selector per
// speculated layer, the gather and every workspace, built from the preset, the shape, the
// calibration and the budget. The same parts by hand: docs/speculation.md.
//
//   const auto p = kvscout::presets::kvscout_default(64);
//   const auto cal = kvscout::presets::calibrate(p, shape, rope, q, k, n);  // kvscout/calibrate.hpp
//   kvscout::presets::pipeline_host<layout> pipe(p, shape, cal, 0.10, w_q, b_q, /*threads=*/2);
//   pipe->speculate(i + 1, ctx, kv[i + 1]);  pipe->attend(i, ctx, kv[i], cur, out);  ...

#include <cstddef>
#include <optional>
#include <vector>

#include "kvscout/core/error.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/pipeline/host_pipeline.hpp"
#include "kvscout/presets.hpp"
#include "kvscout/score/infinigen.hpp"
#include "kvscout/select/topk.hpp"

namespace kvscout::presets {

/// PkT: the policy's partial-key format, which must be the preset's (partial_keys_t<key_bits>).
/// The presets that select by top-k (kvscout_default, kvscout_speculation_only); infinigen_paper's
/// threshold selector is built by hand. Neither copyable nor movable: the pipeline holds its
/// parts by reference.
template <kv_layout Layout, partial_key_format PkT = partial_keys_t<2>>
class pipeline_host {
 public:
  using policy_type = infinigen_policy_host<PkT>;
  using pipeline_type = decode_pipeline_host<Layout, policy_type, topk_selector_host>;

  /// w_q: each layer's W_Q [num_q_heads * head_dim, d_model]; b_q: each layer's bias, or empty
  /// (no biases). threads: the gather's and attention's, the caller's included.
  pipeline_host(const speculation_preset& p, const decode_shape& shape, const calibration& cal,
                double budget, const std::vector<host_span<const float>>& w_q,
                const std::vector<host_span<const float>>& b_q, int threads = 1)
      : budgets_(checked_budgets(p, shape, cal, budget)),
        policy_ws_(make_workspace<policy_type>(p.policy_config(shape))),
        policy_built_(build_policy(p, shape, cal, w_q, b_q)),
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
        pipe_(cfg_, *policy_, selectors_.pointers(), gather_, pipe_ws_.span()) {}
  pipeline_host(const pipeline_host&) = delete;
  pipeline_host& operator=(const pipeline_host&) = delete;

  [[nodiscard]] pipeline_type& pipeline() noexcept { return pipe_; }
  [[nodiscard]] const pipeline_type& pipeline() const noexcept { return pipe_; }
  pipeline_type* operator->() noexcept { return &pipe_; }
  const pipeline_type* operator->() const noexcept { return &pipe_; }
  [[nodiscard]] policy_type& policy() noexcept { return *policy_; }
  [[nodiscard]] const step_budgets& budgets() const noexcept { return budgets_; }
  [[nodiscard]] const host_pipeline_config& configuration() const noexcept { return cfg_; }

 private:
  static step_budgets checked_budgets(const speculation_preset& p, const decode_shape& shape,
                                      const calibration& cal, double budget) {
    KVSCOUT_EXPECTS(p.selector == selector_kind::topk, "pipeline_host: ", p.name, " selects by ",
                    to_string(p.selector), "; it builds top-k selectors only (build ", p.name,
                    "'s parts by hand: docs/speculation.md)");
    constexpr bool quantized = detail::is_quantized_keys_v<PkT>;
    int bits = 0;
    if constexpr (quantized) bits = PkT::bits;
    KVSCOUT_EXPECTS(p.key_bits == bits || (!quantized && p.key_bits == 0), "pipeline_host: ",
                    p.name, " keeps its partial keys at ", p.key_bits,
                    " bits (0: the element type), the pipeline's PkT at ", bits,
                    ": use pipeline_host<Layout, presets::partial_keys_t<", p.key_bits, ">>");
    return presets::budgets(p, shape, budget, cal.layer_shares(p, budget));
  }
  bool build_policy(const speculation_preset& p, const decode_shape& shape, const calibration& cal,
                    const std::vector<host_span<const float>>& w_q,
                    const std::vector<host_span<const float>>& b_q) {
    std::vector<host_span<const float>> bias = b_q;
    if (bias.empty()) bias.resize(static_cast<std::size_t>(shape.num_layers));
    if (cal.correction_plans.empty())
      policy_.emplace(p.policy_config(shape), cal.plans, w_q, bias, policy_ws_.span());
    else
      policy_.emplace(p.policy_config(shape), cal.plans, cal.correction_plans, w_q, bias,
                      policy_ws_.span());
    return true;
  }

  step_budgets budgets_;
  host_workspace policy_ws_;
  std::optional<policy_type> policy_;  // built in place by build_policy, before the parts below
  bool policy_built_;
  detail::layer_selectors selectors_;
  host_pipeline_config cfg_;
  host_workspace gather_ws_;
  gather_executor_host<Layout> gather_;
  host_workspace pipe_ws_;
  pipeline_type pipe_;
};

}  // namespace kvscout::presets
