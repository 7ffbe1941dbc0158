#pragma once
// infinigen_query_scores_host: the host InfiniGen policy's score_query (score/infinigen.hpp) as a
// speculation_policy of its own.

#include "kvscout/core/exec.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/score/concepts.hpp"
#include "kvscout/score/infinigen.hpp"

namespace kvscout {

/// policy_layers<infinigen_policy_host>'s score_query as a policy of its own (needs_query = true): a pipeline's
/// correction step, or the late ranking alone. Holds a reference; the policy outlives it. append()
/// feeds the policy's partial keys.
template <class P>
class infinigen_query_scores_host {
 public:
  static constexpr bool needs_query = true;
  explicit infinigen_query_scores_host(P& policy) : p_(&policy) {}
  void score(int layer, const score_context<host_space>& ctx, const score_buffer<host_space>& out,
             host_exec x = {}) {
    p_->score_query(layer, ctx, out, x);
  }
  void append(int layer, int s, int t, const float* k_pre, const float* k_post, host_exec x = {}) {
    p_->append(layer, s, t, k_pre, k_post, x);
  }

 private:
  P* p_;
};

static_assert(speculation_policy<infinigen_query_scores_host<policy_layers<infinigen_policy_host<>>>>);

}  // namespace kvscout
