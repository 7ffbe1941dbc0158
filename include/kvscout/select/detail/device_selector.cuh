#pragma once
// What the two device selectors share: the config (the host selector's), the workspace and its
// check, how long rows split over blocks, and the prologue of select().

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kvscout/core/exec.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/select/detail/checks.hpp"
#include "kvscout/select/detail/device_config.hpp"
#include "kvscout/select/detail/radix_select.cuh"
#include "kvscout/select/detail/radix_select_split.cuh"

namespace kvscout::detail {

template <class Config>
class device_selector_base {
 public:
  using config = Config;  // the host selector's config: the same fields, the same meaning
  using config_type = Config;
  using memory_space = device_space;
  using exec_type = cuda_exec;  // select()'s last argument: stream and device status word
  static constexpr std::size_t workspace_alignment = device_selector_workspace_alignment;

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }
  [[nodiscard]] select_split split() const noexcept { return split_; }

 protected:
  /// need: the facade's workspace_bytes(cfg, opt); splits: whether long rows may split over blocks.
  device_selector_base(const Config& cfg, device_span<std::byte> workspace, std::size_t need,
                       select_split_options opt, bool splits)
      : cfg_(cfg),
        workspace_(workspace.data()),
        max_chunks_(max_select_chunks(cfg.shape.max_tokens, opt)) {
    check_device_workspace(workspace, need);
    if (splits)
      split_ = device_select_split(cfg.shape.num_seqs, cfg.shape.num_kv_heads, cfg.shape.max_tokens,
                                   opt);
  }

  /// False when there is no row to select.
  bool prologue(const score_view<device_space>& scores, const selection_buffers<device_space>& out,
                const cuda_exec& exec, select_params& p) const {
    check_selector_views(cfg_.shape.num_seqs, cfg_.shape.num_kv_heads, cfg_.shape.max_tokens,
                         cfg_.capacity, scores, out);
    p = select_params{};
    p.scores = scores.scores.data();
    p.seq_lens = scores.seq_lens.data();
    p.indices = out.indices.data();
    p.counts = out.counts.data();
    p.num_seqs = cfg_.shape.num_seqs;
    p.num_kv_heads = cfg_.shape.num_kv_heads;
    p.stride = cfg_.shape.max_tokens;
    p.capacity = cfg_.capacity;
    p.budget = cfg_.budget;
    p.budget_share = cfg_.budget_share;
    p.row_budgets = nullptr;
    p.keep = cfg_.keep;
    p.status = exec.status;
    return rows() > 0;
  }
  [[nodiscard]] long long rows() const noexcept {
    return static_cast<long long>(cfg_.shape.num_seqs) * cfg_.shape.num_kv_heads;
  }
  void run_split(const select_params& p, bool topk, cudaStream_t stream) const {
    run_split_select(split_params_in(p, split_, topk, workspace_, max_chunks_), stream);
  }

  Config cfg_;
  std::byte* workspace_ = nullptr;
  int max_chunks_ = 1;
  select_split split_{};
};

}  // namespace kvscout::detail
