#pragma once
// infinigen: InfiniGen's speculation (Lee et al., OSDI'24). During layer i-1, layer i's partial
// query q~ is computed from layer i-1's normalised input x with layer i's partial W_Q (skew/), and
// scored against the partial keys of every cached token (cache/partial_key_cache.hpp):
//
//   logit~[s, qh, t] = scale * q~[s, qh] . pk[s, h, t],   h = qh / g
//   score[s, h, t]   = aggregate over the g query heads of the group (score/concepts.hpp)
//
// Layers without plans (below skip_layers) are not tracked: append() to them does nothing, score()
// of them throws. State (partial key caches, partial W_Q rows): the caller's where it passes
// memory_bytes(...) bytes to the constructor that takes `memory` last; otherwise allocated here.
//
//   auto ws = kvscout::make_workspace<kvscout::infinigen_policy_host<>>(cfg);
//   kvscout::infinigen_policy_host<> p(cfg, plans, w_q, b_q, ws.span());   // plans[layer][kv_head]
//   p.append(layer, s, t, k_pre_rope, k_post_rope);        // as tokens enter the cache
//   p.score(layer, {.x = x, .positions = pos, .seq_lens = lens}, out);   // during layer - 1

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvscout/cache/host_buffer.hpp"
#include "kvscout/cache/partial_key_cache.hpp"
#include "kvscout/cache/partial_key_store.hpp"
#include "kvscout/core/detail/checked_size.hpp"
#include "kvscout/core/dispatch.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/simd.hpp"
#include "kvscout/score/concepts.hpp"
#include "kvscout/score/detail/aggregate.hpp"
#include "kvscout/score/detail/infinigen_host_kernels.hpp"
#include "kvscout/score/detail/infinigen_host_memory.hpp"
#include "kvscout/score/infinigen_config.hpp"
#include "kvscout/skew/partial_query.hpp"
#include "kvscout/skew/plan.hpp"

namespace kvscout {

/// PkT: the partial keys' format: an element type (float, half, bfloat16) or
/// quantized_keys<Bits, Group> (scored from the codes); WT: the partial query weights' element
/// type (float, or the model's half / bfloat16: half the bytes the per-step GEMV reads).
template <partial_key_format PkT = float, compute_element WT = float>
class infinigen_policy_host {
 public:
  using config = infinigen_config;
  using config_type = config;
  static constexpr bool needs_query = false;
  using key_store = partial_key_store<PkT>;
  using mem_layout = detail::infinigen_host_memory<PkT, WT>;
  static constexpr bool quantized = detail::is_quantized_keys_v<PkT>;

  /// Scratch of one score() / score_query() / append(), sized for r = head_dim. Checks the config.
  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg) {
    return mem_layout::workspace_bytes(cfg);
  }
  static constexpr std::size_t workspace_alignment =
      alignof(rope_table) > alignof(float) ? alignof(rope_table) : alignof(float);

  /// plans[layer] is empty (layer not speculated) or holds one plan per KV head, all with the same
  /// r. w_q[layer] / b_q[layer]: layer's W_Q [num_q_heads * head_dim, d_model] and bias (may be
  /// empty), float or the model's half / bfloat16, read here only. workspace: at least
  /// workspace_bytes(cfg) bytes, the caller's, used by every later call (one call at a time) and
  /// not shared with anything else while the policy lives.
  infinigen_policy_host(const config& cfg, const std::vector<std::vector<skew_plan>>& plans,
                        const std::vector<host_span<const float>>& w_q,
                        const std::vector<host_span<const float>>& b_q,
                        host_span<std::byte> workspace)
      : infinigen_policy_host(build_tag{}, cfg, plans, nullptr, w_q, b_q, workspace) {}
  template <compute_element In>
    requires(!std::is_same_v<In, float>)
  infinigen_policy_host(const config& cfg, const std::vector<std::vector<skew_plan>>& plans,
                        const std::vector<host_span<const In>>& w_q,
                        const std::vector<host_span<const In>>& b_q,
                        host_span<std::byte> workspace)
      : infinigen_policy_host(build_tag{}, cfg, plans, nullptr, w_q, b_q, workspace) {}

  /// One cache read at two widths (kvscout's, not InfiniGen's): score() speculates with `plans`
  /// (r_s channels) and score_query() reads the wider `correction_plans` (r_c >= r_s channels,
  /// [layer][kv head]). A layer's cache holds r_c channels per token, the speculation's r_s first,
  /// so the speculation scores exactly as a policy built from `plans` alone. Each speculation
  /// plan's channels must be among its correction plan's, with the same mode, RoPE and rotation A:
  /// calibrate_skew with the same samples and a larger r gives such a plan.
  infinigen_policy_host(const config& cfg, const std::vector<std::vector<skew_plan>>& plans,
                        const std::vector<std::vector<skew_plan>>& correction_plans,
                        const std::vector<host_span<const float>>& w_q,
                        const std::vector<host_span<const float>>& b_q,
                        host_span<std::byte> workspace)
      : infinigen_policy_host(build_tag{}, cfg, plans, &correction_plans, w_q, b_q, workspace) {}
  template <compute_element In>
    requires(!std::is_same_v<In, float>)
  infinigen_policy_host(const config& cfg, const std::vector<std::vector<skew_plan>>& plans,
                        const std::vector<std::vector<skew_plan>>& correction_plans,
                        const std::vector<host_span<const In>>& w_q,
                        const std::vector<host_span<const In>>& b_q,
                        host_span<std::byte> workspace)
      : infinigen_policy_host(build_tag{}, cfg, plans, &correction_plans, w_q, b_q, workspace) {}

  /// The partial key caches (key_memory_bytes), then the partial W_Q rows (weight_memory_bytes),
  /// each piece at memory_alignment. Checks the config and each speculated layer's first plan.
  [[nodiscard]] static std::size_t memory_bytes(const config& cfg, const std::vector<std::vector<skew_plan>>& plans,
                                                const std::vector<std::vector<skew_plan>>& correction_plans = {}) {
    return detail::checked_sum("infinigen_policy_host memory bytes", key_memory_bytes(cfg, plans, correction_plans),
                               weight_memory_bytes(cfg, plans));
  }
  static constexpr std::size_t memory_alignment = mem_layout::memory_alignment;

  /// Every speculated layer's cache, at its correction plans' width where it has them.
  [[nodiscard]] static std::size_t key_memory_bytes(
      const config& cfg, const std::vector<std::vector<skew_plan>>& plans,
      const std::vector<std::vector<skew_plan>>& correction_plans = {}) {
    return mem_layout::key_memory_bytes(cfg, plans, correction_plans);
  }
  /// For every query head of every speculated layer: the rows, their bias, the rotation A[:, S] and
  /// the planes.
  [[nodiscard]] static std::size_t weight_memory_bytes(
      const config& cfg, const std::vector<std::vector<skew_plan>>& plans) {
    return mem_layout::weight_memory_bytes(cfg, plans);
  }

  /// The same policy with its state in the caller's memory: at least memory_bytes(cfg, plans,
  /// correction_plans) bytes at memory_alignment, written here, never freed here, not shared with
  /// anything else while the policy lives. correction_plans may be empty.
  template <compute_element In>
  infinigen_policy_host(const config& cfg, const std::vector<std::vector<skew_plan>>& plans,
                        const std::vector<std::vector<skew_plan>>& correction_plans,
                        const std::vector<host_span<const In>>& w_q,
                        const std::vector<host_span<const In>>& b_q,
                        host_span<std::byte> workspace, host_span<std::byte> memory)
      : infinigen_policy_host(build_tag{}, cfg, plans, correction_plans.empty() ? nullptr : &correction_plans,
                              w_q, b_q, workspace, &memory) {}

 private:
  struct build_tag {};
  void carve(host_span<std::byte> workspace) {
    const std::size_t need = workspace_bytes(cfg_);
    KVSCOUT_EXPECTS(workspace.size() >= need, "infinigen_policy_host: workspace holds ",
                    workspace.size(), " bytes, expected at least workspace_bytes(config) = ", need);
    KVSCOUT_EXPECTS(workspace.data() != nullptr, "infinigen_policy_host: workspace is null");
    KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(workspace.data()) % workspace_alignment == 0,
                    "infinigen_policy_host: workspace must be ", workspace_alignment,
                    "-byte aligned, got address ", static_cast<const void*>(workspace.data()));
    static_assert(std::is_trivially_destructible_v<rope_table>);
    static_assert(sizeof(rope_table) % alignof(float) == 0);
    rope_ = reinterpret_cast<rope_table*>(workspace.data());
    std::uninitialized_default_construct_n(rope_, query_block);
    qp_ = reinterpret_cast<float*>(workspace.data() + sizeof(rope_table) * query_block);
    pk_ =
        qp_ + static_cast<std::size_t>(query_block) * cfg_.shape.num_q_heads * cfg_.shape.head_dim;
    qm_ = pk_ + cfg_.shape.head_dim;
    lg_ = mem_layout::sum_prob_bytes(cfg_) > 0 ? qm_ + cfg_.shape.head_dim : nullptr;
    if constexpr (quantized)
      qw_ = qm_ + cfg_.shape.head_dim + mem_layout::sum_prob_bytes(cfg_) / sizeof(float);
  }
  template <compute_element In>
  infinigen_policy_host(build_tag, const config& cfg,
                        const std::vector<std::vector<skew_plan>>& plans,
                        const std::vector<std::vector<skew_plan>>* correction_plans,
                        const std::vector<host_span<const In>>& w_q,
                        const std::vector<host_span<const In>>& b_q, host_span<std::byte> workspace,
                        const host_span<std::byte>* caller_memory = nullptr)
      : cfg_(cfg), layers_(static_cast<std::size_t>(cfg.shape.num_layers)) {
    carve(workspace);  // checks the config too
    KVSCOUT_EXPECTS(plans.size() == layers_.size() && w_q.size() == layers_.size() &&
                        b_q.size() == layers_.size(),
                    "expected one entry per layer (", cfg.shape.num_layers, ") in plans (",
                    plans.size(), "), w_q (", w_q.size(), ") and b_q (", b_q.size(), ")");
    KVSCOUT_EXPECTS(correction_plans == nullptr || correction_plans->size() == layers_.size(),
                    "expected one entry per layer (", cfg.shape.num_layers,
                    ") in correction_plans (", correction_plans ? correction_plans->size() : 0,
                    ")");
    static const std::vector<std::vector<skew_plan>> none;
    const std::vector<std::vector<skew_plan>>& wide_plans = correction_plans ? *correction_plans : none;
    // Owned: the weights in one allocation and each cache its own (fresh pages, untouched until
    // written).
    host_span<std::byte> memory;
    std::size_t key_at = 0, weight_at = 0;  // the next layer's cache, the next head's weights
    if (caller_memory != nullptr) {
      memory = *caller_memory;
      detail::check_cache_memory("infinigen_policy_host memory", memory, memory_bytes(cfg, plans, wide_plans),
                                 memory_alignment);
      weight_at = key_memory_bytes(cfg, plans, wide_plans);
    } else {
      own_ = host_buffer<std::byte>(weight_memory_bytes(cfg, plans));
      memory = own_.span();
    }
    for (int l = 0; l < cfg.shape.num_layers; ++l) {
      const auto lu = static_cast<std::size_t>(l);
      const std::vector<skew_plan>* wide =
          correction_plans && !(*correction_plans)[lu].empty() ? &(*correction_plans)[lu] : nullptr;
      build_layer(l, plans[lu], wide, w_q[lu], b_q[lu], memory, caller_memory != nullptr, key_at,
                  weight_at);
    }
  }
  /// Checks layer l's speculation plans (and its correction plans, where given) and sets its
  /// plans, widths and key plans.
  void set_plans(int l, const std::vector<skew_plan>& pl, const std::vector<skew_plan>* wide) {
    auto& st = layers_[static_cast<std::size_t>(l)];
    KVSCOUT_EXPECTS(static_cast<int>(pl.size()) == cfg_.shape.num_kv_heads, "layer ", l, " has ",
                    pl.size(), " skew plans, expected one per kv head (", cfg_.shape.num_kv_heads,
                    ")");
    st.plans = pl;
    st.r = pl[0].r;
    for (const auto& p : pl) {
      detail::check_plan(p);
      KVSCOUT_EXPECTS(p.r == st.r, "layer ", l, " mixes partial dims ", st.r, " and ", p.r);
      KVSCOUT_EXPECTS(p.head_dim == cfg_.shape.head_dim, "layer ", l, " plan head_dim ",
                      p.head_dim, " differs from the model's ", cfg_.shape.head_dim);
      KVSCOUT_EXPECTS(p.mode == pl[0].mode && p.rope.head_dim == pl[0].rope.head_dim &&
                          p.rope.theta == pl[0].rope.theta && p.rope.style == pl[0].rope.style,
                      "layer ", l, " mixes RoPE modes or configurations across kv heads");
    }
    st.spec_r = st.r;
    KVSCOUT_EXPECTS(cfg_.r == 0 || (st.spec_r == cfg_.r && pl[0].mode == cfg_.mode), "layer ", l,
                    "'s plans have r = ", st.spec_r, " and mode ", to_string(pl[0].mode),
                    ", the config r = ", cfg_.r, " and mode ", to_string(cfg_.mode),
                    " (r = 0: the plans' own)");
    if (wide == nullptr) {
      st.key_plans = pl;
      return;
    }
    KVSCOUT_EXPECTS(static_cast<int>(wide->size()) == cfg_.shape.num_kv_heads, "layer ", l, " has ",
                    wide->size(), " correction plans, expected one per kv head (",
                    cfg_.shape.num_kv_heads, ")");
    for (int h = 0; h < cfg_.shape.num_kv_heads; ++h) {
      const skew_plan& w = (*wide)[static_cast<std::size_t>(h)];
      detail::check_plan(w);
      KVSCOUT_EXPECTS(w.r == (*wide)[0].r, "layer ", l, " mixes correction partial dims ",
                      (*wide)[0].r, " and ", w.r);
      st.key_plans.push_back(
          detail::nested_key_plan(pl[static_cast<std::size_t>(h)], w,
                                  "layer " + std::to_string(l) + ", kv head " + std::to_string(h)));
    }
    st.r = (*wide)[0].r;
    KVSCOUT_EXPECTS(cfg_.correction_r == 0 || st.r == cfg_.correction_r, "layer ", l,
                    "'s correction plans have r = ", st.r, ", the config correction_r = ",
                    cfg_.correction_r, " (0: the plans' own)");
  }
  /// Layer l's state: its plans, its partial W_Q rows placed in `memory` at weight_at, its RoPE
  /// frequencies and planes, and its key cache (in `memory` at key_at where the caller gave it).
  template <compute_element In>
  void build_layer(int l, const std::vector<skew_plan>& pl, const std::vector<skew_plan>* wide,
                   host_span<const In> w_q, host_span<const In> b_q, host_span<std::byte> memory,
                   bool caller_memory, std::size_t& key_at, std::size_t& weight_at) {
    KVSCOUT_EXPECTS(!(pl.empty() && wide), "layer ", l,
                    " has correction plans but no speculation plans; the correction reads the "
                    "speculated layers' caches");
    if (pl.empty()) return;
    set_plans(l, pl, wide);
    auto& st = layers_[static_cast<std::size_t>(l)];
    const int g = cfg_.shape.num_q_heads / cfg_.shape.num_kv_heads;
    const typename mem_layout::weight_sizes wz =
        mem_layout::head_weight_sizes(cfg_, pl[0]);  // one r and mode per layer
    for (int qh = 0; qh < cfg_.shape.num_q_heads; ++qh) {
      st.weights.push_back(mem_layout::place_weights(
          detail::make_partial_query_weights_from(pl[static_cast<std::size_t>(qh / g)], w_q, b_q,
                                                  cfg_.shape.d_model, qh),
          wz, memory.data(), weight_at));
    }
    if (st.plans[0].mode != rope_mode::pre_rope_folded) {
      KVSCOUT_EXPECTS(cfg_.shape.head_dim <= 2 * rope_table::max_planes, "layer ", l,
                      ": head_dim ", cfg_.shape.head_dim, " exceeds the RoPE modes' limit ",
                      2 * rope_table::max_planes);
      st.freq = rope_frequencies(st.plans[0].rope);
    }
    if (st.plans[0].mode == rope_mode::rope_planes) {
      for (const auto& p : pl)
        st.rope_planes.insert(st.rope_planes.end(), p.planes.begin(), p.planes.end());
      std::sort(st.rope_planes.begin(), st.rope_planes.end());
      st.rope_planes.erase(std::unique(st.rope_planes.begin(), st.rope_planes.end()),
                           st.rope_planes.end());
    }
    const decode_shape& sh = cfg_.shape;
    if (!caller_memory) {
      st.cache = key_store(sh.num_seqs, sh.num_kv_heads, st.r, sh.max_tokens);
    } else {
      const std::size_t b = mem_layout::key_layer_bytes(cfg_, st.r);  // padded to the alignment
      st.cache = key_store(sh.num_seqs, sh.num_kv_heads, st.r, sh.max_tokens,
                           memory.subspan(key_at, b));
      key_at += b;
    }
  }

 public:

  [[nodiscard]] bool tracks(int layer) const {
    return layer >= 0 && layer < cfg_.shape.num_layers &&
           !layers_[static_cast<std::size_t>(layer)].plans.empty();
  }
  [[nodiscard]] const key_store& keys(int layer) const {
    check_layer(layer);
    return state(layer).cache;
  }
  /// One plan per kv head whose channels are the cache's in order: the correction plans where the
  /// layer has them (the speculation's channels first), else the speculation's.
  [[nodiscard]] const std::vector<skew_plan>& key_plans(int layer) const {
    check_layer(layer);
    return state(layer).key_plans;
  }
  [[nodiscard]] int speculation_channels(int layer) const {
    check_layer(layer);
    return state(layer).spec_r;
  }
  [[nodiscard]] int correction_channels(int layer) const {
    check_layer(layer);
    return state(layer).r;
  }

  /// Token t of sequence s entered layer `layer`'s cache; k_pre / k_post are its keys before and
  /// after RoPE, [num_kv_heads, head_dim] floats (equal for models without RoPE). A layer without
  /// plans keeps no keys (appending does nothing); a layer outside [0, num_layers) throws.
  void append(int layer, int s, int t, const float* k_pre, const float* k_post, host_exec = {}) {
    check_layer(layer);
    if (!tracks(layer)) return;
    layer_state& st = state(layer);
    const bool pre = st.plans[0].mode == rope_mode::pre_rope_folded;  // one mode per layer
    KVSCOUT_EXPECTS((pre ? k_pre : k_post) != nullptr, "infinigen_policy_host::append: ",
                    pre ? "k_pre" : "k_post", " is null (layer ", layer, ", token ", t, ")");
    if constexpr (quantized) {
      // A quantised cache refuses non-finite values: every head's key is projected and checked
      // before any is written, so a refusal writes nothing.
      const std::size_t r = static_cast<std::size_t>(st.r);
      for (int h = 0; h < cfg_.shape.num_kv_heads; ++h) {
        const float* k = (pre ? k_pre : k_post) + static_cast<std::size_t>(h) * cfg_.shape.head_dim;
        detail::project_key_checked_plan(st.key_plans[static_cast<std::size_t>(h)], k, qp_ + h * r);
        st.cache.check_append(s, h, t, qp_ + h * r);
      }
      for (int h = 0; h < cfg_.shape.num_kv_heads; ++h) st.cache.append(s, h, t, qp_ + h * r);
    } else {
      for (int h = 0; h < cfg_.shape.num_kv_heads; ++h) {
        const skew_plan& p = st.key_plans[static_cast<std::size_t>(h)];
        const float* k = (pre ? k_pre : k_post) + static_cast<std::size_t>(h) * cfg_.shape.head_dim;
        detail::project_key_checked_plan(p, k, pk_);
        st.cache.append(s, h, t, pk_);
      }
    }
  }

  void score(int layer, const score_context<host_space>& ctx, const score_buffer<host_space>& out,
             host_exec = {}) {
    KVSCOUT_EXPECTS(tracks(layer), "layer ", layer, " has no skew plans (below skip_layers?)");
    detail::check_score_buffer(out, ctx, cfg_.shape.num_kv_heads, cfg_.shape.num_seqs,
                               cfg_.shape.max_tokens);
    layer_state& st = state(layer);
    const int S = out.num_seqs, H = cfg_.shape.num_kv_heads, Hq = cfg_.shape.num_q_heads,
              g = Hq / H, r = st.spec_r;
    KVSCOUT_EXPECTS(ctx.x.size() >= static_cast<std::size_t>(S) * cfg_.shape.d_model, "x holds ",
                    ctx.x.size(), " floats, expected [", S, ", ", cfg_.shape.d_model, "]");
    KVSCOUT_EXPECTS(ctx.positions.size() >= static_cast<std::size_t>(S), "positions holds ",
                    ctx.positions.size(), " entries, expected ", S);
    // Sequences in blocks of query_block, so each head's weights come from memory once per block.
    const bool rope = st.plans[0].mode != rope_mode::pre_rope_folded;
    const bool some_planes = !st.rope_planes.empty();
    const std::size_t ldq = static_cast<std::size_t>(Hq) * r;
    for (int s0 = 0; s0 < S; s0 += query_block) {
      const int count = std::min(query_block, S - s0);
      if (rope)
        for (int v = 0; v < count; ++v) {
          rope_table& rt = rope_[v];
          if (some_planes) {
            rt.fill(st.freq, ctx.positions[s0 + v], st.rope_planes.data(),
                    static_cast<int>(st.rope_planes.size()));
          } else {
            rt.fill(st.freq, ctx.positions[s0 + v]);
          }
        }
      const float* x = ctx.x.data() + static_cast<std::size_t>(s0) * cfg_.shape.d_model;
      for (int qh = 0; qh < Hq; ++qh) {
        float* q = qp_ + static_cast<std::size_t>(qh) * r;
        partial_queries(st.weights[static_cast<std::size_t>(qh)], x,
                        static_cast<std::size_t>(cfg_.shape.d_model), count, rope_, q, ldq);
        for (int v = 0; v < count; ++v)
          for (int c = 0; c < r; ++c) q[v * ldq + static_cast<std::size_t>(c)] *= cfg_.shape.scale;
      }
      for (int v = 0; v < count; ++v)
        for (int h = 0; h < H; ++h) {
          const int b = s0 + v;
          const float* qg = qp_ + v * ldq + static_cast<std::size_t>(h) * g * r;
          const float top =
              score_row(st, qg, r, detail::seq_of(ctx, b), h, g, ctx.seq_lens[b], out.row(b, h),
                      cfg_.aggregation);
          if (!out.row_max.empty()) out.row_max[static_cast<std::size_t>(b) * H + h] = top;
        }
    }
  }

  /// The correction step's scores (kvscout's, not InfiniGen's): layer `layer`'s own query
  /// ctx.q [num_seqs, num_q_heads, head_dim], after RoPE, projected by the layer's plans as a key
  /// is and scored against the same partial keys, aggregated as score() does:
  ///
  ///   logit[s, qh, t] = scale * ((q[s, qh] A_h)[S_h]) . pk[s, h, t],   h = qh / g
  ///
  /// Runs at the start of layer `layer`, when its query exists. A pre_rope_folded layer keeps
  /// pre-RoPE partial keys, which a query after RoPE does not match: refused. Allocates nothing.
  void score_query(int layer, const score_context<host_space>& ctx,
                   const score_buffer<host_space>& out, host_exec = {}) {
    KVSCOUT_EXPECTS(tracks(layer), "layer ", layer, " has no skew plans (below skip_layers?)");
    detail::check_score_buffer(out, ctx, cfg_.shape.num_kv_heads, cfg_.shape.num_seqs,
                               cfg_.shape.max_tokens);
    layer_state& st = state(layer);
    KVSCOUT_EXPECTS(st.plans[0].mode != rope_mode::pre_rope_folded, "score_query: layer ", layer,
                    "'s plans are pre_rope_folded (partial keys before RoPE); a query after RoPE "
                    "needs post_rope_skew or rope_planes plans");
    const int S = out.num_seqs, H = cfg_.shape.num_kv_heads, Hq = cfg_.shape.num_q_heads,
              g = Hq / H, r = st.r;
    const std::size_t qrow = static_cast<std::size_t>(Hq) * cfg_.shape.head_dim;
    KVSCOUT_EXPECTS(ctx.q.size() >= static_cast<std::size_t>(S) * qrow, "q holds ", ctx.q.size(),
                    " floats, expected [", S, ", ", Hq, ", ", cfg_.shape.head_dim, "]");
    float* qg = qp_;  // [g, r]: one group's scaled partial queries
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h) {
        const skew_plan& p = st.key_plans[static_cast<std::size_t>(h)];
        for (int j = 0; j < g; ++j) {
          const float* q = ctx.q.data() + static_cast<std::size_t>(s) * qrow +
                           static_cast<std::size_t>(h * g + j) * cfg_.shape.head_dim;
          float* out_q = qg + static_cast<std::size_t>(j) * r;
          detail::project_key_checked_plan(p, q, out_q);
          for (int c = 0; c < r; ++c) out_q[c] *= cfg_.shape.scale;
        }
        const float top =
            score_row(st, qg, r, detail::seq_of(ctx, s), h, g, ctx.seq_lens[s], out.row(s, h),
                      cfg_.late_aggregation());
        if (!out.row_max.empty()) out.row_max[static_cast<std::size_t>(s) * H + h] = top;
      }
  }

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }

 private:
  struct layer_state {
    std::vector<skew_plan> plans;                 // [num_kv_heads] the speculation's
    std::vector<skew_plan> key_plans;             // [num_kv_heads] the cache's (the correction's)
    std::vector<detail::partial_query_weights_view<WT>>
        weights;  // [num_q_heads], in the state memory
    key_store cache;
    int r = 0;        // the cache's channels (score_query reads them all)
    int spec_r = 0;   // the speculation's: the first spec_r of them
    // rope_planes mode: the planes the kv heads' plans rotate (sorted, unique); empty otherwise.
    std::vector<int> rope_planes;
    rope_frequencies freq;   // the layer's RoPE (one per layer: layers may differ in theta)
  };

  void check_layer(int layer) const {
    KVSCOUT_EXPECTS(layer >= 0 && layer < cfg_.shape.num_layers, "layer ", layer,
                    " is out of range [0, ", cfg_.shape.num_layers, ")");
  }
  layer_state& state(int layer) { return layers_[static_cast<std::size_t>(layer)]; }
  const layer_state& state(int layer) const { return layers_[static_cast<std::size_t>(layer)]; }

  // One (s, h) row. The g query heads of the group are scored together, so the loop is bound by
  // reading the keys. qg: [g, r]; r: the first r of the cache's channels. Returns the row's largest
  // non-NaN score (-inf if none).
  float score_row(const layer_state& st, const float* qg, int r, int s, int h, int g, int n,
                  float* row, gqa_aggregation agg) {
    return detail::host_score_row<PkT>(st.cache, qg, r, s, h, g, n, row, agg,
                                       {lg_, qm_, qw_, cfg_.shape.max_tokens});
  }

  static constexpr int query_block = mem_layout::query_block;

  config cfg_;
  host_buffer<std::byte> own_;  // the partial weights, where the caller gave no memory
  std::vector<layer_state> layers_;
  // Scratch in the caller's workspace, sized for r = head_dim; a layer uses the first r of each.
  float* qp_ = nullptr;    // [query_block, num_q_heads, r] scaled partial queries
  float* pk_ = nullptr;    // [r] one projected key
  float* qm_ = nullptr;    // [r] a group's mean partial query (mean_logit)
  float* lg_ = nullptr;    // [g, max_tokens] a group's logit rows (sum_prob; null otherwise)
  float* qw_ = nullptr;    // quantized only: [g, r] a tile's products q_c step_c per query head
  rope_table* rope_ = nullptr;   // [query_block]: each sequence's rotation, shared by all heads
};

static_assert(speculation_policy<infinigen_policy_host<>>);
static_assert(speculation_policy<infinigen_policy_host<half, bfloat16>>);
static_assert(speculation_policy<infinigen_policy_host<quantized_keys<4>>>);

}  // namespace kvscout
