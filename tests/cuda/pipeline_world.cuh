#pragma once
// A small synthetic model for the CUDA pipeline tests (test_decode_step_device,
// test_correction_pipeline_device): per layer an fp16 KV cache in mapped pinned memory (the
// offloaded cache), W_Q and RoPE-plane skew plans; per layer the input x and the query q of one
// step, and the current token's K / V; and device speculators whose partial keys are filled from
// the caches. Seeded; keys have a few strong channels so that attention is peaked.
//
//   struct shape { static constexpr int L = 4, skip = 1, S = 2, H = 2, Hq = 4, D = 64, dm = 128,
//                  r = 16, max_tokens = 512; };
//   gpu_test::pipeline_world<shape> w(2024, {300, 170});

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpu_harness.cuh"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/skew/plan.hpp"
#include "kvscout/score/infinigen.cuh"

namespace gpu_test {

template <class T>
kvscout::device_span<T> dspan(const device_vector<std::remove_const_t<T>>& v) {
  return {v.data(), v.size()};
}

/// A RoPE-plane plan of r channels: planes chosen at random, identity skew (score/ and skew/ test
/// the others).
inline kvscout::skew_plan plane_plan(std::mt19937& rng, int D, int r) {
  std::vector<int> all(static_cast<std::size_t>(D / 2));
  for (int i = 0; i < D / 2; ++i) all[static_cast<std::size_t>(i)] = i;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<std::size_t>(r / 2));
  std::sort(all.begin(), all.end());
  return kvscout::rope_planes_plan({D, 10000.f, kvscout::rope_style::interleaved}, std::move(all));
}

template <class Shape>
struct pipeline_world {
  static constexpr int L = Shape::L, skip = Shape::skip, S = Shape::S, H = Shape::H, Hq = Shape::Hq,
                       D = Shape::D, dm = Shape::dm, r = Shape::r, max_tokens = Shape::max_tokens;
  using layout = kvscout::contiguous_layout<half, D, kvscout::hnd>;

  std::mt19937 rng;
  std::vector<int32_t> lens_init;       // [S] cached tokens per sequence
  pinned_vector<int32_t> lens{S};       // layout metadata: host and device read it
  std::vector<std::unique_ptr<pinned_vector<half>>> k, v;  // per layer, mapped
  std::vector<std::vector<float>> w_q;                     // per layer [Hq * D, dm]
  std::vector<std::vector<kvscout::skew_plan>> plans;      // per layer, empty below skip
  std::vector<float> x, q;         // [L, S, dm], [L, S, Hq, D]
  std::vector<half> k_cur, v_cur;  // [L, S, H, D]
  layout host_layout, dev_layout;
  std::size_t cache_bytes = static_cast<std::size_t>(S) * H * max_tokens * D * sizeof(half);

  /// q_scale: the queries' spread (a larger one peaks attention more).
  pipeline_world(unsigned seed, std::vector<int32_t> lengths, float q_scale = 1.f)
      : rng(seed), lens_init(std::move(lengths)) {
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int s = 0; s < S; ++s) lens[s] = lens_init[static_cast<std::size_t>(s)];
    host_layout = layout::padded(H, max_tokens, lens.data(), S);
    dev_layout = layout::padded(H, max_tokens, lens.device_data(), S);
    const std::size_t cache = static_cast<std::size_t>(S) * H * max_tokens * D;
    for (int l = 0; l < L; ++l) {
      k.push_back(std::make_unique<pinned_vector<half>>(cache));
      v.push_back(std::make_unique<pinned_vector<half>>(cache));
      for (std::size_t i = 0; i < cache; ++i) {
        (*k.back())[i] = kvscout::from_float<half>(nd(rng) * (i % D < 8 ? 3.f : 1.f));
        (*v.back())[i] = kvscout::from_float<half>(nd(rng));
      }
      w_q.emplace_back(static_cast<std::size_t>(Hq) * D * dm);
      for (auto& w : w_q.back()) w = nd(rng) / std::sqrt(static_cast<float>(dm));
      plans.emplace_back();
      if (l >= skip)
        for (int h = 0; h < H; ++h) plans.back().push_back(plane_plan(rng, D, r));
    }
    x.resize(static_cast<std::size_t>(L) * S * dm);
    q.resize(static_cast<std::size_t>(L) * S * Hq * D);
    for (auto& e : x) e = nd(rng);
    for (auto& e : q) e = nd(rng) * q_scale;
    k_cur.resize(static_cast<std::size_t>(L) * S * H * D);
    v_cur.resize(k_cur.size());
    for (auto& e : k_cur) e = kvscout::from_float<half>(nd(rng));
    for (auto& e : v_cur) e = kvscout::from_float<half>(nd(rng));
  }

  /// The cached keys of layer l as floats, [num_kv_heads, head_dim] for token t of sequence s.
  [[nodiscard]] std::vector<float> key_row(int l, int s, int t) const {
    std::vector<float> out(static_cast<std::size_t>(H) * D);
    for (int h = 0; h < H; ++h) {
      const half* row = k[static_cast<std::size_t>(l)]->data() + host_layout.k_offset(s, t, h) / sizeof(half);
      for (int c = 0; c < D; ++c) out[static_cast<std::size_t>(h) * D + c] = kvscout::to_float(row[c]);
    }
    return out;
  }
};

/// The speculators of layers skip .. L - 1, their partial key caches filled from the world's
/// caches: batch row s's tokens as sequence slot_of[s] (empty: s); with decoy >= 0, also as many
/// tokens of other keys as row 0 has, as sequence decoy.
template <class World>
struct pipeline_speculators {
  using spec_t = kvscout::infinigen_policy_cuda<float>;
  std::vector<std::unique_ptr<device_vector<std::byte>>> ws;
  std::vector<std::unique_ptr<spec_t>> owned;
  std::vector<spec_t*> per_layer = std::vector<spec_t*>(World::L, nullptr);

  pipeline_speculators(World& w, const kvscout::infinigen_config& cfg, cudaStream_t stream,
                       std::vector<int> slot_of = {}, int decoy = -1) {
    constexpr int S = World::S, H = World::H, D = World::D;
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int l = World::skip; l < World::L; ++l) {
      ws.push_back(std::make_unique<device_vector<std::byte>>(spec_t::workspace_bytes(cfg)));
      owned.push_back(std::make_unique<spec_t>(
          cfg, w.plans[static_cast<std::size_t>(l)],
          kvscout::host_span<const float>(w.w_q[static_cast<std::size_t>(l)].data(), w.w_q[static_cast<std::size_t>(l)].size()),
          kvscout::host_span<const float>{},
          kvscout::device_span<std::byte>(ws.back()->data(), ws.back()->size())));
      per_layer[static_cast<std::size_t>(l)] = owned.back().get();
      std::vector<float> keys;
      std::vector<int32_t> sid, tid;
      for (int s = 0; s < S; ++s)
        for (int t = 0; t < w.lens_init[static_cast<std::size_t>(s)]; ++t) {
          const auto kr = w.key_row(l, s, t);
          keys.insert(keys.end(), kr.begin(), kr.end());
          sid.push_back(slot_of.empty() ? s : slot_of[static_cast<std::size_t>(s)]);
          tid.push_back(t);
        }
      for (int t = 0; decoy >= 0 && t < w.lens_init[0]; ++t) {
        for (int e = 0; e < H * D; ++e) keys.push_back(nd(w.rng) * 3.f);
        sid.push_back(decoy);
        tid.push_back(t);
      }
      device_vector<float> dk(keys);
      device_vector<int32_t> ds(sid), dt(tid);
      owned.back()->append(dspan<const float>(dk), dspan<const int32_t>(ds), dspan<const int32_t>(dt),
                           static_cast<int>(sid.size()), {stream});
      KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
  }
};

}  // namespace gpu_test
