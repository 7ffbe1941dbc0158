// Host selectors against their anchors, in the same run.
//
// Scores: 32 rows (1 sequence x 32 kv heads) of n tokens, n = 4096 / 32768 / 131072, seeded
// normal(0, 1), allocated and filled up front (0.5 / 4 / 16 MiB in all).
//
//   BM_topk_radix          topk_selector_host, budget k = n / 10, no keep-set
//   BM_topk_nth_element    per row: copy + std::nth_element + collect the same k indices in
//                          ascending order (ties to the lowest index, as the selector does)
//                          goal: radix >= 3x faster
//   BM_threshold           threshold_selector_host, per_head, alpha 5, budget n / 10 (on
//                          normal scores about 70 % of a row is within alpha of its max, so the
//                          cap binds and the best n / 10 are chosen)
//   BM_threshold_logits    the same selector on logit-like rows: the same normal scores times 4
//                          (attention logits of a trained model are peaked: alpha 5 then admits
//                          about 2 % of a row, InfiniGen's regime, and the cap does not bind)
//   BM_threshold_logits_row_max  BM_threshold_logits with each row's maximum handed to the
//                          selector (score_view::row_max, found before the timing), as
//                          infinigen_policy_host hands it on from scoring: one compaction per row,
//                          the hint checked against its candidates
//   BM_threshold_uncapped  the same logit-like rows with budget = n: the cap cannot bind, so
//                          the selector takes its exact path (a max pass, then one compaction
//                          against the final floor); for reference, no goal
//   BM_stream_pass         one streaming read of the logit rows: a sum per row with 16
//                          independent accumulators, which the compiler vectorises and keeps
//                          in registers (the read's own cost)
//                          goal: threshold <= 1.5x stream_pass
//   BM_stream_pass_scalar  BM_stream_pass's sum with one accumulator: bound by the add latency,
//                          not by the read; for reference only
//   BM_compare_pass        the logit rows counted against each row's floor (max - 5, found up
//                          front): one ordered compare per score, nothing written. Threshold
//                          selection compares every score at least once, so this is about
//                          the least it can cost on the core; for reference, no goal
//
//   BM_pooled_topk        pooled_topk_selector_host (select/pooled.hpp): the 32 rows are the
//                          KV heads of one sequence sharing 32 * n / 10 rows (capacity n), logit
//                          scale, mass rule, on the logit-like rows (spread 4); anchor
//                          BM_topk_radix_logits, per-head top-k on the same rows (no goal: the
//                          measure is its cost over per-head top-k)
//   BM_pooled_topk_coverage  the same with the coverage rule (a sort per head)
//
// Reported: items_per_second (scores) and bytes_per_second (score bytes read once).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "kvscout/core/config.hpp"
#include "kvscout/select/pooled.hpp"
#include "kvscout/select/threshold.hpp"
#include "kvscout/select/topk.hpp"

namespace {

constexpr int rows = 32;

struct scores {
  int n;
  std::vector<float> values;  // [rows, n]
  std::vector<std::int32_t> lens;
  scores(int tokens, float spread)
      : n(tokens), values(static_cast<std::size_t>(rows) * tokens), lens{tokens} {
    std::mt19937 rng(20240611u + static_cast<unsigned>(tokens));
    std::normal_distribution<float> normal(0.f, 1.f);
    for (float& v : values) v = spread * normal(rng);
  }
  kvscout::score_view<kvscout::host_space> view() const {
    return {{values.data(), values.size()}, {lens.data(), lens.size()}, 1, rows, n};
  }
  const float* row(int r) const { return values.data() + static_cast<std::size_t>(r) * n; }
};

const scores& scores_for(int n, float spread = 1.f) {
  static std::map<std::pair<int, float>, scores> cache;
  const auto key = std::make_pair(n, spread);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, scores(n, spread)).first;
  return it->second;
}

struct output {
  std::vector<std::int32_t> indices, counts;
  int capacity;
  explicit output(int cap)
      : indices(static_cast<std::size_t>(rows) * cap, -1), counts(rows, 0), capacity(cap) {}
  kvscout::selection_buffers<kvscout::host_space> buffers() {
    return {{indices.data(), indices.size()}, {counts.data(), counts.size()}, 1, rows, capacity};
  }
};

void set_processed(benchmark::State& state, int n) {
  const auto items = static_cast<std::int64_t>(state.iterations()) * rows * n;
  state.SetItemsProcessed(items);
  state.SetBytesProcessed(items * static_cast<std::int64_t>(sizeof(float)));
}

// with_row_max: the view carries each row's maximum (score_view::row_max), found up front.
template <class Selector>
void run_selector(benchmark::State& state, const typename Selector::config& cfg, int n,
                  float spread = 1.f, bool with_row_max = false) {
  const scores& s = scores_for(n, spread);
  output out(cfg.capacity);
  std::vector<std::byte> ws(Selector::workspace_bytes(cfg));
  Selector sel(cfg, {ws.data(), ws.size()});
  std::vector<float> top;
  for (int r = 0; with_row_max && r < rows; ++r)
    top.push_back(*std::max_element(s.row(r), s.row(r) + n));  // the rows hold no NaN
  auto view = s.view();
  view.row_max = {top.data(), top.size()};
  const auto bufs = out.buffers();
  for (auto _ : state) {
    sel.select(view, bufs);
    benchmark::DoNotOptimize(out.indices.data());
    benchmark::ClobberMemory();
  }
  set_processed(state, n);
  std::int64_t selected = 0;
  for (int c : out.counts) selected += c;
  state.counters["selected_per_row"] = static_cast<double>(selected) / rows;
}

void BM_topk_radix(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int k = n / 10;
  run_selector<kvscout::topk_selector_host>(state, {{.num_seqs = 1, .num_kv_heads = rows,
                                                    .max_tokens = n}, k, k, {}}, n);
}

void BM_topk_radix_logits(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int k = n / 10;
  run_selector<kvscout::topk_selector_host>(state, {{.num_seqs = 1, .num_kv_heads = rows,
                                                    .max_tokens = n}, k, k, {}}, n, 4.f);
}

void BM_pooled_topk(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int k = n / 10;
  run_selector<kvscout::pooled_topk_selector_host>(
      state, {{.num_seqs = 1, .num_kv_heads = rows, .max_tokens = n}, n, k, {},
              kvscout::pooled_scale::logit, kvscout::pooled_rule::mass}, n, 4.f);
}

void BM_pooled_topk_coverage(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int k = n / 10;
  run_selector<kvscout::pooled_topk_selector_host>(
      state, {{.num_seqs = 1, .num_kv_heads = rows, .max_tokens = n}, n, k, {},
              kvscout::pooled_scale::logit, kvscout::pooled_rule::coverage}, n, 4.f);
}

void BM_topk_nth_element(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int k = n / 10;
  const scores& s = scores_for(n);
  output out(k);
  std::vector<float> tmp(static_cast<std::size_t>(n));
  for (auto _ : state) {
    for (int r = 0; r < rows; ++r) {
      const float* p = s.row(r);
      std::copy(p, p + n, tmp.begin());
      std::nth_element(tmp.begin(), tmp.begin() + (k - 1), tmp.end(), std::greater<float>());
      const float kth = tmp[static_cast<std::size_t>(k - 1)];
      int ties = k;  // the k-th and the equal ones before it are ties; the larger ones are not
      for (int i = 0; i < k - 1; ++i)
        ties -= static_cast<int>(tmp[static_cast<std::size_t>(i)] > kth);
      std::int32_t* o = out.indices.data() + static_cast<std::size_t>(r) * k;
      int c = 0;
      for (int i = 0; i < n && c < k; ++i) {
        bool take = p[i] > kth;
        if (p[i] == kth) [[unlikely]] {  // the selector's emission does the same
          take = ties > 0;
          ties -= static_cast<int>(take);
        }
        o[c] = i;
        c += static_cast<int>(take);
      }
      out.counts[static_cast<std::size_t>(r)] = c;
    }
    benchmark::DoNotOptimize(out.indices.data());
    benchmark::ClobberMemory();
  }
  set_processed(state, n);
}

void BM_threshold(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int k = n / 10;
  run_selector<kvscout::threshold_selector_host>(
      state, {{.num_seqs = 1, .num_kv_heads = rows, .max_tokens = n}, k, 5.f, k,
              kvscout::threshold_rule::per_head, {}}, n);
}

void BM_threshold_logits(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int k = n / 10;
  run_selector<kvscout::threshold_selector_host>(
      state, {{.num_seqs = 1, .num_kv_heads = rows, .max_tokens = n}, k, 5.f, k,
              kvscout::threshold_rule::per_head, {}}, n, 4.f);
}

void BM_threshold_logits_row_max(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int k = n / 10;
  run_selector<kvscout::threshold_selector_host>(
      state, {{.num_seqs = 1, .num_kv_heads = rows, .max_tokens = n}, k, 5.f, k,
              kvscout::threshold_rule::per_head, {}}, n, 4.f, true);
}

// InfiniGen's own rule on the same logit rows: one count (the mean over the rows of how many
// scores lie within alpha of their row's maximum), then that many per row by exact top-k.
void BM_threshold_infinigen_logits(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int k = n / 10;
  run_selector<kvscout::threshold_selector_host>(
      state, {{.num_seqs = 1, .num_kv_heads = rows, .max_tokens = n}, k, 5.f, k,
              kvscout::threshold_rule::infinigen_mean, {}}, n, 4.f);
}

void BM_threshold_uncapped(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  run_selector<kvscout::threshold_selector_host>(
      state, {{.num_seqs = 1, .num_kv_heads = rows, .max_tokens = n}, n, 5.f, n,
              kvscout::threshold_rule::per_head, {}}, n, 4.f);
}

void BM_stream_pass(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const scores& s = scores_for(n, 4.f);  // the logit rows, the very bytes the target selects over
  constexpr int lanes = 16;
  for (auto _ : state) {
    for (int r = 0; r < rows; ++r) {
      const float* p = s.row(r);
      float acc[lanes] = {};
      int i = 0;
      for (; i + lanes <= n; i += lanes) {
        // Unrolled, so that the accumulators are registers: left a loop, GCC keeps acc in memory
        // and the pass is bound by store-to-load forwarding, not by the read (about 3x slower
        // on an AVX2 Zen 1 core).
        KVSCOUT_HOST_UNROLL
        for (int j = 0; j < lanes; ++j) acc[j] += p[i + j];
      }
      for (; i < n; ++i) acc[0] += p[i];
      float sum = 0.f;
      for (float a : acc) sum += a;
      benchmark::DoNotOptimize(sum);
    }
  }
  set_processed(state, n);
}

// The least a threshold pass that compares every score once can cost: the logit rows' scores
// counted against each row's floor (its maximum - 5, found before the timing), an ordered
// compare and a vector count per 8 or 16 scores, nothing written (detail::count_at_least).
void BM_compare_pass(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const scores& s = scores_for(n, 4.f);
  std::vector<float> floors(rows);
  for (int r = 0; r < rows; ++r)
    floors[static_cast<std::size_t>(r)] =
        kvscout::detail::threshold_floor(kvscout::detail::max_of(s.row(r), n, -INFINITY), 5.f);
  std::int64_t counted = 0;
  for (auto _ : state) {
    for (int r = 0; r < rows; ++r) {
      int c = kvscout::detail::count_at_least(s.row(r), n, floors[static_cast<std::size_t>(r)]);
      benchmark::DoNotOptimize(c);
      counted += c;
    }
  }
  set_processed(state, n);
  state.counters["counted_per_row"] =
      static_cast<double>(counted) / static_cast<double>(state.iterations()) / rows;
}

void BM_stream_pass_scalar(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const scores& s = scores_for(n);
  for (auto _ : state) {
    for (int r = 0; r < rows; ++r) {
      const float* p = s.row(r);
      float sum = 0.f;
      for (int i = 0; i < n; ++i) sum += p[i];
      benchmark::DoNotOptimize(sum);
    }
  }
  set_processed(state, n);
}

}  // namespace

#define KVSCOUT_SELECT_BENCH(fn) \
  BENCHMARK(fn)->ArgNames({"n"})->Arg(4096)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond)

KVSCOUT_SELECT_BENCH(BM_topk_radix);
KVSCOUT_SELECT_BENCH(BM_topk_nth_element);
KVSCOUT_SELECT_BENCH(BM_topk_radix_logits);
KVSCOUT_SELECT_BENCH(BM_pooled_topk);
KVSCOUT_SELECT_BENCH(BM_pooled_topk_coverage);
KVSCOUT_SELECT_BENCH(BM_threshold);
KVSCOUT_SELECT_BENCH(BM_threshold_logits);
KVSCOUT_SELECT_BENCH(BM_threshold_logits_row_max);
KVSCOUT_SELECT_BENCH(BM_threshold_infinigen_logits);
KVSCOUT_SELECT_BENCH(BM_threshold_uncapped);
KVSCOUT_SELECT_BENCH(BM_stream_pass);
KVSCOUT_SELECT_BENCH(BM_compare_pass);
KVSCOUT_SELECT_BENCH(BM_stream_pass_scalar);

BENCHMARK_MAIN();
