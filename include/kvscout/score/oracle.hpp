#pragma once
// oracle: the true scores of layer i, from its own query and the full cached keys: the upper
// bound every other policy is measured against (needs_query = true).
//
// Keys are read as attention reads them: through the layout, or, for a KIVI cache, dequantised
// (then the resident window); an fp8 cache's keys times the layer's k_scale. So on a quantised
// cache the oracle ranks by the logits attention will actually compute.
//
//   kvscout::oracle_policy_host<layout> oracle({.shape = shape}, per_layer_kv);  // Hq, scale

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "kvscout/attention/cache_rows.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/simd.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/score/concepts.hpp"
#include "kvscout/score/detail/aggregate.hpp"

namespace kvscout {

template <kv_layout L>
class oracle_policy_host {
 public:
  struct config {
    decode_shape shape{};  // num_q_heads, scale
    gqa_aggregation aggregation = gqa_aggregation::sum_prob;
  };
  using config_type = config;
  static constexpr bool needs_query = true;
  static constexpr int head_dim = L::head_dim;

  using view_type = detail::cache_view_t<L>;

  /// layers[i] is layer i's host cache (its metadata must stay valid while the policy is used).
  /// k_scales: empty, or layer i's k_scale at [i] (fp8 caches).
  oracle_policy_host(const config& cfg, std::vector<view_type> layers,
                     std::vector<float> k_scales = {})
      : cfg_(cfg), layers_(std::move(layers)), k_scales_(std::move(k_scales)) {
    KVSCOUT_EXPECTS(!layers_.empty(), "oracle_policy_host needs at least one layer");
    KVSCOUT_EXPECTS(k_scales_.empty() || k_scales_.size() == layers_.size(), "oracle_policy_host: ",
                    k_scales_.size(), " k_scales for ", layers_.size(),
                    " layers (expected none or one per layer)");
    for (std::size_t i = 0; i < k_scales_.size(); ++i)
      KVSCOUT_EXPECTS(std::isfinite(k_scales_[i]) && k_scales_[i] > 0.f, "k_scales[", i, "] = ",
                      k_scales_[i], " must be positive and finite");
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const int H = layers_[i].layout.num_kv_heads();
      KVSCOUT_EXPECTS(H >= 1 && cfg.shape.num_q_heads >= 1 && cfg.shape.num_q_heads % H == 0,
                      "num_q_heads = ", cfg.shape.num_q_heads,
                      " must be a positive multiple of layer ", i, "'s num_kv_heads = ", H);
    }
    detail::check_scale(cfg.shape.scale);
  }

  void score(int layer, const score_context<host_space>& ctx,
             const score_buffer<host_space>& out, host_exec = {}) const {
    KVSCOUT_EXPECTS(layer >= 0 && layer < static_cast<int>(layers_.size()), "layer ", layer,
                    " is out of range [0, ", layers_.size(), ")");
    const detail::cache_rows_t<L> rows(layers_[static_cast<std::size_t>(layer)]);
    const int H = rows.num_kv_heads();
    detail::check_score_buffer(out, ctx, H, rows.num_seqs(), std::numeric_limits<int>::max(),
                               "the cache's");
    const int g = cfg_.shape.num_q_heads / H;
    KVSCOUT_EXPECTS(
        ctx.q.size() >= static_cast<std::size_t>(out.num_seqs) * cfg_.shape.num_q_heads * head_dim,
        "the oracle needs layer ", layer, "'s query: q holds ", ctx.q.size(), " floats, expected [",
        out.num_seqs, ", ", cfg_.shape.num_q_heads, ", ", head_dim, "]");
    // Every sequence's length before the first score is written, so a bad one leaves out as it was.
    for (int s = 0; s < out.num_seqs; ++s) {
      const int seq = detail::seq_of(ctx, s);
      KVSCOUT_EXPECTS(ctx.seq_lens[s] <= rows.rows(seq, 0), "seq_lens[", s, "] = ",
                      ctx.seq_lens[s], " exceeds the cache's length ", rows.rows(seq, 0),
                      " (sequence ", seq, ")");
    }
    float k[head_dim];
    const float logit_scale = k_scales_.empty()
                                  ? cfg_.shape.scale
                                  : cfg_.shape.scale * k_scales_[static_cast<std::size_t>(layer)];
    for (int s = 0; s < out.num_seqs; ++s) {
      const int seq = detail::seq_of(ctx, s);
      for (int h = 0; h < H; ++h) {
        const float* qg = ctx.q.data() +
                          (static_cast<std::size_t>(s) * cfg_.shape.num_q_heads + h * g) * head_dim;
        detail::aggregate_scores(ctx.seq_lens[s], g, cfg_.aggregation, out.row(s, h),
                                 [&](int t, float* z) {
                                   rows.load_k(seq, h, t, k);
                                   for (int j = 0; j < g; ++j)
                                     z[j] = detail::dot(qg + j * head_dim, k, head_dim) *
                                            logit_scale;
                                 });
      }
    }
    detail::write_row_max(out, ctx);
  }

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }

 private:
  config cfg_;
  std::vector<view_type> layers_;
  std::vector<float> k_scales_;
};

}  // namespace kvscout
