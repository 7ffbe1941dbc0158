#pragma once
// The correction step's selector (kvscout's; no published offloading system has it): once layer
// i's own query exists, which rows did the speculation miss?
//
// Per (sequence, kv head) row of length len = seq_lens[s]:
//   want  = the top-k selection (select/topk.hpp) of the late scores at `budget`, keep-set
//           included: the rows the layer's real query ranks best
//   miss  = want \ speculated (the rows already fetched, or in flight)
//   added = the `extra` best of miss by late score (all of miss where it holds no more; ties go
//           to the lower token index), written ascending
// So the rows moved for the layer are |speculated| + |added| <= speculated capacity + extra, and
// no added row is one the speculation already moved.
//
//   kvscout::correction_selector_host::config cfg{.num_seqs = 1, .num_kv_heads = 8,
//       .stride = 4096, .capacity = 64, .budget = 410, .extra = 64, .keep = {4, 16}};
//   std::vector<std::byte> ws = ...;   // make_workspace<correction_selector_host>(cfg)
//   kvscout::correction_selector_host corr(cfg, {ws.data(), ws.size()});
//   corr.select(late_scores, speculated, added);   // score_view, selection_view, selection_buffers
//
// select() checks every input before it writes (the speculated rows must be strictly ascending
// and inside [0, len): an executor's rule), throws kvscout::error naming the bad value, and
// allocates nothing.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/select/concepts.hpp"
#include "kvscout/select/detail/checks.hpp"
#include "kvscout/select/topk.hpp"

namespace kvscout {

class correction_selector_host {
 public:
  struct config {
    int num_seqs = 0;
    int num_kv_heads = 0;
    int stride = 0;    // score row stride: tokens per row, >= every seq_lens[s]
    int capacity = 0;  // index slots per (sequence, kv_head) in the output buffers
    int budget = 0;    // depth of the late ranking, keep-set included
    int extra = 0;     // rows added per (sequence, kv_head) at most: <= capacity
    keep_set keep{};
  };
  using config_type = config;
  using memory_space = host_space;

  /// Workspace: the top-k selector's (about 12 * stride + 16 KiB) and two lists of `budget`
  /// token indices.
  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg) {
    check_config(cfg);
    return sizeof(std::uint32_t) * (detail::row_workspace::words(cfg.stride) +
                                    2 * static_cast<std::size_t>(cfg.budget));
  }
  static constexpr std::size_t workspace_alignment = detail::row_workspace_alignment;

  correction_selector_host(const config& cfg, host_span<std::byte> workspace) : cfg_(cfg) {
    std::uint32_t* w = detail::workspace_words(workspace, workspace_bytes(cfg));
    ws_ = detail::row_workspace::carve(w, cfg.stride);
    want_ = reinterpret_cast<std::int32_t*>(w + detail::row_workspace::words(cfg.stride));
    miss_ = want_ + cfg.budget;
  }

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }

  /// Writes the rows to add for every (sequence, kv_head) row (see the header comment).
  void select(const score_view<host_space>& scores, const selection_view<host_space>& speculated,
              const selection_buffers<host_space>& out) {
    detail::check_selector_views(cfg_.num_seqs, cfg_.num_kv_heads, cfg_.stride, cfg_.capacity,
                                 scores, out);
    check_speculated(scores, speculated);
    for (int s = 0; s < cfg_.num_seqs; ++s) {
      const int len = scores.seq_lens[static_cast<std::size_t>(s)];
      for (int h = 0; h < cfg_.num_kv_heads; ++h) {
        const std::size_t r = speculated.row(s, h);
        const float* row = scores.scores.data() + scores.row(s, h);
        const int nw = detail::topk_row_host(row, len, cfg_.keep, cfg_.budget, ws_, want_);
        const std::int32_t* sp = speculated.indices.data() + r * static_cast<std::size_t>(speculated.capacity);
        const int ns = speculated.counts[r];
        // want \ speculated: both ascending.
        int nm = 0;
        for (int i = 0, j = 0; i < nw; ++i) {
          while (j < ns && sp[j] < want_[i]) ++j;
          if (j == ns || sp[j] != want_[i]) miss_[nm++] = want_[i];
        }
        if (nm > cfg_.extra) {
          // The `extra` best by late score; NaN lowest (a keep-set row may carry one), ties to
          // the lower index: a strict weak order, so the kept set does not depend on the library.
          const auto better = [row](std::int32_t a, std::int32_t b) {
            const float x = row[a], y = row[b];
            const bool xn = std::isnan(x), yn = std::isnan(y);
            if (xn != yn) return yn;
            if (!xn && x != y) return x > y;
            return a < b;
          };
          std::nth_element(miss_, miss_ + cfg_.extra, miss_ + nm, better);
          nm = cfg_.extra;
          std::sort(miss_, miss_ + nm);
        }
        std::copy(miss_, miss_ + nm, out.indices.data() + r * static_cast<std::size_t>(cfg_.capacity));
        out.counts[r] = nm;
      }
    }
  }

 private:
  static void check_config(const config& cfg) {
    KVSCOUT_EXPECTS(cfg.num_seqs >= 0, "num_seqs must be non-negative, got ", cfg.num_seqs);
    KVSCOUT_EXPECTS(cfg.num_kv_heads > 0, "num_kv_heads must be positive, got ", cfg.num_kv_heads);
    KVSCOUT_EXPECTS(cfg.capacity >= 0, "capacity must be non-negative, got ", cfg.capacity);
    KVSCOUT_EXPECTS(cfg.keep.sinks >= 0 && cfg.keep.recent >= 0, "keep.sinks = ", cfg.keep.sinks,
                    " and keep.recent = ", cfg.keep.recent, " must be non-negative");
    KVSCOUT_EXPECTS(cfg.budget >= 1 && cfg.budget <= cfg.stride, "budget = ", cfg.budget,
                    " must be in [1, stride = ", cfg.stride, "] (the late ranking's depth)");
    KVSCOUT_EXPECTS(static_cast<long long>(cfg.keep.sinks) + cfg.keep.recent <= cfg.budget,
                    "budget ", cfg.budget, " is smaller than the keep-set it includes: sinks ",
                    cfg.keep.sinks, " + recent ", cfg.keep.recent);
    KVSCOUT_EXPECTS(cfg.extra >= 0 && cfg.extra <= cfg.capacity, "extra = ", cfg.extra,
                    " must be in [0, capacity = ", cfg.capacity, "]");
  }

  void check_speculated(const score_view<host_space>& scores,
                        const selection_view<host_space>& sp) const {
    KVSCOUT_EXPECTS(sp.num_seqs == cfg_.num_seqs && sp.num_kv_heads == cfg_.num_kv_heads,
                    "speculated selection shape [num_seqs, num_kv_heads] = [", sp.num_seqs, ", ",
                    sp.num_kv_heads, "] differs from the config's [", cfg_.num_seqs, ", ",
                    cfg_.num_kv_heads, "]");
    KVSCOUT_EXPECTS(sp.capacity >= 0, "speculated selection capacity ", sp.capacity,
                    " is negative");
    const std::size_t rows = static_cast<std::size_t>(cfg_.num_seqs) * cfg_.num_kv_heads;
    KVSCOUT_EXPECTS(sp.counts.size() >= rows && (sp.counts.data() != nullptr || rows == 0),
                    "speculated counts holds ", sp.counts.size(), " entries, expected ", rows);
    KVSCOUT_EXPECTS(sp.indices.size() >= rows * static_cast<std::size_t>(sp.capacity) &&
                        (sp.indices.data() != nullptr || rows * sp.capacity == 0),
                    "speculated indices holds ", sp.indices.size(), " entries, expected ",
                    rows * static_cast<std::size_t>(sp.capacity));
    for (int s = 0; s < cfg_.num_seqs; ++s) {
      const int len = scores.seq_lens[static_cast<std::size_t>(s)];
      for (int h = 0; h < cfg_.num_kv_heads; ++h) {
        const std::size_t r = sp.row(s, h);
        const int n = sp.counts[r];
        KVSCOUT_EXPECTS(n >= 0 && n <= sp.capacity, "speculated count of (seq ", s, ", kv head ",
                        h, ") = ", n, " is outside [0, capacity = ", sp.capacity, "]");
        const std::int32_t* x = sp.indices.data() + r * static_cast<std::size_t>(sp.capacity);
        for (int i = 0; i < n; ++i)
          KVSCOUT_EXPECTS(x[i] >= 0 && x[i] < len && (i == 0 || x[i] > x[i - 1]),
                          "speculated index ", x[i], " at (seq ", s, ", kv head ", h, ", slot ", i,
                          ") is not strictly ascending inside [0, seq_len = ", len, ")");
      }
    }
  }

  config cfg_;
  detail::row_workspace ws_{};
  std::int32_t* want_ = nullptr;  // [budget]
  std::int32_t* miss_ = nullptr;  // [budget]
};

}  // namespace kvscout
