#pragma once
// h2o: heavy hitters (H2O, Zhang et al., NeurIPS'23). A token's score is the attention probability
// it has received so far, accumulated over decode steps and summed over its GQA group; pair it with
// a selector keep_set.recent window, as H2O does. Needs no query.
//
// Memory: one float per (layer, sequence, kv head, token slot), zeroed at construction, the
// policy's own or the caller's (state, not scratch: it lives with the policy). reset(s) clears a
// sequence.
//
//   kvscout::h2o_policy_host h2o({.shape = shape});  // num_layers, num_seqs, num_kv_heads, max_tokens

#include <algorithm>
#include <cstddef>

#include "kvscout/attention/rows.hpp"
#include "kvscout/cache/host_buffer.hpp"
#include "kvscout/core/detail/checked_size.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/score/concepts.hpp"

namespace kvscout {

class h2o_policy_host {
 public:
  struct config {
    decode_shape shape{};  // num_layers, num_seqs, num_kv_heads, max_tokens
  };
  using config_type = config;
  static constexpr bool needs_query = false;

  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg) {
    return detail::checked_size("h2o_policy_host's mass in bytes", elements(cfg), sizeof(float));
  }
  static constexpr std::size_t workspace_alignment = alignof(float);

  explicit h2o_policy_host(const config& cfg) : cfg_(cfg), mass_(elements(cfg)) {}
  /// The mass in the caller's memory: at least workspace_bytes(cfg) bytes at workspace_alignment,
  /// zeroed here, never freed here, not shared with anything else while the policy lives.
  h2o_policy_host(const config& cfg, host_span<std::byte> workspace)
      : cfg_(cfg),
        mass_(detail::borrow_zeroed<float>("h2o_policy_host workspace", workspace, workspace_bytes(cfg),
                                           workspace_alignment)) {}

  void score(int layer, const score_context<host_space>& ctx,
             const score_buffer<host_space>& out, host_exec = {}) const {
    check_layer(layer);
    detail::check_score_buffer(out, ctx, cfg_.shape.num_kv_heads, cfg_.shape.num_seqs,
                               cfg_.shape.max_tokens);
    for (int s = 0; s < out.num_seqs; ++s)
      for (int h = 0; h < cfg_.shape.num_kv_heads; ++h) {
        const float* m = mass(layer, detail::seq_of(ctx, s), h);
        std::copy(m, m + ctx.seq_lens[s], out.row(s, h));
      }
    detail::write_row_max(out, ctx);
  }

  /// Adds the probabilities of the rows attended at this step (and of the current token at position
  /// seq_lens[s], when the attention had one and it is below max_tokens). probs is
  /// [rows.num_seqs(), num_kv_heads, stride], as decode_attention_host writes it. Row s adds to
  /// sequence ctx.seq_ids[s] (s when seq_ids is empty).
  template <attention_rows Rows>
  void observe(int layer, const score_context<host_space>& ctx, const Rows& rows,
               host_span<const float> probs, int stride, bool has_current = true,
               host_exec = {}) {
    check_layer(layer);
    check_observe(ctx, rows, probs, stride, has_current);
    for (int s = 0; s < rows.num_seqs(); ++s)
      for (int h = 0; h < rows.num_kv_heads(); ++h) {
        float* m = mass(layer, detail::seq_of(ctx, s), h);
        const float* p = probs.data() + (static_cast<std::size_t>(s) * rows.num_kv_heads() + h) *
                                            static_cast<std::size_t>(stride);
        const int n = rows.rows(s, h);
        for (int i = 0; i < n; ++i) m[rows.token(s, h, i)] += p[i];
        if (has_current && ctx.seq_lens[s] < cfg_.shape.max_tokens) m[ctx.seq_lens[s]] += p[n];
      }
  }

  void reset(int s) {
    KVSCOUT_EXPECTS(s >= 0 && s < cfg_.shape.num_seqs, "sequence ", s, " is out of range [0, ",
                    cfg_.shape.num_seqs, ")");
    for (int layer = 0; layer < cfg_.shape.num_layers; ++layer)
      for (int h = 0; h < cfg_.shape.num_kv_heads; ++h)
        std::fill(mass(layer, s, h), mass(layer, s, h) + cfg_.shape.max_tokens, 0.f);
  }

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }

 private:
  void check_layer(int layer) const {
    KVSCOUT_EXPECTS(layer >= 0 && layer < cfg_.shape.num_layers, "layer ", layer,
                    " is out of range [0, ", cfg_.shape.num_layers, ")");
  }
  // Checked before the first addition, so bad input leaves the mass as it was.
  template <attention_rows Rows>
  void check_observe(const score_context<host_space>& ctx, const Rows& rows,
                     host_span<const float> probs, int stride, bool has_current) const {
    const int S = rows.num_seqs(), H = rows.num_kv_heads();
    KVSCOUT_EXPECTS(S >= 0 && S <= cfg_.shape.num_seqs, "rows hold ", S,
                    " sequences, expected [0, the policy's num_seqs = ", cfg_.shape.num_seqs, "]");
    KVSCOUT_EXPECTS(H == cfg_.shape.num_kv_heads, "rows have ", H, " kv heads, the policy ",
                    cfg_.shape.num_kv_heads);
    KVSCOUT_EXPECTS(stride >= 0, "stride must be non-negative, got ", stride);
    const std::size_t need = static_cast<std::size_t>(S) * H * static_cast<std::size_t>(stride);
    KVSCOUT_EXPECTS(probs.size() >= need && (probs.data() != nullptr || need == 0), "probs holds ",
                    probs.size(), " floats, expected [", S, ", ", H, ", ", stride, "] = ", need);
    if (has_current)
      KVSCOUT_EXPECTS(ctx.seq_lens.size() >= static_cast<std::size_t>(S), "seq_lens holds ",
                      ctx.seq_lens.size(), " entries, expected num_seqs = ", S);
    detail::check_seq_ids(ctx, S, cfg_.shape.num_seqs);
    for (int s = 0; s < S; ++s) {
      if (has_current)
        KVSCOUT_EXPECTS(ctx.seq_lens[s] >= 0, "seq_lens[", s, "] = ", ctx.seq_lens[s],
                        " is negative (the current token's position)");
      for (int h = 0; h < H; ++h) {
        const int n = rows.rows(s, h);
        KVSCOUT_EXPECTS(n >= 0 && n + (has_current ? 1 : 0) <= stride, "(s, h) = (", s, ", ", h,
                        ") has ", n, " rows", has_current ? " and the current token" : "",
                        ", expected at most stride = ", stride, " probabilities");
        for (int i = 0; i < n; ++i) {
          const int t = rows.token(s, h, i);
          KVSCOUT_EXPECTS(t >= 0 && t < cfg_.shape.max_tokens, "row ", i, " of (s, h) = (", s, ", ",
                          h, ") is token ", t,
                          ", out of range [0, max_tokens = ", cfg_.shape.max_tokens, ")");
        }
      }
    }
  }
  static std::size_t elements(const config& cfg) {
    detail::check_policy_sizes("h2o_policy_host", cfg.shape.num_layers, cfg.shape.num_seqs,
                               cfg.shape.num_kv_heads, cfg.shape.max_tokens);
    return detail::checked_size(
        "h2o_policy_host's mass (layers x seqs x kv heads x max_tokens floats)",
        cfg.shape.num_layers, cfg.shape.num_seqs, cfg.shape.num_kv_heads, cfg.shape.max_tokens);
  }
  float* mass(int layer, int s, int h) {
    return mass_.data() +
           ((static_cast<std::size_t>(layer) * cfg_.shape.num_seqs + s) * cfg_.shape.num_kv_heads +
            h) *
               static_cast<std::size_t>(cfg_.shape.max_tokens);
  }
  const float* mass(int layer, int s, int h) const {
    return const_cast<h2o_policy_host*>(this)->mass(layer, s, h);
  }

  config cfg_;
  host_buffer<float> mass_;  // [num_layers, num_seqs, num_kv_heads, max_tokens]
};

static_assert(speculation_policy<h2o_policy_host>);

}  // namespace kvscout
