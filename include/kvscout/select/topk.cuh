#pragma once
// Exact top-k selector on the device: the semantics of topk_selector_host, the same indices, ties
// included, by a radix select over score keys and an order-preserving compaction: one thread
// block per (sequence, kv_head) row where rows fill the device, else each row split over several
// blocks.
//
//   kvscout::topk_selector_cuda topk(cfg, workspace);   // cfg: topk_selector_host::config
//   topk.select(scores, out, {stream, d_status});
//
// seq_lens are clamped to [0, stride] on the device (device_status::bad_length). Counts stay on
// the device.

#include <cuda_runtime.h>

#include <cstddef>

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
#include "kvscout/select/topk.hpp"

namespace kvscout {

class topk_selector_cuda : public detail::device_selector_base<topk_selector_host::config> {
 public:
  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg,
                                                select_split_options opt = {}) {
    return detail::topk_cuda_workspace_bytes(cfg, opt);
  }

  /// opt: how long rows split over blocks; the SM count is asked here when opt.num_sms is 0.
  topk_selector_cuda(const config& cfg, device_span<std::byte> workspace,
                     select_split_options opt = {})
      : device_selector_base(cfg, workspace, workspace_bytes(cfg, opt), opt, true) {}

  void select(const score_view<device_space>& scores, const selection_buffers<device_space>& out,
              const cuda_exec& exec) {
    select_rows(scores, out, exec, nullptr);
  }

 private:
  friend class correction_selector_cuda;
  /// row_budgets: null, or one budget per row in device memory (each in [0, capacity]).
  void select_rows(const score_view<device_space>& scores,
                   const selection_buffers<device_space>& out, const cuda_exec& exec,
                   const std::int32_t* row_budgets) {
    const cudaStream_t stream = exec.stream;
    detail::select_params p;
    if (!prologue(scores, out, exec, p)) return;
    p.row_budgets = row_budgets;
    if (split_.chunks > 1) {
      run_split(p, true, stream);
      return;
    }
    detail::launch(detail::topk_rows<>, static_cast<unsigned>(rows()), detail::select_block_threads,
                   0, stream, p);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
  }
};

static_assert(row_selector<topk_selector_cuda>);

}  // namespace kvscout
