#pragma once
// Threshold selector on the device: the semantics of threshold_selector_host, both rules, the
// same indices, ties included.
//   per_head        one kernel, one block per row: the row maximum, then the best budget - |keep|
//                   candidates >= max - alpha; where rows are few and long, each row split over
//                   several blocks
//   infinigen_mean  two kernels, no host round trip: every row's candidate count into the
//                   workspace, then every block sums the counts itself (rows are few) for the mean
//                   and selects its row's best min(mean, slots)
//
//   kvscout::threshold_selector_cuda sel(cfg, workspace);   // cfg: threshold_selector_host::config
//   sel.select(scores, out, {stream, d_status});
//
// seq_lens are clamped to [0, stride] on the device (device_status::bad_length).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kvscout/core/detail/launch.cuh"
#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/select/concepts.hpp"
#include "kvscout/select/detail/device_config.hpp"
#include "kvscout/select/detail/device_selector.cuh"
#include "kvscout/select/detail/radix_select.cuh"
#include "kvscout/select/detail/radix_select_split.cuh"
#include "kvscout/select/threshold.hpp"

namespace kvscout {

class threshold_selector_cuda : public detail::device_selector_base<threshold_selector_host::config> {
 public:
  /// [num_seqs * num_kv_heads] int32 for infinigen_mean; the split kernels' for per_head rows that
  /// split (0 for short rows).
  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg,
                                                select_split_options opt = {}) {
    return detail::threshold_cuda_workspace_bytes(cfg, opt);
  }

  /// opt: how long rows split over blocks (per_head); the SM count is asked here when opt.num_sms
  /// is 0.
  threshold_selector_cuda(const config& cfg, device_span<std::byte> workspace,
                          select_split_options opt = {})
      : device_selector_base(cfg, workspace, workspace_bytes(cfg, opt), opt,
                             cfg.rule == threshold_rule::per_head) {}

  void select(const score_view<device_space>& scores, const selection_buffers<device_space>& out,
              const cuda_exec& exec) {
    const cudaStream_t stream = exec.stream;
    detail::select_params p;
    if (!prologue(scores, out, exec, p)) return;
    p.alpha = cfg_.alpha;
    p.row_counts = reinterpret_cast<std::int32_t*>(workspace_);  // infinigen_mean's counts
    const unsigned grid = static_cast<unsigned>(rows());
    if (cfg_.rule == threshold_rule::per_head) {
      if (split_.chunks > 1) {
        run_split(p, false, stream);
        return;
      }
      detail::launch(detail::threshold_rows<>, grid, detail::select_block_threads, 0, stream, p);
    } else {
      detail::launch(detail::threshold_mean_counts<>, grid, detail::select_block_threads, 0, stream,
                     p);
      KVSCOUT_CUDA_CHECK(cudaGetLastError());
      detail::launch(detail::threshold_mean_rows<>, grid, detail::select_block_threads, 0, stream,
                     p);
    }
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
  }
};

static_assert(row_selector<threshold_selector_cuda>);

}  // namespace kvscout
