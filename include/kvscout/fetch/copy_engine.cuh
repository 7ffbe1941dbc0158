#pragma once
// Copy-engine executor: the selected rows move as DMA copies (the GPU's copy engines, no SM
// time), one copy per run of rows adjacent in the source and consecutive in the selection, issued
// as one cudaMemcpyBatchAsync (CUDA >= 12.8) or one cudaMemcpyAsync per run.
//
//   kvscout::copy_engine_config cfg{.shape = shape, .capacity = 512};
//   std::vector<std::byte> ws(kvscout::copy_engine_executor_cuda<layout>::workspace_bytes(cfg));
//   kvscout::copy_engine_executor_cuda<layout> fetch(cfg, {ws.data(), ws.size()});
//   auto c = fetch.submit(pinned_kv, host_selection, device_destination, {stream});
//
// The host builds the run list and calls the memcpy APIs (no device-side memcpy reaches the copy
// engines), so this executor takes a host-visible selection; a device selection does not compile.
//
// The source is the host KV store (metadata read on the host); it should be pinned, otherwise the
// driver stages pageable copies and they are neither asynchronous nor fast. submit() validates
// everything first (as gather_executor_host) and throws kvscout::error naming the bad value; then
// builds the copy list in the caller's workspace and enqueues it on exec.stream (exec.status is
// unused). The host thread never waits for the device. The batch API needs a stream other than
// the legacy default stream; otherwise copies go one by one.
//
// Completion: an event recorded on exec.stream after the copies. Once submit() returns, the
// selection and the workspace may be reused; the source must stay unchanged until the event
// completes.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvscout/core/event_completion.hpp"
#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/fetch/concepts.hpp"
#include "kvscout/fetch/detail/cuda_fetch_checks.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/kivi.hpp"
#include "kvscout/kv/paged.hpp"

#if defined(CUDART_VERSION) && CUDART_VERSION >= 12080
#define KVSCOUT_HAS_MEMCPY_BATCH 1
#else
#define KVSCOUT_HAS_MEMCPY_BATCH 0
#endif

namespace kvscout {

template <kv_layout Layout>
class copy_engine_executor_cuda {
 public:
  using layout_type = Layout;
  using config_type = copy_engine_config;
  using source_type = kv_view<Layout, host_space>;
  using selection_type = selection_view<host_space>;  // host-visible: see the header comment
  using destination_type = gather_destination<device_space>;
  using completion_type = event_completion;
  using exec_type = cuda_exec;

  [[nodiscard]] static std::size_t workspace_bytes(const config_type& cfg) {
    return detail::copy_engine_workspace_bytes(cfg);
  }
  static constexpr std::size_t workspace_alignment = alignof(std::int64_t);

  static constexpr bool batch_api_available = KVSCOUT_HAS_MEMCPY_BATCH != 0;

  copy_engine_executor_cuda(const config_type& cfg, host_span<std::byte> workspace) : cfg_(cfg) {
    const std::size_t need = workspace_bytes(cfg);
    detail::check_workspace(workspace.data(), workspace.size(), need, workspace_alignment,
                            "workspace");
    const std::size_t pairs = detail::fetch_pairs(cfg.shape.num_seqs, cfg.shape.num_kv_heads);
    const std::size_t copies = 2 * pairs * static_cast<std::size_t>(cfg.capacity);
    std::byte* p = workspace.data();
    prefix_ = reinterpret_cast<std::int64_t*>(p);
    p += (pairs + 1) * sizeof(std::int64_t);
    dsts_ = reinterpret_cast<void**>(p);
    p += copies * sizeof(void*);
    srcs_ = reinterpret_cast<const void**>(p);
    p += copies * sizeof(void*);
    sizes_ = reinterpret_cast<std::size_t*>(p);
  }

  [[nodiscard]] const config_type& configuration() const noexcept { return cfg_; }
  [[nodiscard]] cudaEvent_t event() const noexcept { return event_.get(); }
  /// K and V counted separately.
  [[nodiscard]] std::size_t last_copy_count() const noexcept { return last_copies_; }

  completion_type submit(const source_type& src, const selection_type& sel,
                         const destination_type& dst, const exec_type& exec) {
    detail::check_fetch_views(cfg_.shape.num_seqs, cfg_.shape.num_kv_heads, cfg_.capacity, src, sel,
                              dst,
                              /*vector_aligned=*/false);
    detail::check_host_selection(src, sel, prefix_);
    const std::size_t n =
        detail::build_copy_runs(src.layout, src.k.data(), src.v.data(), dst.k.data(),
                                dst.v.data(), sel, dsts_, srcs_, sizes_);
    last_copies_ = n;
    if (n > 0) enqueue(n, exec.stream);
    event_.record(exec.stream);
    return completion_type{event_.get()};
  }

 private:
  void enqueue(std::size_t n, cudaStream_t stream) {
#if KVSCOUT_HAS_MEMCPY_BATCH
    // The legacy default stream is not allowed for batches (and per-thread default streams are not
    // distinguishable here).
    if (cfg_.use_batch_api && stream != nullptr && stream != cudaStreamLegacy) {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;  // the store may change between steps
      std::size_t attr_index = 0;
#if CUDART_VERSION >= 13000
      KVSCOUT_CUDA_CHECK(cudaMemcpyBatchAsync(dsts_, srcs_, sizes_, n, &attr, &attr_index, 1,
                                              stream));
#else
      std::size_t fail_index = 0;
      KVSCOUT_CUDA_CHECK(cudaMemcpyBatchAsync(dsts_, const_cast<void**>(srcs_), sizes_, n, &attr,
                                              &attr_index, 1, &fail_index, stream));
#endif
      return;
    }
#endif
    for (std::size_t c = 0; c < n; ++c) {
      KVSCOUT_CUDA_CHECK(
          cudaMemcpyAsync(dsts_[c], srcs_[c], sizes_[c], cudaMemcpyHostToDevice, stream));
    }
  }

  config_type cfg_;
  cuda_event event_;
  std::int64_t* prefix_ = nullptr;
  void** dsts_ = nullptr;
  const void** srcs_ = nullptr;
  std::size_t* sizes_ = nullptr;
  std::size_t last_copies_ = 0;
};

static_assert(prefetch_executor<copy_engine_executor_cuda<contiguous_layout<half, 128, hnd>>>);
static_assert(prefetch_executor<copy_engine_executor_cuda<kivi_layout<half, 128, 4>>>);
static_assert(!device_step_executor<copy_engine_executor_cuda<contiguous_layout<half, 128, hnd>>>);

}  // namespace kvscout
