// score/ on the device: infinigen_policy_cuda against infinigen_policy_host, on seeded
// random plans, weights, keys and inputs (never zeros), for every rope mode, every GQA
// aggregation, fp16 and float partial keys, head_dim 64 and 128, group sizes 1, 3 and 12 (the
// generic kernels), 4 and 8, several sequences of different lengths (0, 1, a partial tile, several blocks)
// and one 128k-token row.
//
// Checked, every element:
//   partial keys   device cache vs host partial_key_cache: equal up to one unit in the last place
//                  of the element type (skew_dot is the same function; the device does not
//                  contract to FMA, so the bits are expected equal)
//   partial query  device vs host partial_query (* scale): |d - h| <= 1e-5 * (1 + sum |w x|)
//                  (the GEMV sums in another order)
//   scores         device vs host policy: max/mean logits within 1e-5 * (1 + b) (+ 1e-3 * b for
//                  fp16 keys, one rounding of a key), b = scale * sum_c |q_c| |pk_c| the largest
//                  over the group; sum_prob relative 4 * (logit tolerance of the row) + 1e-4
//   untouched      scores past each length keep their poison (NaN bits)
// Bad setup and call arguments throw kvscout::error naming the value.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpu_harness.cuh"
#include "../host/random_orthogonal.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/core/device_status.hpp"
#include "kvscout/core/configured.hpp"
#include "kvscout/score/infinigen.cuh"
#include "kvscout/score/infinigen.hpp"

namespace {

using kvscout::gqa_aggregation;
using kvscout::rope_mode;

static_assert(kvscout::configured<kvscout::infinigen_policy_cuda<float>>);

struct shape {
  int H, g, D, r, d_model;
  rope_mode mode;
  kvscout::rope_style style;
  gqa_aggregation agg;
  std::vector<int> lens;
  bool bias = true;
};

using kvtest::random_orthogonal;  // tests/host/random_orthogonal.hpp

kvscout::skew_plan random_plan(const shape& sh, std::mt19937& rng) {
  kvscout::skew_plan p;
  p.mode = sh.mode;
  p.head_dim = sh.D;
  p.r = sh.r;
  p.rope = {sh.D, 10000.f, sh.style};
  if (sh.mode == rope_mode::rope_planes) {
    std::vector<int> all(sh.D / 2);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(sh.r / 2);
    std::sort(all.begin(), all.end());
    return kvscout::rope_planes_plan(p.rope, std::move(all));
  } else {
    p.A = random_orthogonal(sh.D, rng);
    std::vector<int> all(sh.D);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    p.channels.assign(all.begin(), all.begin() + sh.r);
    std::sort(p.channels.begin(), p.channels.end());
  }
  return p;
}

/// Whether a float still holds device_vector's poison (every bit set: a NaN).
bool poisoned(float a) {
  std::uint32_t b;
  std::memcpy(&b, &a, sizeof b);
  return b == 0xffffffffu;
}

template <class PkT, class WT = float>
void run_case(const shape& sh, std::uint32_t seed) {
  const int S = static_cast<int>(sh.lens.size());
  const int H = sh.H, Hq = sh.H * sh.g, D = sh.D, r = sh.r, dm = sh.d_model;
  const int max_len = *std::max_element(sh.lens.begin(), sh.lens.end());
  const int max_tokens = max_len + 7;
  const int stride = max_len + 3;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);

  std::vector<kvscout::skew_plan> plans;
  for (int h = 0; h < H; ++h) plans.push_back(random_plan(sh, rng));
  std::vector<float> w_q(static_cast<std::size_t>(Hq) * D * dm), b_q;
  for (auto& v : w_q) v = nd(rng) / std::sqrt(static_cast<float>(dm));
  if (sh.bias) {
    b_q.resize(static_cast<std::size_t>(Hq) * D);
    for (auto& v : b_q) v = 0.1f * nd(rng);
  }
  std::vector<float> x(static_cast<std::size_t>(S) * dm);
  for (auto& v : x) v = nd(rng);
  std::vector<std::int32_t> positions(S), lens(sh.lens.begin(), sh.lens.end());
  for (int s = 0; s < S; ++s) positions[s] = lens[s] + 3 * s;

  // The host reference and the device policy: one config, the same constructor arguments.
  kvscout::infinigen_config dc{{.num_seqs = S, .num_kv_heads = H, .num_q_heads = Hq,
                                    .head_dim = D, .d_model = dm, .max_tokens = max_tokens,
                                    .scale = scale}, r, sh.mode, sh.agg};
  using policy = kvscout::infinigen_policy_host<PkT, WT>;
  auto host_ws = kvscout::make_workspace<policy>(dc);
  policy host(dc, plans, {w_q.data(), w_q.size()}, {b_q.data(), b_q.size()}, host_ws.span());

  // Device.
  using spec = kvscout::infinigen_policy_cuda<PkT, WT>;
  const std::size_t ws_bytes = spec::workspace_bytes(dc);
  gpu_test::device_vector<std::byte> ws(ws_bytes);
  spec dev(dc, plans, {w_q.data(), w_q.size()}, {b_q.data(), b_q.size()}, {ws.data(), ws_bytes});
  cudaStream_t stream;
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&stream));

  // Keys: k_pre random, k_post = RoPE at the token's position. Appended in batches of up to
  // 4096 tokens (prefill-like), in random order inside a batch.
  std::vector<float> k_pre(static_cast<std::size_t>(H) * D), k_post(k_pre.size());
  const int batch = 4096;
  std::vector<float> keys;
  std::vector<std::int32_t> seq_ids, token_ids;
  const auto flush = [&] {
    const int n = static_cast<int>(seq_ids.size());
    if (n == 0) return;
    gpu_test::device_vector<float> dk(keys);
    gpu_test::device_vector<std::int32_t> ds(seq_ids), dt(token_ids);
    dev.append({dk.data(), dk.size()}, {ds.data(), ds.size()}, {dt.data(), dt.size()}, n, {stream});
    KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(stream));
    keys.clear();
    seq_ids.clear();
    token_ids.clear();
  };
  for (int s = 0; s < S; ++s) {
    for (int t = 0; t < lens[s]; ++t) {
      for (auto& v : k_pre) v = nd(rng);
      k_post = k_pre;
      for (int h = 0; h < H; ++h) kvscout::apply_rope(k_post.data() + static_cast<std::size_t>(h) * D, t, plans[0].rope);
      const std::vector<float>& k = sh.mode == rope_mode::pre_rope_folded ? k_pre : k_post;
      const std::int32_t seq = s, tok = t;
      host.append(kvscout::host_span<const float>(k), {&seq, 1}, {&tok, 1}, 1);
      keys.insert(keys.end(), k.begin(), k.end());
      seq_ids.push_back(s);
      token_ids.push_back(t);
      if (static_cast<int>(seq_ids.size()) == batch) flush();
    }
  }
  flush();

  // Partial keys: same bits expected, one ulp of PkT allowed.
  {
    const kvscout::partial_key_view<PkT> view = dev.keys();
    std::vector<PkT> cache(view.data.size());
    KVSCOUT_CUDA_CHECK(cudaMemcpy(cache.data(), view.data.data(), sizeof(PkT) * cache.size(),
                                  cudaMemcpyDeviceToHost));
    const double ulp = 2 * kvscout::dtype_traits<PkT>::epsilon;
    int bad = 0;
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < r; ++c)
          for (int t = 0; t < lens[s]; ++t) {
            const float d = kvscout::to_float(cache[view.offset(s, h, c, t)]);
            const float e = kvscout::to_float(host.keys().at(s, h, c, t));
            if (!(std::fabs(d - e) <= ulp * std::fabs(e) + 1e-30) && bad++ < 5)
              std::fprintf(stderr, "pk (%d,%d,%d,%d): device %g host %g\n", s, h, c, t, d, e);
          }
    GPU_CHECK(bad == 0);
  }

  // Score, host and device.
  std::vector<float> host_scores(static_cast<std::size_t>(S) * H * stride, 0.f);
  host.score({{x.data(), x.size()}, {}, {positions.data(), positions.size()}, {lens.data(), lens.size()}},
             {{host_scores.data(), host_scores.size()}, S, H, stride});
  gpu_test::device_vector<float> dx(x);
  gpu_test::device_vector<std::int32_t> dpos(positions), dlens(lens);
  gpu_test::device_vector<float> dscores(host_scores.size());  // poisoned: NaN bits
  dev.score({{dx.data(), dx.size()}, {dpos.data(), dpos.size()}, {dlens.data(), dlens.size()}, max_len},
            {{dscores.data(), dscores.size()}, S, H, stride}, {stream});
  KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(stream));
  KVSCOUT_CUDA_CHECK(cudaStreamDestroy(stream));
  const std::vector<float> scores = dscores.download();

  // Partial queries against the host's partial_query.
  std::vector<float> qd(static_cast<std::size_t>(S) * Hq * r);
  KVSCOUT_CUDA_CHECK(cudaMemcpy(qd.data(), dev.partial_queries().data(), sizeof(float) * qd.size(),
                                cudaMemcpyDeviceToHost));
  std::vector<float> qh(qd.size());
  {
    int bad = 0;
    for (int qi = 0; qi < Hq; ++qi) {
      const kvscout::partial_query_weights w = kvscout::make_partial_query_weights(
          plans[qi / sh.g], {w_q.data(), w_q.size()}, {b_q.data(), b_q.size()}, dm, qi);
      for (int s = 0; s < S; ++s) {
        double sum_abs = 0;  // the largest sum |w x| of a row: the GEMV's rounding scale
        for (int row = 0; row < w.rows(); ++row) {
          double a = 0;
          for (int j = 0; j < dm; ++j)
            a += std::fabs(w.weight[static_cast<std::size_t>(row) * dm + j] * x[static_cast<std::size_t>(s) * dm + j]);
          sum_abs = std::max(sum_abs, a);
        }
        float* q = qh.data() + (static_cast<std::size_t>(s) * Hq + qi) * r;
        // The host's GEMV over the same weights, rounded to WT as the speculator rounds them.
        kvscout::partial_query(kvscout::detail::weights_as<WT>(w),
                               x.data() + static_cast<std::size_t>(s) * dm, positions[s], q);
        for (int c = 0; c < r; ++c) {
          q[c] *= scale;
          const float d = qd[(static_cast<std::size_t>(s) * Hq + qi) * r + c];
          const double tol = 1e-5 * (1.0 + sum_abs * std::sqrt(static_cast<double>(D)));
          if (!(std::fabs(d - q[c]) <= tol) && bad++ < 5)
            std::fprintf(stderr, "q~ (s %d, qh %d, c %d): device %g host %g\n", s, qi, c, d, q[c]);
        }
      }
    }
    GPU_CHECK(bad == 0);
  }

  // Scores.
  int bad = 0;
  for (int s = 0; s < S; ++s) {
    for (int h = 0; h < H; ++h) {
      const std::size_t base = (static_cast<std::size_t>(s) * H + h) * stride;
      // Logit tolerance per token: b = scale * max_j sum_c |q_jc| |pk_c| (host data).
      std::vector<double> tol(static_cast<std::size_t>(lens[s]));
      double row_tol = 0;
      for (int t = 0; t < lens[s]; ++t) {
        double b = 0;
        for (int j = 0; j < sh.g; ++j) {
          const float* q = qh.data() + (static_cast<std::size_t>(s) * Hq + h * sh.g + j) * r;
          double a = 0;
          for (int c = 0; c < r; ++c)
            a += std::fabs(q[c] * kvscout::to_float(host.keys().at(s, h, c, t)));
          b = std::max(b, a);  // q is scaled already
        }
        const bool half = sizeof(PkT) == 2;
        tol[t] = 1e-5 * (1 + b) + (half ? 1e-3 * b : 0.0);
        row_tol = std::max(row_tol, tol[t]);
      }
      for (int t = 0; t < stride; ++t) {
        const float d = scores[base + t];
        if (t >= lens[s]) {
          if (!poisoned(d) && bad++ < 5)
            std::fprintf(stderr, "score (%d,%d,%d) past the length was written: %g\n", s, h, t, d);
          continue;
        }
        const float e = host_scores[base + t];
        const double allowed = sh.agg == gqa_aggregation::sum_prob
                                   ? 1e-7 + std::fabs(e) * (4 * row_tol + 1e-4)
                                   : tol[t];
        if (!(std::fabs(d - e) <= allowed) && bad++ < 5)
          std::fprintf(stderr, "score (%d,%d,%d): device %.9g host %.9g (allowed %g)\n", s, h, t, d, e, allowed);
      }
    }
  }
  GPU_CHECK(bad == 0);
}

std::vector<shape> shapes() {
  std::vector<shape> v;
  const std::vector<int> lens = {0, 1, 77, 1024, 2500};
  for (rope_mode mode : {rope_mode::post_rope_skew, rope_mode::rope_planes, rope_mode::pre_rope_folded})
    for (gqa_aggregation agg : {gqa_aggregation::max_logit, gqa_aggregation::mean_logit, gqa_aggregation::sum_prob})
      for (int D : {64, 128}) {
        const int r = D == 64 ? 16 : 32;
        const auto style = D == 64 ? kvscout::rope_style::split_half : kvscout::rope_style::interleaved;
        v.push_back({2, 4, D, r, 256, mode, style, agg, lens, true});
        v.push_back({3, 1, D, r, 192, mode, style, agg, {5, 1500}, false});
        v.push_back({1, 3, D, r, 128, mode, style, agg, {33, 0, 1025}, true});  // generic group
        // G = 8 (static), and a generic group of 12: two chunks of 8 heads, the second partial
        // (the j0 loop of score_group / softmax_stats / score_sum_prob).
        v.push_back({1, 8, D, r, 64, mode, style, agg, {1100}, true});
        v.push_back({1, 12, D, r, 64, mode, style, agg, {5, 1300}, false});
      }
  return v;
}

/// On the SIMT emulator the suite runs three times, threads forward, reversed and shuffled
/// (tests/simt/CMakeLists.txt). The kernels' barriers and shuffles are the same for every key
/// and weight type, so the reordered runs sweep the shapes with float keys and weights only; the
/// other types, and the 128k row, run once (forward, and always on a device). Under
/// AddressSanitizer on a 2-core 2 GHz machine the full sweep in every order passed 900 s each.
using gpu_test::reordered_emulator_run;

template <class PkT, class WT = float>
void all_shapes() {
  if (!(std::is_same_v<PkT, float> && std::is_same_v<WT, float>) && reordered_emulator_run()) {
    std::printf("note: key / weight type sweep runs in forward order only on the emulator\n");
    return;
  }
  std::uint32_t seed = sizeof(PkT) * 1000 + (std::is_same_v<WT, float> ? 0 : sizeof(WT) * 100);
  for (const shape& sh : shapes()) {
    // 2-byte weights change the GEMV only, not the scoring after it: one aggregation covers
    // them (a third of the shapes; under ASan every case is costly).
    if (!std::is_same_v<WT, float> && sh.agg != gqa_aggregation::max_logit) continue;
    run_case<PkT, WT>(sh, seed++);
  }
}

void long_row() {
  // 128k tokens (128 scoring blocks), GQA group of 4, every aggregation.
  if (reordered_emulator_run()) {
    std::printf("note: the 128k row runs in forward order only on the emulator\n");
    return;
  }
  for (gqa_aggregation agg : {gqa_aggregation::max_logit, gqa_aggregation::sum_prob})
    run_case<kvscout::half>({1, 4, 128, 32, 128, rope_mode::post_rope_skew, kvscout::rope_style::split_half,
                             agg, {131072, 3}, true},
                            77);
}

using gpu_test::throws_with;

void bad_input_throws() {
  const shape sh{2, 2, 64, 16, 64, rope_mode::post_rope_skew, kvscout::rope_style::split_half,
                 gqa_aggregation::max_logit, {10}, true};
  std::mt19937 rng(9);
  std::vector<kvscout::skew_plan> plans = {random_plan(sh, rng), random_plan(sh, rng)};
  std::vector<float> w_q(4 * 64 * 64, 0.01f), b_q;
  kvscout::infinigen_config cfg{{.num_seqs = 1, .num_kv_heads = 2, .num_q_heads = 4,
                                     .head_dim = 64, .d_model = 64, .max_tokens = 100,
                                     .scale = 0.125f}, 16, rope_mode::post_rope_skew,
                                     gqa_aggregation::max_logit};
  using spec = kvscout::infinigen_policy_cuda<float>;
  const std::size_t bytes = spec::workspace_bytes(cfg);
  gpu_test::device_vector<std::byte> ws(bytes);
  const kvscout::device_span<std::byte> wsp(ws.data(), bytes);
  GPU_CHECK(throws_with([&] { spec s(cfg, {plans[0]}, {w_q.data(), w_q.size()}, {}, wsp); }, "got 1 skew plans"));
  GPU_CHECK(throws_with([&] { spec s(cfg, plans, {w_q.data(), 100}, {}, wsp); }, "W_Q holds 100"));
  GPU_CHECK(throws_with([&] { spec s(cfg, plans, {w_q.data(), w_q.size()}, {}, {ws.data(), bytes - 1}); },
                        std::to_string(bytes - 1)));
  auto bad = cfg;
  bad.r = 65;
  GPU_CHECK(throws_with([&] { (void)spec::workspace_bytes(bad); }, "r = 65"));
  spec s(cfg, plans, {w_q.data(), w_q.size()}, {}, wsp);
  gpu_test::device_vector<float> x(64), out(2 * 50);
  gpu_test::device_vector<std::int32_t> pos(1), lens(1);
  const kvscout::score_context<kvscout::device_space> ctx{{x.data(), 64}, {pos.data(), 1}, {lens.data(), 1}, 101};
  GPU_CHECK(throws_with([&] { s.score(ctx, {{out.data(), out.size()}, 1, 2, 50}, {}); }, "max_seq_len = 101"));
  const kvscout::score_context<kvscout::device_space> ok{{x.data(), 64}, {pos.data(), 1}, {lens.data(), 1}, 50};
  GPU_CHECK(throws_with([&] { s.score(ok, {{out.data(), out.size()}, 1, 3, 50}, {}); }, "has 3 kv heads"));
  GPU_CHECK(throws_with([&] { s.score(ok, {{out.data(), 60}, 1, 2, 50}, {}); }, "holds 60"));
}

// A small speculator set-up (2 sequences, 1 kv head, 2 query heads, head_dim 64, d_model 64,
// 64 tokens, r 16) with a random plan and W_Q of normal(0, sigma) entries, drawn from rng.
struct small_setup {
  std::vector<kvscout::skew_plan> plans;
  std::vector<float> w_q;
  kvscout::infinigen_config cfg;
};
small_setup small_speculator(rope_mode mode, float sigma, std::mt19937& rng) {
  const shape sh{1, 2, 64, 16, 64, mode, kvscout::rope_style::interleaved,
                 gqa_aggregation::sum_prob, {40}, true};
  small_setup u{{random_plan(sh, rng)}, std::vector<float>(2 * 64 * 64),
                {{.num_seqs = 2, .num_kv_heads = 1, .num_q_heads = 2, .head_dim = 64, .d_model = 64,
                  .max_tokens = 64, .scale = 0.125f},
                 16, mode, gqa_aggregation::sum_prob}};
  std::normal_distribution<float> nd(0.f, sigma);
  for (auto& v : u.w_q) v = nd(rng);
  return u;
}

void weights_in_the_model_dtype() {
  // W_Q handed over in bfloat16 (the model's own, no float copy) builds the workspace a float W_Q
  // holding the same values builds: the same partial queries and scores, bit for bit, every mode.
  for (rope_mode mode : {rope_mode::post_rope_skew, rope_mode::rope_planes,
                         rope_mode::pre_rope_folded}) {
    std::mt19937 rng(23);
    const small_setup u = small_speculator(mode, 0.1f, rng);
    std::vector<kvscout::bfloat16> w16(u.w_q.size());
    std::vector<float> w_rounded(u.w_q.size());
    for (std::size_t i = 0; i < w16.size(); ++i) {
      w16[i] = kvscout::from_float<kvscout::bfloat16>(u.w_q[i]);
      w_rounded[i] = kvscout::to_float(w16[i]);
    }
    using spec = kvscout::infinigen_policy_cuda<float, kvscout::bfloat16>;
    gpu_test::device_vector<std::byte> ws_a(spec::workspace_bytes(u.cfg)),
        ws_b(spec::workspace_bytes(u.cfg));
    spec a(u.cfg, u.plans, kvscout::host_span<const kvscout::bfloat16>(w16.data(), w16.size()), {},
           {ws_a.data(), ws_a.size()});
    spec b(u.cfg, u.plans, {w_rounded.data(), w_rounded.size()}, {}, {ws_b.data(), ws_b.size()});
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> keys(2 * 64), x(2 * 64);
    for (auto& v : keys) v = nd(rng);
    for (auto& v : x) v = nd(rng);
    gpu_test::device_vector<float> dk(keys), dx(x);
    gpu_test::device_vector<std::int32_t> sid(std::vector<std::int32_t>{0, 1}),
        tid(std::vector<std::int32_t>{0, 0}), pos(std::vector<std::int32_t>{5, 9}),
        lens(std::vector<std::int32_t>{1, 1});
    gpu_test::device_vector<float> sa(2 * 64), sb(2 * 64);
    for (spec* sp : {&a, &b}) {
      sp->append({dk.data(), dk.size()}, {sid.data(), sid.size()}, {tid.data(), tid.size()}, 2,
                 {});
      gpu_test::device_vector<float>& out = sp == &a ? sa : sb;
      sp->score({{dx.data(), dx.size()}, {pos.data(), pos.size()}, {lens.data(), lens.size()}, 1},
                {{out.data(), out.size()}, 2, 1, 64}, {});
    }
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> qa(2 * 2 * 16), qb(qa.size());
    KVSCOUT_CUDA_CHECK(cudaMemcpy(qa.data(), a.partial_queries().data(), sizeof(float) * qa.size(),
                                  cudaMemcpyDeviceToHost));
    KVSCOUT_CUDA_CHECK(cudaMemcpy(qb.data(), b.partial_queries().data(), sizeof(float) * qb.size(),
                                  cudaMemcpyDeviceToHost));
    GPU_CHECK(std::memcmp(qa.data(), qb.data(), sizeof(float) * qa.size()) == 0);
    const std::vector<float> ra = sa.download(), rb = sb.download();
    GPU_CHECK(ra[0] == rb[0] && ra[64] == rb[64] && !poisoned(ra[0]));
  }
}

void lengths_on_device_are_clamped() {
  // seq_lens beyond the bound are clamped to it; negative ones score nothing; both are reported
  // as device_status::bad_length.
  std::mt19937 rng(11);
  const small_setup u = small_speculator(rope_mode::rope_planes, 0.1f, rng);
  std::normal_distribution<float> nd(0.f, 0.1f);
  using spec = kvscout::infinigen_policy_cuda<float>;
  gpu_test::device_vector<std::byte> ws(spec::workspace_bytes(u.cfg));
  spec s(u.cfg, u.plans, {u.w_q.data(), u.w_q.size()}, {}, {ws.data(), ws.size()});
  std::vector<float> keys(64 * 64);
  for (auto& v : keys) v = nd(rng);
  std::vector<std::int32_t> sid(64), tid(64);
  for (int t = 0; t < 64; ++t) sid[t] = t % 2, tid[t] = t / 2;
  gpu_test::device_vector<float> dk(keys);
  gpu_test::device_vector<std::int32_t> ds(sid), dt(tid);
  {
    gpu_test::device_vector<int> status(std::vector<int>{0});
    s.append({dk.data(), dk.size()}, {ds.data(), ds.size()}, {dt.data(), dt.size()}, 64,
             {nullptr, status.data()});
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(status.download()[0] == 0);  // good pairs: nothing reported
  }
  // Pairs outside [0, num_seqs) x [0, max_tokens) are skipped on the device: no fault, and the
  // cache keeps every byte.
  {
    const kvscout::partial_key_view<float> view = s.keys();
    std::vector<float> before(view.data.size()), after(view.data.size());
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    KVSCOUT_CUDA_CHECK(cudaMemcpy(before.data(), view.data.data(), sizeof(float) * before.size(),
                                  cudaMemcpyDeviceToHost));
    gpu_test::device_vector<std::int32_t> bs(std::vector<std::int32_t>{-1, 2, 0, 1});
    gpu_test::device_vector<std::int32_t> bt(std::vector<std::int32_t>{0, 0, 64, -1});
    gpu_test::device_vector<int> status(std::vector<int>{0});
    s.append({dk.data(), dk.size()}, {bs.data(), bs.size()}, {bt.data(), bt.size()}, 4,
             {nullptr, status.data()});
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(status.download()[0] == kvscout::device_status::bad_index);  // and reported
    KVSCOUT_CUDA_CHECK(cudaMemcpy(after.data(), view.data.data(), sizeof(float) * after.size(),
                                  cudaMemcpyDeviceToHost));
    GPU_CHECK(std::memcmp(before.data(), after.data(), sizeof(float) * before.size()) == 0);
  }
  std::vector<float> x(2 * 64, 0.5f);
  gpu_test::device_vector<float> dx(x), out(2 * 40);
  gpu_test::device_vector<std::int32_t> pos(std::vector<std::int32_t>{5, 6}), lens(std::vector<std::int32_t>{1000, -3});
  gpu_test::device_vector<int> status(std::vector<int>{0});
  s.score({{dx.data(), dx.size()}, {pos.data(), 2}, {lens.data(), 2}, 20},
          {{out.data(), out.size()}, 2, 1, 40}, {nullptr, status.data()});
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  GPU_CHECK(status.download()[0] == kvscout::device_status::bad_length);  // reported
  {
    // Lengths at the bound and 0 are good: nothing reported.
    gpu_test::device_vector<std::int32_t> good(std::vector<std::int32_t>{20, 0});
    gpu_test::device_vector<int> quiet(std::vector<int>{0});
    gpu_test::device_vector<float> scratch(2 * 40);
    s.score({{dx.data(), dx.size()}, {pos.data(), 2}, {good.data(), 2}, 20},
            {{scratch.data(), scratch.size()}, 2, 1, 40}, {nullptr, quiet.data()});
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(quiet.download()[0] == 0);
    // A negative length alone raises it.
    gpu_test::device_vector<std::int32_t> negative(std::vector<std::int32_t>{20, -1});
    s.score({{dx.data(), dx.size()}, {pos.data(), 2}, {negative.data(), 2}, 20},
            {{scratch.data(), scratch.size()}, 2, 1, 40}, {nullptr, quiet.data()});
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(quiet.download()[0] == kvscout::device_status::bad_length);
  }
  const std::vector<float> o = out.download();
  int written0 = 0, written1 = 0;
  double mass = 0;
  for (int t = 0; t < 40; ++t) {
    const bool w0 = !poisoned(o[t]);
    written0 += w0;
    if (w0) mass += o[t];
    written1 += !poisoned(o[40 + t]);
  }
  GPU_CHECK(written0 == 20);                 // clamped to the bound
  GPU_CHECK(std::fabs(mass - 2.0) < 1e-4);   // sum_prob over 2 query heads: mass 2
  GPU_CHECK(written1 == 0);                  // negative: nothing
}

void seq_ids_name_the_sequences() {
  // Continuous batching: batch rows {2, 0} with seq_ids score as sequences 2 and 0 do in a batch of
  // all three, bit for bit (each aggregation's kernels); a sequence id the speculator does not hold
  // raises device_status::bad_seq_id and its row is scored -inf, the other row as before.
  for (gqa_aggregation agg : {gqa_aggregation::max_logit, gqa_aggregation::sum_prob}) {
    std::mt19937 rng(31);
    small_setup u = small_speculator(rope_mode::post_rope_skew, 0.1f, rng);
    u.cfg.shape.num_seqs = 3;
    u.cfg.aggregation = agg;
    using spec = kvscout::infinigen_policy_cuda<float>;
    gpu_test::device_vector<std::byte> ws(spec::workspace_bytes(u.cfg));
    spec sp(u.cfg, u.plans, {u.w_q.data(), u.w_q.size()}, {}, {ws.data(), ws.size()});
    const std::vector<std::int32_t> lens{30, 12, 50}, pos{31, 12, 900};
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> keys, x(3 * 64);
    std::vector<std::int32_t> sid, tid;
    for (int s = 0; s < 3; ++s)
      for (int t = 0; t < lens[s]; ++t) {
        sid.push_back(s), tid.push_back(t);
        for (int c = 0; c < 64; ++c) keys.push_back(nd(rng));
      }
    for (auto& v : x) v = nd(rng);
    gpu_test::device_vector<float> dk(keys), dx(x);
    gpu_test::device_vector<std::int32_t> ds(sid), dt(tid);
    sp.append({dk.data(), dk.size()}, {ds.data(), ds.size()}, {dt.data(), dt.size()},
              static_cast<int>(sid.size()), {});
    gpu_test::device_vector<std::int32_t> dpos(pos), dlens(lens);
    gpu_test::device_vector<float> all(3 * 64);
    sp.score({{dx.data(), dx.size()}, {dpos.data(), 3}, {dlens.data(), 3}, 50},
             {{all.data(), all.size()}, 3, 1, 64}, {});
    // The batch: rows of sequences 2 and 0.
    std::vector<float> bx(x.begin() + 2 * 64, x.end());
    bx.insert(bx.end(), x.begin(), x.begin() + 64);
    gpu_test::device_vector<float> dbx(bx);
    gpu_test::device_vector<std::int32_t> bpos(std::vector<std::int32_t>{900, 31}),
        blens(std::vector<std::int32_t>{50, 30}), seq_ids(std::vector<std::int32_t>{2, 0}),
        bad(std::vector<std::int32_t>{2, 3});
    gpu_test::device_vector<int> status(std::vector<int>{0});
    gpu_test::device_vector<float> got(2 * 64), got_bad(2 * 64);  // poisoned
    sp.score({{dbx.data(), dbx.size()}, {bpos.data(), 2}, {blens.data(), 2}, 50,
              {seq_ids.data(), 2}},
             {{got.data(), got.size()}, 2, 1, 64}, {nullptr, status.data()});
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(status.download()[0] == 0);
    sp.score({{dbx.data(), dbx.size()}, {bpos.data(), 2}, {blens.data(), 2}, 50,
              {bad.data(), 2}},
             {{got_bad.data(), got_bad.size()}, 2, 1, 64}, {nullptr, status.data()});
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(status.download()[0] == kvscout::device_status::bad_seq_id);
    const std::vector<float> a = all.download(), b = got.download(), c = got_bad.download();
    int same = 0, minus_inf = 0;
    for (int t = 0; t < 50; ++t) {
      same += std::memcmp(&b[t], &a[2 * 64 + t], sizeof(float)) == 0;
      same += std::memcmp(&c[t], &a[2 * 64 + t], sizeof(float)) == 0;
      minus_inf += c[64 + t] == -std::numeric_limits<float>::infinity();
    }
    for (int t = 0; t < 30; ++t) same += std::memcmp(&b[64 + t], &a[t], sizeof(float)) == 0;
    GPU_CHECK(same == 50 + 50 + 30);
    GPU_CHECK(minus_inf == 30);        // the bad row's length, nothing past it
    GPU_CHECK(!poisoned(a[2 * 64]) && poisoned(c[64 + 30]));
    // Too few seq_ids for the rows: refused on the host, before any launch.
    GPU_CHECK(throws_with([&] {
      sp.score({{dbx.data(), dbx.size()}, {bpos.data(), 2}, {blens.data(), 2}, 50,
                {seq_ids.data(), 1}},
               {{got.data(), got.size()}, 2, 1, 64}, {});
    }, "seq_ids holds 1 entries, expected num_seqs = 2"));
  }
}

}  // namespace

// Keys in the engine's own element type: appending bf16 / half keys stores the same partial
// keys, bit for bit, as appending the same values widened to float (post-RoPE skew: the
// rotation; RoPE planes: the gather).
template <class K>
void typed_keys_match_float(rope_mode mode) {
  std::mt19937 rng(12);
  const small_setup u = small_speculator(mode, 0.5f, rng);
  std::normal_distribution<float> nd(0.f, 0.5f);
  using spec = kvscout::infinigen_policy_cuda<float>;
  gpu_test::device_vector<std::byte> ws_a(spec::workspace_bytes(u.cfg)), ws_b(ws_a.size());
  spec a(u.cfg, u.plans, {u.w_q.data(), u.w_q.size()}, {}, {ws_a.data(), ws_a.size()});
  spec b(u.cfg, u.plans, {u.w_q.data(), u.w_q.size()}, {}, {ws_b.data(), ws_b.size()});
  std::vector<K> keys(64 * 64);
  std::vector<float> widened(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    keys[i] = kvscout::from_float<K>(nd(rng));
    widened[i] = kvscout::to_float(keys[i]);
  }
  std::vector<std::int32_t> sid(64), tid(64);
  for (int t = 0; t < 64; ++t) sid[t] = t % 2, tid[t] = t / 2;
  gpu_test::device_vector<K> dk(keys);
  gpu_test::device_vector<float> dw(widened);
  gpu_test::device_vector<std::int32_t> ds(sid), dt(tid);
  a.append(kvscout::device_span<const K>(dk.data(), dk.size()), {ds.data(), ds.size()},
           {dt.data(), dt.size()}, 64, {});
  b.append({dw.data(), dw.size()}, {ds.data(), ds.size()}, {dt.data(), dt.size()}, 64, {});
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  const auto download = [](const kvscout::partial_key_view<float>& v) {
    std::vector<float> h(v.data.size());
    KVSCOUT_CUDA_CHECK(cudaMemcpy(h.data(), v.data.data(), sizeof(float) * h.size(),
                                  cudaMemcpyDeviceToHost));
    return h;
  };
  const std::vector<float> ka = download(a.keys()), kb = download(b.keys());
  GPU_CHECK(std::memcmp(ka.data(), kb.data(), sizeof(float) * ka.size()) == 0);
  int stored = 0;  // and something was stored: 64 tokens x 16 channels, none of them zero
  for (float v : ka) stored += v != 0.f;
  GPU_CHECK(stored >= 64 * 16 - 4);
}

int main() {
  return gpu_test::run_all("spec_device", {{"float_keys", all_shapes<float>},
                                           {"half_keys", all_shapes<kvscout::half>},
                                           {"bf16_weights", all_shapes<float, kvscout::bfloat16>},
                                           {"half_keys_half_weights",
                                            all_shapes<kvscout::half, kvscout::half>},
                                           {"long_row_128k", long_row},
                                           {"lengths_on_device_are_clamped", lengths_on_device_are_clamped},
                                           {"weights_in_the_model_dtype",
                                            weights_in_the_model_dtype},
                                           {"bad_input_throws", bad_input_throws},
                                           {"seq_ids_name_the_sequences",
                                            seq_ids_name_the_sequences},
                                           {"bf16_keys_post_rope_skew", [] { typed_keys_match_float<kvscout::bfloat16>(rope_mode::post_rope_skew); }},
                                           {"half_keys_rope_planes", [] { typed_keys_match_float<kvscout::half>(rope_mode::rope_planes); }}});
}
