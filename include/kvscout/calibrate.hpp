#pragma once
// One calibration call for a preset (offline; Eigen, as skew/calibrate.hpp): the skew plans, the
// correction plans and the per-layer mass curves that presets::kvscout_default needs, measured on
// a calibration text's queries and keys.
//
//   const auto p = kvscout::presets::kvscout_default(shape.head_dim);
//   const auto cal = kvscout::presets::calibrate(p, shape, rope, q_by_layer, k_by_layer, n);
//   const auto b = kvscout::presets::budgets(p, shape, 0.10, cal.layer_shares(p, 0.10));

#include <algorithm>
#include <vector>

#include "kvscout/core/error.hpp"
#include "kvscout/core/rope.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/presets.hpp"
#include "kvscout/select/budgets.hpp"
#include "kvscout/skew/calibrate.hpp"

namespace kvscout {
namespace presets {

/// Everything preset p needs measured, in one call on a calibration text's queries and keys as
/// attention sees them (after RoPE; laid out as calibrate_skew_layers takes them): its skew plans
/// (and correction plans where it has a correction step over more channels) from layer
/// p.skip_layers on, and, where it shares the budget by layer, the mass curves.
inline calibration calibrate(const speculation_preset& p, const decode_shape& shape,
                             const rope_config& rope, const std::vector<std::vector<float>>& q,
                             const std::vector<std::vector<float>>& k, int n) {
  KVSCOUT_EXPECTS(rope.head_dim == shape.head_dim, "calibrate: rope.head_dim = ", rope.head_dim,
                  ", expected the shape's head_dim = ", shape.head_dim);
  calibration c;
  c.first_layer = std::min(p.skip_layers, shape.num_layers);
  c.plans = calibrate_skew_layers(shape, q, k, n, p.skew(rope), c.first_layer);
  if (p.correction_share > 0 && p.correction_channels() > p.r)
    c.correction_plans =
        calibrate_skew_layers(shape, q, k, n, p.correction_skew(rope), c.first_layer);
  if (p.layer_rule) {
    c.bins = p.layer_bins;
    c.mass_curves = layer_mass_curves(shape, q, k, n, c.bins, c.first_layer);
  }
  return c;
}

}  // namespace presets
}  // namespace kvscout
