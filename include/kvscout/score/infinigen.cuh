#pragma once
// InfiniGen's speculation on the device, for one layer: every query head's partial query, the
// scores of every cached token of every (sequence, kv head) aggregated over the GQA group, and
// the device partial key cache. Mirrors infinigen_policy_host, the GPU tests' reference.
//
//   using spec = kvscout::infinigen_policy_cuda<kvscout::half>;
//   // setup (once per layer): the only place anything is copied synchronously
//   spec sp(cfg, plans /* [num_kv_heads] */, w_q, b_q,
//           {static_cast<std::byte*>(ws), spec::workspace_bytes(cfg)});
//   sp.append(keys, seq_ids, token_ids, count, {stream, d_status});   // as tokens enter the cache
//   sp.score({.x = x, .positions = pos, .seq_lens = lens, .max_seq_len = bound},
//            {.scores = scores, .num_seqs = S, .num_kv_heads = H, .stride = stride},
//            {stream, d_status});                                    // during layer i - 1
//
// seq_lens are clamped to [0, max_seq_len] and append pairs outside [0, num_seqs) x
// [0, max_tokens) are skipped, each raising a bit in exec.status. Scores are logits times
// cfg.shape.scale, row (s, h) written for t < seq_lens[s] only.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kvscout/cache/partial_key_store.hpp"
#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/detail/launch.cuh"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/score/detail/infinigen_append_kernels.cuh"
#include "kvscout/score/detail/infinigen_kernels.cuh"
#include "kvscout/score/detail/infinigen_query_kernels.cuh"
#include "kvscout/score/device_concepts.hpp"
#include "kvscout/score/infinigen_device.hpp"
#include "kvscout/score/policy_layers.hpp"
#include "kvscout/skew/partial_query.hpp"
#include "kvscout/skew/plan.hpp"

namespace kvscout {

/// PkT: the partial keys' format: float, half, bfloat16, or quantized_keys<Bits, Group> (scored
/// from the codes, appended in order); WT: the partial query weights' (float, half or bfloat16).
template <partial_key_format PkT = float, compute_element WT = float>
class infinigen_policy_cuda {
 public:
  using config = infinigen_config;
  using config_type = config;
  using memory_space = device_space;
  using key_format = PkT;
  static constexpr bool quantized = detail::is_quantized_keys_v<PkT>;

  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg) {
    return detail::infinigen_cuda_layout_of<PkT, WT>(cfg).total;
  }
  static constexpr std::size_t workspace_alignment = detail::infinigen_workspace_alignment;

  /// plans: one per kv head (mode, r, head_dim as in cfg); w_q [num_q_heads * head_dim, d_model],
  /// b_q [num_q_heads * head_dim] or empty, on the host, read here only. The partial weights go
  /// into the workspace by a synchronous cudaMemcpy. The cache is not cleared: a token must be
  /// appended before a length covers it.
  infinigen_policy_cuda(const config& cfg, const std::vector<skew_plan>& plans,
                        host_span<const float> w_q, host_span<const float> b_q,
                        device_span<std::byte> workspace)
      : infinigen_policy_cuda(build_tag{}, cfg, plans, nullptr, w_q, b_q, workspace) {}
  template <compute_element In>
    requires(!std::is_same_v<In, float>)
  infinigen_policy_cuda(const config& cfg, const std::vector<skew_plan>& plans,
                        host_span<const In> w_q, host_span<const In> b_q,
                        device_span<std::byte> workspace)
      : infinigen_policy_cuda(build_tag{}, cfg, plans, nullptr, w_q, b_q, workspace) {}

  /// One cache read at two widths (as infinigen_policy_host's): score() reads cfg.r channels,
  /// score_query() all cfg.correction_r of `correction_plans` (one per kv head, each holding its
  /// speculation plan's channels, with the same mode, RoPE and rotation).
  infinigen_policy_cuda(const config& cfg, const std::vector<skew_plan>& plans,
                        const std::vector<skew_plan>& correction_plans,
                        host_span<const float> w_q, host_span<const float> b_q,
                        device_span<std::byte> workspace)
      : infinigen_policy_cuda(build_tag{}, cfg, plans, &correction_plans, w_q, b_q, workspace) {}
  template <compute_element In>
    requires(!std::is_same_v<In, float>)
  infinigen_policy_cuda(const config& cfg, const std::vector<skew_plan>& plans,
                        const std::vector<skew_plan>& correction_plans,
                        host_span<const In> w_q, host_span<const In> b_q,
                        device_span<std::byte> workspace)
      : infinigen_policy_cuda(build_tag{}, cfg, plans, &correction_plans, w_q, b_q, workspace) {}

  /// One policy per layer that has plans, as infinigen_policy_host::layers builds them (each layer's
  /// r, mode and correction_r its plans' own), each with a device workspace owned by the result.
  /// w_q / b_q: [layer] on the host, b_q entries may be empty (no bias).
  template <compute_element In>
  [[nodiscard]] static policy_layers<infinigen_policy_cuda> layers(
      const config& cfg, const std::vector<std::vector<skew_plan>>& plans,
      const std::vector<std::vector<skew_plan>>& correction_plans,
      const std::vector<host_span<const In>>& w_q, const std::vector<host_span<const In>>& b_q) {
    return detail::build_infinigen_layers<infinigen_policy_cuda, In>(cfg, plans, correction_plans,
                                                                     w_q, b_q);
  }
  template <compute_element In>
  [[nodiscard]] static policy_layers<infinigen_policy_cuda> layers(
      const config& cfg, const std::vector<std::vector<skew_plan>>& plans,
      const std::vector<host_span<const In>>& w_q, const std::vector<host_span<const In>>& b_q) {
    return detail::build_infinigen_layers<infinigen_policy_cuda, In>(cfg, plans, {}, w_q, b_q);
  }

 private:
  struct build_tag {};
  template <compute_element In>
  infinigen_policy_cuda(build_tag, const config& cfg, const std::vector<skew_plan>& plans,
                        const std::vector<skew_plan>* correction_plans,
                        host_span<const In> w_q, host_span<const In> b_q,
                        device_span<std::byte> workspace)
      : cfg_(cfg), layout_(detail::infinigen_cuda_layout_of<PkT, WT>(cfg)) {
    detail::check_infinigen_cuda_workspace(workspace, layout_.total);
    detail::check_infinigen_plans(cfg, plans, w_q, b_q, correction_plans);
    base_ = workspace.data();
    rope_ = plans[0].rope;
    const int H = cfg.shape.num_kv_heads, Hq = cfg.shape.num_q_heads, g = Hq / H,
              D = cfg.shape.head_dim, r = cfg.key_r();
    // The rotation and channels below are the cache's; the weights the speculation's.
    std::vector<skew_plan> key_plans;
    if (correction_plans != nullptr) {
      for (int h = 0; h < H; ++h)
        key_plans.push_back(detail::nested_key_plan(plans[static_cast<std::size_t>(h)],
                                                    (*correction_plans)[static_cast<std::size_t>(h)],
                                                    "kv head " + std::to_string(h)));
    }
    const std::vector<skew_plan>& kp = correction_plans != nullptr ? key_plans : plans;
    const std::size_t rows = static_cast<std::size_t>(layout_.rows);
    const std::size_t dm = static_cast<std::size_t>(cfg.shape.d_model);
    std::vector<WT> weights(static_cast<std::size_t>(Hq) * rows * dm);
    std::vector<float> bias(static_cast<std::size_t>(Hq) * rows);
    for (int qh = 0; qh < Hq; ++qh) {
      const partial_query_weights w = detail::make_partial_query_weights_from(
          plans[static_cast<std::size_t>(qh / g)], w_q, b_q, cfg.shape.d_model, qh);
      const std::vector<WT> rounded = detail::weights_as<WT>(w).weight;
      std::memcpy(weights.data() + static_cast<std::size_t>(qh) * rows * dm, rounded.data(),
                  sizeof(WT) * rows * dm);
      std::memcpy(bias.data() + static_cast<std::size_t>(qh) * rows, w.bias.data(),
                  sizeof(float) * rows);
    }
    std::vector<std::int32_t> channels(static_cast<std::size_t>(H) * r);
    std::vector<std::int32_t> planes;
    std::vector<float> rotation;
    if (cfg.mode != rope_mode::rope_planes) rotation.resize(static_cast<std::size_t>(H) * D * r);
    for (int h = 0; h < H; ++h) {
      const skew_plan& p = kp[static_cast<std::size_t>(h)];
      for (int i = 0; i < r; ++i) {
        channels[static_cast<std::size_t>(h) * r + i] = p.channels[static_cast<std::size_t>(i)];
      }
      if (cfg.mode == rope_mode::rope_planes) {
        const auto& sp = plans[static_cast<std::size_t>(h)].planes;  // the speculation's
        planes.insert(planes.end(), sp.begin(), sp.end());
      } else {
        for (int d = 0; d < D; ++d)
          for (int i = 0; i < r; ++i)
            rotation[(static_cast<std::size_t>(h) * D + d) * r + i] =
                p.A[static_cast<std::size_t>(d) * D + p.channels[static_cast<std::size_t>(i)]];
      }
    }
    upload(layout_.weights, weights);
    upload(layout_.bias, bias);
    upload(layout_.rotation, rotation);
    upload(layout_.channels, channels);
    upload(layout_.planes, planes);
    if constexpr (quantized) {
      KVSCOUT_CUDA_CHECK(cudaMemset(
          base_ + layout_.keys, 0,
          detail::device_key_format<PkT>::bytes(cfg.shape.num_seqs, H, r, cfg.shape.max_tokens)));
    }
  }

 public:

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }
  [[nodiscard]] bool rotated_keys() const noexcept { return cfg_.mode != rope_mode::pre_rope_folded; }

  [[nodiscard]] detail::device_key_view<PkT> keys() const noexcept {
    return detail::device_key_format<PkT>::make(base_ + layout_.keys, cfg_.shape.num_seqs,
                                                cfg_.shape.num_kv_heads, cfg_.key_r(),
                                                cfg_.shape.max_tokens);
  }
  [[nodiscard]] device_span<const float> partial_queries() const noexcept {
    return {at<float>(layout_.q), static_cast<std::size_t>(cfg_.shape.num_seqs) *
                                      cfg_.shape.num_q_heads * static_cast<std::size_t>(cfg_.r)};
  }

  /// Projects and stores `count` tokens' partial keys: keys [count, num_kv_heads, head_dim] (RoPE'd
  /// at their own positions unless the mode is pre_rope_folded); token n goes to sequence
  /// seq_ids[n], position token_ids[n] (device memory; pairs out of range are skipped and raise
  /// device_status::bad_index). The pairs of one call must be distinct (unchecked); a repeated slot
  /// keeps either entry's key.
  ///
  /// Quantised keys take each sequence's tokens as one run of consecutive entries and positions per
  /// call, from where the sequence stopped (or from 0: a new sequence in the slot); an entry that
  /// breaks this is skipped and raises bad_order, a non-finite value is stored as 0 and raises
  /// bad_value.
  template <class KSpan = const float>
  void append(device_span<KSpan> keys, device_span<const int32_t> seq_ids,
              device_span<const int32_t> token_ids, int count, const cuda_exec& exec) {
    const cudaStream_t stream = exec.stream;
    using K = std::remove_const_t<KSpan>;
    static_assert(compute_element<K>,
                  "kvscout::infinigen_policy_cuda::append: keys must be float, "
                                 "half or bfloat16");
    detail::check_infinigen_cuda_append(cfg_, keys.size(), keys.data() != nullptr, seq_ids,
                                        token_ids, count);
    if (count == 0) return;
    const dim3 grid(static_cast<unsigned>(count), static_cast<unsigned>(cfg_.shape.num_kv_heads));
    if constexpr (quantized) {
      // The groups the call completes quantised, the rest staged, then the counts.
      constexpr int Bits = PkT::bits, Group = PkT::group;
      const auto p = append_params(keys.data(), seq_ids, token_ids, count, exec.status);
      const std::size_t smem = sizeof(float) * static_cast<std::size_t>(p.r) * Group;
      detail::launch(detail::quantise_groups<Bits, Group, K>, grid, detail::spec_append_threads, smem,
                     stream, p);
      KVSCOUT_CUDA_CHECK(cudaGetLastError());
      detail::launch(detail::stage_tail<Bits, Group, K>, grid, detail::spec_append_threads, 0, stream, p);
      KVSCOUT_CUDA_CHECK(cudaGetLastError());
      detail::launch(detail::count_tokens<Bits, Group, K>, dim3(static_cast<unsigned>(count)), 1, 0,
                     stream, p);
    } else {
      const auto p = append_params(keys.data(), seq_ids, token_ids, count, exec.status);
      detail::launch(detail::append_keys<PkT, K>, grid, detail::spec_append_threads, 0, stream, p);
    }
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
  }

  /// Writes out.scores[s, h, t] for t < seq_lens[s]. max_seq_len = 0 launches nothing
  /// (partial_queries() then keeps the previous call's values). Enqueues on exec.stream.
  void score(const score_context<device_space>& ctx, const score_buffer<device_space>& out,
             const cuda_exec& exec) {
    detail::check_infinigen_cuda_score(cfg_, ctx, out);
    if (ctx.max_seq_len == 0) return;
    const detail::infinigen_params<PkT> p = params(ctx, out, exec.status);
    const detail::spec_launch_shapes shapes = detail::spec_shapes(cfg_, p.rows, p.num_seqs, p.max_len);
    const cudaStream_t stream = exec.stream;
    detail::launch(detail::partial_query_gemv<PkT, WT>, static_cast<unsigned>(shapes.gemv_blocks),
                   detail::spec_gemv_threads, 0, stream, p);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
    detail::launch(detail::partial_query_finish<PkT>, dim(shapes.finish),
                   detail::spec_finish_threads, 0, stream, p);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
    score_rows(p, shapes, stream);
  }

  /// The correction step's scores: the layer's own query q [num_seqs, num_q_heads, head_dim] floats
  /// on the device, after RoPE, projected as a key is and scored against the same partial keys;
  /// pre_rope_folded plans are refused. It shares score()'s partial-query scratch: the caller
  /// orders calls of the two on one speculator (one stream, or an event).
  void score_query(device_span<const float> q, const score_context<device_space>& ctx,
                   const score_buffer<device_space>& out, const cuda_exec& exec) {
    detail::check_infinigen_cuda_score_query(cfg_, q.size(), q.data() != nullptr, ctx, out);
    if (ctx.max_seq_len == 0) return;
    detail::infinigen_params<PkT> p = params(ctx, out, exec.status);
    p.aggregation = cfg_.late_aggregation();
    p.r = cfg_.key_r();  // every cached channel
    const detail::spec_launch_shapes shapes = detail::spec_shapes(cfg_, p.rows, p.num_seqs, p.max_len);
    const cudaStream_t stream = exec.stream;
    detail::launch(detail::project_true_query<PkT>,
                   dim3(static_cast<unsigned>(p.num_seqs), static_cast<unsigned>(p.num_q_heads)),
                   detail::spec_project_threads, 0, stream, p, q.data());
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
    score_rows(p, shapes, stream);
  }

 private:
  template <class K>
  detail::key_append_params<detail::device_key_view<PkT>, K> append_params(
      const K* k, device_span<const int32_t> seq_ids, device_span<const int32_t> token_ids,
      int count, int* status) const {
    detail::key_append_params<detail::device_key_view<PkT>, K> p{};
    p.rotation = at<float>(layout_.rotation);
    p.channels = at<std::int32_t>(layout_.channels);
    p.keys = keys();
    p.k = k;
    p.seq_ids = seq_ids.data();
    p.token_ids = token_ids.data();
    p.count = count;
    p.num_kv_heads = cfg_.shape.num_kv_heads;
    p.head_dim = cfg_.shape.head_dim;
    p.r = cfg_.key_r();
    p.mode = cfg_.mode;
    p.status = status;
    return p;
  }

  static dim3 dim(const long long (&g)[3]) {
    return dim3(static_cast<unsigned>(g[0]), static_cast<unsigned>(g[1]), static_cast<unsigned>(g[2]));
  }

  void score_rows(const detail::infinigen_params<PkT>& p, const detail::spec_launch_shapes& shapes,
                  cudaStream_t stream) const {
    const dim3 grid = dim(shapes.score);
    const std::size_t q_bytes = sizeof(float) * static_cast<std::size_t>(p.group) * p.r;
    with_group(p.group, [&](auto G) {
      constexpr int g = decltype(G)::value;
      if (p.aggregation == gqa_aggregation::sum_prob) {
        detail::launch(detail::softmax_stats<PkT, g>, grid, detail::spec_block_threads, q_bytes,
                       stream, p);
        KVSCOUT_CUDA_CHECK(cudaGetLastError());
        detail::launch(detail::score_sum_prob<PkT, g>, grid, detail::spec_block_threads,
                       q_bytes + 2 * sizeof(float) * p.group, stream, p);
      } else {
        detail::launch(detail::score_group<PkT, g>, grid, detail::spec_block_threads, q_bytes,
                       stream, p);
      }
      KVSCOUT_CUDA_CHECK(cudaGetLastError());
    });
  }

  template <class T>
  T* at(std::size_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }

  template <class T>
  void upload(std::size_t offset, const std::vector<T>& v) {
    if (v.empty()) return;
    KVSCOUT_CUDA_CHECK(cudaMemcpy(at<T>(offset), v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice));
  }

  template <class F>
  static void with_group(int g, F&& f) {
    switch (g) {
      case 1: f(std::integral_constant<int, 1>{}); break;
      case 2: f(std::integral_constant<int, 2>{}); break;
      case 4: f(std::integral_constant<int, 4>{}); break;
      case 8: f(std::integral_constant<int, 8>{}); break;
      default: f(std::integral_constant<int, 0>{}); break;
    }
  }

  detail::infinigen_params<PkT> params(const score_context<device_space>& ctx,
                                       const score_buffer<device_space>& out, int* status) const {
    detail::infinigen_params<PkT> p{};
    p.weights = at<WT>(layout_.weights);
    p.bias = at<float>(layout_.bias);
    p.rotation = at<float>(layout_.rotation);
    p.channels = at<std::int32_t>(layout_.channels);
    p.planes = at<std::int32_t>(layout_.planes);
    p.y = at<float>(layout_.y);
    p.q = at<float>(layout_.q);
    p.stats = at<float2>(layout_.stats);
    p.keys = keys();
    p.x = ctx.x.data();
    p.positions = ctx.positions.data();
    p.seq_lens = ctx.seq_lens.data();
    p.seq_ids = ctx.seq_ids.empty() ? nullptr : ctx.seq_ids.data();
    p.scores = out.scores.data();
    p.num_seqs = out.num_seqs;
    p.num_kv_heads = cfg_.shape.num_kv_heads;
    p.num_q_heads = cfg_.shape.num_q_heads;
    p.group = cfg_.shape.num_q_heads / cfg_.shape.num_kv_heads;
    p.head_dim = cfg_.shape.head_dim;
    p.d_model = cfg_.shape.d_model;
    p.r = cfg_.r;
    p.key_r = cfg_.key_r();
    p.rows = layout_.rows;
    p.stride = out.stride;
    p.max_len = ctx.max_seq_len;  // validated <= stride and <= max_tokens
    p.status = status;
    p.max_chunks = layout_.chunks;
    p.rope = rope_;
    p.mode = cfg_.mode;
    p.aggregation = cfg_.aggregation;
    p.scale = cfg_.shape.scale;
    return p;
  }

  config cfg_;
  detail::infinigen_cuda_layout layout_;
  std::byte* base_ = nullptr;
  rope_config rope_{};
};

static_assert(speculation_policy_cuda<infinigen_policy_cuda<float>>);
static_assert(speculation_policy_cuda<infinigen_policy_cuda<half>>);
static_assert(speculation_policy_cuda<infinigen_policy_cuda<half, bfloat16>>);
static_assert(speculation_policy_cuda<infinigen_policy_cuda<quantized_keys<2>>>);

}  // namespace kvscout
