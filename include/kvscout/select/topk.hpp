#pragma once
// Exact top-k selector on the host: per (sequence, kv_head), the keep-set and the best-scoring
// other tokens, `budget` tokens in all, written as ascending token indices.
//
//   kvscout::topk_selector_host::config cfg{.shape = shape,   // num_seqs, num_kv_heads, max_tokens
//                                           .capacity = 512, .budget = 512,
//                                           .keep = {.sinks = 4, .recent = 64}};
//   std::vector<std::byte> ws(kvscout::topk_selector_host::workspace_bytes(cfg));
//   kvscout::topk_selector_host topk(cfg, {ws.data(), ws.size()});
//   topk.select(scores, out);  // score_view<host_space>, selection_buffers<host_space>
//
// Per row (s, h) of length len = seq_lens[s]: len <= budget selects all len tokens; otherwise the
// keep-set (NaN included) and the best budget - |keep| other tokens by score (-inf is a legal,
// lowest score; ties go to the lowest token indices; NaN is never chosen by score, so a row with
// NaNs may select fewer). Output: out.indices[s, h, 0:count] strictly ascending,
// out.counts[s, h] = count; entries past the count are not written.
// sinks + recent <= budget <= capacity. Every input is checked before anything is written.

#include <cstddef>
#include <cstdint>

#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/select/concepts.hpp"
#include "kvscout/select/detail/host_rows.hpp"

namespace kvscout {
namespace detail {

inline int topk_row_host(const float* row, int len, keep_set keep, int budget,
                         const row_workspace& ws, std::int32_t* out) {
  if (len <= budget) return emit_range(0, len, out);
  const detail::keep_range kr = detail::keep_bounds(keep, len);
  int c = emit_range(0, kr.head_end, out);
  c += best_of_range(row, kr.head_end, kr.tail_begin - kr.head_end, budget - kr.size(len), ws,
                     out + c);
  return c + emit_range(kr.tail_begin, len, out + c);
}

}  // namespace detail

class topk_selector_host {
 public:
  struct config {
    decode_shape shape{};  // num_seqs, num_kv_heads, max_tokens (the score rows' stride)
    int capacity = 0;  // index slots per (sequence, kv_head) in the selection buffers
    int budget = 0;    // tokens selected per (sequence, kv_head), keep-set included
    keep_set keep{};
    /// > 0: a row of len cached tokens selects row_budget(budget, budget_share, keep, len) tokens,
    /// a share of its length (budget is then the most); 0: `budget` tokens.
    double budget_share = 0;
  };
  using config_type = config;
  using memory_space = host_space;
  using exec_type = host_exec;  // select()'s last argument, defaulted (core/exec.hpp)

  /// Workspace: a radix histogram, a score sample, one row's candidate lists (about
  /// 12 * stride + 16 KiB bytes).
  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg) {
    check_config(cfg);
    return sizeof(std::uint32_t) * detail::row_workspace::words(cfg.shape.max_tokens);
  }
  static constexpr std::size_t workspace_alignment = detail::row_workspace_alignment;

  topk_selector_host(const config& cfg, host_span<std::byte> workspace)
      : cfg_(cfg),
        ws_(detail::row_workspace::carve(detail::workspace_words(workspace, workspace_bytes(cfg)),
                                         cfg.shape.max_tokens)) {}

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }

  void select(const score_view<host_space>& scores, const selection_buffers<host_space>& out,
              host_exec = {}) {
    detail::check_selector_views(cfg_.shape.num_seqs, cfg_.shape.num_kv_heads,
                                 cfg_.shape.max_tokens, cfg_.capacity, scores, out);
    for (int s = 0; s < cfg_.shape.num_seqs; ++s) {
      const int len = scores.seq_lens[static_cast<std::size_t>(s)];
      for (int h = 0; h < cfg_.shape.num_kv_heads; ++h) {
        const std::size_t r = static_cast<std::size_t>(s) * cfg_.shape.num_kv_heads + h;
        out.counts[r] = detail::topk_row_host(
            scores.scores.data() + scores.row(s, h), len, cfg_.keep,
            detail::row_budget(cfg_.budget, cfg_.budget_share, cfg_.keep, len), ws_,
            out.indices.data() + r * static_cast<std::size_t>(cfg_.capacity));
      }
    }
  }

 private:
  static void check_config(const config& cfg) {
    detail::check_selector_config(cfg.shape.num_seqs, cfg.shape.num_kv_heads, cfg.shape.max_tokens,
                                  cfg.capacity, "budget", cfg.budget, cfg.keep,
                                  cfg.budget_share);
  }

  config cfg_;
  detail::row_workspace ws_;
};

static_assert(row_selector<topk_selector_host>);

}  // namespace kvscout
