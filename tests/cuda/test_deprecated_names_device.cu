// The device-side names issue 33 replaced stay usable for one release, as deprecated aliases
// and forwarding functions: each one used here with its warning silenced (nvcc's front end and
// the host compiler), checked to name its replacement, and each forwarding function instantiated
// (so its body compiles against the function it forwards to). Nothing runs on the device; the
// host-side names are in tests/host/test_deprecated_names.cpp.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "gpu_harness.cuh"
#include "kvscout/attention/decode.cuh"
#include "kvscout/attention/rows.cuh"
#include "kvscout/fetch/copy_engine.cuh"
#include "kvscout/fetch/staged.cuh"
#include "kvscout/fetch/zero_copy.cuh"
#include "kvscout/kv/append.cuh"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/kivi.hpp"
#include "kvscout/pipeline/cuda_pipeline.hpp"
#include "kvscout/pipeline/cuda_stages.cuh"
#include "kvscout/score/device_concepts.hpp"
#include "kvscout/score/infinigen.cuh"
#include "kvscout/score/streaming.cuh"
#include "kvscout/select/topk.cuh"

#if defined(__NVCC__)
#pragma nv_diag_suppress deprecated_entity
#pragma nv_diag_suppress deprecated_entity_with_custom_message
#endif
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace {
namespace ks = kvscout;
using layout = ks::contiguous_layout<ks::half, 128, ks::hnd>;
using kivi = ks::kivi_layout<ks::half, 128, 2>;
using rows = ks::gathered_rows_cuda<ks::half, 128>;
using ks::cuda_exec;
using ks::device_span;
using ks::device_space;

// score/
static_assert(std::is_same_v<ks::infinigen_speculator_cuda<>, ks::infinigen_policy_cuda<>>);
static_assert(std::is_same_v<ks::infinigen_speculator_cuda<ks::half, ks::bfloat16>,
                             ks::infinigen_policy_cuda<ks::half, ks::bfloat16>>);
static_assert(ks::device_speculation_policy<ks::streaming_policy_cuda> &&
              ks::speculation_policy_cuda<ks::streaming_policy_cuda>);
static_assert(ks::device_query_scoring_policy<ks::infinigen_policy_cuda<>> &&
              ks::query_scoring_policy_cuda<ks::infinigen_policy_cuda<>>);
static_assert(!ks::device_query_scoring_policy<ks::streaming_policy_cuda>);

// attention/: the device row sources and their concept
static_assert(std::is_same_v<ks::gathered_rows_device<ks::half, 128>, rows>);
static_assert(std::is_same_v<ks::layout_rows_device<layout>, ks::layout_rows_cuda<layout>>);
static_assert(std::is_same_v<ks::kivi_gathered_rows_device<kivi>,
                             ks::kivi_gathered_rows_cuda<kivi>>);
static_assert(std::is_same_v<ks::joined_rows_device<rows, rows>, ks::joined_rows_cuda<rows, rows>>);
static_assert(ks::device_attention_rows<rows> && ks::attention_rows_cuda<rows>);
static_assert(!ks::device_attention_rows<ks::gathered_rows_host<ks::half, 128>>);

// fetch/: the CUDA executors
static_assert(std::is_same_v<ks::zero_copy_executor<layout>, ks::zero_copy_executor_cuda<layout>>);
static_assert(std::is_same_v<ks::zero_copy_executor<kivi>, ks::zero_copy_executor_cuda<kivi>>);
static_assert(std::is_same_v<ks::copy_engine_executor<layout>,
                             ks::copy_engine_executor_cuda<layout>>);
static_assert(std::is_same_v<ks::staged_executor<layout>, ks::staged_executor_cuda<layout>>);

// pipeline/: the stages (the executor defaulted and given), their reference, the pipeline and
// its stages' concept (a plain alias: it accepts what the new one accepts, refuses the rest)
using stages = ks::speculation_stages_cuda<layout, ks::streaming_policy_cuda,
                                           ks::topk_selector_cuda,
                                           ks::zero_copy_executor_cuda<layout>>;
static_assert(std::is_same_v<ks::cuda_speculation_stages<layout, ks::streaming_policy_cuda,
                                                         ks::topk_selector_cuda>,
                             stages>);
static_assert(std::is_same_v<ks::infinigen_cuda_stages<layout, ks::topk_selector_cuda>,
                             ks::infinigen_stages_cuda<layout, ks::topk_selector_cuda>>);
static_assert(std::is_same_v<
              ks::infinigen_cuda_stages<layout, ks::topk_selector_cuda, ks::half, ks::half,
                                        ks::zero_copy_executor_cuda<layout>>,
              ks::speculation_stages_cuda<layout, ks::infinigen_policy_cuda<ks::half, ks::half>,
                                          ks::topk_selector_cuda,
                                          ks::zero_copy_executor_cuda<layout>>>);
static_assert(std::is_same_v<ks::cuda_stages_ref<stages>, ks::stages_ref_cuda<stages>>);
static_assert(std::is_same_v<ks::cuda_decode_pipeline<ks::stages_ref_cuda<stages>>,
                             ks::decode_pipeline_cuda<ks::stages_ref_cuda<stages>>>);
static_assert(ks::cuda_pipeline_stages<stages> && ks::pipeline_stages_cuda<stages>);
static_assert(ks::cuda_pipeline_stages<ks::stages_ref_cuda<stages>>);
static_assert(!ks::cuda_pipeline_stages<ks::zero_copy_executor_cuda<layout>>);

// The forwarding functions, with the signatures of the functions they forward to.
using cur = ks::current_token<ks::half, device_space>;
[[maybe_unused]] const auto plan_fn =
    static_cast<ks::decode_attention_plan (*)(ks::decode_attention_shape)>(
        &ks::plan_decode_attention_device);
[[maybe_unused]] const auto attend_planned_fn =
    static_cast<void (*)(const rows&, const cur&, device_span<const float>, device_span<float>,
                         const ks::attention_params&, const ks::decode_attention_plan&,
                         device_span<std::byte>, const cuda_exec&)>(
        &ks::decode_attention_device<rows, ks::half>);
[[maybe_unused]] const auto attend_fn =
    static_cast<void (*)(const rows&, const cur&, device_span<const float>, device_span<float>,
                         const ks::attention_params&, const cuda_exec&)>(
        &ks::decode_attention_device<rows, ks::half>);
[[maybe_unused]] const auto append_scaled_fn =
    static_cast<void (*)(const layout&, device_span<std::byte>, device_span<std::byte>,
                         device_span<const float>, device_span<const float>, const std::int32_t*,
                         ks::kv_scales, const cuda_exec&)>(
        &ks::append_token_device<layout, const float>);
[[maybe_unused]] const auto append_fn =
    static_cast<void (*)(const layout&, device_span<std::byte>, device_span<std::byte>,
                         device_span<const float>, device_span<const float>, const std::int32_t*,
                         const cuda_exec&)>(&ks::append_token_device<layout, const float>);
[[maybe_unused]] const auto kivi_append_fn =
    static_cast<void (*)(const kivi&, const ks::kivi_buffers<device_space>&, std::int32_t*,
                         device_span<const float>, device_span<const float>, const cuda_exec&)>(
        &ks::kivi_append_device<kivi, const float>);

// The forwarding plan gives the plan it forwards to (num_sms given: no device is asked).
void check_plan_forwards() {
  const ks::decode_attention_shape sh{.num_seqs = 2, .num_kv_heads = 8, .num_q_heads = 32,
                                      .head_dim = 128, .max_rows = 1000, .num_sms = 132};
  const ks::decode_attention_plan a = plan_fn(sh);
  const ks::decode_attention_plan b = ks::plan_decode_attention_cuda(sh);
  GPU_CHECK(a.splits == b.splits && a.rows_per_split == b.rows_per_split &&
            a.head_blocks == b.head_blocks && a.heads_per_block == b.heads_per_block);
}
}  // namespace

#pragma GCC diagnostic pop

int main() {
  return gpu_test::run_all("deprecated_names_device", {{"plan_forwards", check_plan_forwards}});
}
