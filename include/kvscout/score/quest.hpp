#pragma once
// quest: query-aware page selection (Quest, Tang et al. ICML'24). For every page of P tokens the
// policy keeps the per-channel minimum and maximum of the (post-RoPE) keys; the largest q.k any
// key of the page can reach is bounded by sum_c max(q_c * min_c, q_c * max_c). Every token of a
// page gets the page's bound, so a top-k selector picks whole pages in bound order. Needs layer
// i's query. Memory: the page bounds, the policy's own or the caller's (state, not scratch).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvscout/cache/host_buffer.hpp"
#include "kvscout/core/detail/checked_size.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/score/concepts.hpp"
#include "kvscout/score/detail/aggregate.hpp"

namespace kvscout {

template <int HeadDim>
class quest_policy_host {
 public:
  struct config {
    decode_shape shape{};  // num_layers, num_seqs, num_kv_heads, num_q_heads, max_tokens, scale
    int page_size = 16;
    gqa_aggregation aggregation = gqa_aggregation::max_logit;
  };
  using config_type = config;
  static constexpr bool needs_query = true;
  static constexpr int head_dim = HeadDim;

  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg) {
    return detail::checked_size("quest_policy_host's page bounds in bytes", elements(cfg), sizeof(float));
  }
  static constexpr std::size_t workspace_alignment = alignof(float);

  explicit quest_policy_host(const config& cfg)
      : cfg_(cfg), max_pages_(pages_of(cfg)), bounds_(elements(cfg)) {}
  /// The page bounds in the caller's memory: at least workspace_bytes(cfg) bytes at
  /// workspace_alignment, zeroed here, never freed here, not shared while the policy lives.
  quest_policy_host(const config& cfg, host_span<std::byte> workspace)
      : cfg_(cfg),
        max_pages_(pages_of(cfg)),
        bounds_(detail::borrow_zeroed<float>("quest_policy_host workspace", workspace, workspace_bytes(cfg),
                                             workspace_alignment)) {}

  /// k_post is [num_kv_heads, head_dim].
  void append(int layer, int s, int t, const float* /*k_pre_rope*/, const float* k_post,
              host_exec = {}) {
    KVSCOUT_EXPECTS(layer >= 0 && layer < cfg_.shape.num_layers, "layer ", layer,
                    " is out of range [0, ", cfg_.shape.num_layers, ")");
    KVSCOUT_EXPECTS(s >= 0 && s < cfg_.shape.num_seqs, "sequence ", s, " is out of range [0, ",
                    cfg_.shape.num_seqs, ")");
    KVSCOUT_EXPECTS(t >= 0 && t < cfg_.shape.max_tokens, "token ", t,
                    " is out of range [0, max_tokens = ", cfg_.shape.max_tokens, ")");
    KVSCOUT_EXPECTS(k_post != nullptr, "k_post is null: quest_policy_host bounds the post-RoPE keys");
    const bool first = t % cfg_.page_size == 0;
    for (int h = 0; h < cfg_.shape.num_kv_heads; ++h) {
      float* mn = page(layer, s, h, t / cfg_.page_size);
      float* mx = mn + HeadDim;
      const float* k = k_post + static_cast<std::size_t>(h) * HeadDim;
      for (int c = 0; c < HeadDim; ++c) {
        mn[c] = first ? k[c] : std::min(mn[c], k[c]);
        mx[c] = first ? k[c] : std::max(mx[c], k[c]);
      }
    }
  }

  void score(int layer, const score_context<host_space>& ctx,
             const score_buffer<host_space>& out, host_exec = {}) const {
    KVSCOUT_EXPECTS(layer >= 0 && layer < cfg_.shape.num_layers, "layer ", layer,
                    " is out of range [0, ", cfg_.shape.num_layers, ")");
    detail::check_score_buffer(out, ctx, cfg_.shape.num_kv_heads, cfg_.shape.num_seqs,
                               cfg_.shape.max_tokens);
    const int g = cfg_.shape.num_q_heads / cfg_.shape.num_kv_heads;
    KVSCOUT_EXPECTS(
        ctx.q.size() >= static_cast<std::size_t>(out.num_seqs) * cfg_.shape.num_q_heads * HeadDim,
        "quest needs layer ", layer, "'s query: q holds ", ctx.q.size(), " floats, expected [",
        out.num_seqs, ", ", cfg_.shape.num_q_heads, ", ", HeadDim, "]");
    for (int s = 0; s < out.num_seqs; ++s) {
      const int len = ctx.seq_lens[s], seq = detail::seq_of(ctx, s);
      const int pages = (len + cfg_.page_size - 1) / cfg_.page_size;
      for (int h = 0; h < cfg_.shape.num_kv_heads; ++h) {
        const float* qg =
            ctx.q.data() + (static_cast<std::size_t>(s) * cfg_.shape.num_q_heads + h * g) * HeadDim;
        float* row = out.row(s, h);
        detail::aggregate_scores(pages, g, cfg_.aggregation, row,
                                 [&](int p, float* z) {
                                   const float* mn = page(layer, seq, h, p);
                                   const float* mx = mn + HeadDim;
                                   for (int j = 0; j < g; ++j) {
                                     const float* q = qg + static_cast<std::size_t>(j) * HeadDim;
                                     float ub = 0;
                                     for (int c = 0; c < HeadDim; ++c)
                                       ub += std::max(q[c] * mn[c], q[c] * mx[c]);
                                     z[j] = ub * cfg_.shape.scale;
                                   }
                                 });
        // Spread to every token of its page, last page first: page p writes
        // indices >= p * page_size >= p, so no bound is overwritten before it is read.
        for (int p = pages - 1; p >= 0; --p) {
          const float b = row[p];
          const int t1 = std::min(len, (p + 1) * cfg_.page_size);
          for (int t = p * cfg_.page_size; t < t1; ++t) row[t] = b;
        }
      }
    }
    detail::write_row_max(out, ctx);
  }

  [[nodiscard]] int page_size() const { return cfg_.page_size; }

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }

 private:
  static int pages_of(const config& cfg) {
    check(cfg);
    return static_cast<int>((static_cast<std::int64_t>(cfg.shape.max_tokens) + cfg.page_size - 1) /
                            cfg.page_size);
  }
  static void check(const config& cfg) {
    detail::check_policy_sizes("quest_policy_host", cfg.shape.num_layers, cfg.shape.num_seqs,
                               cfg.shape.num_kv_heads, cfg.shape.max_tokens);
    KVSCOUT_EXPECTS(cfg.page_size >= 1, "page_size must be positive, got ", cfg.page_size);
    detail::check_gqa(cfg.shape.num_q_heads, cfg.shape.num_kv_heads);
    detail::check_scale(cfg.shape.scale);
  }
  static std::size_t elements(const config& cfg) {
    return detail::checked_size(
        "quest_policy_host's page bounds (layers x seqs x kv heads x pages x 2 x "
        "head_dim floats)",
        cfg.shape.num_layers, cfg.shape.num_seqs, cfg.shape.num_kv_heads, pages_of(cfg),
        2 * HeadDim);
  }
  float* page(int layer, int s, int h, int p) {
    return bounds_.data() + ((((static_cast<std::size_t>(layer) * cfg_.shape.num_seqs + s) *
                                   cfg_.shape.num_kv_heads +
                               h) *
                                  max_pages_ +
                              p) *
                             2) *
                                HeadDim;
  }
  const float* page(int layer, int s, int h, int p) const {
    return const_cast<quest_policy_host*>(this)->page(layer, s, h, p);
  }

  config cfg_;
  int max_pages_ = 0;
  host_buffer<float> bounds_;  // [layers, seqs, kv_heads, max_pages, {min, max}, head_dim]
};

static_assert(speculation_policy<quest_policy_host<64>>);

}  // namespace kvscout
