// Head-pooled top-k (issue 32, part 2): pooled_topk_selector_host against a brute-force reference
// of its semantics (every candidate of a sequence sorted by its comparable value, then taken
// greedily under each head's cap), and its relation to per-head top-k.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "kvscout/core/workspace.hpp"
#include "kvscout/select/pooled.hpp"
#include "kvscout/select/topk.hpp"

namespace {

using kvscout::keep_set;
using kvscout::pooled_scale;
using kvscout::pooled_topk_selector_host;

const float nan_f = std::numeric_limits<float>::quiet_NaN();
const float inf_f = std::numeric_limits<float>::infinity();

struct problem {
  int S, H, stride;
  std::vector<float> scores;     // [S, H, stride]
  std::vector<std::int32_t> lens;
};

// The reference: per sequence, the keep-set of every head, then the candidates sorted by
// (value desc, head asc, token asc), taken greedily while the head is under its cap, until
// H * (budget - |keep|) are taken; each head's selection sorted ascending.
std::vector<std::vector<std::int32_t>> reference(const problem& p, const pooled_topk_selector_host::config& c) {
  std::vector<std::vector<std::int32_t>> out(static_cast<std::size_t>(p.S) * p.H);
  for (int s = 0; s < p.S; ++s) {
    const int len = p.lens[static_cast<std::size_t>(s)];
    const auto row = [&](int h) { return &p.scores[(static_cast<std::size_t>(s) * p.H + h) * p.stride]; };
    if (len <= c.budget) {
      for (int h = 0; h < p.H; ++h)
        for (int t = 0; t < len; ++t) out[static_cast<std::size_t>(s) * p.H + h].push_back(t);
      continue;
    }
    const int head_end = std::min(c.keep.sinks, len), tail_begin = std::max(head_end, len - c.keep.recent);
    const int keep = head_end + (len - tail_begin);
    std::vector<std::tuple<double, int, int>> cand;  // (-value, head, token)
    for (int h = 0; h < p.H; ++h) {
      const float* r = row(h);
      double m = -INFINITY, z = 0;
      for (int t = 0; t < len; ++t)
        if (!std::isnan(r[t])) m = std::max(m, static_cast<double>(r[t]));
      if (std::isfinite(m))
        for (int t = 0; t < len; ++t)
          if (!std::isnan(r[t])) z += std::exp(r[t] - m);
      for (int t = 0; t < len; ++t) {
        auto& o = out[static_cast<std::size_t>(s) * p.H + h];
        if (t < head_end || t >= tail_begin) {
          o.push_back(t);
          continue;
        }
        if (std::isnan(r[t])) continue;
        double v = r[t];
        if (c.scale == pooled_scale::logit) {
          if (m == INFINITY) v = r[t] == inf_f ? INFINITY : -INFINITY;
          else if (std::isfinite(v)) v = v - m - std::log(z);
        }
        cand.emplace_back(-v, h, t);
      }
    }
    std::sort(cand.begin(), cand.end());
    long long want = static_cast<long long>(p.H) * (c.budget - keep);
    std::vector<int> taken(static_cast<std::size_t>(p.H), keep);
    for (const auto& [nv, h, t] : cand) {
      if (want == 0) break;
      if (taken[static_cast<std::size_t>(h)] >= c.capacity) continue;
      ++taken[static_cast<std::size_t>(h)];
      out[static_cast<std::size_t>(s) * p.H + h].push_back(t);
      --want;
    }
    for (int h = 0; h < p.H; ++h) {
      auto& o = out[static_cast<std::size_t>(s) * p.H + h];
      std::sort(o.begin(), o.end());
    }
  }
  return out;
}

struct result {
  std::vector<std::int32_t> idx, cnt;
};

result run(const problem& p, const pooled_topk_selector_host::config& c) {
  auto ws = kvscout::make_workspace<pooled_topk_selector_host>(c);
  pooled_topk_selector_host sel(c, ws.span());
  result r;
  r.idx.assign(static_cast<std::size_t>(p.S) * p.H * c.capacity, -7);
  r.cnt.assign(static_cast<std::size_t>(p.S) * p.H, -7);
  const kvscout::score_view<kvscout::host_space> sv{{p.scores.data(), p.scores.size()}, {p.lens.data(), p.lens.size()}, p.S, p.H, p.stride};
  sel.select(sv, {{r.idx.data(), r.idx.size()}, {r.cnt.data(), r.cnt.size()}, p.S, p.H, c.capacity});
  return r;
}

void require_equal(const problem& p, const pooled_topk_selector_host::config& c, const result& r) {
  const auto ref = reference(p, c);
  for (std::size_t row = 0; row < ref.size(); ++row) {
    INFO("row " << row << " len " << p.lens[row / static_cast<std::size_t>(p.H)]);
    REQUIRE(r.cnt[row] == static_cast<std::int32_t>(ref[row].size()));
    const std::vector<std::int32_t> got(r.idx.begin() + static_cast<std::ptrdiff_t>(row * c.capacity),
                                        r.idx.begin() + static_cast<std::ptrdiff_t>(row * c.capacity + r.cnt[row]));
    REQUIRE(got == ref[row]);
  }
}

}  // namespace

TEST_CASE("pooled top-k equals the greedy reference on tied mass scores, caps, NaN and infinities", "[select][pooled]") {
  std::mt19937 rng(3201);
  for (int trial = 0; trial < 80; ++trial) {
    problem p;
    p.S = 1 + static_cast<int>(rng() % 3);
    p.H = 1 + static_cast<int>(rng() % 5);
    p.stride = 40 + static_cast<int>(rng() % 60);
    p.scores.resize(static_cast<std::size_t>(p.S) * p.H * p.stride);
    std::uniform_int_distribution<int> level(0, 6);  // few distinct values: many ties
    for (auto& x : p.scores) {
      const auto u = static_cast<unsigned>(rng() % 40);
      x = u == 0 ? nan_f : u == 1 ? inf_f : u == 2 ? -inf_f : 0.25f * static_cast<float>(level(rng)) + 0.5f;
    }
    for (int s = 0; s < p.S; ++s) p.lens.push_back(static_cast<std::int32_t>(rng() % (p.stride + 1)));
    pooled_topk_selector_host::config c;
    c.shape.num_seqs = p.S, c.shape.num_kv_heads = p.H, c.shape.max_tokens = p.stride;
    c.keep = {static_cast<int>(rng() % 3), static_cast<int>(rng() % 4)};
    c.budget = c.keep.sinks + c.keep.recent + 1 + static_cast<int>(rng() % 12);
    c.capacity = c.budget + static_cast<int>(rng() % 3 == 0 ? 0 : rng() % 20);  // often tight
    c.scale = pooled_scale::mass;
    INFO("trial " << trial);
    require_equal(p, c, run(p, c));
  }
}

TEST_CASE("pooled top-k on logits with NaN, infinities and heads of no candidates", "[select][pooled]") {
  std::mt19937 rng(3206);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (int trial = 0; trial < 60; ++trial) {
    problem p;
    p.S = 2, p.H = 4, p.stride = 80;
    for (int i = 0; i < p.S * p.H * p.stride; ++i) {
      const auto u = static_cast<unsigned>(rng() % 50);
      p.scores.push_back(u == 0 ? nan_f : u == 1 ? -inf_f : nd(rng));
    }
    // Head 1 of sequence 0: a +inf row (its other rows rank last); head 2: all NaN but its
    // keep-set; head 3 of sequence 1: all -inf.
    p.scores[1 * p.stride + 30] = inf_f;
    for (int t = 0; t < p.stride; ++t) p.scores[2 * static_cast<std::size_t>(p.stride) + t] = nan_f;
    for (int t = 0; t < p.stride; ++t) p.scores[7 * static_cast<std::size_t>(p.stride) + t] = -inf_f;
    p.lens = {80, 40 + static_cast<std::int32_t>(rng() % 40)};
    pooled_topk_selector_host::config c{{.num_seqs = p.S, .num_kv_heads = p.H,
                                         .max_tokens = p.stride}, 20 + static_cast<int>(rng() % 40),
                                        12, {2, 3}, pooled_scale::logit};
    INFO("trial " << trial);
    require_equal(p, c, run(p, c));
  }
}

TEST_CASE("pooled top-k on logits compares each head's softmax", "[select][pooled]") {
  std::mt19937 rng(3202);
  for (int trial = 0; trial < 40; ++trial) {
    problem p;
    p.S = 2, p.H = 4, p.stride = 700;
    p.scores.resize(static_cast<std::size_t>(p.S) * p.H * p.stride);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int s = 0; s < p.S; ++s)
      for (int h = 0; h < p.H; ++h) {
        // Heads differ in temperature and offset: the raw logits do not compare across heads.
        const float temp = 0.5f + 2.0f * static_cast<float>(h), off = 10.f * static_cast<float>(h);
        for (int t = 0; t < p.stride; ++t)
          p.scores[(static_cast<std::size_t>(s) * p.H + h) * p.stride + t] = off + temp * nd(rng);
      }
    p.lens = {600 + static_cast<std::int32_t>(rng() % 100), 300};
    pooled_topk_selector_host::config c{{.num_seqs = p.S, .num_kv_heads = p.H,
                                         .max_tokens = p.stride}, 400, 60, {4, 16},
                                        pooled_scale::logit};
    INFO("trial " << trial);
    const result r = run(p, c);
    require_equal(p, c, r);
    // The heads' counts differ (the budget followed the attention) and sum to the pooled total.
    for (int s = 0; s < p.S; ++s) {
      int sum = 0, lo = 1 << 30, hi = 0;
      for (int h = 0; h < p.H; ++h) {
        const int n = r.cnt[static_cast<std::size_t>(s) * p.H + h];
        sum += n, lo = std::min(lo, n), hi = std::max(hi, n);
      }
      REQUIRE(sum == p.H * c.budget);
      REQUIRE(hi > lo);
    }
  }
}

TEST_CASE("pooled top-k keeps at least per-head top-k's attention mass at the same budget", "[select][pooled]") {
  std::mt19937 rng(3203);
  problem p;
  p.S = 3, p.H = 3, p.stride = 2048;
  p.scores.resize(static_cast<std::size_t>(p.S) * p.H * p.stride);
  std::exponential_distribution<float> ed(1.f);
  for (int s = 0; s < p.S; ++s)
    for (int h = 0; h < p.H; ++h) {  // per-head attention distributions of different sharpness
      float* r = &p.scores[(static_cast<std::size_t>(s) * p.H + h) * p.stride];
      double z = 0;
      for (int t = 0; t < p.stride; ++t) z += r[t] = std::pow(ed(rng), 1.f + 3.f * static_cast<float>(h));
      for (int t = 0; t < p.stride; ++t) r[t] = static_cast<float>(r[t] / z);
    }
  p.lens = {2048, 1500, 900};
  const pooled_topk_selector_host::config c{{.num_seqs = p.S, .num_kv_heads = p.H,
                                             .max_tokens = p.stride}, 2048, 100, {4, 16},
                                            pooled_scale::mass};
  const result pooled = run(p, c);
  const kvscout::topk_selector_host::config tc{{.num_seqs = p.S, .num_kv_heads = p.H,
                                                .max_tokens = p.stride}, 2048, 100, {4, 16}};
  auto tws = kvscout::make_workspace<kvscout::topk_selector_host>(tc);
  kvscout::topk_selector_host topk(tc, tws.span());
  result per_head;
  per_head.idx.assign(static_cast<std::size_t>(p.S) * p.H * 2048, 0);
  per_head.cnt.assign(static_cast<std::size_t>(p.S) * p.H, 0);
  const kvscout::score_view<kvscout::host_space> sv{{p.scores.data(), p.scores.size()}, {p.lens.data(), p.lens.size()}, p.S, p.H, p.stride};
  topk.select(sv, {{per_head.idx.data(), per_head.idx.size()}, {per_head.cnt.data(), per_head.cnt.size()}, p.S, p.H, 2048});
  for (int s = 0; s < p.S; ++s) {
    double mp = 0, mt = 0;
    int np = 0, nt = 0;
    for (int h = 0; h < p.H; ++h) {
      const std::size_t row = static_cast<std::size_t>(s) * p.H + h;
      const float* r = &p.scores[row * p.stride];
      for (int i = 0; i < pooled.cnt[row]; ++i) mp += r[pooled.idx[row * 2048 + static_cast<std::size_t>(i)]];
      for (int i = 0; i < per_head.cnt[row]; ++i) mt += r[per_head.idx[row * 2048 + static_cast<std::size_t>(i)]];
      np += pooled.cnt[row], nt += per_head.cnt[row];
    }
    INFO("sequence " << s << ": pooled mass " << mp << ", per-head " << mt);
    REQUIRE(np == nt);
    REQUIRE(mp > mt);  // strictly: the heads' sharpness differs
  }
}

TEST_CASE("pooled top-k with one head is top-k", "[select][pooled]") {
  std::mt19937 rng(3204);
  problem p;
  p.S = 2, p.H = 1, p.stride = 500;
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int i = 0; i < p.S * p.stride; ++i) p.scores.push_back(nd(rng));
  p.lens = {500, 77};
  for (pooled_scale sc : {pooled_scale::logit, pooled_scale::mass}) {
    const pooled_topk_selector_host::config c{{.num_seqs = p.S, .num_kv_heads = 1,
                                               .max_tokens = p.stride}, 200, 90, {4, 16}, sc};
    const result a = run(p, c);
    const kvscout::topk_selector_host::config tc{{.num_seqs = p.S, .num_kv_heads = 1,
                                                  .max_tokens = p.stride}, 200, 90, {4, 16}};
    auto tws = kvscout::make_workspace<kvscout::topk_selector_host>(tc);
    kvscout::topk_selector_host topk(tc, tws.span());
    result b;
    b.idx.assign(a.idx.size(), -7);
    b.cnt.assign(a.cnt.size(), -7);
    const kvscout::score_view<kvscout::host_space> sv{{p.scores.data(), p.scores.size()}, {p.lens.data(), p.lens.size()}, p.S, 1, p.stride};
    topk.select(sv, {{b.idx.data(), b.idx.size()}, {b.cnt.data(), b.cnt.size()}, p.S, 1, 200});
    REQUIRE(a.cnt == b.cnt);
    REQUIRE(a.idx == b.idx);
  }
}

TEST_CASE("pooled top-k refuses bad configurations and views by name", "[select][pooled]") {
  using cfg = pooled_topk_selector_host::config;
  REQUIRE_THROWS_WITH(pooled_topk_selector_host::workspace_bytes(cfg{{.num_seqs = 1,
                                                                     .num_kv_heads = 2,
                                                                     .max_tokens = 100}, 50, 60, {},
                                                                     pooled_scale::logit}),
                      Catch::Contains("budget 60 is larger than the destination capacity 50"));
  REQUIRE_THROWS_WITH(pooled_topk_selector_host::workspace_bytes(cfg{{.num_seqs = 1,
                                                                     .num_kv_heads = 2,
                                                                     .max_tokens = 100}, 50, 10,
                                                                     {8, 8}, pooled_scale::logit}),
                      Catch::Contains("smaller than the keep-set"));
  REQUIRE_THROWS_WITH(pooled_topk_selector_host::workspace_bytes(cfg{{.num_seqs = 1,
                                                                     .num_kv_heads = 2,
                                                                     .max_tokens = 100}, 50, 10, {},
                                                                     static_cast<pooled_scale>(7)}),
                      Catch::Contains("scale = pooled_scale(7)"));
  REQUIRE_THROWS_WITH(pooled_topk_selector_host::workspace_bytes(
                          cfg{{.num_seqs = 1, .num_kv_heads = 2, .max_tokens = 100}, 50, 10, {},
                              pooled_scale::logit, static_cast<kvscout::pooled_rule>(5)}),
                      Catch::Contains("rule = pooled_rule(5)"));
  const cfg c{{.num_seqs = 1, .num_kv_heads = 2, .max_tokens = 100}, 50, 10, {},
              pooled_scale::logit};
  std::vector<std::byte> small(64);
  REQUIRE_THROWS_WITH(pooled_topk_selector_host(c, {small.data(), small.size()}),
                      Catch::Contains("expected at least workspace_bytes(config)"));
  auto ws = kvscout::make_workspace<pooled_topk_selector_host>(c);
  pooled_topk_selector_host sel(c, ws.span());
  std::vector<float> sc(200, 1.f);
  std::vector<std::int32_t> idx(100, -7), cnt(2, -7), lens{101};
  REQUIRE_THROWS_WITH(sel.select({{sc.data(), sc.size()}, {lens.data(), 1}, 1, 2, 100}, {{idx.data(), idx.size()}, {cnt.data(), 2}, 1, 2, 50}),
                      Catch::Contains("seq_lens[0] = 101 is outside [0, max_tokens = 100]"));
  REQUIRE(cnt == std::vector<std::int32_t>{-7, -7});  // nothing written
}

namespace {
// Head h's probabilities as the coverage rule defines them (the softmax of logits; mass over its
// sum), in double.
std::vector<double> head_probs(const float* r, int len, pooled_scale sc) {
  std::vector<double> q(static_cast<std::size_t>(len), 0.0);
  if (sc == pooled_scale::mass) {
    double z = 0;
    for (int t = 0; t < len; ++t) z += r[t] > 0 && std::isfinite(r[t]) ? r[t] : 0.0;
    for (int t = 0; t < len; ++t) q[static_cast<std::size_t>(t)] = r[t] > 0 && std::isfinite(r[t]) && z > 0 ? r[t] / z : 0.0;
    return q;
  }
  double m = -INFINITY, z = 0;
  for (int t = 0; t < len; ++t) m = std::max(m, static_cast<double>(r[t]));
  for (int t = 0; t < len; ++t) z += std::exp(r[t] - m);
  for (int t = 0; t < len; ++t) q[static_cast<std::size_t>(t)] = std::exp(r[t] - m) / z;
  return q;
}
}  // namespace

TEST_CASE("pooled coverage rule reaches the best common coverage (brute force over allocations)", "[select][pooled]") {
  std::mt19937 rng(3205);
  int spread_checks = 0;
  for (int trial = 0; trial < 150; ++trial) {
    problem p;
    p.S = 1;
    p.H = 2 + static_cast<int>(rng() % 2);
    p.stride = 14;
    const int len = 10 + static_cast<int>(rng() % 5);
    p.lens = {len};
    const pooled_scale sc = trial % 2 ? pooled_scale::logit : pooled_scale::mass;
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int h = 0; h < p.H; ++h)
      for (int t = 0; t < p.stride; ++t) {
        const float temp = 0.3f + 1.5f * static_cast<float>(rng() % 4);
        const float x = temp * nd(rng);
        p.scores.push_back(sc == pooled_scale::mass ? std::exp(x) : x);
      }
    pooled_topk_selector_host::config c;
    c.shape.num_seqs = 1, c.shape.num_kv_heads = p.H, c.shape.max_tokens = p.stride;
    c.keep = {static_cast<int>(rng() % 2), static_cast<int>(rng() % 2)};
    c.budget = c.keep.sinks + c.keep.recent + 1 + static_cast<int>(rng() % 5);
    c.capacity = c.budget + static_cast<int>(rng() % 4);
    c.scale = sc;
    c.rule = kvscout::pooled_rule::coverage;
    INFO("trial " << trial);
    const result r = run(p, c);
    if (len <= c.budget) continue;
    const int head_end = std::min(c.keep.sinks, len), tail_begin = std::max(head_end, len - c.keep.recent);
    const int keep = head_end + (len - tail_begin);
    // Per head: the keep-set's probability, and the candidates' probabilities sorted descending.
    std::vector<double> kept(static_cast<std::size_t>(p.H));
    std::vector<std::vector<double>> sorted(static_cast<std::size_t>(p.H));
    for (int h = 0; h < p.H; ++h) {
      const auto q = head_probs(&p.scores[static_cast<std::size_t>(h) * p.stride], len, sc);
      auto& hs = sorted[static_cast<std::size_t>(h)];
      for (int t = 0; t < len; ++t) {
        const double x = q[static_cast<std::size_t>(t)];
        if (t < head_end || t >= tail_begin)
          kept[static_cast<std::size_t>(h)] += x;
        else
          hs.push_back(x);
      }
      std::sort(sorted[static_cast<std::size_t>(h)].rbegin(), sorted[static_cast<std::size_t>(h)].rend());
    }
    const auto cov = [&](int h, int j) {
      double a = kept[static_cast<std::size_t>(h)];
      for (int i = 0; i < j; ++i) a += sorted[static_cast<std::size_t>(h)][static_cast<std::size_t>(i)];
      return a;
    };
    const int want = p.H * (c.budget - keep);
    const int cap = std::min(c.capacity - keep, len - keep);
    // Every allocation of want rows (each head at most cap): the best smallest coverage.
    double best = -1;
    std::vector<int> a(static_cast<std::size_t>(p.H), 0);
    for (;;) {
      int sum = 0;
      for (int x : a) sum += x;
      if (sum == std::min(want, p.H * cap)) {
        double mn = 1e9;
        for (int h = 0; h < p.H; ++h) mn = std::min(mn, cov(h, a[static_cast<std::size_t>(h)]));
        best = std::max(best, mn);
      }
      int h = 0;
      while (h < p.H && ++a[static_cast<std::size_t>(h)] > cap) a[static_cast<std::size_t>(h++)] = 0;
      if (h == p.H) break;
    }
    double got = 1e9;
    int total = 0;
    for (int h = 0; h < p.H; ++h) {
      const int n = r.cnt[static_cast<std::size_t>(h)];
      total += n;
      got = std::min(got, cov(h, n - keep));
      // Within the head: its best rows by score (top-k's rule at its count).
      std::vector<std::pair<float, int>> byscore;
      for (int t = head_end; t < tail_begin; ++t) byscore.emplace_back(-p.scores[static_cast<std::size_t>(h) * p.stride + t], t);
      std::sort(byscore.begin(), byscore.end());
      std::vector<std::int32_t> expect;
      for (int t = 0; t < head_end; ++t) expect.push_back(t);
      for (int t = tail_begin; t < len; ++t) expect.push_back(t);
      for (int i = 0; i < n - keep; ++i) expect.push_back(byscore[static_cast<std::size_t>(i)].second);
      std::sort(expect.begin(), expect.end());
      REQUIRE(std::vector<std::int32_t>(r.idx.begin() + static_cast<std::ptrdiff_t>(h) * c.capacity,
                                        r.idx.begin() + static_cast<std::ptrdiff_t>(h) * c.capacity + n) == expect);
    }
    REQUIRE(total == keep * p.H + std::min(want, p.H * cap));
    REQUIRE(got == Approx(best).epsilon(1e-5));
    ++spread_checks;
  }
  REQUIRE(spread_checks > 100);
}
