#pragma once
// The correction step's selector (kvscout's): once layer i's own query exists, which rows did the
// speculation miss?
//
// Per (sequence, kv head) row of length len = seq_lens[s] with ns speculated rows, and
// e = extra, or with total_share > 0 min(extra, max(0, min(len, ceil(total_share * len)) - ns)):
//   added = the e best rows by late score among [0, len) minus the speculated rows (NaN never
//           chosen by score; ties go to the lower token index), written ascending; where no more
//           than e rows are left unspeculated, all of them
// So no added row is one the speculation already moved. This is top-k with the speculated rows'
// scores masked.
//
//   auto ws = kvscout::make_workspace<kvscout::correction_selector_host>(cfg);
//   kvscout::correction_selector_host corr(cfg, ws.span());
//   corr.select(late_scores, speculated, added);   // score_view, selection_view, selection_buffers
//
// The speculated rows must be strictly ascending and inside [0, len).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/select/concepts.hpp"
#include "kvscout/select/detail/checks.hpp"
#include "kvscout/select/topk.hpp"

namespace kvscout {

namespace detail {
/// Rows the correction adds to a row of len cached tokens of which `speculated` are selected.
KVSCOUT_HOST_DEVICE int correction_extra(int extra, double total_share, int len, int speculated) {
  if (!(total_share > 0)) return extra;
  const int e = detail::row_budget(len, total_share, keep_set{}, len) - speculated;
  return e < 0 ? 0 : (e < extra ? e : extra);
}

inline void check_correction_config(int num_seqs, int num_kv_heads, int max_tokens, int capacity,
                                    int extra, double total_share) {
  KVSCOUT_EXPECTS(total_share >= 0 && total_share <= 1, "total_share = ", total_share,
                  ": expected a share of the cached rows in [0, 1] (0: `extra` rows added)");
  KVSCOUT_EXPECTS(num_seqs >= 0, "num_seqs must be non-negative, got ", num_seqs);
  KVSCOUT_EXPECTS(num_kv_heads > 0, "num_kv_heads must be positive, got ", num_kv_heads);
  KVSCOUT_EXPECTS(max_tokens >= 0, "max_tokens must be non-negative, got ", max_tokens);
  KVSCOUT_EXPECTS(extra >= 1 && extra <= capacity, "extra = ", extra, " must be in [1, capacity = ",
                  capacity, "] (rows added per (sequence, kv head))");
}

template <class Space>
void check_speculated_shape(int num_seqs, int num_kv_heads, const selection_view<Space>& sp) {
  KVSCOUT_EXPECTS(sp.num_seqs == num_seqs && sp.num_kv_heads == num_kv_heads,
                  "speculated selection shape [num_seqs, num_kv_heads] = [", sp.num_seqs, ", ",
                  sp.num_kv_heads, "] differs from the config's [", num_seqs, ", ", num_kv_heads,
                  "]");
  KVSCOUT_EXPECTS(sp.capacity >= 0, "speculated selection capacity ", sp.capacity, " is negative");
  const std::size_t rows = static_cast<std::size_t>(num_seqs) * num_kv_heads;
  KVSCOUT_EXPECTS(sp.counts.size() >= rows && (sp.counts.data() != nullptr || rows == 0),
                  "speculated counts holds ", sp.counts.size(), " entries, expected ", rows);
  const std::size_t slots = rows * static_cast<std::size_t>(sp.capacity);
  KVSCOUT_EXPECTS(sp.indices.size() >= slots && (sp.indices.data() != nullptr || slots == 0),
                  "speculated indices holds ", sp.indices.size(), " entries, expected ", slots);
}
}  // namespace detail

class correction_selector_host {
 public:
  struct config {
    decode_shape shape{};  // num_seqs, num_kv_heads, max_tokens (the score rows' stride)
    int capacity = 0;  // index slots per (sequence, kv_head) in the output buffers
    int extra = 0;     // rows added per (sequence, kv_head) at most: in [1, capacity]
    /// > 0: a row of len cached tokens is topped up to ceil(total_share * len) rows in all, its
    /// speculated rows included (correction_extra); 0: `extra` rows added.
    double total_share = 0;
  };
  using config_type = config;
  using memory_space = host_space;

  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg) {
    detail::check_correction_config(cfg.shape.num_seqs, cfg.shape.num_kv_heads,
                                    cfg.shape.max_tokens, cfg.capacity, cfg.extra,
                                    cfg.total_share);
    return sizeof(std::uint32_t) * (detail::row_workspace::words(cfg.shape.max_tokens) +
                                    static_cast<std::size_t>(cfg.shape.max_tokens));
  }
  static constexpr std::size_t workspace_alignment = detail::row_workspace_alignment;

  correction_selector_host(const config& cfg, host_span<std::byte> workspace) : cfg_(cfg) {
    std::uint32_t* w = detail::workspace_words(workspace, workspace_bytes(cfg));
    ws_ = detail::row_workspace::carve(w, cfg.shape.max_tokens);
    masked_ = reinterpret_cast<float*>(w + detail::row_workspace::words(cfg.shape.max_tokens));
  }

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }

  void select(const score_view<host_space>& scores, const selection_view<host_space>& speculated,
              const selection_buffers<host_space>& out) {
    detail::check_selector_views(cfg_.shape.num_seqs, cfg_.shape.num_kv_heads,
                                 cfg_.shape.max_tokens, cfg_.capacity, scores, out);
    detail::check_speculated_shape(cfg_.shape.num_seqs, cfg_.shape.num_kv_heads, speculated);
    check_speculated_rows(scores, speculated);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int s = 0; s < cfg_.shape.num_seqs; ++s) {
      const int len = scores.seq_lens[static_cast<std::size_t>(s)];
      for (int h = 0; h < cfg_.shape.num_kv_heads; ++h) {
        const std::size_t r = speculated.row(s, h);
        const std::int32_t* sp =
            speculated.indices.data() + r * static_cast<std::size_t>(speculated.capacity);
        const int ns = speculated.counts[r];
        std::int32_t* dst = out.indices.data() + r * static_cast<std::size_t>(cfg_.capacity);
        const int extra = detail::correction_extra(cfg_.extra, cfg_.total_share, len, ns);
        if (len - ns <= extra) {  // every unspeculated row
          int c = 0;
          for (int t = 0, j = 0; t < len; ++t) {
            if (j < ns && sp[j] == t) {
              ++j;
            } else {
              dst[c++] = t;
            }
          }
          out.counts[r] = c;
          continue;
        }
        std::copy_n(scores.scores.data() + scores.row(s, h), len, masked_);
        for (int j = 0; j < ns; ++j) masked_[sp[j]] = nan;
        out.counts[r] = detail::topk_row_host(masked_, len, {}, extra, ws_, dst);
      }
    }
  }

 private:
  void check_speculated_rows(const score_view<host_space>& scores,
                             const selection_view<host_space>& sp) const {
    for (int s = 0; s < cfg_.shape.num_seqs; ++s) {
      const int len = scores.seq_lens[static_cast<std::size_t>(s)];
      for (int h = 0; h < cfg_.shape.num_kv_heads; ++h) {
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
  float* masked_ = nullptr;  // [stride]
};

}  // namespace kvscout
