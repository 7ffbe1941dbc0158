// Must NOT compile: CUDA stages with the correction step over a policy that cannot score layer
// i's own query (streaming_policy_cuda keeps sinks and a recent window; it has no score_query).
// The stages refuse it by name. Built for the host SIMT emulator (kvscout_simt: cuda_runtime.h).
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/pipeline/cuda_stages.cuh"
#include "kvscout/select/topk.cuh"
#include "kvscout/score/streaming.cuh"

int main() {
  using layout = kvscout::contiguous_layout<kvscout::half, 64, kvscout::hnd>;
  using stages = kvscout::speculation_stages_cuda<layout, kvscout::streaming_policy_cuda,
                                                  kvscout::topk_selector_cuda>;
  kvscout::topk_selector_cuda* selector = nullptr;
  stages::executor_type* fetch = nullptr;
  stages s({nullptr}, *selector, *fetch, {}, {}, {}, {}, {}, kvscout::cuda_stage_buffering::slots,
           nullptr, kvscout::cuda_stage_correction<stages::executor_type>{});
  return s.num_layers();
}
