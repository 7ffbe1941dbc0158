#pragma once
// A small Llama-shaped decoder for pipeline tests: L layers of RMSNorm -> Q/K/V projections ->
// RoPE -> GQA attention (through a kvscout pipeline) -> output projection -> residual; no MLP.
// Seeded random weights; every layer's cache is a padded HND kvscout layout of element T.
// Prefill runs token by token through a dense pipeline and can collect calibration samples.

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kvscout/attention/decode.hpp"
#include "kvscout/core/rope.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/score/concepts.hpp"

namespace kvtest {

template <class T, int D>
struct toy_model {
  using layout = kvscout::contiguous_layout<T, D, kvscout::hnd>;
  int L, d, Hq, H, S, max_tokens;
  kvscout::rope_config rope{D, 10000.f, kvscout::rope_style::split_half};
  std::vector<std::vector<float>> wq, wk, wv, wo, norm;  // per layer, [out, in] row-major
  std::vector<int32_t> lens;                             // [S], shared by every layer's layout
  std::vector<std::vector<T>> kc, vc;                    // per layer [S, H, max_tokens, D]
  std::vector<layout> layouts;
  // Calibration samples collected during prefill (post-RoPE): per layer q [n, Hq, D], k [n, H, D].
  bool collect = false;
  // Called at every layer just before its attention, with the layer's query in ctx.q.
  std::function<void(int, const kvscout::score_context<kvscout::host_space>&, const kvscout::current_token<T>&)> on_attend;
  // Called at every layer just after its attention, with the attention output [S, Hq, D].
  std::function<void(int, const std::vector<float>&)> on_output;
  std::vector<std::vector<float>> q_samples, k_samples;

  toy_model(int layers, int num_q_heads, int num_kv_heads, int num_seqs, int max_len, std::uint32_t seed)
      : L(layers), d(num_q_heads * D), Hq(num_q_heads), H(num_kv_heads), S(num_seqs), max_tokens(max_len) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    auto mat = [&](int out, int in, float gain) {
      std::vector<float> m(static_cast<std::size_t>(out) * in);
      for (auto& x : m) x = gain * nd(rng) / std::sqrt(static_cast<float>(in));
      return m;
    };
    for (int l = 0; l < L; ++l) {
      // A few dominant directions in W_Q / W_K make attention peaked, as in trained models.
      wq.push_back(mat(Hq * D, d, 3.f));
      wk.push_back(mat(H * D, d, 3.f));
      wv.push_back(mat(H * D, d, 1.f));
      wo.push_back(mat(d, Hq * D, 0.5f));
      std::vector<float> n(d);
      for (auto& x : n) x = 1.f + 0.1f * nd(rng);
      norm.push_back(n);
      kc.emplace_back(static_cast<std::size_t>(S) * H * max_tokens * D);
      vc.emplace_back(kc.back().size());
    }
    lens.assign(S, 0);
    for (int l = 0; l < L; ++l) layouts.push_back(layout::padded(H, max_tokens, lens.data(), S));
    q_samples.resize(L), k_samples.resize(L);
  }
  toy_model(const toy_model&) = delete;

  kvscout::kv_view<layout, kvscout::host_space> view(int l) const {
    const auto& k = kc[static_cast<std::size_t>(l)];
    const auto& v = vc[static_cast<std::size_t>(l)];
    return {layouts[static_cast<std::size_t>(l)], kvscout::as_bytes(kvscout::host_span<const T>(k.data(), k.size())),
            kvscout::as_bytes(kvscout::host_span<const T>(v.data(), v.size()))};
  }

  static void matvec(const std::vector<float>& w, const float* x, int out, int in, float* y) {
    for (int o = 0; o < out; ++o) {
      double a = 0;
      for (int i = 0; i < in; ++i) a += static_cast<double>(w[static_cast<std::size_t>(o) * in + i]) * x[i];
      y[o] = static_cast<float>(a);
    }
  }

  // One decode step of every sequence. hs [S, d] is the residual stream in and out. Layers are
  // run through `pipe` (a kvscout::decode_pipeline_host); speculation of layer i + 1 is issued
  // during layer i from layer i's normalised input, as InfiniGen does.
  // dense_only: attend densely in every layer (prefill), still feeding appends to the policy.
  template <class Pipe>
  void step(Pipe& pipe, std::vector<float>& hs, const std::vector<float>& embed, bool dense_only = false) {
    using Policy = typename Pipe::policy_type;
    const int skip = dense_only ? L : pipe.configuration().skip_layers;
    std::vector<float> xn(static_cast<std::size_t>(S) * d), q(static_cast<std::size_t>(S) * Hq * D),
        kpre(static_cast<std::size_t>(S) * H * D), kpost(kpre.size()), v(kpre.size()), out(q.size()), o(d);
    std::vector<T> kcur(kpre.size()), vcur(kpre.size());
    std::vector<int32_t> pos(lens.begin(), lens.end());
    hs = embed;
    for (int l = 0; l < L; ++l) {
      for (int s = 0; s < S; ++s) {
        const float* h = &hs[static_cast<std::size_t>(s) * d];
        double ms = 0;
        for (int i = 0; i < d; ++i) ms += static_cast<double>(h[i]) * h[i];
        const float inv = static_cast<float>(1.0 / std::sqrt(ms / d + 1e-6));
        for (int i = 0; i < d; ++i) xn[static_cast<std::size_t>(s) * d + i] = h[i] * inv * norm[l][i];
      }
      const kvscout::score_context<kvscout::host_space> early{{xn.data(), xn.size()}, {}, {pos.data(), pos.size()}, {lens.data(), lens.size()}};
      if (!Policy::needs_query && l + 1 < L && l + 1 >= skip) pipe.speculate(l + 1, early, view(l + 1));
      for (int s = 0; s < S; ++s) {
        const float* x = &xn[static_cast<std::size_t>(s) * d];
        float* qs = &q[static_cast<std::size_t>(s) * Hq * D];
        matvec(wq[l], x, Hq * D, d, qs);
        matvec(wk[l], x, H * D, d, &kpre[static_cast<std::size_t>(s) * H * D]);
        matvec(wv[l], x, H * D, d, &v[static_cast<std::size_t>(s) * H * D]);
        for (int qh = 0; qh < Hq; ++qh) kvscout::apply_rope(qs + qh * D, pos[s], rope);
        for (int h = 0; h < H; ++h) {
          float* kp = &kpost[(static_cast<std::size_t>(s) * H + h) * D];
          std::copy_n(&kpre[(static_cast<std::size_t>(s) * H + h) * D], D, kp);
          kvscout::apply_rope(kp, pos[s], rope);
        }
      }
      for (std::size_t i = 0; i < kcur.size(); ++i) {
        kcur[i] = kvscout::from_float<T>(kpost[i]);
        vcur[i] = kvscout::from_float<T>(v[i]);
      }
      if (collect) {
        q_samples[l].insert(q_samples[l].end(), q.begin(), q.end());
        k_samples[l].insert(k_samples[l].end(), kpost.begin(), kpost.end());
      }
      const kvscout::score_context<kvscout::host_space> late{{xn.data(), xn.size()}, {q.data(), q.size()}, {pos.data(), pos.size()}, {lens.data(), lens.size()}};
      const kvscout::current_token<T> cur{{kcur.data(), kcur.size()}, {vcur.data(), vcur.size()}};
      if (on_attend) on_attend(l, late, cur);
      if (l < skip) {
        kvscout::decode_attention_host(kvscout::layout_rows_host(view(l)), cur, {q.data(), q.size()},
                                       {out.data(), out.size()}, {Hq, 1.f / std::sqrt(static_cast<float>(D))});
      } else {
        pipe.attend(l, late, view(l), cur, {out.data(), out.size()});
      }
      if (on_output) on_output(l, out);
      for (int s = 0; s < S; ++s) {
        for (int h = 0; h < H; ++h) {
          const std::size_t dst = ((static_cast<std::size_t>(s) * H + h) * max_tokens + lens[s]) * D;
          std::copy_n(&kcur[(static_cast<std::size_t>(s) * H + h) * D], D, &kc[l][dst]);
          std::copy_n(&vcur[(static_cast<std::size_t>(s) * H + h) * D], D, &vc[l][dst]);
        }
        pipe.append(l, s, lens[s], &kpre[static_cast<std::size_t>(s) * H * D], &kpost[static_cast<std::size_t>(s) * H * D]);
        matvec(wo[l], &out[static_cast<std::size_t>(s) * Hq * D], d, Hq * D, o.data());
        for (int i = 0; i < d; ++i) hs[static_cast<std::size_t>(s) * d + i] += o[i];
      }
    }
    for (auto& x : lens) ++x;
  }

  // Seeded token embeddings, one [S, d] block per step.
  std::vector<float> embedding(std::uint32_t seed) const {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> e(static_cast<std::size_t>(S) * d);
    for (auto& x : e) x = nd(rng);
    return e;
  }
};

}  // namespace kvtest
