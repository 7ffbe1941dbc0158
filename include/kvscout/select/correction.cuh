#pragma once
// The correction step's selector on the device: correction_selector_host's semantics and indices,
// as three launches on one stream:
//   1. mask    the speculated rows' late scores become NaN (in place: the late scores are the
//              caller's scratch, written by score_query for this step)
//   2. top-k   topk_selector_cuda at each row's budget (correction_extra, which the mask writes
//              to the workspace), no keep-set, over the masked scores
//   3. filter  rows with no more than that many unspeculated rows: all of them instead
// Nothing is read back, nothing allocated.
//
//   auto ws = kvscout::make_device_workspace<kvscout::correction_selector_cuda>(cfg);
//   kvscout::correction_selector_cuda corr(cfg, ws.span());
//   corr.select(late, seq_lens, speculated, added, {stream, d_status});
//
// select() checks what the host knows and throws kvscout::error naming the bad value. Lengths are
// clamped to [0, stride], speculated counts to [0, capacity], a speculated index outside [0, len)
// is skipped by the mask, and one not above its predecessor reported (bad_index): the filter's
// output for such a row is then undefined but stays inside the row's slots.

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/detail/launch.cuh"
#include "kvscout/core/device_status.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/select/correction.hpp"
#include "kvscout/select/topk.cuh"

namespace kvscout {
namespace detail {

struct correction_params {
  float* scores;                 // [rows, stride], masked in place
  const std::int32_t* seq_lens;  // [num_seqs]
  const std::int32_t* spec_idx;  // [rows, spec_capacity]
  const std::int32_t* spec_cnt;  // [rows]
  std::int32_t* out_idx;         // [rows, capacity]
  std::int32_t* out_cnt;         // [rows]
  std::int32_t* row_extra;        // [rows]: correction_extra of each row, written by the mask
  int num_kv_heads, stride, spec_capacity, capacity, extra;
  double total_share;
  int* status;
};

inline constexpr int correction_threads = 256;

KVSCOUT_DEVICE int correction_len(const correction_params& p, int row) {
  int len = p.seq_lens[row / p.num_kv_heads];
  if (len < 0 || len > p.stride) {
    if (threadIdx.x == 0) raise_device_status(p.status, device_status::bad_length);
    len = len < 0 ? 0 : p.stride;
  }
  return len;
}

KVSCOUT_DEVICE int correction_spec_count(const correction_params& p, int row) {
  int n = p.spec_cnt[row];
  if (n < 0 || n > p.spec_capacity) {
    if (threadIdx.x == 0) raise_device_status(p.status, device_status::bad_count);
    n = n < 0 ? 0 : p.spec_capacity;
  }
  return n;
}

__global__ void __launch_bounds__(correction_threads) correction_mask(const correction_params p) {
  const int row = static_cast<int>(blockIdx.x);
  const int len = correction_len(p, row);
  const int n = correction_spec_count(p, row);
  const std::int32_t* sp = p.spec_idx + static_cast<std::size_t>(row) * p.spec_capacity;
  float* sc = p.scores + static_cast<std::size_t>(row) * p.stride;
  if (threadIdx.x == 0) p.row_extra[row] = correction_extra(p.extra, p.total_share, len, n);
  for (int j = static_cast<int>(threadIdx.x); j < n; j += blockDim.x) {
    const int t = sp[j];
    if (t < 0 || t >= len || (j > 0 && t <= sp[j - 1])) {
      raise_device_status(p.status, device_status::bad_index);
      if (t < 0 || t >= len) continue;
    }
    sc[t] = __int_as_float(0x7fc00000);  // quiet NaN
  }
}

/// Step 3: row t of [0, len) not speculated goes to slot t - |{speculated < t}|.
__global__ void __launch_bounds__(correction_threads) correction_filter(const correction_params p) {
  const int row = static_cast<int>(blockIdx.x);
  const int len = correction_len(p, row);
  const int n = correction_spec_count(p, row);
  const int extra = p.row_extra[row];
  if (len - n > extra) return;  // top-k's selection stands
  const std::int32_t* sp = p.spec_idx + static_cast<std::size_t>(row) * p.spec_capacity;
  std::int32_t* out = p.out_idx + static_cast<std::size_t>(row) * p.capacity;
  for (int t = static_cast<int>(threadIdx.x); t < len; t += blockDim.x) {
    int lo = 0, hi = n;  // first speculated index >= t
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (sp[mid] < t) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    const bool speculated = lo < n && sp[lo] == t;
    const int slot = t - lo;
    // Bad speculated rows (reported by the mask) must not address outside the row's slots.
    if (!speculated && slot >= 0 && slot < p.capacity) out[slot] = t;
  }
  if (threadIdx.x == 0) {
    // Within [0, extra] whatever the speculated rows hold.
    int inside = 0;
    for (int j = 0; j < n; ++j) inside += (sp[j] >= 0 && sp[j] < len) ? 1 : 0;
    const int c = len - inside;
    p.out_cnt[row] = c < 0 ? 0 : (c < extra ? c : extra);
  }
}

}  // namespace detail

class correction_selector_cuda {
 public:
  using config = correction_selector_host::config;
  using config_type = config;
  using memory_space = device_space;

  [[nodiscard]] static topk_selector_host::config topk_config(const config& cfg) {
    detail::check_correction_config(cfg.shape.num_seqs, cfg.shape.num_kv_heads,
                                    cfg.shape.max_tokens, cfg.capacity, cfg.extra,
                                    cfg.total_share);
    return {.shape = cfg.shape, .capacity = cfg.capacity, .budget = cfg.extra, .keep = {}};
  }
  /// The top-k's, then one budget per row.
  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg) {
    return topk_bytes(cfg) + sizeof(std::int32_t) * static_cast<std::size_t>(cfg.shape.num_seqs) *
                                 static_cast<std::size_t>(cfg.shape.num_kv_heads);
  }
  static constexpr std::size_t workspace_alignment = topk_selector_cuda::workspace_alignment;

  correction_selector_cuda(const config& cfg, device_span<std::byte> workspace)
      : cfg_(cfg), topk_(topk_config(cfg), workspace) {
    detail::check_device_workspace(workspace, workspace_bytes(cfg));
    row_extra_ = reinterpret_cast<std::int32_t*>(workspace.data() + topk_bytes(cfg));
  }

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }

  /// Masks the speculated rows of `late` (NaN) on the way. late: [num_seqs, num_kv_heads, stride].
  void select(device_span<float> late, device_span<const std::int32_t> seq_lens,
              const selection_view<device_space>& speculated,
              const selection_buffers<device_space>& out, const cuda_exec& exec) {
    const score_view<device_space> view{{late.data(), late.size()},
                                        seq_lens,
                                        cfg_.shape.num_seqs,
                                        cfg_.shape.num_kv_heads,
                                        cfg_.shape.max_tokens};
    detail::check_selector_views(cfg_.shape.num_seqs, cfg_.shape.num_kv_heads,
                                 cfg_.shape.max_tokens, cfg_.capacity, view, out);
    detail::check_speculated_shape(cfg_.shape.num_seqs, cfg_.shape.num_kv_heads, speculated);
    const int rows = cfg_.shape.num_seqs * cfg_.shape.num_kv_heads;
    if (rows == 0) return;
    const detail::correction_params p{late.data(),          seq_lens.data(),
                                      speculated.indices.data(), speculated.counts.data(),
                                      out.indices.data(),   out.counts.data(),
                                      row_extra_,           cfg_.shape.num_kv_heads,
                                      cfg_.shape.max_tokens, speculated.capacity,
                                      cfg_.capacity,        cfg_.extra,
                                      cfg_.total_share,     exec.status};
    const cudaStream_t stream = exec.stream;
    detail::launch(detail::correction_mask, static_cast<unsigned>(rows),
                   detail::correction_threads, 0, stream, p);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
    topk_.select_rows(view, out, exec, row_extra_);
    detail::launch(detail::correction_filter, static_cast<unsigned>(rows),
                   detail::correction_threads, 0, stream, p);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
  }

 private:
  static std::size_t topk_bytes(const config& cfg) {
    const std::size_t a = workspace_alignment;
    return (topk_selector_cuda::workspace_bytes(topk_config(cfg)) + a - 1) / a * a;
  }

  config cfg_;
  topk_selector_cuda topk_;
  std::int32_t* row_extra_ = nullptr;  // [rows], in the workspace
};

}  // namespace kvscout
