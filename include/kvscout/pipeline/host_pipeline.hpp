#pragma once
// The host decode pipeline: the one place that knows the order of a decode step.
//
// Layers below skip_layers attend densely over the whole cache. For a layer i at or above it, the
// rows layer i attends to are chosen and fetched before layer i runs:
//   speculate(i, ctx, kv_i)    during layer i-1: policy.score -> selector.select -> executor.submit
//   attend(i, ctx, kv_i, ...)  layer i: wait for the fetch, sparse attention over the fetched rows
//                              plus the current token
// Policies that need layer i's own query (P::needs_query: oracle, quest) speculate inside attend().
//
// Correction (cfg.correction_capacity > 0, a policy with score_query): attend(i) first scores
// layer i's own query against the same partial keys and fetches, on the critical path, the best
// correction_capacity rows per (sequence, kv head) the speculation missed; attention reads both.
// Two buffer sets alternate by layer parity.
//
// Memory: every buffer is carved from one caller-owned workspace of workspace_bytes(cfg) bytes,
// zeroed at construction; speculate() and attend() allocate nothing. Executor, policy and
// selectors are the caller's; with the executor's pool(), attention runs on its threads too (the
// same bits). Selectors: one for every layer, or one per layer (null below skip_layers).
//
//   using pipe_t = kvscout::decode_pipeline_host<layout, policy_t, selector_t>;
//   auto ws = kvscout::make_workspace<pipe_t>(cfg);
//   pipe_t pipe(cfg, policy, selector, gather, ws.span());
//   for (int i = 0; i < L; ++i) {
//     if (i + 1 < L && i + 1 >= cfg.skip_layers) pipe.speculate(i + 1, ctx_next, kv[i + 1]);
//     ... q, k, v of layer i ...
//     pipe.attend(i, ctx_i, kv[i], {k_cur, v_cur}, out);
//     ... append k, v to kv[i]; pipe.append(i, s, t, k_pre, k_post) ...
//   }

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "kvscout/attention/decode.hpp"
#include "kvscout/attention/rows.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/detail/checked_size.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/thread_pool.hpp"
#include "kvscout/fetch/concepts.hpp"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/select/concepts.hpp"
#include "kvscout/select/correction.hpp"
#include "kvscout/score/concepts.hpp"

namespace kvscout {

struct host_pipeline_config {
  decode_shape shape{};  // num_layers, num_seqs, num_kv_heads, num_q_heads, max_tokens, scale
  int skip_layers = 2;  // layers [0, skip_layers) attend densely
  int capacity = 0;    // most rows fetched per (sequence, kv head): the selector's budget
  int threads = 1;     // gather (and so attention) threads, the caller's included
  bool track_reuse = true;  // count rows re-selected from the previous step (fetch_stats::reused)
  /// Most rows the correction step adds per (sequence, kv head), at most capacity; 0: none.
  int correction_capacity = 0;
  /// [num_layers] or empty: layer i's correction tops each row of len cached tokens up to
  /// ceil(correction_shares[i] * len) rows in all (correction_selector_host::config::total_share;
  /// 0: correction_capacity rows added). presets::step_budgets::correction_shares() fills it.
  std::vector<double> correction_shares{};
  // automatic streams a layer's fetch of 4 MiB or more past the cache; cached keeps it there for
  // the attention that reads it.
  gather_stores stores = gather_stores::automatic;

  /// The gather executor's config: the pipeline's shape, capacity, threads and stores.
  [[nodiscard]] host_gather_config gather_config() const {
    host_gather_config gc{shape, capacity, threads};
    gc.stores = stores;
    return gc;
  }
};

template <class E, class Layout>
concept host_step_executor =
    prefetch_executor<E> && std::same_as<typename E::source_type, kv_view<Layout, host_space>> &&
    std::same_as<typename E::selection_type, selection_view<host_space>> &&
    std::same_as<typename E::destination_type, gather_destination<host_space>> &&
    std::same_as<typename E::exec_type, host_exec>;

struct fetch_stats {
  std::vector<std::int64_t> rows;    // [num_layers], accumulated (corrected rows included)
  std::vector<std::int64_t> bytes;   // [num_layers], accumulated
  std::vector<std::int64_t> reused;  // [num_layers]: rows also selected the step before
  std::vector<std::int64_t> corrected;  // [num_layers], accumulated: rows the correction step added
};

/// L: a layout of float, half, bfloat16 or fp8 rows (fp8: attend() takes the layer's scales); not
/// KIVI (compose kivi_gathered_rows_host with a selector and the gather directly).
template <kv_layout L, speculation_policy P, row_selector Selector,
          class Executor = gather_executor_host<L>>
  requires(!kivi_quantized_layout<L> && std::same_as<typename Selector::memory_space, host_space> &&
           host_step_executor<Executor, L>)
class decode_pipeline_host {
 public:
  using config_type = host_pipeline_config;
  using element_type = typename L::element_type;
  using policy_type = P;
  using selector_type = Selector;
  using executor_type = Executor;
  static constexpr int head_dim = L::head_dim;

  [[nodiscard]] static std::size_t workspace_bytes(const host_pipeline_config& cfg) {
    check_config(cfg);
    return carve(cfg, nullptr).bytes;
  }
  static constexpr std::size_t workspace_alignment = 64;

  /// policy, selector, executor: used by reference (they outlive the pipeline); the selector's and
  /// executor's shapes are checked against cfg here. workspace: the pipeline's alone while it
  /// lives.
  decode_pipeline_host(const host_pipeline_config& cfg, P& policy, Selector& selector,
                       Executor& executor, host_span<std::byte> workspace)
      : decode_pipeline_host(
            cfg, policy,
            std::vector<Selector*>(static_cast<std::size_t>(std::max(cfg.shape.num_layers, 0)),
                                   &selector),
            executor, workspace) {}
  /// Not copyable: a copy would share the parts and the workspace the first one writes.
  decode_pipeline_host(const decode_pipeline_host&) = delete;
  decode_pipeline_host& operator=(const decode_pipeline_host&) = delete;
  /// selectors[i] selects layer i's rows (null below skip_layers; one may serve several).
  decode_pipeline_host(const host_pipeline_config& cfg, P& policy, std::vector<Selector*> selectors,
                       Executor& executor, host_span<std::byte> workspace)
      : cfg_(cfg), policy_(policy), selectors_(std::move(selectors)), executor_(executor) {
    check_config(cfg);
    KVSCOUT_EXPECTS(selectors_.size() == static_cast<std::size_t>(cfg.shape.num_layers), "got ",
                    selectors_.size(), " selectors, expected one per layer (num_layers = ",
                    cfg.shape.num_layers, ")");
    for (int i = cfg.skip_layers; i < cfg.shape.num_layers; ++i) {
      const Selector* sel = selectors_[static_cast<std::size_t>(i)];
      KVSCOUT_EXPECTS(sel != nullptr, "layer ", i, " is speculated (skip_layers = ", cfg.skip_layers,
                      ") but its selector is null");
      if constexpr (requires { sel->configuration().capacity; }) {
        const auto& sc = sel->configuration();
        KVSCOUT_EXPECTS(
            sc.shape.num_seqs == cfg.shape.num_seqs &&
                sc.shape.num_kv_heads == cfg.shape.num_kv_heads &&
                sc.shape.max_tokens == cfg.shape.max_tokens && sc.capacity == cfg.capacity,
            "layer ", i,
            "'s selector configured for [num_seqs, num_kv_heads, max_tokens, capacity] = [",
            sc.shape.num_seqs, ", ", sc.shape.num_kv_heads, ", ", sc.shape.max_tokens, ", ",
            sc.capacity, "], expected the pipeline's [", cfg.shape.num_seqs, ", ",
            cfg.shape.num_kv_heads, ", ", cfg.shape.max_tokens, ", ", cfg.capacity, "]");
      }
    }
    if constexpr (requires { executor.configuration().capacity; }) {
      const auto& ec = executor.configuration();
      KVSCOUT_EXPECTS(
          ec.shape.num_seqs == cfg.shape.num_seqs &&
              ec.shape.num_kv_heads == cfg.shape.num_kv_heads && ec.capacity == cfg.capacity,
          "executor configured for [num_seqs, num_kv_heads, capacity] = [", ec.shape.num_seqs, ", ",
          ec.shape.num_kv_heads, ", ", ec.capacity, "], expected the pipeline's [",
          cfg.shape.num_seqs, ", ", cfg.shape.num_kv_heads, ", ", cfg.capacity, "]");
    }
    if (cfg.correction_capacity != 0) check_correction_policy();
    const std::size_t need = carve(cfg, nullptr).bytes;
    KVSCOUT_EXPECTS(workspace.size() >= need, "decode_pipeline_host: workspace holds ",
                    workspace.size(), " bytes, expected at least workspace_bytes(config) = ", need);
    KVSCOUT_EXPECTS(workspace.data() != nullptr, "decode_pipeline_host: workspace is null");
    KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(workspace.data()) % workspace_alignment == 0,
                    "decode_pipeline_host: workspace must be ", workspace_alignment,
                    "-byte aligned, got address ", static_cast<const void*>(workspace.data()));
    std::memset(workspace.data(), 0, need);  // counts start at 0 (previous_, last_selection())
    const carved c = carve(cfg, workspace.data());
    scores_ = c.scores;
    row_max_ = c.row_max;
    probs_ = c.probs;
    buffers_[0] = c.buffers[0];
    buffers_[1] = c.buffers[1];
    corr_ = c.corr;
    previous_ = c.previous;
    corr_ws_ = c.corr_ws;
    stats_.rows.assign(static_cast<std::size_t>(cfg.shape.num_layers), 0);
    stats_.bytes.assign(static_cast<std::size_t>(cfg.shape.num_layers), 0);
    stats_.reused.assign(static_cast<std::size_t>(cfg.shape.num_layers), 0);
    stats_.corrected.assign(static_cast<std::size_t>(cfg.shape.num_layers), 0);
  }

  void speculate(int layer, const score_context<host_space>& ctx,
                 const kv_view<L, host_space>& kv) {
    KVSCOUT_EXPECTS(layer >= cfg_.skip_layers && layer < cfg_.shape.num_layers, "layer ", layer,
                    " is not speculated: expected [skip_layers = ", cfg_.skip_layers,
                    ", num_layers = ", cfg_.shape.num_layers, ")");
    buffer& b = buffers_[static_cast<std::size_t>(layer % 2)];
    // NaN first: a policy that does not write the row maxima leaves no hint rather than a stale
    // one.
    std::fill(row_max_.begin(), row_max_.end(), std::numeric_limits<float>::quiet_NaN());
    const score_buffer<host_space> out{{scores_.data(), scores_.size()}, cfg_.shape.num_seqs,
                                       cfg_.shape.num_kv_heads, cfg_.shape.max_tokens,
                                       {row_max_.data(), row_max_.size()}};
    policy_.score(layer, ctx, out, host_exec{pool()});
    selectors_[static_cast<std::size_t>(layer)]->select(out.view(ctx.seq_lens), selection(b));
    executor_.submit(kv, selection(b).view(), {as_writable_bytes(b.k), as_writable_bytes(b.v)},
                     host_exec{})
        .wait();
    std::int64_t rows = 0;
    for (int c : b.counts) rows += c;
    stats_.rows[static_cast<std::size_t>(layer)] += rows;
    if (cfg_.track_reuse) count_reuse(layer, b);
    stats_.bytes[static_cast<std::size_t>(layer)] +=
        rows * static_cast<std::int64_t>(kv.layout.k_row_bytes() + kv.layout.v_row_bytes());
    b.layer = layer;
  }

  /// Dense below skip_layers, otherwise sparse over the rows speculate() fetched (speculating now
  /// if the policy needs the query). `scales`: the layer's k / v scales for fp8 caches.
  void attend(int layer, const score_context<host_space>& ctx, const kv_view<L, host_space>& kv,
              const current_token<element_type>& cur, host_span<float> out,
              kv_scales scales = {}) {
    KVSCOUT_EXPECTS(layer >= 0 && layer < cfg_.shape.num_layers, "layer ", layer,
                    " is out of range [0, ", cfg_.shape.num_layers, ")");
    const attention_params ap{cfg_.shape.num_q_heads, cfg_.shape.scale, scales.k, scales.v};
    if (layer < cfg_.skip_layers) {
      decode_attention_host(layout_rows_host<L>(kv), cur, ctx.q, out, ap, {}, 0, host_exec{pool()});
      return;
    }
    if constexpr (P::needs_query) speculate(layer, ctx, kv);
    buffer& b = buffers_[static_cast<std::size_t>(layer % 2)];
    KVSCOUT_EXPECTS(b.layer == layer, "attend(", layer, ") without speculate(", layer,
                    ") first (the buffers hold layer ", b.layer, ")");
    const gathered_rows_host<element_type, head_dim> rows(
        selection(b).view(), {b.k.data(), b.k.size()}, {b.v.data(), b.v.size()});
    const auto attend_rows = [&](const auto& r) {
      const int stride = cfg_.capacity + cfg_.correction_capacity + 1;
      if constexpr (requires { policy_.observe(layer, ctx, r, host_span<const float>{}, 0, true); }) {
        decode_attention_host(r, cur, ctx.q, out, ap, {probs_.data(), probs_.size()}, stride,
                              host_exec{pool()});
        policy_.observe(layer, ctx, r, {probs_.data(), probs_.size()}, stride, cur.present());
      } else {
        decode_attention_host(r, cur, ctx.q, out, ap, {}, 0, host_exec{pool()});
      }
    };
    if (cfg_.correction_capacity > 0) {
      correct(layer, ctx, kv, b);
      const gathered_rows_host<element_type, head_dim> added(
          correction_selection().view(), {corr_.k.data(), corr_.k.size()},
          {corr_.v.data(), corr_.v.size()});
      attend_rows(joined_rows_host(rows, added));
      corr_.layer = layer;
    } else {
      attend_rows(rows);
    }
    b.layer = -1;  // consumed
  }

  void append(int layer, int s, int t, const float* k_pre, const float* k_post) {
    if constexpr (requires { policy_.append(layer, s, t, k_pre, k_post); })
      policy_.append(layer, s, t, k_pre, k_post);
  }

  [[nodiscard]] selection_view<host_space> last_selection(int layer) const {
    KVSCOUT_EXPECTS(layer >= 0 && layer < cfg_.shape.num_layers, "layer ", layer,
                    " is out of range [0, ", cfg_.shape.num_layers, ")");
    const buffer& b = buffers_[static_cast<std::size_t>(layer % 2)];
    return {{b.indices.data(), b.indices.size()}, {b.counts.data(), b.counts.size()},
            cfg_.shape.num_seqs, cfg_.shape.num_kv_heads, cfg_.capacity};
  }
  /// The rows the last attend()'s correction added, ascending, at most correction_capacity per
  /// row: [num_seqs, num_kv_heads, capacity] (layer last_corrected_layer()). Empty without.
  [[nodiscard]] selection_view<host_space> last_correction() const {
    if (cfg_.correction_capacity == 0) return {};  // no rows, no shape
    return {{corr_.indices.data(), corr_.indices.size()}, {corr_.counts.data(), corr_.counts.size()},
            cfg_.shape.num_seqs, cfg_.shape.num_kv_heads, cfg_.capacity};
  }
  [[nodiscard]] int last_corrected_layer() const noexcept { return corr_.layer; }
  [[nodiscard]] host_span<const float> last_scores() const { return {scores_.data(), scores_.size()}; }
  [[nodiscard]] const fetch_stats& stats() const { return stats_; }
  [[nodiscard]] const host_pipeline_config& configuration() const noexcept { return cfg_; }

 private:
  struct buffer {
    host_span<int32_t> indices, counts;  // [num_seqs, num_kv_heads, capacity], [.., ..]
    host_span<element_type> k, v;        // [num_seqs, num_kv_heads, capacity, head_dim]
    int layer = -1;  // which layer's rows the buffer holds
  };
  struct carved {
    host_span<float> scores, row_max, probs;
    buffer buffers[2];
    buffer corr;
    host_span<std::byte> corr_ws;
    host_span<int32_t> previous;
    std::size_t bytes = 0;
  };
  static carved carve(const host_pipeline_config& cfg, std::byte* base) {
    carved c;
    std::size_t at = 0;
    const auto take = [&]<class T>(std::size_t n, T*) {
      at = (at + workspace_alignment - 1) / workspace_alignment * workspace_alignment;
      T* p = base != nullptr ? reinterpret_cast<T*>(base + at) : nullptr;
      at += detail::checked_size("decode_pipeline_host workspace region bytes", n, sizeof(T));
      return host_span<T>(p, n);
    };
    const std::size_t pairs = static_cast<std::size_t>(cfg.shape.num_seqs) * cfg.shape.num_kv_heads;
    const std::size_t slots = pairs * static_cast<std::size_t>(cfg.capacity);
    const auto take_buffer = [&] {
      buffer b;
      b.indices = take(slots, static_cast<int32_t*>(nullptr));
      b.counts = take(pairs, static_cast<int32_t*>(nullptr));
      b.k = take(slots * head_dim, static_cast<element_type*>(nullptr));
      b.v = take(slots * head_dim, static_cast<element_type*>(nullptr));
      return b;
    };
    c.scores =
        take(detail::checked_size("decode_pipeline_host scores", pairs, cfg.shape.max_tokens),
             static_cast<float*>(nullptr));
    c.row_max = take(pairs, static_cast<float*>(nullptr));
    c.probs = take(pairs * static_cast<std::size_t>(cfg.capacity + cfg.correction_capacity + 1),
                   static_cast<float*>(nullptr));
    c.buffers[0] = take_buffer();
    c.buffers[1] = take_buffer();
    if (cfg.correction_capacity != 0) {
      c.corr = take_buffer();
      c.corr_ws = take(correction_selector_host::workspace_bytes(correction_config(cfg)),
                       static_cast<std::byte*>(nullptr));
    }
    if (cfg.track_reuse)
      c.previous = take(detail::checked_size("decode_pipeline_host previous selections",
                                             cfg.shape.num_layers, pairs, cfg.capacity + 1),
                        static_cast<int32_t*>(nullptr));
    c.bytes = at;
    return c;
  }
  static_assert(workspace_alignment % correction_selector_host::workspace_alignment == 0 &&
                workspace_alignment % alignof(element_type) == 0);

  static void check_config(const host_pipeline_config& cfg) {
    KVSCOUT_EXPECTS(cfg.shape.num_layers > 0, "num_layers must be positive, got ",
                    cfg.shape.num_layers);
    KVSCOUT_EXPECTS(cfg.skip_layers >= 0, "skip_layers must be non-negative, got ",
                    cfg.skip_layers);
    KVSCOUT_EXPECTS(cfg.shape.num_seqs > 0 && cfg.shape.num_kv_heads > 0,
                    "num_seqs and num_kv_heads must be "
                    "positive, got ",
                    cfg.shape.num_seqs, " and ", cfg.shape.num_kv_heads);
    detail::check_gqa(cfg.shape.num_q_heads, cfg.shape.num_kv_heads);
    KVSCOUT_EXPECTS(cfg.capacity >= 1 && cfg.capacity <= cfg.shape.max_tokens,
                    "capacity = ", cfg.capacity,
                    " must be in [1, max_tokens = ", cfg.shape.max_tokens, "]");
    KVSCOUT_EXPECTS(cfg.correction_capacity >= 0 && cfg.correction_capacity <= cfg.capacity,
                    "correction_capacity = ", cfg.correction_capacity, " must be in [0, capacity = ",
                    cfg.capacity, "] (the correction's rows use the speculation's slots and gather)");
    KVSCOUT_EXPECTS(
        cfg.correction_shares.empty() ||
            (cfg.correction_capacity > 0 &&
             cfg.correction_shares.size() == static_cast<std::size_t>(cfg.shape.num_layers)),
        "correction_shares holds ", cfg.correction_shares.size(),
        " entries, expected none or one per layer (num_layers = ", cfg.shape.num_layers,
        ") with correction_capacity > 0 (got ", cfg.correction_capacity, ")");
    for (std::size_t l = 0; l < cfg.correction_shares.size(); ++l) {
      const double x = cfg.correction_shares[l];
      KVSCOUT_EXPECTS(x >= 0 && x <= 1, "correction_shares[", l, "] = ", x,
                      ": expected a share of the cached rows in [0, 1]");
    }
  }
  static correction_selector_host::config correction_config(const host_pipeline_config& cfg,
                                                            int layer = -1) {
    const double share = layer >= 0 && !cfg.correction_shares.empty()
                             ? cfg.correction_shares[static_cast<std::size_t>(layer)]
                             : 0.0;
    return {.shape = cfg.shape,
            .capacity = cfg.capacity,
            .extra = cfg.correction_capacity,
            .total_share = share};
  }
  thread_pool* pool() {
    if constexpr (requires(Executor& e) { { e.pool() } -> std::same_as<thread_pool&>; }) {
      return &executor_.pool();
    } else {
      return nullptr;
    }
  }
  // Rows this selection shares with the layer's previous one, then keeps this one as the previous.
  // previous_ row r of a layer: [count, indices...].
  void count_reuse(int layer, const buffer& b) {
    const std::size_t pairs =
        static_cast<std::size_t>(cfg_.shape.num_seqs) * cfg_.shape.num_kv_heads;
    const std::size_t row = static_cast<std::size_t>(cfg_.capacity) + 1;
    std::int64_t reused = 0;
    for (std::size_t r = 0; r < pairs; ++r) {
      int32_t* prev = previous_.data() + (static_cast<std::size_t>(layer) * pairs + r) * row;
      const int32_t* cur = b.indices.data() + r * static_cast<std::size_t>(cfg_.capacity);
      const int n = b.counts[r];
      reused += detail::common_count_sorted(prev + 1, prev[0], cur, n);
      prev[0] = n;
      std::copy(cur, cur + n, prev + 1);
    }
    stats_.reused[static_cast<std::size_t>(layer)] += reused;
  }

  void check_correction_policy() const {
    constexpr bool late = requires(P& p, const score_context<host_space>& c,
                                   const score_buffer<host_space>& o) {
      p.score_query(0, c, o);
    };
    KVSCOUT_EXPECTS(late, "correction_capacity = ", cfg_.correction_capacity,
                    " needs a policy that scores the layer's own query (score_query, e.g. "
                    "policy_layers<infinigen_policy_host>); this one has none");
  }

  void correct(int layer, const score_context<host_space>& ctx, const kv_view<L, host_space>& kv,
               const buffer& b) {
    if constexpr (requires(P& p, const score_context<host_space>& c,
                           const score_buffer<host_space>& o) {
                    p.score_query(0, c, o);
                  }) {
      const score_buffer<host_space> late{{scores_.data(), scores_.size()}, cfg_.shape.num_seqs,
                                          cfg_.shape.num_kv_heads, cfg_.shape.max_tokens};
      policy_.score_query(layer, ctx, late);
      const selection_view<host_space> speculated{{b.indices.data(), b.indices.size()},
                                                  {b.counts.data(), b.counts.size()},
                                                  cfg_.shape.num_seqs,
                                                  cfg_.shape.num_kv_heads,
                                                  cfg_.capacity};
      correction_selector_host corrector(correction_config(cfg_, layer), corr_ws_);
      corrector.select(late.view(ctx.seq_lens), speculated, correction_selection());
      executor_.submit(kv, correction_selection().view(),
                       {as_writable_bytes(corr_.k), as_writable_bytes(corr_.v)}, host_exec{})
          .wait();
      std::int64_t rows = 0;
      for (int c : corr_.counts) rows += c;
      stats_.rows[static_cast<std::size_t>(layer)] += rows;
      stats_.corrected[static_cast<std::size_t>(layer)] += rows;
      stats_.bytes[static_cast<std::size_t>(layer)] +=
          rows * static_cast<std::int64_t>(kv.layout.k_row_bytes() + kv.layout.v_row_bytes());
    }
  }

  selection_buffers<host_space> correction_selection() {
    return {{corr_.indices.data(), corr_.indices.size()}, {corr_.counts.data(), corr_.counts.size()},
            cfg_.shape.num_seqs, cfg_.shape.num_kv_heads, cfg_.capacity};
  }

  selection_buffers<host_space> selection(buffer& b) {
    return {{b.indices.data(), b.indices.size()}, {b.counts.data(), b.counts.size()},
            cfg_.shape.num_seqs, cfg_.shape.num_kv_heads, cfg_.capacity};
  }

  host_pipeline_config cfg_;
  P& policy_;
  std::vector<Selector*> selectors_;  // [num_layers], null below skip_layers
  Executor& executor_;
  host_span<float> scores_;
  host_span<float> row_max_;  // [num_seqs, num_kv_heads]: the rows' maxima, policy to selector
  buffer buffers_[2];
  host_span<float> probs_;
  host_span<int32_t> previous_;  // [num_layers, num_seqs * num_kv_heads, 1 + capacity]
  buffer corr_;
  host_span<std::byte> corr_ws_;  // the correction selector's workspace (one per call, no state)
  fetch_stats stats_;
};

}  // namespace kvscout
