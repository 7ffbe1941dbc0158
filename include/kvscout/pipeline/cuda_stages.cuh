#pragma once
// Device parts as the two stages of decode_pipeline_cuda (pipeline/cuda_pipeline.hpp), and an
// optional third, the correction step, that the caller runs on the compute stream:
//
//   speculate(i, b, exec)    layer i's policy scores every cached token from slot b's layer input
//                            (x_{i-1}); the selector writes slot b's selection
//   fetch(i, b, exec)        the executor moves those rows from layer i's host cache into slot b's
//                            row buffers
//   correct(i, b, q, exec)   after wait_rows(i): scores layer i's own query q, selects what
//                            slot b's selection missed, fetches it into added(i, b)
//
// Everything is caller-owned and set up once. Nothing here allocates, synchronises or reads device
// memory on the host, so a step can be captured in a CUDA graph.
//
//   kvscout::infinigen_stages_cuda<layout, kvscout::topk_selector_cuda> stages(
//       speculators, selector, fetch, sources, scores, {positions, seq_lens, max_tokens},
//       {x0, x1}, buffer_sets);
//   kvscout::decode_pipeline_cuda pipe({.num_layers = L, .skip_layers = 2},
//                                      kvscout::stages_ref_cuda<decltype(stages)>{&stages});
//   // layer i: write x_i into stages.x(pipe.slot(i + 1)), pipe.input_ready(i, x),
//   //          pipe.wait_rows(i, x), attention over stages.buffers(i, pipe.slot(i)) ...
//
// The lengths and positions are device arrays the compute stream advances after a step's appends;
// max_seq_len (host-known) sizes the scoring grid.

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <concepts>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvscout/core/error.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/fetch/zero_copy.cuh"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/pipeline/cuda_pipeline.hpp"
#include "kvscout/select/concepts.hpp"
#include "kvscout/select/correction.cuh"
#include "kvscout/score/device_concepts.hpp"
#include "kvscout/score/infinigen.cuh"

namespace kvscout {

struct cuda_stage_buffers {
  selection_buffers<device_space> selection;  // what the selector writes, the executor reads
  gather_destination<device_space> rows;      // where the executor writes the selected rows
};

/// The stages' device buffers for slots buffering, carved from one allocation the caller owns: the
/// score buffer [num_seqs, num_kv_heads, max_tokens], the two layer-input slots [num_seqs,
/// d_model] and two buffer sets of `capacity` rows per (sequence, kv head).
///
///   auto m = cuda_stage_memory::carve(shape, cap, lay.k_row_bytes(), lay.v_row_bytes(),
///                                     alloc(cuda_stage_memory::bytes(shape, cap, kb, vb)));
///   stages_t stages(spec, selector, fetch, sources, m.scores, lengths, m.inputs(), m.sets());
struct cuda_stage_memory {
  score_buffer<device_space> scores{};
  std::array<device_span<float>, 2> x{};
  std::array<cuda_stage_buffers, 2> set{};

  [[nodiscard]] static std::size_t bytes(const decode_shape& shape, int capacity,
                                         std::size_t k_row_bytes, std::size_t v_row_bytes) {
    return layout(shape, capacity, k_row_bytes, v_row_bytes).total;
  }
  /// memory: at least bytes(...) bytes of device memory, 256-byte aligned.
  [[nodiscard]] static cuda_stage_memory carve(const decode_shape& shape, int capacity,
                                               std::size_t k_row_bytes, std::size_t v_row_bytes,
                                               device_span<std::byte> memory) {
    const sizes z = layout(shape, capacity, k_row_bytes, v_row_bytes);
    KVSCOUT_EXPECTS(memory.size() >= z.total, "cuda_stage_memory: memory holds ", memory.size(),
                    " bytes, expected at least bytes(...) = ", z.total);
    KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(memory.data()) % 256 == 0,
                    "cuda_stage_memory: memory must be 256-byte aligned");
    std::byte* base = memory.data();
    const auto at = [&](std::size_t off) { return base + off; };
    const int S = shape.num_seqs, H = shape.num_kv_heads;
    cuda_stage_memory m;
    m.scores = {{reinterpret_cast<float*>(at(z.scores)), z.score_n}, S, H, shape.max_tokens};
    for (int b = 0; b < 2; ++b) {
      m.x[b] = {reinterpret_cast<float*>(at(z.x[b])), z.x_n};
      m.set[b] = {{{reinterpret_cast<std::int32_t*>(at(z.indices[b])), z.slots},
                   {reinterpret_cast<std::int32_t*>(at(z.counts[b])), z.rows},
                   S, H, capacity},
                  {{at(z.k[b]), z.slots * k_row_bytes}, {at(z.v[b]), z.slots * v_row_bytes}}};
    }
    return m;
  }
  [[nodiscard]] std::array<device_span<const float>, 2> inputs() const { return {x[0], x[1]}; }
  [[nodiscard]] std::vector<cuda_stage_buffers> sets() const { return {set[0], set[1]}; }

 private:
  struct sizes {
    std::size_t rows = 0, slots = 0, score_n = 0, x_n = 0, scores = 0, total = 0;
    std::size_t x[2]{}, indices[2]{}, counts[2]{}, k[2]{}, v[2]{};
  };
  static sizes layout(const decode_shape& shape, int capacity, std::size_t k_row_bytes,
                      std::size_t v_row_bytes) {
    KVSCOUT_EXPECTS(shape.num_seqs > 0 && shape.num_kv_heads > 0 && shape.max_tokens > 0 &&
                        shape.d_model > 0,
                    "cuda_stage_memory: shape [num_seqs ", shape.num_seqs, ", num_kv_heads ",
                    shape.num_kv_heads, ", max_tokens ", shape.max_tokens, ", d_model ",
                    shape.d_model, "] must be positive");
    KVSCOUT_EXPECTS(capacity > 0, "cuda_stage_memory: capacity must be positive, got ", capacity);
    sizes z;
    z.rows = static_cast<std::size_t>(shape.num_seqs) * shape.num_kv_heads;
    z.slots = z.rows * static_cast<std::size_t>(capacity);
    z.score_n = z.rows * static_cast<std::size_t>(shape.max_tokens);
    z.x_n = static_cast<std::size_t>(shape.num_seqs) * shape.d_model;
    std::size_t at = 0;
    const auto take = [&](std::size_t n) {
      const std::size_t here = at;
      at = (at + n + 255) / 256 * 256;
      return here;
    };
    z.scores = take(sizeof(float) * z.score_n);
    for (int b = 0; b < 2; ++b) {
      z.x[b] = take(sizeof(float) * z.x_n);
      z.indices[b] = take(sizeof(std::int32_t) * z.slots);
      z.counts[b] = take(sizeof(std::int32_t) * z.rows);
      z.k[b] = take(z.slots * k_row_bytes);
      z.v[b] = take(z.slots * v_row_bytes);
    }
    z.total = at;
    return z;
  }
};

struct cuda_stage_lengths {
  device_span<const int32_t> positions;  // [num_seqs] position of the decoded token (RoPE)
  device_span<const int32_t> seq_lens;   // [num_seqs] cached tokens (the current one excluded)
  int max_seq_len = 0;                   // host-known bound on every seq_lens[s]
  /// [num_seqs] the sequence of the policies' state each batch row reads, or empty: row s is
  /// sequence s (continuous batching).
  device_span<const int32_t> seq_ids = {};
  /// row_cache buffering: [num_seqs] the batch row that held each row's sequence at the previous
  /// step, or -1 for a sequence new to the batch, advanced by the caller. Empty: every row holds
  /// the sequence it held before. Required with seq_ids (a cache hit would otherwise copy another
  /// sequence's rows). Unused with slots.
  device_span<const int32_t> cached_rows = {};
};

///   slots      two buffer sets, by the pipeline's slot (layer parity): the least memory
///   row_cache  two sets per layer, by step parity: layer i's fetch at step t copies the rows it
///              fetched at step t - 1 from the other set on the device. Call next_step() after
///              each step's last layer; a captured graph holds one parity, so capture two.
enum class cuda_stage_buffering { slots, row_cache };

/// The correction step's parts (optional): selector and executor of capacity
/// `sets[b].selection.capacity`, a late-score buffer of its own (correct(i) runs while
/// speculate(i + 1) writes the speculation's), and by slot the added rows' selection and rows.
template <class Executor>
struct cuda_stage_correction {
  correction_selector_cuda* selector = nullptr;  // null: no correction step
  Executor* fetch = nullptr;
  score_buffer<device_space> scores{};            // [num_seqs, num_kv_heads, stride] late scores
  std::array<cuda_stage_buffers, 2> sets{};  // by slot: the added rows' selection and rows
  /// Empty, or one selector per layer (null below skip_layers), each with `selector`'s shape and
  /// capacity: layer i's correction then runs per_layer[i] (e.g. each at its layer's total_share,
  /// presets::step_budgets::total).
  std::vector<correction_selector_cuda*> per_layer{};
};

template <class E>
concept row_caching_executor =
    requires(E& e, const typename E::source_type& src, const typename E::selection_type& sel,
             const typename E::destination_type& dst, const row_cache_view& cache,
             const typename E::exec_type& x) {
      e.submit(src, sel, dst, cache, x);
    };

/// One selector for every layer (a Selector& converts), or one per layer (null below skip_layers;
/// one may serve several).
template <class Selector>
struct cuda_stage_selectors {
  cuda_stage_selectors(Selector& every_layer) : all(&every_layer) {}  // NOLINT(google-explicit-constructor)
  cuda_stage_selectors(std::vector<Selector*> by_layer) : per_layer(std::move(by_layer)) {}  // NOLINT
  Selector* all = nullptr;
  std::vector<Selector*> per_layer;
};

template <kv_layout L, class Policy, class Selector, class Executor = zero_copy_executor_cuda<L>>
  requires speculation_policy_cuda<Policy> && row_selector<Selector>
class speculation_stages_cuda {
 public:
  using speculator_type = Policy;
  using executor_type = Executor;
  static_assert(device_step_executor<executor_type>,
                "speculation_stages_cuda: the executor must be a device_step_executor "
                "(fetch/concepts.hpp): a prefetch_executor that takes a device selection and "
                "never blocks the host (zero_copy_executor_cuda, or the engine's own)");
  static_assert(std::same_as<typename Executor::source_type, kv_view<L, device_space>> &&
                    std::same_as<typename Executor::destination_type,
                                 gather_destination<device_space>> &&
                    std::same_as<typename Executor::exec_type, cuda_exec>,
                "speculation_stages_cuda: the executor must read kv_view<Layout, device_space>, "
                "write gather_destination<device_space> and take a cuda_exec");
  static_assert(std::same_as<typename Selector::exec_type, cuda_exec>,
                "the pipeline's selector must be a device selector (exec_type cuda_exec: "
                "topk_selector_cuda, threshold_selector_cuda or the engine's own)");

  /// speculators[i]: layer i's policy, null below skip_layers (one may serve several layers).
  /// sources[i]: layer i's host cache as the device sees it (mapped aliases). x[b]: slot b's layer
  /// input [num_seqs, d_model]. sets: 2 (slots) or 2 per layer, set 2 i + parity for layer i
  /// (row_cache). hits: optional device counter of rows the row cache served.
  speculation_stages_cuda(std::vector<speculator_type*> speculators,
                          cuda_stage_selectors<Selector> selectors, executor_type& fetch,
                          std::vector<kv_view<L, device_space>> sources,
                          const score_buffer<device_space>& scores, const cuda_stage_lengths& lengths,
                          const std::array<device_span<const float>, 2>& x,
                          std::vector<cuda_stage_buffers> sets,
                          cuda_stage_buffering buffering = cuda_stage_buffering::slots,
                          unsigned long long* hits = nullptr)
      : speculators_(std::move(speculators)),
        selectors_(selectors.all != nullptr
                       ? std::vector<Selector*>(speculators_.size(), selectors.all)
                       : std::move(selectors.per_layer)),
        fetch_(&fetch),
        sources_(std::move(sources)),
        scores_(scores),
        lengths_(lengths),
        x_(x),
        sets_(std::move(sets)),
        buffering_(buffering),
        hits_(hits) {
    KVSCOUT_EXPECTS(!speculators_.empty(), "speculation_stages_cuda needs at least one layer");
    KVSCOUT_EXPECTS(sources_.size() == speculators_.size(), "sources has ", sources_.size(),
                    " layers, speculators ", speculators_.size());
    KVSCOUT_EXPECTS(selectors_.size() == speculators_.size(), "got ", selectors_.size(),
                    " selectors, expected one per layer (", speculators_.size(), " layers)");
    for (std::size_t i = 0; i < speculators_.size(); ++i) {
      const Selector* sel = selectors_[i];
      KVSCOUT_EXPECTS(speculators_[i] == nullptr || sel != nullptr, "layer ", i,
                      " has a speculation policy but a null selector");
      if constexpr (requires { sel->configuration().capacity; }) {
        const int cap = sets_.empty() ? 0 : sets_[0].selection.capacity;
        if (sel != nullptr && !sets_.empty()) {  // (no sets: refused below)
          const auto& c = sel->configuration();
          KVSCOUT_EXPECTS(
              c.shape.num_seqs == scores.num_seqs && c.shape.num_kv_heads == scores.num_kv_heads &&
                  c.shape.max_tokens == scores.stride && c.capacity == cap,
              "layer ", i,
              "'s selector configured for [num_seqs, num_kv_heads, max_tokens, "
              "capacity] = [",
              c.shape.num_seqs, ", ", c.shape.num_kv_heads, ", ", c.shape.max_tokens, ", ",
              c.capacity, "], expected the scores' and buffer sets' [", scores.num_seqs, ", ",
              scores.num_kv_heads, ", ", scores.stride, ", ", cap, "]");
        }
      }
    }
    KVSCOUT_EXPECTS(lengths.max_seq_len >= 0, "max_seq_len must be non-negative, got ",
                    lengths.max_seq_len);
    KVSCOUT_EXPECTS(lengths.seq_lens.data() != nullptr && lengths.positions.data() != nullptr,
                    "seq_lens and positions must be device arrays, got null");
    KVSCOUT_EXPECTS(x[0].data() != nullptr && x[1].data() != nullptr,
                    "the layer inputs x[0] / x[1] must be device arrays, got null");
    KVSCOUT_EXPECTS(buffering != cuda_stage_buffering::row_cache || lengths.seq_ids.empty() ||
                        !lengths.cached_rows.empty(),
                    "row_cache buffering with seq_ids needs cached_rows (cuda_stage_lengths): "
                    "which batch row held each row's sequence at the previous step");
    KVSCOUT_EXPECTS(lengths.cached_rows.empty() ||
                        (lengths.cached_rows.data() != nullptr &&
                         lengths.cached_rows.size() >= static_cast<std::size_t>(scores.num_seqs)),
                    "cached_rows holds ", lengths.cached_rows.size(), " entries, expected num_seqs = ",
                    scores.num_seqs);
    KVSCOUT_EXPECTS(buffering != cuda_stage_buffering::row_cache ||
                        row_caching_executor<executor_type>,
                    "row_cache buffering needs an executor whose submit takes a row_cache_view "
                    "(row_caching_executor: zero_copy_executor_cuda); this one has none, use "
                    "slots");
    const std::size_t want = buffering == cuda_stage_buffering::slots ? 2 : 2 * speculators_.size();
    KVSCOUT_EXPECTS(sets_.size() == want, "got ", sets_.size(), " buffer sets, expected ", want,
                    buffering == cuda_stage_buffering::slots ? " (two slots)" : " (two per layer)");
    if (buffering_ == cuda_stage_buffering::row_cache) {
      reset_cache(cuda_exec{});
      KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    }
  }

  speculation_stages_cuda(std::vector<speculator_type*> speculators,
                          cuda_stage_selectors<Selector> selectors, executor_type& fetch,
                          std::vector<kv_view<L, device_space>> sources,
                          const score_buffer<device_space>& scores, const cuda_stage_lengths& lengths,
                          const std::array<device_span<const float>, 2>& x,
                          std::vector<cuda_stage_buffers> sets, cuda_stage_buffering buffering,
                          unsigned long long* hits,
                          const cuda_stage_correction<executor_type>& correction)
      : speculation_stages_cuda(std::move(speculators), std::move(selectors), fetch, std::move(sources), scores,
                                lengths, x, std::move(sets), buffering, hits) {
    correction_ = correction;
    KVSCOUT_EXPECTS(correction_.selector != nullptr, "the correction step's selector is null "
                    "(cuda_stage_correction::selector); build the stages without it instead");
    check_correction();
  }

  /// row_cache: forget every cached row (a new batch of sequences).
  void reset_cache(const cuda_exec& exec) {
    const cudaStream_t stream = exec.stream;
    if (buffering_ != cuda_stage_buffering::row_cache) return;
    for (const auto& set : sets_) {
      KVSCOUT_CUDA_CHECK(cudaMemsetAsync(set.selection.counts.data(), 0,
                                         set.selection.counts.size() * sizeof(int32_t), stream));
    }
  }

  [[nodiscard]] int num_layers() const noexcept { return static_cast<int>(speculators_.size()); }
  [[nodiscard]] cuda_stage_buffering buffering() const noexcept { return buffering_; }

  [[nodiscard]] const cuda_stage_buffers& buffers(int layer, int slot) const {
    return sets_[set_index(layer, slot, parity_)];
  }
  [[nodiscard]] selection_view<device_space> selection(int layer, int slot) const {
    return buffers(layer, slot).selection.view();
  }
  [[nodiscard]] device_span<const float> x(int b) const { return x_[check_slot(b)]; }

  void set_max_seq_len(int n) {
    KVSCOUT_EXPECTS(n >= 0, "max_seq_len must be non-negative, got ", n);
    lengths_.max_seq_len = n;
  }
  void next_step() noexcept { parity_ ^= 1; }
  [[nodiscard]] int step_parity() const noexcept { return parity_; }

  void speculate(int layer, int b, const cuda_exec& exec) {
    speculator_type* spec = speculator(layer);
    const cuda_stage_buffers& cur = sets_[set_index(layer, b, parity_)];
    const score_context<device_space> ctx{x_[check_slot(b)], lengths_.positions, lengths_.seq_lens,
                                  lengths_.max_seq_len, lengths_.seq_ids};
    spec->score(ctx, scores_, exec);
    selectors_[static_cast<std::size_t>(layer)]->select(scores_.view(lengths_.seq_lens), cur.selection,
                                                        exec);
  }

  [[nodiscard]] bool has_correction() const noexcept { return correction_.selector != nullptr; }
  [[nodiscard]] const cuda_stage_buffers& added(int layer, int slot) const {
    KVSCOUT_EXPECTS(has_correction(), "added(): the stages were built without correction parts "
                    "(cuda_stage_correction)");
    (void)set_index(layer, slot, parity_);  // range checks
    return correction_.sets[check_slot(slot)];
  }

  /// Layer i's correction on exec.stream (the compute stream, after wait_rows(i)): scores its own
  /// query q [num_seqs, num_q_heads, head_dim] (floats, after RoPE), selects the best rows slot b's
  /// speculation missed and fetches them into added(i, b), on the critical path. Attend over
  /// joined_rows_cuda of buffers(i, b) and added(i, b). Refused at run time for stages built
  /// without correction parts.
  void correct(int layer, int b, device_span<const float> q, const cuda_exec& exec) {
    static_assert(query_scoring_policy_cuda<speculator_type>,
                  "speculation_stages_cuda::correct: the correction step needs a policy with "
                  "score_query(q, ctx, out, exec) (query_scoring_policy_cuda: "
                  "infinigen_policy_cuda); this policy scores from the layer input only");
    KVSCOUT_EXPECTS(has_correction(), "correct(): the stages were built without correction parts "
                    "(cuda_stage_correction: selector, fetch, scores, sets); got a null selector");
    speculator_type* spec = speculator(layer);
    const cuda_stage_buffers& cur = sets_[set_index(layer, b, parity_)];
    const cuda_stage_buffers& add = correction_.sets[check_slot(b)];
    const score_context<device_space> ctx{{}, {}, lengths_.seq_lens, lengths_.max_seq_len,
                                  lengths_.seq_ids};
    spec->score_query(q, ctx, correction_.scores, exec);
    correction_selector_cuda* sel = correction_.per_layer.empty()
                                        ? correction_.selector
                                        : correction_.per_layer[static_cast<std::size_t>(layer)];
    KVSCOUT_EXPECTS(sel != nullptr, "correct(", layer, "): the layer's correction selector "
                    "(cuda_stage_correction::per_layer) is null");
    sel->select(correction_.scores.scores, lengths_.seq_lens, cur.selection.view(), add.selection,
                exec);
    (void)correction_.fetch->submit(sources_[static_cast<std::size_t>(layer)],
                                    add.selection.view(), add.rows, exec);
  }

  void fetch(int layer, int b, const cuda_exec& exec) {
    (void)speculator(layer);  // range check
    const cuda_stage_buffers& cur = sets_[set_index(layer, b, parity_)];
    if constexpr (row_caching_executor<executor_type>) {
      if (buffering_ == cuda_stage_buffering::row_cache) {
        const cuda_stage_buffers& prev = sets_[set_index(layer, b, parity_ ^ 1)];
        (void)fetch_->submit(sources_[static_cast<std::size_t>(layer)], cur.selection.view(),
                             cur.rows,
                             row_cache_view{prev.selection.view(), prev.rows, hits_,
                                            lengths_.cached_rows},
                             exec);
        return;
      }
    }
    (void)fetch_->submit(sources_[static_cast<std::size_t>(layer)], cur.selection.view(), cur.rows,
                         exec);
  }

 private:
  void check_correction() const {
    static_assert(query_scoring_policy_cuda<speculator_type>,
                  "speculation_stages_cuda: correction parts given for a policy without "
                  "score_query(q, ctx, out, exec) (query_scoring_policy_cuda: "
                  "infinigen_policy_cuda); the correction step scores layer i's own query");
    const cuda_stage_correction<executor_type>& c = correction_;
    KVSCOUT_EXPECTS(c.fetch != nullptr, "the correction step has a selector but no executor "
                    "(cuda_stage_correction::fetch is null)");
    const auto& cc = c.selector->configuration();
    KVSCOUT_EXPECTS(c.per_layer.empty() || c.per_layer.size() == speculators_.size(), "got ",
                    c.per_layer.size(), " per-layer correction selectors, expected none or one per "
                    "layer (", speculators_.size(), ")");
    for (std::size_t l = 0; l < c.per_layer.size(); ++l) {
      if (c.per_layer[l] == nullptr) continue;
      const auto& lc = c.per_layer[l]->configuration();
      KVSCOUT_EXPECTS(lc.shape == cc.shape && lc.capacity == cc.capacity, "layer ", l,
                      "'s correction selector differs from cuda_stage_correction::selector in its "
                      "shape or capacity (", lc.capacity, " vs ", cc.capacity, ")");
    }
    KVSCOUT_EXPECTS(c.scores.scores.data() != nullptr && c.scores.num_seqs == scores_.num_seqs &&
                        c.scores.num_kv_heads == scores_.num_kv_heads &&
                        c.scores.stride >= lengths_.max_seq_len,
                    "the correction's late-score buffer [num_seqs, num_kv_heads, stride] = [",
                    c.scores.num_seqs, ", ", c.scores.num_kv_heads, ", ", c.scores.stride,
                    "] (data ", static_cast<const void*>(c.scores.scores.data()),
                    "), expected [", scores_.num_seqs, ", ", scores_.num_kv_heads,
                    ", >= max_seq_len = ", lengths_.max_seq_len, "], not null");
    const float* late = c.scores.scores.data();
    const float* spec = scores_.scores.data();
    KVSCOUT_EXPECTS(late + c.scores.scores.size() <= spec || spec + scores_.scores.size() <= late,
                    "the correction's late-score buffer overlaps the speculation's score buffer: "
                    "speculate(i + 1) writes that one while correct(i) runs; give it its own");
    KVSCOUT_EXPECTS(cc.shape.num_seqs == scores_.num_seqs &&
                        cc.shape.num_kv_heads == scores_.num_kv_heads &&
                        cc.shape.max_tokens == c.scores.stride,
                    "correction selector config [num_seqs, num_kv_heads, max_tokens] = [",
                    cc.shape.num_seqs, ", ", cc.shape.num_kv_heads, ", ", cc.shape.max_tokens,
                    "], expected the late scores' [",
                    c.scores.num_seqs, ", ", c.scores.num_kv_heads, ", ", c.scores.stride, "]");
    for (int b = 0; b < 2; ++b) {
      const auto& sel = c.sets[static_cast<std::size_t>(b)].selection;
      KVSCOUT_EXPECTS(sel.capacity == cc.capacity, "correction set ", b, " has capacity ",
                      sel.capacity, ", expected the correction selector's ", cc.capacity);
      if constexpr (requires { c.fetch->configuration().capacity; }) {
        KVSCOUT_EXPECTS(sel.capacity == c.fetch->configuration().capacity, "correction set ", b,
                        " has capacity ", sel.capacity, ", expected the correction executor's ",
                        c.fetch->configuration().capacity);
      }
      KVSCOUT_EXPECTS(sel.indices.data() != nullptr && sel.counts.data() != nullptr &&
                          c.sets[static_cast<std::size_t>(b)].rows.k.data() != nullptr &&
                          c.sets[static_cast<std::size_t>(b)].rows.v.data() != nullptr,
                      "correction set ", b, " has a null selection or row buffer");
    }
  }

  speculator_type* speculator(int layer) const {
    KVSCOUT_EXPECTS(layer >= 0 && layer < num_layers(), "layer ", layer,
                    " is out of range [0, ", num_layers(), ")");
    speculator_type* p = speculators_[static_cast<std::size_t>(layer)];
    KVSCOUT_EXPECTS(p != nullptr, "layer ", layer, " has no speculation policy (is it below skip_layers?)");
    return p;
  }
  static std::size_t check_slot(int b) {
    KVSCOUT_EXPECTS(b == 0 || b == 1, "slot ", b, " is not 0 or 1");
    return static_cast<std::size_t>(b);
  }
  std::size_t set_index(int layer, int slot, int parity) const {
    KVSCOUT_EXPECTS(layer >= 0 && layer < num_layers(), "layer ", layer,
                    " is out of range [0, ", num_layers(), ")");
    return buffering_ == cuda_stage_buffering::slots
               ? check_slot(slot)
               : 2 * static_cast<std::size_t>(layer) + static_cast<std::size_t>(parity);
  }

  std::vector<speculator_type*> speculators_;
  std::vector<Selector*> selectors_;  // [num_layers], null where not speculated
  executor_type* fetch_;
  std::vector<kv_view<L, device_space>> sources_;
  score_buffer<device_space> scores_;
  cuda_stage_lengths lengths_;
  std::array<device_span<const float>, 2> x_;
  std::vector<cuda_stage_buffers> sets_;
  cuda_stage_buffering buffering_;
  unsigned long long* hits_;
  cuda_stage_correction<executor_type> correction_{};
  int parity_ = 0;
};

template <kv_layout L, class Selector, compute_element PkT = float, compute_element WT = float,
          class Executor = zero_copy_executor_cuda<L>>
using infinigen_stages_cuda =
    speculation_stages_cuda<L, infinigen_policy_cuda<PkT, WT>, Selector, Executor>;

template <class S>
  requires pipeline_stages_cuda<S>
struct stages_ref_cuda {
  S* stages;
  void speculate(int layer, int slot, const cuda_exec& x) { stages->speculate(layer, slot, x); }
  void fetch(int layer, int slot, const cuda_exec& x) { stages->fetch(layer, slot, x); }
};

}  // namespace kvscout
