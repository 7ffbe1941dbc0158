#pragma once
// A preset's CUDA pipeline with its parts owned, the device twin of preset_pipeline.hpp: per
// speculated layer an InfiniGen policy, a top-k selector and a correction selector at the layer's
// shares; the executors, buffers, decode_pipeline_cuda and attention plans. The same parts by
// hand: examples/02 (one layer), pipeline/cuda_stages.cuh.
//
//   const auto p = kvscout::presets::kvscout_default(64);
//   kvscout::presets::pipeline_cuda<layout> owned(p, shape, cal, 0.10, w_q, b_q, sources,
//                                                 {d_positions, d_lens, max_len});
//   for (int i = 0; i < L; ++i) {                  // x: the step's cuda_pipeline_exec
//     owned.input_ready(i, x_i, x);                // side streams: speculate, fetch layer i + 1
//     owned.attend(i, q_i, current_i, out_i, x);  // compute: its rows, correction, attention
//   }
// After construction nothing allocates, synchronises or reads device memory on the host (a step
// can be captured in a CUDA graph). Neither copyable nor movable.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <deque>
#include <optional>
#include <vector>

#include "kvscout/attention/decode.cuh"
#include "kvscout/attention/rows.cuh"
#include "kvscout/core/workspace.hpp"
#include "kvscout/fetch/zero_copy.cuh"
#include "kvscout/pipeline/cuda_pipeline.hpp"
#include "kvscout/pipeline/cuda_stages.cuh"
#include "kvscout/preset_pipeline.hpp"
#include "kvscout/select/correction.cuh"
#include "kvscout/select/topk.cuh"
#include "kvscout/score/infinigen.cuh"

namespace kvscout::presets {

/// PkT: the preset's partial-key format (partial_keys_t<key_bits>). Top-k presets, non-KIVI layouts
/// (KIVI rows need kivi_gathered_rows_cuda: build those stages by hand).
template <kv_layout Layout, partial_key_format PkT = partial_keys_t<2>>
  requires(!kivi_quantized_layout<Layout>)
class pipeline_cuda {
 public:
  using policy_type = policy_layers<infinigen_policy_cuda<PkT>>;  // one per speculated layer
  using executor_type = zero_copy_executor_cuda<Layout>;
  using stages_type = speculation_stages_cuda<Layout, infinigen_policy_cuda<PkT>, topk_selector_cuda>;
  using pipeline_type = decode_pipeline_cuda<stages_ref_cuda<stages_type>>;
  using element_type = typename Layout::element_type;

  struct options {
    bool overlap = true;    // false: speculation and fetch in line on the compute stream
    int gather_blocks = 0;  // the executors' zero_copy_config::max_blocks
  };

  /// cal, w_q, b_q: as pipeline_host's. sources[l]: layer l's host cache as the device reads it
  /// (mapped), one per layer. lengths: the device's positions and cached lengths, which the caller
  /// advances on the compute stream after a step's appends, and their host-known bound
  /// (max_seq_len <= shape.max_tokens; set_max_seq_len moves it).
  template <compute_element In>
  pipeline_cuda(const speculation_preset& p, const decode_shape& shape, const calibration& cal,
                double budget, const std::vector<host_span<const In>>& w_q,
                const std::vector<host_span<const In>>& b_q,
                std::vector<kv_view<Layout, device_space>> sources,
                const cuda_stage_lengths& lengths, options opt = {})
      : budgets_(detail::preset_pipeline_budgets<Layout, PkT>("pipeline_cuda", p, shape, cal,
                                                              budget, w_q, b_q)),
        shape_(shape),
        policy_(detail::preset_policy_layers<infinigen_policy_cuda<PkT>>(p, shape, cal, w_q, b_q)),
        sources_(std::move(sources)),
        fetch_({.shape = shape, .capacity = budgets_.capacity, .max_blocks = opt.gather_blocks}) {
    KVSCOUT_EXPECTS(sources_.size() == static_cast<std::size_t>(shape.num_layers),
                    "pipeline_cuda: ", sources_.size(), " sources, expected one host cache per "
                    "layer (", shape.num_layers, ")");
    KVSCOUT_EXPECTS(lengths.max_seq_len <= shape.max_tokens, "pipeline_cuda: max_seq_len = ",
                    lengths.max_seq_len, " is more than shape.max_tokens = ", shape.max_tokens);
    const std::size_t kb = sources_[0].layout.k_row_bytes(), vb = sources_[0].layout.v_row_bytes();
    mem_ws_ = device_workspace(cuda_stage_memory::bytes(shape, budgets_.capacity, kb, vb), 256);
    mem_ = cuda_stage_memory::carve(shape, budgets_.capacity, kb, vb, mem_ws_.span());
    build_selectors();
    if (!selectors_.empty() && budgets_.correction_capacity > 0) {
      build_correction(opt, kb, vb);
      stages_.emplace(policy_.pointers(), selector_ptrs_, fetch_, sources_, mem_.scores, lengths,
                      mem_.inputs(), mem_.sets(), cuda_stage_buffering::slots, nullptr,
                      cuda_stage_correction<executor_type>{&*corr_selectors_.begin(), &*corr_fetch_,
                                                           corr_mem_.scores, corr_mem_.set,
                                                           corr_ptrs_});
    } else {
      stages_.emplace(policy_.pointers(), selector_ptrs_, fetch_, sources_, mem_.scores, lengths,
                      mem_.inputs(), mem_.sets());
    }
    pipe_.emplace(cuda_pipeline_config{.shape = shape,
                                       .skip_layers = std::min(p.skip_layers, shape.num_layers),
                                       .overlap = opt.overlap},
                  stages_ref_cuda<stages_type>{&*stages_});
    sparse_plan_ = plan_decode_attention_cuda(
        {.shape = shape, .max_rows = budgets_.capacity + budgets_.correction_capacity + 1});
    dense_plan_ = plan_decode_attention_cuda({.shape = shape, .max_rows = shape.max_tokens + 1});
    attention_ws_ = device_workspace(
        std::max(sparse_plan_.workspace_bytes(), dense_plan_.workspace_bytes()), 256);
  }
  pipeline_cuda(const pipeline_cuda&) = delete;
  pipeline_cuda& operator=(const pipeline_cuda&) = delete;

  /// Layer `layer`'s input [num_seqs, d_model] is ready on x.compute: copies it (on x.compute) into
  /// the slot layer + 1's speculation reads and starts that speculation and its fetch on x.speculate
  /// and x.copy. layer -1: the first layer's input (skip_layers 0). Call it before attend(layer).
  void input_ready(int layer, device_span<const float> input, const cuda_pipeline_exec& x) {
    KVSCOUT_EXPECTS(layer >= -1 && layer < shape_.num_layers, "pipeline_cuda::input_ready: layer ",
                    layer, " is out of range [-1, ", shape_.num_layers, ")");
    if (!pipe_->sparse(layer + 1)) {
      if (layer >= 0) pipe_->input_ready(layer, x);  // its checks; nothing to launch
      return;
    }
    const int b = pipeline_type::slot(layer + 1);
    const device_span<float> slot = mem_.x[static_cast<std::size_t>(b)];
    KVSCOUT_EXPECTS(input.data() != nullptr && input.size() == slot.size(),
                    "pipeline_cuda::input_ready: the input holds ", input.size(),
                    " floats, expected [num_seqs, d_model] = ", slot.size(), ", not null");
    // Refused before anything is enqueued: the slot's last launch must have been attended.
    KVSCOUT_EXPECTS(pending_[b] < 0, "pipeline_cuda::input_ready(", layer, "): slot ", b,
                    " still holds layer ", pending_[b], "'s rows; call attend(", pending_[b],
                    ") first");
    KVSCOUT_EXPECTS(!pipe_->configuration().overlap ||
                        (x.speculate != x.compute && x.copy != x.compute && x.copy != x.speculate),
                    "overlap needs three distinct streams (compute, speculate, copy)");
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(slot.data(), input.data(), slot.size_bytes(),
                                       cudaMemcpyDeviceToDevice, x.compute));
    pending_[b] = layer + 1;
    if (layer < 0)
      pipe_->speculate_first(x);
    else
      pipe_->input_ready(layer, x);
  }

  /// Layer `layer`'s attention on x.compute (out [num_seqs, num_q_heads, head_dim], q after RoPE):
  /// waits for its rows, runs the correction step with q and attends over both sets; a dense layer
  /// attends over its whole cache in place.
  void attend(int layer, device_span<const float> q,
              const current_token<element_type, device_space>& cur, device_span<float> out,
              const cuda_pipeline_exec& x) {
    pipe_->wait_rows(layer, x);
    const cuda_exec ex{x.compute, x.status};
    const attention_params ap{.num_q_heads = shape_.num_q_heads, .scale = shape_.scale};
    const device_span<std::byte> ws = attention_ws_.span();
    if (!pipe_->sparse(layer)) {
      decode_attention_cuda(layout_rows_cuda<Layout>(sources_[static_cast<std::size_t>(layer)]),
                            cur, q, out, ap, dense_plan_, ws, ex);
      return;
    }
    const int b = pipeline_type::slot(layer);
    pending_[b] = -1;
    const cuda_stage_buffers& got = stages_->buffers(layer, b);
    const rows_type rows(got.selection.view(), got.rows);
    if (!stages_->has_correction()) {
      decode_attention_cuda(rows, cur, q, out, ap, sparse_plan_, ws, ex);
      return;
    }
    stages_->correct(layer, b, q, ex);
    const cuda_stage_buffers& add = stages_->added(layer, b);
    decode_attention_cuda(joined_rows_cuda(rows, rows_type(add.selection.view(), add.rows)), cur,
                          q, out, ap, sparse_plan_, ws, ex);
  }

  /// Layer `layer`'s policy takes `count` tokens' keys [count, num_kv_heads, head_dim] (the prefill's,
  /// then each step's new token after its attention); a dense layer none.
  template <class KSpan>
  void append(int layer, device_span<KSpan> keys, device_span<const int32_t> seq_ids,
              device_span<const int32_t> token_ids, int count, const cuda_exec& x) {
    KVSCOUT_EXPECTS(layer >= 0 && layer < shape_.num_layers, "pipeline_cuda::append: layer ",
                    layer, " is out of range [0, ", shape_.num_layers, ")");
    if (policy_.tracks(layer)) policy_[layer].append(keys, seq_ids, token_ids, count, x);
  }

  /// The host-known bound on the cached lengths, as they grow (at most shape.max_tokens).
  void set_max_seq_len(int n) {
    KVSCOUT_EXPECTS(n <= shape_.max_tokens, "pipeline_cuda: max_seq_len = ", n,
                    " is more than shape.max_tokens = ", shape_.max_tokens);
    stages_->set_max_seq_len(n);
  }

  [[nodiscard]] pipeline_type& pipeline() noexcept { return *pipe_; }
  [[nodiscard]] stages_type& stages() noexcept { return *stages_; }
  [[nodiscard]] policy_type& policy() noexcept { return policy_; }
  [[nodiscard]] const step_budgets& budgets() const noexcept { return budgets_; }

 private:
  using rows_type = gathered_rows_cuda<element_type, Layout::head_dim>;

  void build_selectors() {
    selector_ptrs_.assign(static_cast<std::size_t>(shape_.num_layers), nullptr);
    for (int l = 0; l < shape_.num_layers; ++l) {
      if (!policy_.tracks(l)) continue;
      const topk_selector_cuda::config c = budgets_.selector_config(shape_, l);
      const device_span<std::byte> ws = workspaces_.emplace_back(
          topk_selector_cuda::workspace_bytes(c), topk_selector_cuda::workspace_alignment).span();
      selector_ptrs_[static_cast<std::size_t>(l)] = &selectors_.emplace_back(c, ws);
    }
  }
  void build_correction(const options& opt, std::size_t kb, std::size_t vb) {
    const int extra = budgets_.correction_capacity;
    corr_ptrs_.assign(static_cast<std::size_t>(shape_.num_layers), nullptr);
    for (int l = 0; l < shape_.num_layers; ++l) {
      if (!policy_.tracks(l)) continue;
      const correction_selector_cuda::config c{.shape = shape_, .capacity = extra, .extra = extra,
                                               .total_share = budgets_.total[static_cast<std::size_t>(l)]};
      const device_span<std::byte> ws = workspaces_.emplace_back(
          correction_selector_cuda::workspace_bytes(c),
          correction_selector_cuda::workspace_alignment).span();
      corr_ptrs_[static_cast<std::size_t>(l)] = &corr_selectors_.emplace_back(c, ws);
    }
    corr_fetch_.emplace(zero_copy_config{.shape = shape_, .capacity = extra,
                                         .max_blocks = opt.gather_blocks});
    // The late scores and the added rows' two sets (the two input slots go unused).
    corr_ws_ = device_workspace(cuda_stage_memory::bytes(shape_, extra, kb, vb), 256);
    corr_mem_ = cuda_stage_memory::carve(shape_, extra, kb, vb, corr_ws_.span());
  }

  step_budgets budgets_;
  decode_shape shape_;
  policy_type policy_;
  std::vector<kv_view<Layout, device_space>> sources_;
  executor_type fetch_;
  std::deque<device_workspace> workspaces_;  // the selectors'
  std::deque<topk_selector_cuda> selectors_;  // never moved: the stages hold pointers
  std::vector<topk_selector_cuda*> selector_ptrs_;
  std::deque<correction_selector_cuda> corr_selectors_;
  std::vector<correction_selector_cuda*> corr_ptrs_;
  std::optional<executor_type> corr_fetch_;
  device_workspace mem_ws_, corr_ws_;
  cuda_stage_memory mem_{}, corr_mem_{};
  std::optional<stages_type> stages_;
  std::optional<pipeline_type> pipe_;
  decode_attention_plan sparse_plan_{}, dense_plan_{};
  int pending_[2] = {-1, -1};  // the layer launched into each slot and not yet attended
  device_workspace attention_ws_;
};

}  // namespace kvscout::presets
