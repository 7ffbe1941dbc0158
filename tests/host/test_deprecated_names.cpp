// The names issue 33 replaced stay usable for one release, as deprecated aliases: each one used
// here with its warning silenced, and checked to name its replacement. The device-side ones
// (the .cuh headers) are in tests/cuda/test_deprecated_names_device.cu.

#include <catch2/catch.hpp>

#include <type_traits>

#include "kvscout/attention/decode.hpp"
#include "kvscout/attention/kivi_rows.hpp"
#include "kvscout/attention/rows.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/kivi.hpp"
#include "kvscout/pipeline/host_pipeline.hpp"
#include "kvscout/score/concepts.hpp"
#include "kvscout/score/device_concepts.hpp"
#include "kvscout/score/device_context.hpp"
#include "kvscout/score/h2o.hpp"
#include "kvscout/score/infinigen.hpp"
#include "kvscout/score/oracle.hpp"
#include "kvscout/score/quest.hpp"
#include "kvscout/score/streaming.hpp"
#include "kvscout/select/topk.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace {
namespace ks = kvscout;
using layout = ks::contiguous_layout<ks::half, 128, ks::hnd>;
using kivi = ks::kivi_layout<ks::half, 128, 2>;
using rows = ks::gathered_rows_host<ks::half, 128>;

// score/: the contexts and the score buffer
static_assert(std::is_same_v<ks::spec_context, ks::score_context<ks::host_space>>);
static_assert(std::is_same_v<ks::device_spec_context, ks::score_context<ks::device_space>>);
static_assert(std::is_same_v<ks::device_score_buffer, ks::score_buffer<ks::device_space>>);
// score/: the policies
static_assert(std::is_same_v<ks::infinigen_policy<>, ks::infinigen_policy_host<>>);
static_assert(std::is_same_v<ks::infinigen_policy<ks::half, ks::bfloat16>,
                             ks::infinigen_policy_host<ks::half, ks::bfloat16>>);
static_assert(std::is_same_v<ks::infinigen_query_scores<ks::infinigen_policy_host<>>,
                             ks::infinigen_query_scores_host<ks::infinigen_policy_host<>>>);
static_assert(std::is_same_v<ks::streaming_policy, ks::streaming_policy_host>);
static_assert(std::is_same_v<ks::oracle_policy<layout>, ks::oracle_policy_host<layout>>);
static_assert(std::is_same_v<ks::h2o_policy, ks::h2o_policy_host>);
static_assert(std::is_same_v<ks::quest_policy<128>, ks::quest_policy_host<128>>);
// attention/: the current token and the host row sources
static_assert(std::is_same_v<ks::device_current_token<ks::half>,
                             ks::current_token<ks::half, ks::device_space>>);
static_assert(std::is_same_v<ks::current_token<ks::half>,
                             ks::current_token<ks::half, ks::host_space>>);
static_assert(std::is_same_v<ks::gathered_rows<ks::half, 128>, rows>);
static_assert(std::is_same_v<ks::layout_rows<layout>, ks::layout_rows_host<layout>>);
static_assert(std::is_same_v<ks::joined_rows<rows, rows>, ks::joined_rows_host<rows, rows>>);
static_assert(std::is_same_v<ks::kivi_layout_rows<kivi>, ks::kivi_layout_rows_host<kivi>>);
static_assert(std::is_same_v<ks::kivi_gathered_rows<kivi>, ks::kivi_gathered_rows_host<kivi>>);
// kv/: the KIVI writer, named for its twin kivi_append_cuda
static_assert(std::is_same_v<ks::kivi_host_writer<kivi>, ks::kivi_append_host<kivi>>);
// fetch/ and pipeline/: the host executor and pipeline (the executor defaulted and given)
using gather = ks::gather_executor_host<layout>;
static_assert(std::is_same_v<ks::host_gather_executor<layout>, gather>);
static_assert(std::is_same_v<
              ks::host_decode_pipeline<layout, ks::streaming_policy_host, ks::topk_selector_host>,
              ks::decode_pipeline_host<layout, ks::streaming_policy_host, ks::topk_selector_host,
                                       gather>>);
static_assert(std::is_same_v<ks::host_decode_pipeline<layout, ks::infinigen_policy_host<>,
                                                      ks::topk_selector_host, gather>,
                             ks::decode_pipeline_host<layout, ks::infinigen_policy_host<>,
                                                      ks::topk_selector_host, gather>>);

// The device concepts' old names (plain aliases: a concept cannot be deprecated) accept what the
// new ones accept, and refuse what they refuse.
struct device_policy {
  void score(const ks::score_context<ks::device_space>&, const ks::score_buffer<ks::device_space>&,
             const ks::cuda_exec&) {}
  void score_query(ks::device_span<const float>, const ks::score_context<ks::device_space>&,
                   const ks::score_buffer<ks::device_space>&, const ks::cuda_exec&) {}
};
static_assert(ks::speculation_policy_cuda<device_policy> &&
              ks::device_speculation_policy<device_policy>);
static_assert(ks::query_scoring_policy_cuda<device_policy> &&
              ks::device_query_scoring_policy<device_policy>);
static_assert(!ks::device_speculation_policy<ks::streaming_policy_host>);
}  // namespace

TEST_CASE("deprecated names (issue 33) still build the objects they name", "[deprecated]") {
  float scores[6] = {};
  const ks::spec_context ctx{};
  const ks::score_buffer<ks::host_space> out{{scores, 6}, 1, 2, 3};
  CHECK(ctx.seq_lens.empty());
  CHECK(out.row(0, 1) == scores + 3);
  const ks::device_score_buffer dout{{scores, 6}, 1, 2, 3};
  CHECK(dout.row(0, 1) == scores + 3);
  ks::streaming_policy p({.num_kv_heads = 2, .sinks = 1});
  CHECK(p.configuration().num_kv_heads == 2);
  const ks::host_gather_config gc{.num_seqs = 2, .num_kv_heads = 4, .capacity = 16};
  CHECK(ks::host_gather_executor<layout>::workspace_bytes(gc) ==
        ks::gather_executor_host<layout>::workspace_bytes(gc));
  using old_pipe =
      ks::host_decode_pipeline<layout, ks::streaming_policy_host, ks::topk_selector_host>;
  using new_pipe =
      ks::decode_pipeline_host<layout, ks::streaming_policy_host, ks::topk_selector_host>;
  const ks::host_pipeline_config pc{.num_layers = 4, .skip_layers = 2, .num_seqs = 2,
                                    .num_kv_heads = 4, .num_q_heads = 8, .max_tokens = 64,
                                    .capacity = 16, .scale = 0.125f};
  CHECK(old_pipe::workspace_bytes(pc) == new_pipe::workspace_bytes(pc));
  CHECK(new_pipe::workspace_bytes(pc) > 0);
}

#pragma GCC diagnostic pop
