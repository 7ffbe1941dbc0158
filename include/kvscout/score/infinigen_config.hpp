#pragma once
// The InfiniGen policy's config, one for both backends: infinigen_policy_host serves every layer
// (shape.num_layers of them, its plans per layer), infinigen_policy_cuda one layer (num_layers
// unused). r, mode and correction_r are the device policy's: its kernels are built for one
// partial width. The host policy reads them from its plans and, where r > 0, checks that the
// plans agree.

#include <optional>

#include "kvscout/core/shape.hpp"
#include "kvscout/score/concepts.hpp"
#include "kvscout/skew/plan.hpp"

namespace kvscout {

struct infinigen_config {
  decode_shape shape{};
  int r = 0;  // partial dimension of every plan (host: 0 = the plans' own)
  rope_mode mode = rope_mode::post_rope_skew;  // every plan's mode (host: checked where r > 0)
  gqa_aggregation aggregation = gqa_aggregation::max_logit;
  /// score_query's aggregation (the correction step's late ranking); empty: `aggregation`.
  std::optional<gqa_aggregation> query_aggregation{};
  /// The channels score_query reads, where more than r (0: r); the cache then holds them, the
  /// speculation's first. Host: the correction plans' width, checked where set.
  int correction_r = 0;

  [[nodiscard]] gqa_aggregation late_aggregation() const noexcept {
    return query_aggregation.value_or(aggregation);
  }
  [[nodiscard]] int key_r() const noexcept { return correction_r > 0 ? correction_r : r; }
};

}  // namespace kvscout
