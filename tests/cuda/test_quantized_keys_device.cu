// Quantised partial keys on the device (issue 32): infinigen_policy_cuda<quantized_keys<Bits,
// Group>> against infinigen_policy_host<quantized_keys<Bits, Group>> (the host cache is the
// reference of the format):
//   - the cache after appends in every shape an engine sends (a prefill batch of several
//     sequences, one token per sequence per decode step, a later batch that finishes one group
//     and starts the next): counts, each complete group's min, step and codes, and the staging
//     tile, the same bits (rope_planes: the partial keys are a gather, so exact);
//   - score() and score_query() against the host's, max_logit and sum_prob, group sizes 1 and 3;
//   - appends out of order, out of range or not finite: skipped or zeroed, and reported.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gpu_harness.cuh"
#include "spec_append.cuh"
#include "kvscout/core/device_status.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/score/infinigen.cuh"
#include "kvscout/score/infinigen.hpp"

namespace {

using kvscout::rope_mode;
constexpr int D = 64;

// RoPE-plane plans: every other plane from `first`, r / 2 of them.
std::vector<kvscout::skew_plan> plans_for(int H, int r, int first) {
  const kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  std::vector<kvscout::skew_plan> out;
  for (int h = 0; h < H; ++h) {
    std::vector<int> planes;
    for (int j = 0; j < r / 2; ++j) planes.push_back((first + h + 2 * j) % (D / 2));
    std::sort(planes.begin(), planes.end());
    planes.erase(std::unique(planes.begin(), planes.end()), planes.end());
    out.push_back(kvscout::rope_planes_plan(rope, planes));
  }
  return out;
}

template <class T>
std::vector<T> fetch(const T* p, std::size_t n) {
  std::vector<T> h(n);
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  KVSCOUT_CUDA_CHECK(cudaMemcpy(h.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost));
  return h;
}

// One append call: entries (s, t), keys drawn from rng (channels of different means), to both.
struct appender {
  int H;
  std::mt19937 rng;
  template <class Host, class Dev>
  void call(Host& host, Dev& dev, const std::vector<std::pair<int, int>>& entries, int* status) {
    std::normal_distribution<float> nd(0.f, 1.f);
    gpu_test::append_same_keys(host, entries, H, D, [&](std::vector<float>& k) {
      for (std::size_t i = 0; i < k.size(); ++i) k[i] = 0.3f * static_cast<float>(i % 7) + nd(rng);
    }, status, dev);
  }
};

std::vector<std::pair<int, int>> run(int s, int from, int to) {
  std::vector<std::pair<int, int>> e;
  for (int t = from; t < to; ++t) e.push_back({s, t});
  return e;
}

template <int Bits, int Group>
void matches_host(int g, kvscout::gqa_aggregation agg, std::uint32_t seed) {
  using fmt = kvscout::quantized_keys<Bits, Group>;
  const int H = 2, Hq = H * g, r = 24, dm = 40, S = 3, max_tokens = 200, stride = 210;
  const float scale = 0.125f;
  const auto plans = plans_for(H, r, 1);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w_q(static_cast<std::size_t>(Hq) * D * dm);
  for (auto& v : w_q) v = nd(rng) / 6.f;
  kvscout::infinigen_config hc{.shape = {.num_layers = 1, .num_seqs = S, .num_kv_heads = H,
                               .num_q_heads = Hq, .head_dim = D, .d_model = dm,
                               .max_tokens = max_tokens, .scale = scale},
                               .aggregation = agg};
  auto host = kvscout::infinigen_policy_host<fmt>::layers(hc, {plans}, {{w_q.data(), w_q.size()}}, {{}});
  const kvscout::infinigen_config dc{{.num_seqs = S, .num_kv_heads = H, .num_q_heads = Hq,
                                          .head_dim = D, .d_model = dm, .max_tokens = max_tokens,
                                          .scale = scale}, r, rope_mode::rope_planes, agg};
  using spec = kvscout::infinigen_policy_cuda<fmt>;
  static_assert(spec::quantized);
  auto ws = kvscout::make_device_workspace<spec>(dc);
  spec dev(dc, plans, {w_q.data(), w_q.size()}, {}, ws.span());
  gpu_test::device_vector<int> status(std::vector<int>{0});
  appender ap{H, std::mt19937(seed + 1)};
  // Prefill: sequences 0 and 1 in one call (several groups each, a partial one left).
  auto e = run(0, 0, 2 * Group + 5);
  for (const auto& x : run(1, 0, Group + 3)) e.push_back(x);
  ap.call(host, dev, e, status.data());
  // Decode: one token per sequence per call, sequence 2 starting; crosses group ends.
  std::vector<int> len{2 * Group + 5, Group + 3, 0};
  for (int step = 0; step < Group; ++step) {
    std::vector<std::pair<int, int>> d;
    for (int s = 0; s < S; ++s) d.push_back({s, len[static_cast<std::size_t>(s)]++});
    ap.call(host, dev, d, status.data());
  }
  // A batch that finishes sequence 2's open group and starts another, then sequence 0's.
  e = run(2, len[2], len[2] + Group + 7);
  len[2] += Group + 7;
  for (const auto& x : run(0, len[0], len[0] + 3)) e.push_back(x);
  len[0] += 3;
  ap.call(host, dev, e, status.data());
  GPU_CHECK(status.download()[0] == 0);

  // The cache, against the host's.
  const auto view = dev.keys();
  const auto tiles = fetch(view.tile_data.data(), view.tile_data.size());
  const auto stage = fetch(view.staging.data(), view.staging.size());
  const auto counts = fetch(view.counts.data(), view.counts.size());
  const auto& hk = host[0].keys();
  int bad = 0;
  for (int s = 0; s < S; ++s)
    for (int h = 0; h < H; ++h) {
      GPU_CHECK(counts[static_cast<std::size_t>(s) * H + h] == hk.appended(s, h));
      GPU_CHECK(hk.appended(s, h) == len[static_cast<std::size_t>(s)]);
      for (int b = 0; b < hk.complete_groups(s, h); ++b) {
        const float* t = tiles.data() + view.tile_offset(s, h, b);
        if (std::memcmp(t, hk.group_min(s, h, b), sizeof(float) * r) != 0 ||
            std::memcmp(t + r, hk.group_step(s, h, b), sizeof(float) * r) != 0 ||
            std::memcmp(t + 2 * r, hk.group_codes(s, h, b), static_cast<std::size_t>(r) * view.line_bytes) != 0) {
          if (bad++ < 5) std::fprintf(stderr, "tile (%d,%d,%d) differs\n", s, h, b);
        }
      }
      if (std::memcmp(stage.data() + view.staging_offset(s, h), hk.staging(s, h),
                      sizeof(float) * r * Group) != 0 && bad++ < 5)
        std::fprintf(stderr, "staging (%d,%d) differs\n", s, h);
    }
  GPU_CHECK(bad == 0);

  // Scores: the speculation (x) and the correction (q), against the host's.
  std::vector<float> x(static_cast<std::size_t>(S) * dm), q(static_cast<std::size_t>(S) * Hq * D);
  for (auto& v : x) v = nd(rng);
  for (auto& v : q) v = nd(rng);
  const std::vector<std::int32_t> lens{len[0], len[1], len[2]}, pos{len[0] + 1, len[1] + 1, len[2] + 1};
  const int max_len = *std::max_element(lens.begin(), lens.end());
  for (const bool late : {false, true}) {
    std::vector<float> want(static_cast<std::size_t>(S) * H * stride, 0.f);
    const kvscout::score_context<kvscout::host_space> hctx{{x.data(), x.size()}, {q.data(), q.size()},
                                                           {pos.data(), 3}, {lens.data(), 3}};
    const kvscout::score_buffer<kvscout::host_space> hout{{want.data(), want.size()}, S, H, stride};
    if (late) host.score_query(0, hctx, hout); else host.score(0, hctx, hout);
    gpu_test::device_vector<float> dx(x), dq(q), out(want.size());
    gpu_test::device_vector<std::int32_t> dl(lens), dp(pos);
    const kvscout::score_context<kvscout::device_space> dctx{{dx.data(), dx.size()}, {dp.data(), 3}, {dl.data(), 3}, max_len};
    const kvscout::score_buffer<kvscout::device_space> dout{{out.data(), out.size()}, S, H, stride};
    if (late) dev.score_query({dq.data(), dq.size()}, dctx, dout, {nullptr, status.data()});
    else dev.score(dctx, dout, {nullptr, status.data()});
    const auto got = out.download();
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < lens[static_cast<std::size_t>(s)]; ++t) {
          const std::size_t i = (static_cast<std::size_t>(s) * H + h) * stride + t;
          const float tol = 2e-4f * (1.f + std::fabs(want[i]));
          if (!(std::fabs(got[i] - want[i]) <= tol) && bad++ < 5)
            std::fprintf(stderr, "%s (%d,%d,%d): device %g host %g\n", late ? "score_query" : "score", s, h,
                         t, got[i], want[i]);
        }
  }
  GPU_CHECK(bad == 0);
  GPU_CHECK(status.download()[0] == 0);
}

void matches_host_all() {
  for (const int g : {1, 3}) {
    matches_host<2, 32>(g, kvscout::gqa_aggregation::max_logit, 3u + static_cast<unsigned>(g));
    matches_host<4, 32>(g, kvscout::gqa_aggregation::sum_prob, 5u + static_cast<unsigned>(g));
    matches_host<2, 16>(g, kvscout::gqa_aggregation::mean_logit, 7u + static_cast<unsigned>(g));
    matches_host<8, 64>(g, kvscout::gqa_aggregation::max_logit, 9u + static_cast<unsigned>(g));
  }
}

// Bad appends: skipped (or zeroed) and reported, the rest of the call kept.
void bad_appends_are_reported() {
  using fmt = kvscout::quantized_keys<4, 16>;
  using spec = kvscout::infinigen_policy_cuda<fmt>;
  const int H = 1, r = 8, dm = 16;
  const auto plans = plans_for(H, r, 0);
  std::vector<float> w_q(static_cast<std::size_t>(D) * dm, 0.02f);
  const kvscout::infinigen_config dc{{.num_seqs = 2, .num_kv_heads = H, .num_q_heads = H,
                                          .head_dim = D, .d_model = dm, .max_tokens = 64,
                                          .scale = 0.125f}, r, rope_mode::rope_planes};
  auto ws = kvscout::make_device_workspace<spec>(dc);
  spec dev(dc, plans, {w_q.data(), w_q.size()}, {}, ws.span());
  const auto call = [&](std::vector<std::int32_t> s, std::vector<std::int32_t> t) {
    std::vector<float> k(s.size() * D, 0.5f);
    gpu_test::device_vector<float> dk(k);
    gpu_test::device_vector<std::int32_t> ds(s), dt(t);
    gpu_test::device_vector<int> st(std::vector<int>{0});
    dev.append({dk.data(), dk.size()}, {ds.data(), ds.size()}, {dt.data(), dt.size()},
               static_cast<int>(s.size()), {nullptr, st.data()});
    return st.download()[0];
  };
  const auto counts = [&] { return fetch(dev.keys().counts.data(), 2); };
  GPU_CHECK(call({0, 0, 0}, {0, 1, 2}) == 0);
  GPU_CHECK(counts()[0] == 3);
  // A gap: sequence 0 resumes at 5 instead of 3.
  GPU_CHECK(call({0, 0}, {5, 6}) == kvscout::device_status::bad_order);
  GPU_CHECK(counts()[0] == 3);
  // A run broken inside (3, 4, 6), and sequence 1 fine beside it.
  GPU_CHECK(call({0, 0, 0, 1}, {3, 4, 6, 0}) == kvscout::device_status::bad_order);
  GPU_CHECK(counts()[0] == 5 && counts()[1] == 1);
  // Sequence 0's group end (15) in the batch but after a break: the run's own tokens are staged.
  GPU_CHECK(call({0, 1, 0}, {5, 1, 15}) == kvscout::device_status::bad_order);
  GPU_CHECK(counts()[0] == 6 && counts()[1] == 2);
  {
    const auto view = dev.keys();
    const auto stage = fetch(view.staging.data(), view.staging.size());
    GPU_CHECK(stage[view.staging_offset(0, 0) + 5] == 0.5f);  // channel 0 of token 5
  }
  // Out of range: sequence 2, position 64.
  GPU_CHECK(call({2}, {0}) == kvscout::device_status::bad_index);
  GPU_CHECK(call({0}, {64}) == kvscout::device_status::bad_index);
  // A new sequence in slot 0 restarts at 0.
  GPU_CHECK(call({0}, {0}) == 0);
  GPU_CHECK(counts()[0] == 1);
  // A non-finite key in a kept channel: stored as 0 and reported.
  const int c0 = plans[0].channels[0];
  std::vector<std::int32_t> s1{1}, t1{2};
  std::vector<float> k(D, 0.5f);
  k[static_cast<std::size_t>(c0)] = std::numeric_limits<float>::infinity();
  gpu_test::device_vector<float> dk(k);
  gpu_test::device_vector<std::int32_t> ds(s1), dt(t1);
  gpu_test::device_vector<int> st(std::vector<int>{0});
  dev.append({dk.data(), dk.size()}, {ds.data(), 1}, {dt.data(), 1}, 1, {nullptr, st.data()});
  GPU_CHECK(st.download()[0] == kvscout::device_status::bad_value);
  const auto view = dev.keys();
  const auto stage = fetch(view.staging.data(), view.staging.size());
  GPU_CHECK(stage[view.staging_offset(1, 0) + 2] == 0.f);        // channel 0 of token 2
  GPU_CHECK(stage[view.staging_offset(1, 0) + 16 + 2] == 0.5f);   // channel 1
}

// The setup checks of the format: a group too large for the quantising kernel's shared memory.
void refuses_a_group_too_large() {
  const kvscout::infinigen_config dc{{.num_seqs = 1, .num_kv_heads = 1, .num_q_heads = 1,
                                          .head_dim = 128, .d_model = 16, .max_tokens = 256,
                                          .scale = 0.125f}, 128, rope_mode::rope_planes};
  GPU_CHECK(gpu_test::throws_with(
      [&] { (void)kvscout::infinigen_policy_cuda<kvscout::quantized_keys<4, 128>>::workspace_bytes(dc); },
      "a group of 128 tokens x 128 channels is 65536 bytes"));
}

}  // namespace

int main() {
  return gpu_test::run_all("quantized_keys_device",
                           {{"matches_host", matches_host_all},
                            {"bad_appends_are_reported", bad_appends_are_reported},
                            {"refuses_a_group_too_large", refuses_a_group_too_large}});
}
