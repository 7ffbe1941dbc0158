#pragma once
// Head-pooled top-k on the host (kvscout's): a sequence's KV heads share one budget,
// budget * num_kv_heads rows, instead of each taking `budget`, so a head whose attention is
// concentrated gives rows to one whose attention is spread.
//
//   kvscout::pooled_topk_selector_host::config cfg{.shape = shape,
//       .capacity = 1024, .budget = 256, .keep = {4, 16},
//       .scale = kvscout::pooled_scale::logit};
//   auto ws = kvscout::make_workspace<kvscout::pooled_topk_selector_host>(cfg);
//   kvscout::pooled_topk_selector_host pool(cfg, ws.span());
//   pool.select(scores, out);  // score_view<host_space>, selection_buffers<host_space>
//
// Per sequence s of length len = seq_lens[s], with H = num_kv_heads:
//   - len <= budget: every head selects all len tokens (top-k's rule).
//   - otherwise every head takes its keep-set, and the K = H * (budget - |keep|) other rows are
//     shared among the heads; no head takes more than capacity rows, keep-set included (the
//     excess goes to the others). pooled_rule::mass: the K best across the heads by a score that
//     compares across heads:
//       logit  the row's softmax: s - m_h - log sum_t exp(s_t - m_h) (m_h the head's maximum; NaN
//              ignored; a head with a +inf score ranks its +inf rows first, the rest -inf);
//       mass   the score itself (already attention mass, e.g. oracle_policy_host's or sum_prob's).
//     Ties at the boundary go to the lower head, then to the lower token index; NaN is never
//     chosen by score, so a sequence with NaNs may select fewer rows.
//     pooled_rule::coverage: each head's probabilities (logit: its softmax; mass: the scores over
//     the sum of the finite positive ones, others 0), and the counts that give every head the same
//     share of its own mass, keep-set included, as high as K rows allow; leftover rows go one at a
//     time to the head of lowest share.
//   Within a head the rows are its best by its own score: out.indices[s, h, 0:count] strictly
//   ascending, out.counts[s, h] = count. Pooling needs capacity > budget. A sequence selects at
//   most H * budget rows; a head may select more or fewer than budget. Host only.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>

#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/select/concepts.hpp"
#include "kvscout/select/detail/checks.hpp"
#include "kvscout/select/detail/host_rows.hpp"
#include "kvscout/select/topk.hpp"

namespace kvscout {

enum class pooled_scale : int {
  logit = 0,  // scores are logits: each head's softmax (log-probability) is compared
  mass = 1,   // scores are attention mass already: compared as they are
};

enum class pooled_rule : int {
  mass = 0,
  /// Every head reaches the same share of its own attention mass, as high as rows allow.
  coverage = 1,
};

inline std::ostream& operator<<(std::ostream& os, pooled_rule r) {
  switch (r) {
    case pooled_rule::mass:
      return os << "mass";
    case pooled_rule::coverage:
      return os << "coverage";
  }
  return os << "pooled_rule(" << static_cast<int>(r) << ")";
}

inline std::ostream& operator<<(std::ostream& os, pooled_scale s) {
  switch (s) {
    case pooled_scale::logit:
      return os << "logit";
    case pooled_scale::mass:
      return os << "mass";
  }
  return os << "pooled_scale(" << static_cast<int>(s) << ")";
}

class pooled_topk_selector_host {
 public:
  struct config {
    decode_shape shape{};  // num_seqs, num_kv_heads, max_tokens (the score rows' stride)
    int capacity = 0;  // index slots per (sequence, kv_head): the most one head may take
    int budget = 0;    // mean tokens per (sequence, kv_head), keep-set included
    keep_set keep{};
    pooled_scale scale = pooled_scale::logit;
    pooled_rule rule = pooled_rule::mass;
  };
  using config_type = config;
  using memory_space = host_space;
  using exec_type = host_exec;

  /// Workspace: top-k's row workspace, two floats per (kv head, token) of one sequence and five
  /// words per kv head.
  [[nodiscard]] static std::size_t workspace_bytes(const config& cfg) {
    check_config(cfg);
    KVSCOUT_EXPECTS(static_cast<unsigned long long>(cfg.shape.num_kv_heads) *
                            static_cast<unsigned long long>(cfg.shape.max_tokens) <=
                        (std::numeric_limits<std::size_t>::max() / sizeof(std::uint32_t) - 64) / 4,
                    "num_kv_heads * stride = ", cfg.shape.num_kv_heads, " * ", cfg.shape.max_tokens,
                    " is too large for a workspace size");
    return sizeof(std::uint32_t) *
           (detail::row_workspace::words(cfg.shape.max_tokens) + 2 * pooled_words(cfg) +
            5 * static_cast<std::size_t>(cfg.shape.num_kv_heads));
  }
  static constexpr std::size_t workspace_alignment = detail::row_workspace_alignment;

  pooled_topk_selector_host(const config& cfg, host_span<std::byte> workspace) : cfg_(cfg) {
    std::uint32_t* w = detail::workspace_words(workspace, workspace_bytes(cfg));
    ws_ = detail::row_workspace::carve(w, cfg.shape.max_tokens);
    value_ = reinterpret_cast<float*>(w + detail::row_workspace::words(cfg.shape.max_tokens));
    pool_ = value_ + pooled_words(cfg);
    count_ = reinterpret_cast<std::int32_t*>(pool_ + pooled_words(cfg));
    avail_ = count_ + cfg.shape.num_kv_heads;
    above_ = avail_ + cfg.shape.num_kv_heads;
    ties_ = above_ + cfg.shape.num_kv_heads;
    kept_ = reinterpret_cast<float*>(ties_ + cfg.shape.num_kv_heads);
  }

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }

  void select(const score_view<host_space>& scores, const selection_buffers<host_space>& out,
              host_exec = {}) {
    detail::check_selector_views(cfg_.shape.num_seqs, cfg_.shape.num_kv_heads,
                                 cfg_.shape.max_tokens, cfg_.capacity, scores, out);
    const int H = cfg_.shape.num_kv_heads;
    for (int s = 0; s < cfg_.shape.num_seqs; ++s) {
      const int len = scores.seq_lens[static_cast<std::size_t>(s)];
      if (len > cfg_.budget) allot(scores, s, len);
      for (int h = 0; h < H; ++h) {
        const std::size_t r = static_cast<std::size_t>(s) * H + h;
        const int b = len <= cfg_.budget
                          ? cfg_.budget
                          : detail::keep_bounds(cfg_.keep, len).size(len) + count_[h];
        out.counts[r] = detail::topk_row_host(scores.scores.data() + scores.row(s, h), len, cfg_.keep,
                                              b, ws_, out.indices.data() + r * static_cast<std::size_t>(cfg_.capacity));
      }
    }
  }

 private:
  static std::size_t pooled_words(const config& cfg) {
    return static_cast<std::size_t>(cfg.shape.num_kv_heads) *
           static_cast<std::size_t>(cfg.shape.max_tokens);
  }
  static void check_config(const config& cfg) {
    detail::check_selector_config(cfg.shape.num_seqs, cfg.shape.num_kv_heads, cfg.shape.max_tokens,
                                  cfg.capacity, "budget", cfg.budget, cfg.keep);
    KVSCOUT_EXPECTS(cfg.scale == pooled_scale::logit || cfg.scale == pooled_scale::mass,
                    "scale = ", cfg.scale, ": expected pooled_scale::logit or pooled_scale::mass");
    KVSCOUT_EXPECTS(cfg.rule == pooled_rule::mass || cfg.rule == pooled_rule::coverage,
                    "rule = ", cfg.rule, ": expected pooled_rule::mass or pooled_rule::coverage");
  }
  // Each non-keep row's comparable value into value_ [h * stride + t] (NaN where not a candidate),
  // then how many rows each head takes beyond its keep-set (count_).
  void allot(const score_view<host_space>& scores, int s, int len) {
    const int H = cfg_.shape.num_kv_heads;
    const detail::keep_range kr = detail::keep_bounds(cfg_.keep, len);
    const int keep = kr.size(len);
    const long long want = static_cast<long long>(H) * (cfg_.budget - keep);
    long long total = 0;
    for (int h = 0; h < H; ++h) {
      const float* row = scores.scores.data() + scores.row(s, h);
      const int n = candidates(row, value_ + static_cast<std::size_t>(h) * cfg_.shape.max_tokens,
                               kr, len);
      avail_[h] = count_[h] = std::min(n, cfg_.capacity - keep);
      total += avail_[h];
      ties_[h] = 0;
    }
    if (total <= want) return;  // every candidate fits
    if (cfg_.rule == pooled_rule::coverage) return cover(scores, s, len, want);
    water_fill(kr, want);
  }
  // A head's candidates (neither keep-set nor NaN): how many; under pooled_rule::mass also their
  // comparable values into v (NaN elsewhere). Coverage (cover()) only counts them here.
  int candidates(const float* row, float* v, const detail::keep_range& kr, int len) const {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    const bool values = cfg_.rule == pooled_rule::mass;
    const head_norm nm = values && cfg_.scale == pooled_scale::logit ? normaliser(row, len)
                                                                    : head_norm{cfg_.scale};
    const float shift = static_cast<float>(nm.shift);
    int n = 0;
    for (int t = 0; t < len; ++t) {
      float x = row[t];
      if (t < kr.head_end || t >= kr.tail_begin || std::isnan(x)) {
        if (values) v[t] = nan;
        continue;
      }
      if (!values) {
        ++n;
        continue;
      }
      if (cfg_.scale == pooled_scale::logit) {
        if (nm.inf_rows > 0)
          x = x == inf ? x : -inf;
        else if (x > -inf && std::isfinite(shift))
          x -= shift;
      }
      v[t] = x;
      ++n;
    }
    return n;
  }
  // pooled_rule::mass, more candidates than `want`: water-filling. Heads whose rows above the
  // pool's threshold fill their cap take the cap and leave the pool (ties_[h] = -1); the threshold
  // only falls as they leave, so they stay capped.
  void water_fill(const detail::keep_range& kr, long long want) {
    const int H = cfg_.shape.num_kv_heads;
    std::int32_t *count = count_, *av = avail_, *above = above_, *ties = ties_;
    const auto active = [&](int h) { return ties[h] >= 0; };
    for (;;) {
      if (want <= 0) {
        for (int h = 0; h < H; ++h)
          if (active(h)) count[h] = 0;
        return;
      }
      std::size_t n = 0;
      for (int h = 0; h < H; ++h) {
        if (!active(h)) continue;
        const float* v = value_ + static_cast<std::size_t>(h) * cfg_.shape.max_tokens;
        for (int t = kr.head_end; t < kr.tail_begin; ++t)
          if (!std::isnan(v[t])) pool_[n++] = v[t];
      }
      std::nth_element(pool_, pool_ + (want - 1), pool_ + n, std::greater<float>());
      const float tau = pool_[want - 1];
      bool capped = false;
      for (int h = 0; h < H; ++h) {
        if (!active(h)) continue;
        const float* v = value_ + static_cast<std::size_t>(h) * cfg_.shape.max_tokens;
        int a = 0, e = 0;
        for (int t = kr.head_end; t < kr.tail_begin; ++t) a += v[t] > tau, e += v[t] == tau;
        above[h] = a, ties[h] = e;
        if (a >= av[h]) {  // count[h] is already av[h]
          ties[h] = -1;
          want -= av[h];
          capped = true;
        }
      }
      if (capped) continue;
      // The rows above tau all fit; the rest of want comes from the ties at tau, lower heads first.
      // Where the heads' room for ties is short of that, the heads whose ties fill their cap take
      // it and leave (the threshold falls below tau).
      long long left = want, room = 0;
      for (int h = 0; h < H; ++h)
        if (active(h)) left -= above[h], room += std::min(ties[h], av[h] - above[h]);
      if (left > room) {
        for (int h = 0; h < H; ++h)
          if (active(h) && above[h] + ties[h] >= av[h]) ties[h] = -1, want -= av[h];
        continue;
      }
      for (int h = 0; h < H; ++h) {
        if (!active(h)) continue;
        const long long t = std::min<long long>({left, ties[h], av[h] - above[h]});
        count[h] = above[h] + static_cast<int>(t);
        left -= t;
      }
      return;
    }
  }

  // Each head's candidate probabilities, sorted descending, as running sums in pool_ [h * stride];
  // the highest coverage every head reaches within want rows, by bisection; the leftover rows to
  // the heads of lowest coverage.
  void cover(const score_view<host_space>& scores, int s, int len, long long want) {
    const int H = cfg_.shape.num_kv_heads;
    const detail::keep_range kr = detail::keep_bounds(cfg_.keep, len);
    std::int32_t *count = count_, *av = avail_, *n_of = above_;
    for (int h = 0; h < H; ++h) {
      const float* row = scores.scores.data() + scores.row(s, h);
      const head_norm nm = normaliser(row, len);
      float* p = pool_ + static_cast<std::size_t>(h) * cfg_.shape.max_tokens;
      int n = 0;
      double kept = 0;
      for (int t = 0; t < len; ++t) {
        if (std::isnan(row[t])) continue;
        const double q = nm.prob(row[t]);
        if (t < kr.head_end || t >= kr.tail_begin)
          kept += q;
        else
          p[n++] = static_cast<float>(q);
      }
      std::sort(p, p + n, std::greater<float>());
      double acc = 0;  // summed in double: small probabilities still count late in a long row
      for (int j = 0; j < n; ++j) p[j] = static_cast<float>(acc += p[j]);
      n_of[h] = n;
      kept_[h] = static_cast<float>(kept);
    }
    const auto coverage = [&](int h, int j) {
      return kept_[h] + (j > 0 ? pool_[static_cast<std::size_t>(h) * cfg_.shape.max_tokens +
                                       static_cast<std::size_t>(j - 1)]
                               : 0.f);
    };
    const auto need = [&](int h, double c) -> int {
      if (kept_[h] >= c) return 0;
      const float* p = pool_ + static_cast<std::size_t>(h) * cfg_.shape.max_tokens;
      const int j = static_cast<int>(std::lower_bound(p, p + n_of[h], static_cast<float>(c - kept_[h])) - p) + 1;
      return std::min(j, av[h]);
    };
    double lo = 0, hi = 1;  // sum of need(lo) <= want
    for (int it = 0; it < 40; ++it) {
      const double mid = 0.5 * (lo + hi);
      long long sum = 0;
      for (int h = 0; h < H; ++h) sum += need(h, mid);
      (sum <= want ? lo : hi) = mid;
    }
    long long left = want;
    for (int h = 0; h < H; ++h) left -= count[h] = need(h, lo);
    while (left > 0) {
      int best = -1;
      for (int h = 0; h < H; ++h)
        if (count[h] < av[h] && (best < 0 || coverage(h, count[h]) < coverage(best, count[best]))) best = h;
      if (best < 0) break;
      ++count[best];
      --left;
    }
  }

  // logit scale: the head's softmax (where its maximum is +inf, its +inf rows share 1; where -inf,
  // every row is 0); mass scale: the non-negative finite scores over their sum (others 0).
  struct head_norm {
    pooled_scale scale;
    double shift = 0, norm = 0;  // logit: m + log Z; mass: the sum. inf_rows: logit, m = +inf
    int inf_rows = 0;
    [[nodiscard]] double prob(float x) const {
      if (scale == pooled_scale::mass) return std::isfinite(x) && x > 0 && norm > 0 ? x / norm : 0.0;
      if (inf_rows > 0) return x == INFINITY ? 1.0 / inf_rows : 0.0;
      return std::isfinite(shift) ? std::exp(static_cast<double>(x) - shift) : 0.0;
    }
  };
  [[nodiscard]] head_norm normaliser(const float* row, int len) const {
    head_norm nm{cfg_.scale};
    if (cfg_.scale == pooled_scale::mass) {
      for (int t = 0; t < len; ++t)
        if (std::isfinite(row[t]) && row[t] > 0) nm.norm += row[t];
      return nm;
    }
    double m = -INFINITY;
    for (int t = 0; t < len; ++t) {
      if (row[t] > m) m = row[t];
      nm.inf_rows += row[t] == INFINITY;
    }
    if (!std::isfinite(m)) {
      nm.shift = -INFINITY;
      return nm;
    }
    double z = 0;
    for (int t = 0; t < len; ++t)
      if (!std::isnan(row[t])) z += std::exp(row[t] - m);
    nm.shift = m + std::log(z);
    return nm;
  }

  config cfg_;
  detail::row_workspace ws_;
  float* value_ = nullptr;  // [num_kv_heads, stride] one sequence's comparable values
  float* pool_ = nullptr;   // [num_kv_heads * stride] the pool nth_element permutes
  std::int32_t *count_ = nullptr, *avail_ = nullptr, *above_ = nullptr, *ties_ = nullptr;  // [H]
  float* kept_ = nullptr;  // [H] coverage: each head's keep-set probability
};

static_assert(row_selector<pooled_topk_selector_host>);

}  // namespace kvscout
