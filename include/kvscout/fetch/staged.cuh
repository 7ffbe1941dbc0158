#pragma once
// Staged executor: host threads gather the selected rows, packed back to back, into a pinned
// staging buffer; one bulk cudaMemcpyAsync moves exactly those bytes (plus the row counts) to a
// device landing area; a small kernel scatters them into the destination. The link carries one
// large transfer per step instead of one per run, at the price of a host pass over the rows.
//
//   kvscout::staged_config cfg{.shape = shape, .capacity = 512,
//                              .k_row_bytes = l.k_row_bytes(), .v_row_bytes = l.v_row_bytes(),
//                              .threads = 2};
//   kvscout::staged_executor_cuda<layout> fetch(cfg, pinned_ws, device_ws);
//   auto c = fetch.submit(host_kv, host_selection, device_destination, {stream});
//
// It needs a host-visible selection: the host threads must know which rows to gather.
//
// Staging rotates over config.stages buffers. A submit first waits for the bulk copy that last
// read its stage (a wait only when `stages` submits are still in flight), then validates (as
// gather_executor_host, throwing before anything is written), gathers, and enqueues the bulk copy
// and the scatter kernel on exec.stream (exec.status is unused). The device landing area is a
// single stage: each bulk copy waits on the previous submit's event, so consecutive submits may
// use different streams. Completion: the stage's event, recorded after the scatter.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kvscout/core/detail/launch.cuh"
#include "kvscout/core/event_completion.hpp"
#include "kvscout/core/thread_pool.hpp"
#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/fetch/concepts.hpp"
#include "kvscout/fetch/detail/cuda_fetch_checks.hpp"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/kivi.hpp"
#include "kvscout/kv/paged.hpp"

namespace kvscout {
namespace detail {

struct staged_scatter_params {
  const std::byte* landing;  // [prefix (pairs + 1) int64 | pad to 16][K rows][V rows]
  std::size_t header_bytes;
  std::byte* k_dst;
  std::byte* v_dst;
  std::size_t k_row_bytes;
  std::size_t v_row_bytes;
  long long pairs;
  int capacity;
};

// One block per (sequence, kv_head) pair at a time (grid-stride): rows [prefix[r], prefix[r+1]) of
// the landing area go to destination slots r * capacity + 0, 1, ... (A template only so that the
// header can be included by several translation units.)
template <int Unused = 0>
__global__ void staged_scatter_kernel(const __grid_constant__ staged_scatter_params p) {
  constexpr std::size_t V = fetch_vector_bytes;
  const auto* prefix = reinterpret_cast<const std::int64_t*>(p.landing);
  const std::int64_t total = prefix[p.pairs];
  const std::byte* const k_rows = p.landing + p.header_bytes;
  const std::byte* const v_rows = k_rows + static_cast<std::size_t>(total) * p.k_row_bytes;
  const int nk = static_cast<int>(p.k_row_bytes / V), nv = static_cast<int>(p.v_row_bytes / V);
  const int per_row = nk + nv;
  for (long long r = blockIdx.x; r < p.pairs; r += gridDim.x) {
    const std::int64_t g0 = prefix[r];
    const long long n = prefix[r + 1] - g0;
    const long long vectors = n * per_row;
    const std::size_t slot0 = static_cast<std::size_t>(r) * p.capacity;
    for (long long j = threadIdx.x; j < vectors; j += blockDim.x) {
      const long long i = j / per_row;
      const int c = static_cast<int>(j - i * per_row);
      const std::size_t g = static_cast<std::size_t>(g0 + i);
      const std::size_t slot = slot0 + static_cast<std::size_t>(i);
      if (c < nk) {
        *reinterpret_cast<uint4*>(p.k_dst + slot * p.k_row_bytes + c * V) =
            *reinterpret_cast<const uint4*>(k_rows + g * p.k_row_bytes + c * V);
      } else {
        *reinterpret_cast<uint4*>(p.v_dst + slot * p.v_row_bytes + (c - nk) * V) =
            *reinterpret_cast<const uint4*>(v_rows + g * p.v_row_bytes + (c - nk) * V);
      }
    }
  }
}

}  // namespace detail

template <kv_layout Layout>
class staged_executor_cuda {
 public:
  using layout_type = Layout;
  using config_type = staged_config;
  using source_type = kv_view<Layout, host_space>;
  using selection_type = selection_view<host_space>;  // host-visible: see the header comment
  static constexpr bool submit_blocks_host = true;
  using destination_type = gather_destination<device_space>;
  using completion_type = event_completion;
  using exec_type = cuda_exec;

  [[nodiscard]] static std::size_t workspace_bytes(const config_type& cfg) {
    return detail::staged_workspace_bytes(cfg);
  }
  [[nodiscard]] static std::size_t device_workspace_bytes(const config_type& cfg) {
    return detail::staged_device_workspace_bytes(cfg);
  }
  static constexpr std::size_t workspace_alignment = detail::fetch_vector_bytes;

  /// Checks both workspaces (sizes, 16-byte alignment, the host one pinned).
  staged_executor_cuda(const config_type& cfg, host_span<std::byte> pinned_workspace,
                       device_span<std::byte> device_workspace)
      : cfg_(cfg) {
    stage_bytes_ = detail::staged_stage_bytes(cfg);
    detail::check_workspace(pinned_workspace.data(), pinned_workspace.size(),
                            workspace_bytes(cfg), workspace_alignment,
                            "pinned staging workspace");
    detail::check_workspace(device_workspace.data(), device_workspace.size(),
                            device_workspace_bytes(cfg), workspace_alignment,
                            "device workspace");
    cudaPointerAttributes attr{};
    KVSCOUT_CUDA_CHECK(cudaPointerGetAttributes(&attr, pinned_workspace.data()));
    KVSCOUT_EXPECTS(attr.type == cudaMemoryTypeHost,
                    "the staging workspace must be pinned host memory (cudaHostAlloc or "
                    "cudaHostRegister); cudaPointerGetAttributes reports memory type ",
                    static_cast<int>(attr.type));
    staging_ = pinned_workspace.data();
    landing_ = device_workspace.data();
    pool_ = std::make_unique<thread_pool>(cfg.threads);
    events_.resize(static_cast<std::size_t>(cfg.stages));
    used_.assign(static_cast<std::size_t>(cfg.stages), false);
  }

  [[nodiscard]] const config_type& configuration() const noexcept { return cfg_; }
  [[nodiscard]] cudaEvent_t event() const noexcept { return events_[last_stage_].get(); }

  completion_type submit(const source_type& src, const selection_type& sel,
                         const destination_type& dst, const exec_type& exec) {
    const cudaStream_t stream = exec.stream;
    const Layout& l = src.layout;
    detail::check_fetch_views(cfg_.shape.num_seqs, cfg_.shape.num_kv_heads, cfg_.capacity, src, sel,
                              dst,
                              /*vector_aligned=*/false);
    KVSCOUT_EXPECTS(l.k_row_bytes() == cfg_.k_row_bytes && l.v_row_bytes() == cfg_.v_row_bytes,
                    "the layout's rows (K ", l.k_row_bytes(), ", V ", l.v_row_bytes(),
                    " bytes) differ from the config's k_row_bytes = ", cfg_.k_row_bytes,
                    ", v_row_bytes = ", cfg_.v_row_bytes);
    constexpr std::size_t a = detail::fetch_vector_bytes;
    KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(dst.k.data()) % a == 0 &&
                        reinterpret_cast<std::uintptr_t>(dst.v.data()) % a == 0,
                    "destination K / V at ", static_cast<const void*>(dst.k.data()), " / ",
                    static_cast<const void*>(dst.v.data()), " must be ", a, "-byte aligned");
    const std::size_t stage = next_stage_;
    std::byte* const base = staging_ + stage * stage_bytes_;
    if (used_[stage]) KVSCOUT_CUDA_CHECK(cudaEventSynchronize(events_[stage].get()));
    auto* const prefix = reinterpret_cast<std::int64_t*>(base);
    const std::int64_t total = detail::check_host_selection(src, sel, prefix);
    const std::size_t header = detail::staged_header_bytes(cfg_);
    const std::size_t kb = cfg_.k_row_bytes, vb = cfg_.v_row_bytes;
    std::byte* const k_stage = base + header;
    std::byte* const v_stage = k_stage + static_cast<std::size_t>(total) * kb;
    if (total > 0) {
      const bool streaming =
          detail::gather_streams(cfg_.stores, static_cast<std::size_t>(total) * (kb + vb));
      pool_->run([&](int part, int parts) noexcept {
        const std::int64_t first = total * part / parts;
        const std::int64_t last = total * (part + 1) / parts;
        if (streaming) {
          gather<true>(src, sel, prefix, first, last, k_stage, v_stage);
        } else {
          gather<false>(src, sel, prefix, first, last, k_stage, v_stage);
        }
      });
      const std::size_t bytes = header + static_cast<std::size_t>(total) * (kb + vb);
      // The landing area is one stage: the previous submit's scatter reads it, maybe on another
      // stream.
      if (any_used_) KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(stream, events_[last_stage_].get(), 0));
      KVSCOUT_CUDA_CHECK(
          cudaMemcpyAsync(landing_, base, bytes, cudaMemcpyHostToDevice, stream));
      const long long pairs = static_cast<long long>(cfg_.shape.num_seqs) * cfg_.shape.num_kv_heads;
      detail::staged_scatter_params p{landing_, header,       dst.k.data(),  dst.v.data(),
                                      kb,       vb,           pairs,         cfg_.capacity};
      const long long grid = std::min<long long>(pairs, 1024);
      detail::launch(detail::staged_scatter_kernel<>, static_cast<unsigned>(grid), 256, 0,
                     stream, p);
      KVSCOUT_CUDA_CHECK(cudaGetLastError());
    }
    events_[stage].record(stream);
    used_[stage] = true;
    any_used_ = true;
    last_stage_ = stage;
    next_stage_ = (stage + 1) % events_.size();
    return completion_type{events_[stage].get()};
  }

 private:
  // Packs rows [first, last) at k_stage + row * kb (and likewise V) with the host gather's loop.
  template <bool Streaming>
  void gather(const source_type& src, const selection_type& sel, const std::int64_t* prefix,
              std::int64_t first, std::int64_t last, std::byte* k_stage,
              std::byte* v_stage) const noexcept {
    detail::gather_row_range<true, Streaming>(
        src.layout, src.k.data(), src.v.data(), sel.indices.data(), prefix,
        detail::fetch_pairs(cfg_.shape.num_seqs, cfg_.shape.num_kv_heads), cfg_.shape.num_kv_heads,
        static_cast<std::size_t>(cfg_.capacity), cfg_.prefetch_rows, k_stage, v_stage, first, last);
  }

  config_type cfg_;
  std::size_t stage_bytes_ = 0;
  std::byte* staging_ = nullptr;
  std::byte* landing_ = nullptr;
  std::unique_ptr<thread_pool> pool_;
  std::vector<cuda_event> events_;
  std::vector<bool> used_;
  bool any_used_ = false;  // a submit recorded events_[last_stage_]
  std::size_t next_stage_ = 0;
  std::size_t last_stage_ = 0;
};

static_assert(prefetch_executor<staged_executor_cuda<contiguous_layout<half, 128, hnd>>>);
static_assert(prefetch_executor<staged_executor_cuda<kivi_layout<half, 128, 2>>>);
static_assert(!device_step_executor<staged_executor_cuda<contiguous_layout<half, 128, hnd>>>);

}  // namespace kvscout
