#pragma once
// streaming: attention sinks + a recent window (StreamingLLM). Needs no query and no keys.
// score[t] = t, and +inf for the first `sinks` tokens: any top-k selector with budget B then keeps
// the sinks and the B - sinks most recent tokens, which is the policy.

#include <limits>

#include "kvscout/core/shape.hpp"
#include "kvscout/score/concepts.hpp"

namespace kvscout {

namespace detail {
/// The config of both backends' streaming policies (streaming.cuh).
struct streaming_config {
  decode_shape shape{};  // num_kv_heads
  int sinks = 4;
};
}  // namespace detail

class streaming_policy_host {
 public:
  using config = detail::streaming_config;
  using config_type = config;
  static constexpr bool needs_query = false;

  explicit streaming_policy_host(const config& cfg) : cfg_(cfg) {
    KVSCOUT_EXPECTS(cfg.shape.num_kv_heads > 0, "num_kv_heads must be positive, got ",
                    cfg.shape.num_kv_heads);
    KVSCOUT_EXPECTS(cfg.sinks >= 0, "sinks must be non-negative, got ", cfg.sinks);
  }

  /// Any layer alike: the same call as streaming_policy_cuda's, and the layer-indexed one the host
  /// pipeline makes.
  void score(int /*layer*/, const score_context<host_space>& ctx,
             const score_buffer<host_space>& out, host_exec x = {}) const {
    score(ctx, out, x);
  }
  void score(const score_context<host_space>& ctx, const score_buffer<host_space>& out,
             host_exec = {}) const {
    detail::check_score_buffer(out, ctx, cfg_.shape.num_kv_heads);
    for (int s = 0; s < out.num_seqs; ++s) {
      for (int h = 0; h < out.num_kv_heads; ++h) {
        float* row = out.row(s, h);
        for (int t = 0; t < ctx.seq_lens[s]; ++t)
          row[t] = t < cfg_.sinks ? std::numeric_limits<float>::infinity() : static_cast<float>(t);
      }
    }
    detail::write_row_max(out, ctx);
  }

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }

 private:
  config cfg_;
};

static_assert(speculation_policy<streaming_policy_host>);

}  // namespace kvscout
