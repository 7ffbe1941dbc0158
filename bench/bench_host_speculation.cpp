// InfiniGen speculation on the host: partial-query GEMV + scoring of n cached tokens against the
// partial key cache, compared with one streaming read of the same partial-key bytes.
//
// Shape: SmolLM2-135M (the real model of the accuracy harness): d_model 576, 9 query heads,
// 3 KV heads, head_dim 64, r = 16 partial channels, one sequence (or a batch of 8), n in
// {4k, 32k, 128k} tokens.
// Modes: 0 = post_rope_skew (full head projection, RoPE, then A_S), 1 = rope_planes (r rows of
// W_Q, RoPE on the planes). bytes_per_second counts the partial-key bytes read per step, so the
// benchmarks' rates compare directly (scripts/bench_table.py prints the ratios).
//
//   BM_speculation          the policy's score(): partial-query GEMV + scoring, max_logit
//   BM_speculation_bf16_weights  the same with the partial W_Q rows kept in bfloat16
//                           (infinigen_policy_host<float, bfloat16>): half the bytes the GEMV reads
//   BM_speculation_mean     the same, RoPE planes, mean_logit (the group folded into one query)
//   BM_stream_partial_keys  one vectorised read of the same bytes, with a software prefetch
//                           0 / 4 / 8 / 16 KiB ahead (the table takes the fastest: the anchor)
//   BM_stream_speculation_bytes  one read of every byte score() must read: the partial W_Q rows
//                           the mode's GEMV reads (float; a buffer of their size) and then the
//                           partial keys. BM_speculation against it: how close speculation runs
//                           to the rate of a read of its own bytes; BM_stream_partial_keys
//                           against it: the most the key-only ratio above can be, were every
//                           byte read at the stream's rate (at 4k, post-RoPE reads 1.7x the key
//                           bytes in weights)
//   BM_fma_roof             scoring's multiply-adds alone, operands in registers: the compute
//                           bound, which at 4k (L2-resident keys) lies below the stream
//   BM_speculation_batch    score() of a batch of 8 sequences of 4k tokens in one call (each
//                           head's weights brought in once for the batch), both modes
//   BM_speculation_batch_scattered  the same batch as continuous batching scores it: 8 of 16
//                           held sequences, named by score_context::seq_ids (every other one)
//   BM_stream_batch         its anchor: one read of the batch's partial keys, 0 / 16 KiB ahead
//   BM_speculation_decode_order  score() of 30 layers in turn at 4k tokens, as a decode step
//                           runs them (each layer's bytes evicted from L2 by the others)
//   BM_stream_decode_order  its anchor: the 30 layers' partial keys read in turn
//   BM_rope_table_fill      a step's RoPE table alone (reference: its share of the 4k step)
//   BM_speculation_keys     score() by partial-key format at r = 16, 32 and 64 channels: float,
//                           half, quantized_keys<4> and quantized_keys<2> (issue 32: 64 channels
//                           at 4 or 2 bits against 32 fp16 ones), RoPE planes, max_logit;
//                           bytes_per_second counts each format's own bytes (bytes_for)
//   BM_speculation_aggregation score() with max_logit against sum_prob (the correction's
//                           ranking in kvscout_default), half keys, r = 32, RoPE planes
//   BM_correction_step      the correction step (issue 32) of one layer, on the critical path:
//                           score_query (the layer's own query against the same partial keys)
//                           and correction_selector_host over a speculated 5 % (the best 5 %
//                           of the rest added); anchor: BM_speculation at the
//                           same n and mode (the step that runs ahead, off the critical path)

#include <benchmark/benchmark.h>

#include <algorithm>

#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "kvscout/cache/partial_key_cache.hpp"
#include "kvscout/core/config.hpp"
#include "kvscout/core/simd.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/select/correction.hpp"
#include "kvscout/select/topk.hpp"
#include "kvscout/score/infinigen.hpp"

namespace {

constexpr int d_model = 576, Hq = 9, H = 3, D = 64, r = 16;
static_assert(H * (r / 2) <= D / 2, "make_plan gives the kv heads disjoint RoPE planes");

kvscout::skew_plan make_plan(kvscout::rope_mode mode, int kv_head, int rr = r) {
  // A valid plan for timing: identity skew, channels 0..rr-1; for rope_planes, kv head h keeps
  // planes [h * rr/2, (h + 1) * rr/2): disjoint at rr = r, so a step rotates 24 of the 32 planes
  // (calibrated heads share some planes; this is the costlier case); for a larger rr, as far
  // apart as the 32 planes allow.
  const kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  if (mode == kvscout::rope_mode::rope_planes) {
    std::vector<int> planes(static_cast<std::size_t>(rr / 2));
    std::iota(planes.begin(), planes.end(), kv_head * (rr / 2) % (D / 2 - rr / 2 + 1));
    return kvscout::rope_planes_plan(rope, std::move(planes));
  }
  kvscout::skew_plan p;
  p.mode = mode;
  p.head_dim = D;
  p.r = rr;
  p.rope = rope;
  p.A.assign(static_cast<std::size_t>(D) * D, 0.f);
  for (int i = 0; i < D; ++i) p.A[static_cast<std::size_t>(i) * D + i] = 1.f;
  p.channels.resize(static_cast<std::size_t>(rr));
  std::iota(p.channels.begin(), p.channels.end(), 0);
  return p;
}

template <class WT = float, class PkT = float>
struct fixture {
  std::vector<float> wq, x, scores;
  std::vector<int32_t> lens, pos, seq_ids;
  std::unique_ptr<kvscout::policy_layers<kvscout::infinigen_policy_host<PkT, WT>>> policy;
  int n, seqs, layers, held;

  // `held` > num_seqs: the policy holds `held` sequences and the step scores num_seqs of them,
  // named by seq_ids (continuous batching): every other one, from the last down.
  fixture(int tokens, kvscout::rope_mode mode,
          kvscout::gqa_aggregation agg = kvscout::gqa_aggregation::max_logit, int num_seqs = 1,
          int num_layers = 1, int num_held = 0, int rr = r)
      : n(tokens), seqs(num_seqs), layers(num_layers), held(std::max(num_seqs, num_held)) {
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.f, 1.f);
    wq.resize(static_cast<std::size_t>(Hq) * D * d_model);
    for (auto& w : wq) w = nd(rng) * 0.04f;
    x.resize(static_cast<std::size_t>(seqs) * d_model);
    for (auto& v : x) v = nd(rng);
    std::vector<kvscout::skew_plan> plans;
    for (int h = 0; h < H; ++h) plans.push_back(make_plan(mode, h, rr));
    // Every layer builds its own partial weights and keys (its own memory) from the same W_Q.
    const auto L = static_cast<std::size_t>(layers);
    kvscout::infinigen_config cfg{.shape = {.num_layers = layers, .num_seqs = held,
                                   .num_kv_heads = H, .num_q_heads = Hq, .head_dim = D,
                                   .d_model = d_model, .max_tokens = n, .scale = 0.125f},
                                  .aggregation = agg};
    policy = std::make_unique<kvscout::policy_layers<kvscout::infinigen_policy_host<PkT, WT>>>(
        kvscout::infinigen_policy_host<PkT, WT>::layers(
            cfg, std::vector<std::vector<kvscout::skew_plan>>(L, plans),
            std::vector<kvscout::host_span<const float>>(L, {wq.data(), wq.size()}),
            std::vector<kvscout::host_span<const float>>(L, kvscout::host_span<const float>{})));
    std::vector<float> k(static_cast<std::size_t>(H) * D);
    for (int l = 0; l < layers; ++l)
      for (int s = 0; s < held; ++s)
        for (int t = 0; t < n; ++t) {
          for (auto& v : k) v = nd(rng);
          policy->append(l, s, t, k.data(), k.data());
        }
    scores.assign(static_cast<std::size_t>(seqs) * H * n, 0.f);
    lens.assign(static_cast<std::size_t>(seqs), n);
    pos.resize(static_cast<std::size_t>(seqs));
    for (int s = 0; s < seqs; ++s) pos[static_cast<std::size_t>(s)] = n + 17 * s;
    if (held > seqs)
      for (int s = 0; s < seqs; ++s) seq_ids.push_back(held - 1 - 2 * s);
  }
  // The partial-key bytes a step scores: the scored sequences' (not every held one's).
  std::size_t key_bytes() const { return (*policy)[0].keys().bytes_for(n) / held * seqs; }
};

// The benchmarks' mode argument: 0 = post_rope_skew, 1 = rope_planes.
kvscout::rope_mode mode_arg(std::int64_t a) {
  return a == 0 ? kvscout::rope_mode::post_rope_skew : kvscout::rope_mode::rope_planes;
}

// score() of every layer in turn, `layers` of them (each its own weights and keys): one decode
// step's speculation. Time and bytes are for all the layers.
template <class WT = float, class PkT = float>
void run_speculation(benchmark::State& state, kvscout::rope_mode mode, kvscout::gqa_aggregation agg,
                     int seqs = 1, int layers = 1, int held = 0, int rr = r) {
  fixture<WT, PkT> f(static_cast<int>(state.range(0)), mode, agg, seqs, layers, held, rr);
  const auto S = static_cast<std::size_t>(seqs);
  const kvscout::score_context<kvscout::host_space> ctx{{f.x.data(), f.x.size()}, {}, {f.pos.data(), S},
                                  {f.lens.data(), S}, {f.seq_ids.data(), f.seq_ids.size()}};
  const kvscout::score_buffer<kvscout::host_space> out{{f.scores.data(), f.scores.size()}, seqs, H, f.n};
  for (auto _ : state)
    for (int l = 0; l < layers; ++l) {
      f.policy->score(l, ctx, out);
      benchmark::DoNotOptimize(f.scores.data());
      benchmark::ClobberMemory();
    }
  state.SetBytesProcessed(
      static_cast<std::int64_t>(state.iterations() * layers * f.key_bytes()));
  state.counters["tokens"] = f.n;
  state.counters["seqs"] = seqs;
  state.counters["layers"] = layers;
}

void BM_speculation(benchmark::State& state) {
  const auto mode = mode_arg(state.range(1));
  run_speculation(state, mode, kvscout::gqa_aggregation::max_logit);
}

void BM_speculation_bf16_weights(benchmark::State& state) {
  const auto mode = mode_arg(state.range(1));
  run_speculation<kvscout::bfloat16>(state, mode, kvscout::gqa_aggregation::max_logit);
}

// score() with the partial keys in each format (argument `format`: 0 float, 1 half,
// 2 quantized_keys<4>, 3 quantized_keys<2>) and `r` channels, RoPE planes, max_logit: the
// question of issue 32 is 64 channels at 4 or 2 bits against 32 in half.
void BM_speculation_keys(benchmark::State& state) {
  const auto mode = kvscout::rope_mode::rope_planes;
  const auto agg = kvscout::gqa_aggregation::max_logit;
  const int rr = static_cast<int>(state.range(2));
  switch (state.range(1)) {
    case 0: run_speculation<float, float>(state, mode, agg, 1, 1, 0, rr); break;
    case 1: run_speculation<float, kvscout::half>(state, mode, agg, 1, 1, 0, rr); break;
    case 2: run_speculation<float, kvscout::quantized_keys<4>>(state, mode, agg, 1, 1, 0, rr); break;
    default: run_speculation<float, kvscout::quantized_keys<2>>(state, mode, agg, 1, 1, 0, rr); break;
  }
  state.counters["r"] = rr;
}

// score() by GQA aggregation at the default's shape (half partial keys, r = 32, RoPE planes):
// max_logit (the speculation's) against sum_prob (kvscout_default's correction ranking), in one run.
void BM_speculation_aggregation(benchmark::State& state) {
  const auto agg = state.range(1) == 0 ? kvscout::gqa_aggregation::max_logit : kvscout::gqa_aggregation::sum_prob;
  run_speculation<float, kvscout::half>(state, kvscout::rope_mode::rope_planes, agg, 1, 1, 0, 32);
}

// A batch of `seqs` sequences of n tokens each in one score() call, as a decode step of a batched
// engine runs it: each head's weights come from memory once per 8 sequences (infinigen_policy_host's
// query block), the partial keys of every sequence once. Its anchor, BM_stream_batch, reads the
// same seqs x n tokens of partial keys.
void BM_speculation_batch(benchmark::State& state) {
  const auto mode = mode_arg(state.range(2));
  run_speculation(state, mode, kvscout::gqa_aggregation::max_logit,
                  static_cast<int>(state.range(1)));
}

// BM_speculation_batch as continuous batching runs it: the policy holds 2 x seqs sequences and
// the step scores seqs of them, named by score_context::seq_ids (every other one, last first). The
// same bytes as BM_speculation_batch, from scattered sequences.
void BM_speculation_batch_scattered(benchmark::State& state) {
  const auto mode = mode_arg(state.range(2));
  const int seqs = static_cast<int>(state.range(1));
  run_speculation(state, mode, kvscout::gqa_aggregation::max_logit, seqs, 1, 2 * seqs);
}

// The same with mean_logit, RoPE planes: the group is folded into its mean partial query, one
// multiply-add chain per tile instead of g = 3.
void BM_speculation_mean(benchmark::State& state) {
  run_speculation(state, kvscout::rope_mode::rope_planes, kvscout::gqa_aggregation::mean_logit);
}

// A decode step's speculation in the order a model runs it: score() of each of SmolLM2-135M's 30
// layers in turn, every layer with its own partial weights and keys. Between two visits of a
// layer the other 29 have passed through the caches, so its bytes come from L3 or memory, not
// from L2 as in BM_speculation (30 x 1.1 MB at 4k tokens; this machine's L2 is 2 MiB per core).
// Time and bytes are for the whole step; BM_stream_decode_order is its anchor (each layer's partial
// keys read in turn). Arguments: n, mode, and bf16 (1: the partial W_Q rows in bfloat16).
constexpr int decode_layers = 30;

void BM_speculation_decode_order(benchmark::State& state) {
  const auto mode = mode_arg(state.range(1));
  const auto agg = kvscout::gqa_aggregation::max_logit;
  if (state.range(2) == 0) {
    run_speculation<float>(state, mode, agg, 1, decode_layers);
  } else {
    run_speculation<kvscout::bfloat16>(state, mode, agg, 1, decode_layers);
  }
}

// One pass over the partial keys: four independent 16-wide sums (64 bytes each), so the read, not
// the adds, sets the pace; with a software prefetch `ahead` bytes ahead of the read where ahead > 0
// (from memory the hardware prefetchers alone leave bandwidth unused; the scoring loop prefetches
// too, so the anchor is given the same help: the table takes the fastest distance).
// Vectors of the target's register width (host_float_lanes), four lines a step, one prefetch per
// line: wider generic vectors in an array go through the stack on narrower targets.
template <bool Prefetch>
void stream_once(const float* p, std::size_t count, std::size_t ahead) {
  constexpr int N = kvscout::detail::host_float_lanes, L = 16 / N;
  using vec = kvscout::detail::host_vec;
  vec acc[4 * L] = {};
  for (std::size_t i = 0; i + 64 <= count; i += 64) {
    KVSCOUT_HOST_UNROLL
    for (int j = 0; j < 4; ++j) {
      if constexpr (Prefetch) __builtin_prefetch(p + i + 16 * j + ahead);
      KVSCOUT_HOST_UNROLL
      for (int l = 0; l < L; ++l) {
        vec v;
        std::memcpy(&v, p + i + 16 * j + N * l, sizeof v);
        acc[j * L + l] += v;
      }
    }
  }
  // Only the sum escapes, after the loop: with the array itself handed to DoNotOptimize, GCC
  // stored every accumulator on every step (-O3), and with the loops rolled (-O2) it kept them in
  // memory; either way a store per vector read, which on a core with one store a cycle (Zen 1)
  // bounded the "read" below the loads' own rate.
  vec sum = acc[0];
  for (int k = 1; k < 4 * L; ++k) sum += acc[k];
  benchmark::DoNotOptimize(sum);
}

// Each layer's partial keys in turn: the seqs x H rows of n tokens, contiguous per layer.
void stream_keys(benchmark::State& state, int seqs, std::size_t ahead_bytes, int layers = 1) {
  const auto ahead = ahead_bytes / sizeof(float);
  fixture<> f(static_cast<int>(state.range(0)), kvscout::rope_mode::post_rope_skew,
              kvscout::gqa_aggregation::max_logit, seqs, layers);
  const std::size_t count = f.key_bytes() / sizeof(float);
  for (auto _ : state)
    for (int l = 0; l < layers; ++l) {
      const float* p = (*f.policy)[l].keys().tile(0, 0, 0);
      if (ahead > 0) {
        stream_once<true>(p, count, ahead);
      } else {
        stream_once<false>(p, count, 0);
      }
    }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * layers * f.key_bytes()));
  state.counters["layers"] = layers;
}

void BM_stream_partial_keys(benchmark::State& state) {
  stream_keys(state, 1, static_cast<std::size_t>(state.range(1)));
}

// The weights the mode's GEMV reads (post-RoPE: every head's full projection, Hq * D rows; RoPE
// planes: Hq * r rows; d_model floats each), from a buffer of their size, then the partial keys,
// with a software prefetch `ahead` bytes ahead where ahead > 0 (as BM_stream_partial_keys: the
// table takes the fastest). Its bytes_per_second counts the partial-key bytes, like
// BM_speculation's, so the rates compare.
void BM_stream_speculation_bytes(benchmark::State& state) {
  const auto mode = mode_arg(state.range(1));
  fixture<> f(static_cast<int>(state.range(0)), mode, kvscout::gqa_aggregation::max_logit);
  const std::size_t rows_read =
      static_cast<std::size_t>(Hq) * (mode == kvscout::rope_mode::post_rope_skew ? D : r);
  std::vector<float> weights(rows_read * d_model);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& w : weights) w = nd(rng);
  const std::size_t count = f.key_bytes() / sizeof(float);
  const std::size_t ahead = static_cast<std::size_t>(state.range(2)) / sizeof(float);
  const float* keys = (*f.policy)[0].keys().tile(0, 0, 0);
  for (auto _ : state) {
    if (ahead > 0) {
      stream_once<true>(weights.data(), weights.size(), ahead);
      stream_once<true>(keys, count, ahead);
    } else {
      stream_once<false>(weights.data(), weights.size(), 0);
      stream_once<false>(keys, count, 0);
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * f.key_bytes()));
  state.counters["weight_bytes"] = static_cast<double>(weights.size() * sizeof(float));
  state.counters["key_bytes"] = static_cast<double>(f.key_bytes());
}

void BM_stream_batch(benchmark::State& state) {
  stream_keys(state, static_cast<int>(state.range(1)), static_cast<std::size_t>(state.range(2)));
}

// BM_speculation_decode_order's anchor: the 30 layers' partial keys read in the same order.
void BM_stream_decode_order(benchmark::State& state) {
  stream_keys(state, 1, static_cast<std::size_t>(state.range(1)), decode_layers);
}

// A RoPE table of head_dim 64 filled for one position (advancing), every plane with its
// inverse frequency computed in the fill (planes 32, from_config 1), every plane from
// frequencies computed beforehand (32, 0: what the policy does in post_rope_skew), or only 24 or
// 8 planes (what it does in rope_planes: the union of the kv heads' planes). For reference, no
// anchor: how much of a 4k step the table costs.
void BM_rope_table_fill(benchmark::State& state) {
  const kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  const kvscout::rope_frequencies freq(rope);
  const int planes = static_cast<int>(state.range(0));
  std::vector<int> only(static_cast<std::size_t>(planes));
  std::iota(only.begin(), only.end(), 0);
  kvscout::rope_table t;
  int pos = 4096;
  for (auto _ : state) {
    if (state.range(1) != 0) {
      t.fill(rope, pos);
    } else if (planes == D / 2) {
      t.fill(freq, pos);
    } else {
      t.fill(freq, pos, only.data(), planes);
    }
    benchmark::DoNotOptimize(t.cs);
    benchmark::ClobberMemory();
    ++pos;
  }
}

// The compute roof of scoring: exactly the multiply-adds that scoring does with max_logit (r * g
// per 16-token tile of every kv head, 16 lanes each, in vectors of the register width as scoring
// does), with every operand in registers and 12 independent accumulator registers, so only the
// multiply-add throughput limits it. Its
// bytes_per_second counts the same partial-key bytes: speculation / min(stream, roof) is how
// close speculation gets to what this core can do at all (the GEMV not counted in the roof).
void BM_fma_roof(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  using vec = kvscout::detail::host_vec;
  constexpr int tb = kvscout::partial_key_cache<float>::block_tokens;
  static_assert(tb == 16, "16 tokens per tile line");
  constexpr int L = tb / kvscout::detail::host_float_lanes;  // vectors per 16-lane multiply-add
  // One per 16-lane multiply-add of scoring, in L register-wide pieces.
  const long long fmas = static_cast<long long>(H) * ((n + tb - 1) / tb) * r * (Hq / H) * L;
  constexpr int chains = 12;
  const std::size_t key_bytes = static_cast<std::size_t>(H) * ((n + tb - 1) / tb) * r * tb * 4;
  vec acc[chains];
  vec k, q;
  for (int j = 0; j < kvscout::detail::host_float_lanes; ++j)
    k[j] = 1e-3f * static_cast<float>(j + 1), q[j] = 0.999f;
  for (auto _ : state) {
    for (auto& a : acc) a = vec{} + 1.f;
    benchmark::DoNotOptimize(k);
    benchmark::DoNotOptimize(q);
    // Unrolled: GCC leaves the 12-trip loop rolled and `acc` in memory otherwise, a store and
    // a reload per multiply-add (22.5 us at 4k on an AVX-512 core, a latency chain, not a roof).
    for (long long i = 0; i + chains <= fmas; i += chains)
      KVSCOUT_HOST_UNROLL for (int c = 0; c < chains; ++c) acc[c] = acc[c] * q + k;
    benchmark::DoNotOptimize(acc);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * key_bytes));
  state.counters["fmas"] = static_cast<double>(fmas);
}

void BM_correction_step(benchmark::State& state) {
  const auto mode = mode_arg(state.range(1));
  fixture<> f(static_cast<int>(state.range(0)), mode);
  const int n = f.n, spec = (n + 19) / 20, extra = (n + 9) / 10 - spec;
  // The layer's own query: random, of the model's shape; the speculated rows: the top 5 % of
  // score() (what the speculation fetched), so the correction sees a realistic overlap.
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(static_cast<std::size_t>(Hq) * D);
  for (auto& v : q) v = nd(rng);
  const kvscout::score_context<kvscout::host_space> ctx{{f.x.data(), f.x.size()}, {q.data(), q.size()}, {f.pos.data(), 1},
                                  {f.lens.data(), 1}};
  const kvscout::score_buffer<kvscout::host_space> out{{f.scores.data(), f.scores.size()}, 1, H, n};
  f.policy->score(0, ctx, out);
  const kvscout::topk_selector_host::config tc{{.num_seqs = 1, .num_kv_heads = H,
                                                .max_tokens = n},
                                               spec, spec, {4, 16}};
  auto tws = kvscout::make_workspace<kvscout::topk_selector_host>(tc);
  std::vector<int32_t> sidx(static_cast<std::size_t>(H) * spec), scnt(H), aidx(static_cast<std::size_t>(H) * extra), acnt(H);
  kvscout::topk_selector_host(tc, tws.span())
      .select(out.view({f.lens.data(), 1}), {{sidx.data(), sidx.size()}, {scnt.data(), scnt.size()}, 1, H, spec});
  const kvscout::correction_selector_host::config cc{{.num_seqs = 1, .num_kv_heads = H,
                                                      .max_tokens = n}, extra, extra};
  auto cws = kvscout::make_workspace<kvscout::correction_selector_host>(cc);
  kvscout::correction_selector_host corr(cc, cws.span());
  for (auto _ : state) {
    f.policy->score_query(0, ctx, out);
    corr.select(out.view({f.lens.data(), 1}), {{sidx.data(), sidx.size()}, {scnt.data(), scnt.size()}, 1, H, spec},
                {{aidx.data(), aidx.size()}, {acnt.data(), acnt.size()}, 1, H, extra});
    benchmark::DoNotOptimize(aidx.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * f.key_bytes()));
  state.counters["tokens"] = n;
  state.counters["added"] = static_cast<double>(acnt[0] + acnt[1] + acnt[2]);
}

}  // namespace

BENCHMARK(BM_correction_step)->ArgNames({"n", "mode"})->ArgsProduct({{4096, 32768, 131072}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_fma_roof)->ArgNames({"n"})->Args({4096})->Args({32768})->Args({131072})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_speculation_mean)->ArgNames({"n"})->Args({4096})->Args({32768})->Args({131072})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_speculation)->ArgNames({"n", "mode"})->ArgsProduct({{4096, 32768, 131072}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_speculation_keys)
    ->ArgNames({"n", "format", "r"})
    ->ArgsProduct({{4096, 32768, 131072}, {0, 1, 2, 3}, {16, 32, 64}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_speculation_aggregation)
    ->ArgNames({"n", "sum_prob"})
    ->ArgsProduct({{4096, 32768}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_speculation_bf16_weights)
    ->ArgNames({"n", "mode"})
    ->ArgsProduct({{4096, 32768, 131072}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_speculation_batch)
    ->ArgNames({"n", "seqs", "mode"})
    ->ArgsProduct({{4096}, {8}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_speculation_batch_scattered)
    ->ArgNames({"n", "seqs", "mode"})
    ->ArgsProduct({{4096}, {8}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_speculation_decode_order)
    ->ArgNames({"n", "mode", "bf16"})
    ->ArgsProduct({{4096}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_stream_decode_order)
    ->ArgNames({"n", "ahead"})
    ->ArgsProduct({{4096}, {0, 8192}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rope_table_fill)
    ->ArgNames({"planes", "from_config"})
    ->Args({32, 1})
    ->Args({32, 0})
    ->Args({24, 0})
    ->Args({8, 0})
    ->Unit(benchmark::kNanosecond);
BENCHMARK(BM_stream_batch)
    ->ArgNames({"n", "seqs", "ahead"})
    ->ArgsProduct({{4096}, {8}, {0, 16384}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_stream_speculation_bytes)
    ->ArgNames({"n", "mode", "ahead"})
    ->ArgsProduct({{4096, 32768, 131072}, {0, 1}, {0, 8192}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_stream_partial_keys)->ArgNames({"n", "ahead"})->ArgsProduct({{4096, 32768, 131072}, {0, 4096, 8192, 16384}})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
