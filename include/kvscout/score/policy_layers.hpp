#pragma once
// policy_layers<P>: one per-layer policy P for each speculated layer of a model, as the one
// speculation_policy the host pipeline calls with a layer index. A layer without a policy (a dense
// layer, below skip_layers) is not tracked: append() to it does nothing, score() of it throws. The
// policies are the caller's (by pointer) or built here with their workspaces owned (emplace: host
// memory for a host policy, device memory for a CUDA one); pointers() is what the CUDA stages take.
//
//   kvscout::policy_layers<P> layers(num_layers);
//   layers.emplace(l, cfg, plans, w_q, b_q);      // P(cfg, plans, w_q, b_q, workspace)
//   layers.score(l, ctx, out);                      // layers[l].score(ctx, out)

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvscout/core/error.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/score/concepts.hpp"
#include "kvscout/skew/plan.hpp"

namespace kvscout {

namespace detail {
/// Runs f; a kvscout::error it throws comes back with "layer l: " before its message.
template <class F>
void with_layer_context(int layer, F&& f) {
  try {
    f();
  } catch (const error& e) {
    throw error("layer " + std::to_string(layer) + ": " + e.message(), e.function(), e.file(),
                e.line());
  }
}
}  // namespace detail

template <class P>
class policy_layers {
 public:
  using policy_type = P;
  static constexpr bool needs_query = false;
  /// A host policy (else a CUDA one: emplace() gives it device memory, and only pointers() serves).
  static constexpr bool host_policy = std::is_same_v<typename P::memory_space, host_space>;

  /// num_layers layers, none tracked until emplace().
  explicit policy_layers(int num_layers) : at_(checked_layers(num_layers), nullptr) {}
  /// The caller's policies, one entry per layer (null: not tracked); they outlive this.
  explicit policy_layers(std::vector<P*> layers) : at_(std::move(layers)) {
    checked_layers(static_cast<int>(at_.size()));
  }

  /// Builds layer `layer`'s policy as P(cfg, args..., workspace) with a workspace of
  /// P::workspace_bytes(cfg) bytes owned here. Set-up only: allocates.
  template <class... A>
  P& emplace(int layer, const typename P::config_type& cfg, A&&... args) {
    check_layer(layer);
    KVSCOUT_EXPECTS(at_[static_cast<std::size_t>(layer)] == nullptr, "layer ", layer,
                    " already has a policy");
    auto o = std::make_unique<owned>(cfg, std::forward<A>(args)...);
    P* p = &o->policy;
    owned_.push_back(std::move(o));
    at_[static_cast<std::size_t>(layer)] = p;
    return *p;
  }

  [[nodiscard]] int num_layers() const noexcept { return static_cast<int>(at_.size()); }
  [[nodiscard]] bool tracks(int layer) const noexcept {
    return layer >= 0 && layer < num_layers() && at_[static_cast<std::size_t>(layer)] != nullptr;
  }
  /// Layer `layer`'s policy; throws where it has none.
  [[nodiscard]] P& operator[](int layer) { return get(layer); }
  [[nodiscard]] const P& operator[](int layer) const { return get(layer); }

  /// Token t of sequence s entered layer `layer`'s cache; k_pre / k_post: its keys before and after
  /// RoPE, [num_kv_heads, head_dim] floats. The policy takes the ones its mode reads
  /// (P::rotated_keys()). A layer without a policy keeps no keys; one outside the model throws.
  void append(int layer, int s, int t, const float* k_pre, const float* k_post, host_exec x = {})
    requires host_policy
  {
    check_layer(layer);
    if (!tracks(layer)) return;
    P& p = get(layer);
    const float* k = p.rotated_keys() ? k_post : k_pre;
    KVSCOUT_EXPECTS(k != nullptr, "policy_layers::append: ", p.rotated_keys() ? "k_post" : "k_pre",
                    " is null (layer ", layer, ", token ", t, ")");
    const auto& sh = p.configuration().shape;
    const std::int32_t seq = s, tok = t;
    p.append(host_span<const float>(k, static_cast<std::size_t>(sh.num_kv_heads) * sh.head_dim),
             host_span<const std::int32_t>(&seq, 1), host_span<const std::int32_t>(&tok, 1), 1, x);
  }
  void score(int layer, const score_context<host_space>& ctx, const score_buffer<host_space>& out,
             host_exec x = {})
    requires host_policy
  {
    get(layer).score(ctx, out, x);
  }
  /// The correction step's scores of layer `layer` from its own query ctx.q.
  void score_query(int layer, const score_context<host_space>& ctx,
                   const score_buffer<host_space>& out, host_exec x = {})
    requires host_policy &&
             requires(P& p, const score_context<host_space>& c, const score_buffer<host_space>& o) {
               p.score_query(c.q, c, o, host_exec{});
             }
  {
    get(layer).score_query(ctx.q, ctx, out, x);
  }
  /// [num_layers]: layer l's policy, null where it has none (what speculation_stages_cuda takes).
  [[nodiscard]] const std::vector<P*>& pointers() const noexcept { return at_; }

 private:
  struct owned {
    std::conditional_t<host_policy, host_workspace, device_workspace> workspace;
    P policy;
    template <class... A>
    explicit owned(const typename P::config_type& cfg, A&&... args)
        : workspace(P::workspace_bytes(cfg), P::workspace_alignment),
          policy(cfg, std::forward<A>(args)..., workspace.span()) {}
  };

  static std::size_t checked_layers(int n) {
    KVSCOUT_EXPECTS(n > 0, "policy_layers: num_layers = ", n, " must be positive");
    return static_cast<std::size_t>(n);
  }
  void check_layer(int layer) const {
    KVSCOUT_EXPECTS(layer >= 0 && layer < num_layers(), "layer ", layer, " is out of range [0, ",
                    num_layers(), ")");
  }
  P& get(int layer) const {
    check_layer(layer);
    KVSCOUT_EXPECTS(tracks(layer), "layer ", layer,
                    " has no policy (not speculated: below skip_layers?)");
    return *at_[static_cast<std::size_t>(layer)];
  }

  std::vector<P*> at_;                          // [num_layers], null: not tracked
  std::vector<std::unique_ptr<owned>> owned_;  // the ones emplace() built
};

}  // namespace kvscout
