#pragma once
// infinigen: InfiniGen's speculation (Lee et al., OSDI'24) for one layer, on the host. During layer
// i-1, layer i's partial query q~ is computed from layer i-1's normalised input x with layer i's
// partial W_Q (skew/), and scored against the partial keys of every cached token:
//
//   logit~[s, qh, t] = scale * q~[s, qh] . pk[s, h, t],   h = qh / g
//   score[s, h, t]   = aggregate over the g query heads of the group (score/concepts.hpp)
//
// The same config, constructor, workspace query and calls as infinigen_policy_cuda (score/
// infinigen.cuh), with host spans and host_exec. Its state (the partial key cache and the partial
// W_Q rows) and scratch live in the caller's workspace. policy_layers (score/policy_layers.hpp)
// holds one per speculated layer for the host pipeline; layers() builds them from calibrate_skew's
// plans.
//
//   auto ws = kvscout::make_workspace<kvscout::infinigen_policy_host<>>(cfg);
//   kvscout::infinigen_policy_host<> p(cfg, plans, w_q, b_q, ws.span());   // plans[kv_head]
//   p.append(keys, seq_ids, token_ids, count);                  // as tokens enter the cache
//   p.score({.x = x, .positions = pos, .seq_lens = lens}, out);  // during layer i - 1

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
#include "kvscout/core/workspace.hpp"
#include "kvscout/score/concepts.hpp"
#include "kvscout/score/detail/aggregate.hpp"
#include "kvscout/score/detail/infinigen_host_kernels.hpp"
#include "kvscout/score/detail/infinigen_host_memory.hpp"
#include "kvscout/score/infinigen_config.hpp"
#include "kvscout/score/policy_layers.hpp"
#include "kvscout/skew/partial_query.hpp"
#include "kvscout/skew/plan.hpp"

namespace kvscout {

/// PkT: the partial keys' format: an element type (float, half, bfloat16) or
/// quantized_keys<Bits, Group> (scored from the codes); WT: the partial query weights' element
/// type (float, or the model's half / bfloat16: half the bytes the per-step GEMV reads).
template <partial_key_format PkT = float, compute_element WT = float>
class infinigen_policy_host {
  using mem_layout = detail::infinigen_host_memory<PkT, WT>;

 public:
  using config = infinigen_config;
  using config_type = config;
  using memory_space = host_space;
  using key_format = PkT;
  using key_store = detail::partial_key_store<PkT>;
  static constexpr bool quantized = detail::is_quantized_keys_v<PkT>;

  /// The scratch, the partial key cache (cfg.key_r() channels) and the partial W_Q rows. Checks
  /// the config.
  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg) {
    return mem_layout::workspace_bytes(cfg);
  }
  static constexpr std::size_t workspace_alignment = mem_layout::memory_alignment;

  /// plans: one per kv head (mode, r, head_dim as in cfg); w_q [num_q_heads * head_dim, d_model],
  /// b_q [num_q_heads * head_dim] or empty, float or the model's half / bfloat16, read here only.
  /// workspace: at least workspace_bytes(cfg) bytes at workspace_alignment, the caller's, not
  /// shared with anything else while the policy lives (one call at a time).
  infinigen_policy_host(const config& cfg, const std::vector<skew_plan>& plans,
                        host_span<const float> w_q, host_span<const float> b_q,
                        host_span<std::byte> workspace)
      : infinigen_policy_host(build_tag{}, cfg, plans, nullptr, w_q, b_q, workspace) {}
  template <compute_element In>
    requires(!std::is_same_v<In, float>)
  infinigen_policy_host(const config& cfg, const std::vector<skew_plan>& plans,
                        host_span<const In> w_q, host_span<const In> b_q,
                        host_span<std::byte> workspace)
      : infinigen_policy_host(build_tag{}, cfg, plans, nullptr, w_q, b_q, workspace) {}

  /// One cache read at two widths (kvscout's, not InfiniGen's): score() reads cfg.r channels,
  /// score_query() all cfg.correction_r of `correction_plans` (one per kv head, each holding its
  /// speculation plan's channels, with the same mode, RoPE and rotation: calibrate_skew with the
  /// same samples and a larger r gives such a plan). The speculation scores exactly as a policy
  /// built from `plans` alone.
  infinigen_policy_host(const config& cfg, const std::vector<skew_plan>& plans,
                        const std::vector<skew_plan>& correction_plans, host_span<const float> w_q,
                        host_span<const float> b_q, host_span<std::byte> workspace)
      : infinigen_policy_host(build_tag{}, cfg, plans, &correction_plans, w_q, b_q, workspace) {}
  template <compute_element In>
    requires(!std::is_same_v<In, float>)
  infinigen_policy_host(const config& cfg, const std::vector<skew_plan>& plans,
                        const std::vector<skew_plan>& correction_plans, host_span<const In> w_q,
                        host_span<const In> b_q, host_span<std::byte> workspace)
      : infinigen_policy_host(build_tag{}, cfg, plans, &correction_plans, w_q, b_q, workspace) {}

  /// One policy per layer that has plans (a layer whose plans[l] is empty is not speculated), from
  /// calibrate_skew's [layer][kv head] plans and each layer's W_Q / b_Q; each with its own
  /// workspace. cfg.r, cfg.mode and cfg.correction_r may be 0 / any: each layer's are its plans'
  /// own (where set, the plans must agree, and a correction_r needs correction plans for every
  /// speculated layer). correction_plans: none, or one entry per layer.
  template <class In>  // unconstrained: clang 14 crashes on a constrained member alias
  using layer_spans = std::vector<host_span<const In>>;  // [layer] a W_Q or b_Q
  using layer_plans = std::vector<std::vector<skew_plan>>;  // [layer][kv head]
  [[nodiscard]] static policy_layers<infinigen_policy_host> layers(
      const config& cfg, const layer_plans& plans, const layer_plans& correction_plans,
      const layer_spans<float>& w_q, const layer_spans<float>& b_q) {
    return detail::build_infinigen_layers<infinigen_policy_host, float>(cfg, plans, correction_plans, w_q, b_q);
  }
  [[nodiscard]] static policy_layers<infinigen_policy_host> layers(
      const config& cfg, const layer_plans& plans, const layer_spans<float>& w_q,
      const layer_spans<float>& b_q) {
    return detail::build_infinigen_layers<infinigen_policy_host, float>(cfg, plans, {}, w_q, b_q);
  }
  template <compute_element In>
    requires(!std::is_same_v<In, float>)
  [[nodiscard]] static policy_layers<infinigen_policy_host> layers(
      const config& cfg, const layer_plans& plans, const layer_plans& correction_plans,
      const layer_spans<In>& w_q, const layer_spans<In>& b_q) {
    return detail::build_infinigen_layers<infinigen_policy_host, In>(cfg, plans, correction_plans, w_q, b_q);
  }
  template <compute_element In>
    requires(!std::is_same_v<In, float>)
  [[nodiscard]] static policy_layers<infinigen_policy_host> layers(
      const config& cfg, const layer_plans& plans, const layer_spans<In>& w_q,
      const layer_spans<In>& b_q) {
    return detail::build_infinigen_layers<infinigen_policy_host, In>(cfg, plans, {}, w_q, b_q);
  }

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }
  /// Whether append() takes keys after RoPE (every mode but pre_rope_folded).
  [[nodiscard]] bool rotated_keys() const noexcept { return cfg_.mode != rope_mode::pre_rope_folded; }
  [[nodiscard]] const key_store& keys() const noexcept { return cache_; }
  /// One plan per kv head whose channels are the cache's in order: the correction plans where
  /// given (the speculation's channels first), else the speculation's.
  [[nodiscard]] const std::vector<skew_plan>& key_plans() const noexcept { return key_plans_; }

  /// Projects and stores `count` tokens' partial keys: keys [count, num_kv_heads, head_dim] (after
  /// RoPE at their own positions unless the mode is pre_rope_folded); token n goes to sequence
  /// seq_ids[n], position token_ids[n]. Every pair is checked before any is written. A quantised
  /// cache takes each sequence's tokens in order and refuses a non-finite value; a token it
  /// refuses is not written (the ones before it are).
  template <class KSpan = const float>
  void append(host_span<KSpan> keys, host_span<const int32_t> seq_ids,
              host_span<const int32_t> token_ids, int count, host_exec = {}) {
    using K = std::remove_const_t<KSpan>;
    static_assert(compute_element<K>,
                  "kvscout::infinigen_policy_host::append: keys must be float, half or bfloat16");
    const decode_shape& sh = cfg_.shape;
    const std::size_t row = static_cast<std::size_t>(sh.num_kv_heads) * sh.head_dim;
    check_append(keys.size(), keys.data() != nullptr, row, seq_ids, token_ids, count);
    for (int n = 0; n < count; ++n)
      append_token(seq_ids[n], token_ids[n], keys.data() + static_cast<std::size_t>(n) * row);
  }

  /// Writes out.scores[s, h, t] for t < seq_lens[s] and, where given, out.row_max.
  void score(const score_context<host_space>& ctx, const score_buffer<host_space>& out,
             host_exec = {}) {
    check_scores(ctx, out);
    const int S = out.num_seqs, H = cfg_.shape.num_kv_heads, Hq = cfg_.shape.num_q_heads,
              g = Hq / H, r = cfg_.r;
    KVSCOUT_EXPECTS(ctx.x.size() >= static_cast<std::size_t>(S) * cfg_.shape.d_model, "x holds ",
                    ctx.x.size(), " floats, expected [", S, ", ", cfg_.shape.d_model, "]");
    KVSCOUT_EXPECTS(ctx.positions.size() >= static_cast<std::size_t>(S), "positions holds ",
                    ctx.positions.size(), " entries, expected ", S);
    // Sequences in blocks of query_block, so each head's weights come from memory once per block.
    const std::size_t ldq = static_cast<std::size_t>(Hq) * r;
    for (int s0 = 0; s0 < S; s0 += query_block) {
      const int count = std::min(query_block, S - s0);
      if (rotated_keys())
        for (int v = 0; v < count; ++v) fill_rope(rope_[v], ctx.positions[s0 + v]);
      const float* x = ctx.x.data() + static_cast<std::size_t>(s0) * cfg_.shape.d_model;
      for (int qh = 0; qh < Hq; ++qh) {
        float* q = qp_ + static_cast<std::size_t>(qh) * r;
        partial_queries(weights_[static_cast<std::size_t>(qh)], x,
                        static_cast<std::size_t>(cfg_.shape.d_model), count, rope_, q, ldq);
        for (int v = 0; v < count; ++v)
          for (int c = 0; c < r; ++c) q[v * ldq + static_cast<std::size_t>(c)] *= cfg_.shape.scale;
      }
      for (int v = 0; v < count; ++v)
        for (int h = 0; h < H; ++h) {
          const int b = s0 + v;
          const float* qg = qp_ + v * ldq + static_cast<std::size_t>(h) * g * r;
          const float top = score_row(qg, r, detail::seq_of(ctx, b), h, g, ctx.seq_lens[b],
                                      out.row(b, h), cfg_.aggregation);
          if (!out.row_max.empty()) out.row_max[static_cast<std::size_t>(b) * H + h] = top;
        }
    }
  }

  /// The correction step's scores (kvscout's, not InfiniGen's): the layer's own query
  /// q [num_seqs, num_q_heads, head_dim], after RoPE, projected by the key plans as a key is and
  /// scored against all cfg.key_r() cached channels, aggregated by cfg.late_aggregation():
  ///
  ///   logit[s, qh, t] = scale * ((q[s, qh] A_h)[S_h]) . pk[s, h, t],   h = qh / g
  ///
  /// A pre_rope_folded policy keeps pre-RoPE partial keys, which a query after RoPE does not
  /// match: refused. Allocates nothing.
  void score_query(host_span<const float> q, const score_context<host_space>& ctx,
                   const score_buffer<host_space>& out, host_exec = {}) {
    check_scores(ctx, out);
    KVSCOUT_EXPECTS(rotated_keys(), "score_query: the plans are pre_rope_folded (partial keys "
                    "before RoPE); a query after RoPE needs post_rope_skew or rope_planes plans");
    const int S = out.num_seqs, H = cfg_.shape.num_kv_heads, Hq = cfg_.shape.num_q_heads,
              g = Hq / H, r = cfg_.key_r();
    const std::size_t qrow = static_cast<std::size_t>(Hq) * cfg_.shape.head_dim;
    KVSCOUT_EXPECTS(q.size() >= static_cast<std::size_t>(S) * qrow, "q holds ", q.size(),
                    " floats, expected [", S, ", ", Hq, ", ", cfg_.shape.head_dim, "]");
    float* qg = qp_;  // [g, r]: one group's scaled partial queries
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h) {
        const skew_plan& p = key_plans_[static_cast<std::size_t>(h)];
        for (int j = 0; j < g; ++j) {
          const float* qh = q.data() + static_cast<std::size_t>(s) * qrow +
                            static_cast<std::size_t>(h * g + j) * cfg_.shape.head_dim;
          float* out_q = qg + static_cast<std::size_t>(j) * r;
          detail::project_key_checked_plan(p, qh, out_q);
          for (int c = 0; c < r; ++c) out_q[c] *= cfg_.shape.scale;
        }
        const float top = score_row(qg, r, detail::seq_of(ctx, s), h, g, ctx.seq_lens[s],
                                    out.row(s, h), cfg_.late_aggregation());
        if (!out.row_max.empty()) out.row_max[static_cast<std::size_t>(s) * H + h] = top;
      }
  }

 private:
  static constexpr int query_block = mem_layout::query_block;

  struct build_tag {};

  template <compute_element In>
  infinigen_policy_host(build_tag, const config& cfg, const std::vector<skew_plan>& plans,
                        const std::vector<skew_plan>* correction_plans, host_span<const In> w_q,
                        host_span<const In> b_q, host_span<std::byte> workspace)
      : cfg_(cfg) {
    const std::size_t need = workspace_bytes(cfg);  // checks the config
    detail::check_infinigen_plans(cfg, plans, w_q, b_q, correction_plans);
    check_workspace(workspace, need);
    std::size_t at = carve_scratch(workspace);
    if (correction_plans == nullptr) {
      key_plans_ = plans;
    } else {
      for (int h = 0; h < cfg.shape.num_kv_heads; ++h)
        key_plans_.push_back(detail::nested_key_plan(
            plans[static_cast<std::size_t>(h)], (*correction_plans)[static_cast<std::size_t>(h)],
            "kv head " + std::to_string(h)));
    }
    const decode_shape& sh = cfg.shape;
    const std::size_t kb = mem_layout::key_layer_bytes(cfg, cfg.key_r());
    cache_ = key_store(sh.num_seqs, sh.num_kv_heads, cfg.key_r(), sh.max_tokens,
                       workspace.subspan(at, kb));
    at += kb;
    const int g = sh.num_q_heads / sh.num_kv_heads;
    const typename mem_layout::weight_sizes wz = mem_layout::head_weight_sizes(cfg);
    for (int qh = 0; qh < sh.num_q_heads; ++qh)
      weights_.push_back(mem_layout::place_weights(
          detail::make_partial_query_weights_from(plans[static_cast<std::size_t>(qh / g)], w_q,
                                                  b_q, sh.d_model, qh),
          wz, workspace.data(), at));
    if (rotated_keys()) freq_ = rope_frequencies(plans[0].rope);
    if (cfg.mode == rope_mode::rope_planes) {
      for (const auto& p : plans) rope_planes_.insert(rope_planes_.end(), p.planes.begin(), p.planes.end());
      std::sort(rope_planes_.begin(), rope_planes_.end());
      rope_planes_.erase(std::unique(rope_planes_.begin(), rope_planes_.end()), rope_planes_.end());
    }
  }

  static void check_workspace(host_span<std::byte> workspace, std::size_t need) {
    KVSCOUT_EXPECTS(workspace.size() >= need, "infinigen_policy_host: workspace holds ",
                    workspace.size(), " bytes, expected at least workspace_bytes(config) = ", need);
    KVSCOUT_EXPECTS(workspace.data() != nullptr, "infinigen_policy_host: workspace is null");
    KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(workspace.data()) % workspace_alignment == 0,
                    "infinigen_policy_host: workspace must be ", workspace_alignment,
                    "-byte aligned, got address ", static_cast<const void*>(workspace.data()));
  }
  // The scratch at the workspace's start; returns where the cache begins.
  std::size_t carve_scratch(host_span<std::byte> workspace) {
    static_assert(std::is_trivially_destructible_v<rope_table>);
    static_assert(sizeof(rope_table) % alignof(float) == 0);
    static_assert(alignof(rope_table) <= workspace_alignment);
    const decode_shape& sh = cfg_.shape;
    rope_ = reinterpret_cast<rope_table*>(workspace.data());
    std::uninitialized_default_construct_n(rope_, query_block);
    qp_ = reinterpret_cast<float*>(workspace.data() + sizeof(rope_table) * query_block);
    pk_ = qp_ + static_cast<std::size_t>(query_block) * sh.num_q_heads * sh.head_dim;
    qm_ = pk_ + sh.head_dim;
    kw_ = qm_ + sh.head_dim;
    lg_ = mem_layout::sum_prob_bytes(cfg_) > 0 ? kw_ + sh.head_dim : nullptr;
    if constexpr (quantized) qw_ = kw_ + sh.head_dim + mem_layout::sum_prob_bytes(cfg_) / sizeof(float);
    return mem_layout::scratch_bytes(cfg_);
  }

  void check_append(std::size_t key_elements, bool keys_present, std::size_t row,
                    host_span<const int32_t> seq_ids, host_span<const int32_t> token_ids,
                    int count) const {
    KVSCOUT_EXPECTS(count >= 0, "infinigen_policy_host::append: count = ", count,
                    " must be >= 0");
    const auto n = static_cast<std::size_t>(count);
    KVSCOUT_EXPECTS(key_elements >= n * row && (count == 0 || keys_present),
                    "infinigen_policy_host::append: keys hold ", key_elements,
                    " elements, expected [count = ", count, ", num_kv_heads, head_dim] = ", n * row);
    KVSCOUT_EXPECTS(seq_ids.size() >= n && token_ids.size() >= n,
                    "infinigen_policy_host::append: seq_ids and token_ids hold ", seq_ids.size(),
                    " and ", token_ids.size(), " entries, expected count = ", count);
    for (int i = 0; i < count; ++i)
      KVSCOUT_EXPECTS(seq_ids[i] >= 0 && seq_ids[i] < cfg_.shape.num_seqs && token_ids[i] >= 0 &&
                          token_ids[i] < cfg_.shape.max_tokens,
                      "infinigen_policy_host::append: entry ", i, " (sequence ", seq_ids[i],
                      ", token ", token_ids[i], ") is outside [0, num_seqs = ",
                      cfg_.shape.num_seqs, ") x [0, max_tokens = ", cfg_.shape.max_tokens, ")");
  }

  template <class K>
  void append_token(int s, int t, const K* key) {
    const int H = cfg_.shape.num_kv_heads, D = cfg_.shape.head_dim;
    const auto head = [&](int h) {
      const K* k = key + static_cast<std::size_t>(h) * D;
      if constexpr (std::is_same_v<K, float>) {
        return k;
      } else {
        for (int d = 0; d < D; ++d) kw_[d] = to_float(k[d]);
        return static_cast<const float*>(kw_);
      }
    };
    if constexpr (quantized) {
      // Every head's key is projected and checked before any is written, so a refusal writes
      // nothing of the token.
      const std::size_t r = static_cast<std::size_t>(cfg_.key_r());
      for (int h = 0; h < H; ++h) {
        detail::project_key_checked_plan(key_plans_[static_cast<std::size_t>(h)], head(h),
                                         qp_ + h * r);
        cache_.check_append(s, h, t, qp_ + h * r);
      }
      for (int h = 0; h < H; ++h) cache_.append(s, h, t, qp_ + h * r);
    } else {
      for (int h = 0; h < H; ++h) {
        detail::project_key_checked_plan(key_plans_[static_cast<std::size_t>(h)], head(h), pk_);
        cache_.append(s, h, t, pk_);
      }
    }
  }

  void check_scores(const score_context<host_space>& ctx, const score_buffer<host_space>& out) const {
    detail::check_score_buffer(out, ctx, cfg_.shape.num_kv_heads, cfg_.shape.num_seqs,
                               cfg_.shape.max_tokens);
  }
  void fill_rope(rope_table& rt, int position) const {
    if (rope_planes_.empty()) {
      rt.fill(freq_, position);
    } else {
      rt.fill(freq_, position, rope_planes_.data(), static_cast<int>(rope_planes_.size()));
    }
  }
  // One (s, h) row. The g query heads of the group are scored together, so the loop is bound by
  // reading the keys. qg: [g, r]; r: the first r of the cache's channels. Returns the row's largest
  // non-NaN score (-inf if none).
  float score_row(const float* qg, int r, int s, int h, int g, int n, float* row,
                  gqa_aggregation agg) {
    return detail::host_score_row<PkT>(cache_, qg, r, s, h, g, n, row, agg,
                                       {lg_, qm_, qw_, cfg_.shape.max_tokens});
  }

  config cfg_;
  std::vector<skew_plan> key_plans_;  // [num_kv_heads] the cache's (the correction's)
  std::vector<detail::partial_query_weights_view<WT>> weights_;  // [num_q_heads], in the workspace
  key_store cache_;
  std::vector<int> rope_planes_;  // rope_planes mode: the planes the kv heads rotate (sorted, unique)
  rope_frequencies freq_;
  // Scratch in the workspace, sized for r = head_dim; a call uses the first r of each.
  float* qp_ = nullptr;          // [query_block, num_q_heads, r] scaled partial queries
  float* pk_ = nullptr;          // [r] one projected key
  float* qm_ = nullptr;          // [r] a group's mean partial query (mean_logit)
  float* kw_ = nullptr;          // [head_dim] one key head widened to float
  float* lg_ = nullptr;          // [g, max_tokens] a group's logit rows (sum_prob; null otherwise)
  float* qw_ = nullptr;          // quantized only: [g, r] a tile's products q_c step_c per head
  rope_table* rope_ = nullptr;   // [query_block]: each sequence's rotation, shared by all heads
};

static_assert(speculation_policy<policy_layers<infinigen_policy_host<>>>);
static_assert(speculation_policy<policy_layers<infinigen_policy_host<half, bfloat16>>>);
static_assert(speculation_policy<policy_layers<infinigen_policy_host<quantized_keys<4>>>>);

}  // namespace kvscout
