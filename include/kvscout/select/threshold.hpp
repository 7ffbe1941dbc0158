#pragma once
// Threshold selector on the host: per (sequence, kv_head), the keep-set and the tokens whose score
// is within alpha of the row's maximum, capped at budget tokens in all. Two rules (threshold_rule):
// per_head, the default, is kvscout's own; infinigen_mean is InfiniGen's (OSDI'24).
//
//   kvscout::threshold_selector_host::config cfg{
//       .shape = shape, .capacity = 512, .alpha = 4.f,   // shape: core/shape.hpp
//       .budget = 512, .rule = kvscout::threshold_rule::per_head,
//       .keep = {.sinks = 4, .recent = 64}};
//   std::vector<std::byte> ws(kvscout::threshold_selector_host::workspace_bytes(cfg));
//   kvscout::threshold_selector_host sel(cfg, {ws.data(), ws.size()});
//   sel.select(scores, out);  // score_view<host_space>, selection_buffers<host_space>
//
// Semantics, per row (s, h) of length len = seq_lens[s], keep-set K (always selected, NaN
// included), k = budget - |K| slots for the other tokens:
//   m      = the largest non-NaN score of the row, keep-set included (-inf if none)
//   floor  = m - alpha in float arithmetic; -inf when alpha = +inf (threshold_floor)
//   candidates = the tokens outside K with score >= floor (so the maximum itself qualifies, also
//            when m = +inf; when m = -inf every non-NaN token does; NaN never does)
//   per_head: each row takes K and its candidates; where there are more than k, the best k of
//            them (largest score, ties to the lowest token index).
//   infinigen_mean: n = floor(mean over the rows with len > 0 of their candidate counts); every
//            row takes K and the best min(n, k) tokens outside K by score (not only its own
//            candidates; NaN ignored), as InfiniGen sizes one fetch for all heads.
// budget is a cap, not a quota: a short row (len <= budget) still selects by threshold.
// Output: out.indices[s, h, 0:count] strictly ascending, out.counts[s, h] = count; entries past
// the count are not written. Requires alpha >= 0 (not NaN), sinks + recent <= budget <= capacity.
// score_view::row_max is a hint, checked, never trusted: the result never depends on a hint or a
// sample.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <ostream>

#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/select/concepts.hpp"
#include "kvscout/select/detail/host_rows.hpp"

namespace kvscout {

enum class threshold_rule : int {
  infinigen_mean = 0,  // InfiniGen's rule: every row takes the mean candidate count of all rows
  per_head = 1,        // kvscout's rule: every row takes its own candidates, capped
};

inline std::ostream& operator<<(std::ostream& os, threshold_rule r) {
  switch (r) {
    case threshold_rule::infinigen_mean:
      return os << "infinigen_mean";
    case threshold_rule::per_head:
      return os << "per_head";
  }
  return os << "threshold_rule(" << static_cast<int>(r) << ")";
}

namespace detail {

/// Rows up to this many tokens (16 KiB of scores) take a maximum and a compaction, longer rows one
/// pass with a running floor.
inline constexpr int short_row = 4096;

struct row_lookahead {
  std::optional<float> known;     // in: this row's maximum over all its len scores, if read
  const float* next = nullptr;    // in: the next row, or null
  int next_len = 0;               // in: its length
  std::optional<float> next_max;  // out: the next row's maximum, where this row read it
  std::optional<float> hint;      // in: score_view::row_max of this row, unchecked
};

/// Where a row's candidates against a hinted maximum m stand. The largest candidate or keep-set
/// score equals m exactly when the hint is right: if the true maximum M reaches
/// threshold_floor(m, alpha), M is that largest; if not, there are no candidates and the largest is
/// below m. So one look at the few candidates checks the hint.
enum class hint_result { right, wrong, too_many };

inline hint_result check_hint(const float* row, const std::int32_t* cand, int kept, float keep_max,
                              float m) {
  const auto up = [row](float t, std::int32_t i) {
    const float x = row[i];
    return x > t ? x : t;
  };
  float t0 = keep_max, t1 = -INFINITY, t2 = -INFINITY, t3 = -INFINITY;
  int i = 0;
  for (; i + 4 <= kept; i += 4) {
    t0 = up(t0, cand[i]);
    t1 = up(t1, cand[i + 1]);
    t2 = up(t2, cand[i + 2]);
    t3 = up(t3, cand[i + 3]);
  }
  for (; i < kept; ++i) t0 = up(t0, cand[i]);
  const float top = std::max(std::max(t0, t1), std::max(t2, t3));  // no NaN among them
  return top == m ? hint_result::right : hint_result::wrong;  // a NaN hint is never right
}

inline int per_head_row(const float* row, int len, keep_set keep, int budget, float alpha,
                        const row_workspace& ws, std::int32_t* out, row_lookahead& la) {
  const detail::keep_range kr = detail::keep_bounds(keep, len);
  const int a = kr.head_end;
  const int n = kr.tail_begin - a;
  const int k = budget - kr.size(len);
  std::optional<float> keep_max_value;
  const auto keep_max = [&] {
    if (!keep_max_value)
      keep_max_value = max_of(row + kr.tail_begin, len - kr.tail_begin, max_of(row, a, -INFINITY));
    return *keep_max_value;
  };
  const auto row_max = [&] { return la.known ? *la.known : max_of(row + a, n, keep_max()); };
  const auto compact = [&](float floor, int limit) {
    if (la.next == nullptr) return compact_at_least(row + a, n, a, floor, ws.cand, limit);
    float next_max = 0.f;
    const int got = compact_at_least_and_max(row + a, n, a, floor, ws.cand, limit, la.next,
                                             la.next_len, &next_max);
    la.next_max = next_max;
    return got;
  };
  // With a hint, one compaction against its floor, then check_hint: -1 where the hint is wrong (the
  // row goes as without one). too_many: more than `limit` candidates against the hint's floor.
  const auto hinted = [&](int limit, hint_result& how) {
    const int kept = compact(detail::threshold_floor(*la.hint, alpha), limit);
    how = kept < 0 || kept > limit ? hint_result::too_many
                                   : check_hint(row, ws.cand, kept, keep_max(), *la.hint);
    return how == hint_result::right ? kept : -1;
  };
  int c = emit_range(0, a, out);
  if (n > 0 && k > 0) {
    if (n <= k) {
      hint_result how = hint_result::wrong;
      int taken = la.hint ? hinted(INT_MAX, how) : -1;
      if (taken < 0) taken = compact(detail::threshold_floor(row_max(), alpha), INT_MAX);
      std::memcpy(out + c, ws.cand, sizeof(std::int32_t) * static_cast<std::size_t>(taken));
      c += taken;
    } else {
      // Peaked rows have few candidates: if no more than k reach the final floor, they are the
      // answer. Past short_list_max (or k) the sampled path below takes over.
      const int limit = k < short_list_max ? k : short_list_max;
      hint_result how = hint_result::wrong;
      int kept = la.hint ? hinted(limit, how) : -1;
      if (how == hint_result::right || how == hint_result::too_many) {
      } else if (n <= short_row) {
        // A short row stays in L1: the exact maximum, then one compaction against the final floor.
        kept = compact(detail::threshold_floor(row_max(), alpha), limit);
      } else {
        // One pass collects the candidates of the running maximum; the final floor then filters the
        // few that a lower running maximum let in.
        float m = keep_max();
        const int got = collect_candidates(row + a, n, a, -INFINITY, alpha, m, ws.cand, limit);
        if (got >= 0) kept = filter_at_least(row, ws.cand, got, detail::threshold_floor(m, alpha));
      }
      if (kept >= 0 && kept <= limit) {
        std::memcpy(out + c, ws.cand, sizeof(std::int32_t) * static_cast<std::size_t>(kept));
        return c + kept + emit_range(kr.tail_begin, len, out + c + kept);
      }
      const float lower = sample_lower_bound(row + a, n, k, ws.keys, ws.hist, ws.pos);
      c += best_above_floor(row, a, n, k, alpha, keep_max(), lower, ws, out + c);
    }
  }
  return c + emit_range(kr.tail_begin, len, out + c);
}

}  // namespace detail

class threshold_selector_host {
 public:
  struct config {
    decode_shape shape{};  // num_seqs, num_kv_heads, max_tokens (the score rows' stride)
    int capacity = 0;   // index slots per (sequence, kv_head) in the selection buffers
    float alpha = 0.f;  // candidates score >= row max - alpha; >= 0, +inf admits all
    int budget = 0;  // most tokens selected per (sequence, kv_head), keep-set included
    threshold_rule rule = threshold_rule::per_head;  // kvscout's rule
    keep_set keep{};
    /// > 0: the cap of a row of len cached tokens is row_budget(budget, budget_share, keep, len).
    double budget_share = 0;
  };
  using config_type = config;
  using memory_space = host_space;
  using exec_type = host_exec;  // select()'s last argument, defaulted (core/exec.hpp)

  /// Workspace: about 12 * stride + 16 KiB bytes, and for infinigen_mean 8 bytes per row.
  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg) {
    check_config(cfg);
    return sizeof(std::uint32_t) *
           (detail::row_workspace::words(cfg.shape.max_tokens) + stats_words(cfg));
  }
  static constexpr std::size_t workspace_alignment = detail::row_workspace_alignment;

  threshold_selector_host(const config& cfg, host_span<std::byte> workspace)
      : cfg_(cfg),
        ws_(detail::row_workspace::carve(detail::workspace_words(workspace, workspace_bytes(cfg)),
                                         cfg.shape.max_tokens)) {
    if (stats_words(cfg) > 0) {
      std::uint32_t* stats = reinterpret_cast<std::uint32_t*>(workspace.data()) +
                             detail::row_workspace::words(cfg.shape.max_tokens);
      row_max_ = reinterpret_cast<float*>(stats);
      row_count_ = reinterpret_cast<std::int32_t*>(stats) + rows(cfg);
    }
  }

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }

  void select(const score_view<host_space>& scores, const selection_buffers<host_space>& out,
              host_exec = {}) {
    detail::check_selector_views(cfg_.shape.num_seqs, cfg_.shape.num_kv_heads,
                                 cfg_.shape.max_tokens, cfg_.capacity, scores, out);
    if (cfg_.rule == threshold_rule::per_head) {
      select_per_head(scores, out);
    } else {
      select_infinigen_mean(scores, out);
    }
  }

 private:
  static std::size_t rows(const config& cfg) {
    return static_cast<std::size_t>(cfg.shape.num_seqs) *
           static_cast<std::size_t>(cfg.shape.num_kv_heads);
  }
  static std::size_t stats_words(const config& cfg) {
    return cfg.rule == threshold_rule::infinigen_mean ? 2 * rows(cfg) : 0;
  }

  static void check_config(const config& cfg) {
    detail::check_selector_config(cfg.shape.num_seqs, cfg.shape.num_kv_heads, cfg.shape.max_tokens,
                                  cfg.capacity, "budget", cfg.budget, cfg.keep,
                                  cfg.budget_share);
    KVSCOUT_EXPECTS(cfg.alpha >= 0.f, "alpha must be a non-negative number, got ", cfg.alpha);
    KVSCOUT_EXPECTS(
        cfg.rule == threshold_rule::per_head || cfg.rule == threshold_rule::infinigen_mean, "rule ",
        cfg.rule, " is not one of infinigen_mean, per_head");
  }

  void select_per_head(const score_view<host_space>& scores,
                       const selection_buffers<host_space>& out) const {
    // Each row hands the next its maximum where it read it; with hints, nothing is read ahead.
    const int H = cfg_.shape.num_kv_heads;
    const bool hinted = !scores.row_max.empty();
    detail::row_lookahead la;
    for (int s = 0; s < cfg_.shape.num_seqs; ++s) {
      const int len = scores.seq_lens[static_cast<std::size_t>(s)];
      for (int h = 0; h < H; ++h) {
        const int ns = h + 1 < H ? s : s + 1;
        const int nh = h + 1 < H ? h + 1 : 0;
        const std::size_t r = static_cast<std::size_t>(s) * H + h;
        la.next = nullptr;
        if (hinted) {
          // NaN: no hint for this row (as the host pipeline leaves rows its policy did not write).
          const float m = scores.row_max[r];
          la.hint = m == m ? std::optional<float>(m) : std::nullopt;
        } else if (ns < cfg_.shape.num_seqs) {
          la.next_len = scores.seq_lens[static_cast<std::size_t>(ns)];
          const detail::keep_range nk = detail::keep_bounds(cfg_.keep, la.next_len);
          if (nk.tail_begin - nk.head_end <= detail::short_row)
            la.next = scores.scores.data() + scores.row(ns, nh);
        }
        out.counts[r] = detail::per_head_row(
            scores.scores.data() + scores.row(s, h), len, cfg_.keep,
            detail::row_budget(cfg_.budget, cfg_.budget_share, cfg_.keep, len), cfg_.alpha, ws_,
            out.indices.data() + r * static_cast<std::size_t>(cfg_.capacity), la);
        la.known = la.next_max;
        la.next_max.reset();
      }
    }
  }

  void select_infinigen_mean(const score_view<host_space>& scores,
                             const selection_buffers<host_space>& out) const {
    const int H = cfg_.shape.num_kv_heads;
    long long total = 0;
    long long nonempty_rows = 0;
    for (int s = 0; s < cfg_.shape.num_seqs; ++s) {
      const int len = scores.seq_lens[static_cast<std::size_t>(s)];
      const detail::keep_range kr = detail::keep_bounds(cfg_.keep, len);
      for (int h = 0; h < H; ++h) {
        const std::size_t r = static_cast<std::size_t>(s) * H + h;
        row_max_[r] = -INFINITY;
        row_count_[r] = 0;
        if (len == 0) continue;
        const float* row = scores.scores.data() + scores.row(s, h);
        row_max_[r] = detail::max_of(row, len, -INFINITY);
        row_count_[r] = detail::count_at_least(row + kr.head_end, kr.tail_begin - kr.head_end,
                                               detail::threshold_floor(row_max_[r], cfg_.alpha));
        total += row_count_[r];
        ++nonempty_rows;
      }
    }
    const long long mean = nonempty_rows > 0 ? total / nonempty_rows : 0;
    // Pass 2: every row takes the keep-set and its best min(mean, slots) other tokens. Where the
    // row has that many candidates, the best are among them: radix select on a short list, no
    // sample.
    for (int s = 0; s < cfg_.shape.num_seqs; ++s) {
      const int len = scores.seq_lens[static_cast<std::size_t>(s)];
      const detail::keep_range kr = detail::keep_bounds(cfg_.keep, len);
      const int a = kr.head_end;
      const int n = kr.tail_begin - kr.head_end;
      const int slots =
          detail::row_budget(cfg_.budget, cfg_.budget_share, cfg_.keep, len) - kr.size(len);
      const int k = mean < slots ? static_cast<int>(mean) : slots;
      for (int h = 0; h < H; ++h) {
        const std::size_t r = static_cast<std::size_t>(s) * H + h;
        const float* row = scores.scores.data() + scores.row(s, h);
        std::int32_t* o = out.indices.data() + r * static_cast<std::size_t>(cfg_.capacity);
        int c = detail::emit_range(0, a, o);
        if (n > 0 && k > 0 && k <= row_count_[r] && row_count_[r] <= detail::short_list_max) {
          c += detail::best_above_floor(row, a, n, k, cfg_.alpha, row_max_[r], -INFINITY, ws_,
                                        o + c);
        } else {
          c += detail::best_of_range(row, a, n, k, ws_, o + c);
        }
        c += detail::emit_range(kr.tail_begin, len, o + c);
        out.counts[r] = c;
      }
    }
  }

  config cfg_;
  detail::row_workspace ws_;
  float* row_max_ = nullptr;         // [num_seqs * num_kv_heads], infinigen_mean only
  std::int32_t* row_count_ = nullptr;  // [num_seqs * num_kv_heads], infinigen_mean only
};

static_assert(row_selector<threshold_selector_host>);

}  // namespace kvscout
