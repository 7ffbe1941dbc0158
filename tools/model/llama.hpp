#pragma once
// A Llama decoder on the CPU whose KV cache goes through kvscout's host backend: RMSNorm, RoPE
// (from the GGUF metadata), GQA attention, SwiGLU MLP, tied embeddings. Weights are dequantised to
// float once at load. Each layer's cache is a kvscout padded HND layout of element T; attention is
// kvscout::decode_attention_host, dense, or sparse through a kvscout::decode_pipeline_host
// (speculation of layer i + 1 issued during layer i, from layer i's normalised input).
//
//   kvscout::model::gguf_file file(path);
//   auto weights = kvscout::model::load_llama(file);             // ~540 MB of floats for SmolLM2
//   kvscout::model::llama_session<> session(weights, /*max_tokens=*/2048, /*threads=*/2);
//   const std::vector<float>& logits = session.step(token);      // dense
//   session.step(token, &pipeline);                              // speculative, sparse
//
// Not part of the installed library (tools/, like the GGUF reader and the tokenizer).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kvscout/attention/decode.hpp"
#include "kvscout/core/thread_pool.hpp"
#include "kvscout/core/rope.hpp"
#include "kvscout/core/simd.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/score/concepts.hpp"
#include "model/gguf.hpp"

namespace kvscout::model {

struct llama_config {
  int n_layers = 0, d_model = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int context = 0;
  float rope_theta = 10000.f;
  float rms_eps = 1e-5f;
  rope_style rope = rope_style::interleaved;  // GGUF stores Llama Q / K for adjacent-pair RoPE

  static llama_config from_gguf(const gguf_file& f) {
    const std::string arch = f.get_string("general.architecture");
    KVSCOUT_EXPECTS(arch == "llama", "general.architecture is '", arch, "', expected 'llama'");
    llama_config c;
    c.n_layers = static_cast<int>(f.get_u32("llama.block_count"));
    c.d_model = static_cast<int>(f.get_u32("llama.embedding_length"));
    c.n_heads = static_cast<int>(f.get_u32("llama.attention.head_count"));
    c.n_kv_heads = static_cast<int>(f.get_u32("llama.attention.head_count_kv"));
    c.ffn = static_cast<int>(f.get_u32("llama.feed_forward_length"));
    c.context = static_cast<int>(f.get_u32("llama.context_length"));
    c.head_dim = c.d_model / c.n_heads;
    if (f.contains("llama.rope.freq_base")) c.rope_theta = f.get_f32("llama.rope.freq_base");
    if (f.contains("llama.attention.layer_norm_rms_epsilon"))
      c.rms_eps = f.get_f32("llama.attention.layer_norm_rms_epsilon");
    c.vocab = static_cast<int>(f.tensor("token_embd.weight").ne(1));
    KVSCOUT_EXPECTS(c.n_heads % c.n_kv_heads == 0, "head_count ", c.n_heads,
                    " is not a multiple of head_count_kv ", c.n_kv_heads);
    return c;
  }
};

struct llama_layer {
  std::vector<float> attn_norm, wq, wk, wv, wo;  // W: [out, in] row-major
  std::vector<float> ffn_norm, w_gate, w_up, w_down;
};

struct llama_weights {
  llama_config cfg;
  std::vector<float> tok_embd;  // [vocab, d_model]; also the output projection (tied)
  std::vector<float> out_norm;  // [d_model]
  std::vector<llama_layer> layers;
};

inline llama_weights load_llama(const gguf_file& f) {
  llama_weights w;
  w.cfg = llama_config::from_gguf(f);
  w.tok_embd = f.dequantize("token_embd.weight");
  w.out_norm = f.dequantize("output_norm.weight");
  KVSCOUT_EXPECTS(f.find_tensor("output.weight") == nullptr,
                  "the file has an untied output.weight; this runner supports tied embeddings only");
  for (int l = 0; l < w.cfg.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    llama_layer L;
    L.attn_norm = f.dequantize(b + "attn_norm.weight");
    L.wq = f.dequantize(b + "attn_q.weight");
    L.wk = f.dequantize(b + "attn_k.weight");
    L.wv = f.dequantize(b + "attn_v.weight");
    L.wo = f.dequantize(b + "attn_output.weight");
    L.ffn_norm = f.dequantize(b + "ffn_norm.weight");
    L.w_gate = f.dequantize(b + "ffn_gate.weight");
    L.w_up = f.dequantize(b + "ffn_up.weight");
    L.w_down = f.dequantize(b + "ffn_down.weight");
    w.layers.push_back(std::move(L));
  }
  return w;
}

namespace detail {
/// y[o] = sum_i W[o, i] x[i] for rows [r0, r1).
inline void matvec_rows(const float* W, const float* x, int in, int r0, int r1, float* y) {
  kvscout::detail::dot_rows(W + static_cast<std::size_t>(r0) * in, static_cast<std::size_t>(in), x,
                            in, r1 - r0, y + r0);
}
}  // namespace detail

template <int HeadDim = 64, kv_element T = half>
class llama_session {
 public:
  using layout = contiguous_layout<T, HeadDim, hnd>;

  llama_session(const llama_weights& w, int max_tokens, int threads = 1)
      : w_(w), c_(w.cfg), max_tokens_(max_tokens), pool_(threads) {
    KVSCOUT_EXPECTS(c_.head_dim == HeadDim, "the model's head_dim is ", c_.head_dim,
                    ", this session was compiled for ", HeadDim);
    KVSCOUT_EXPECTS(max_tokens > 0 && max_tokens <= c_.context, "max_tokens = ", max_tokens,
                    " must be in [1, context_length = ", c_.context, "]");
    rope_ = {HeadDim, c_.rope_theta, c_.rope};
    rope_freq_ = rope_frequencies(rope_);
    lens_.assign(1, 0);
    const std::size_t cache = static_cast<std::size_t>(c_.n_kv_heads) * max_tokens * HeadDim;
    for (int l = 0; l < c_.n_layers; ++l) {
      k_.emplace_back(cache);
      v_.emplace_back(cache);
      layouts_.push_back(layout::padded(c_.n_kv_heads, max_tokens, lens_.data(), 1));
    }
    h_.resize(c_.d_model), xn_.resize(c_.d_model), q_.resize(static_cast<std::size_t>(c_.n_heads) * HeadDim);
    kpre_.resize(static_cast<std::size_t>(c_.n_kv_heads) * HeadDim), kpost_.resize(kpre_.size()), v_cur_.resize(kpre_.size());
    kc_.resize(kpre_.size()), vc_.resize(kpre_.size()), attn_.resize(q_.size()), o_.resize(c_.d_model);
    gate_.resize(c_.ffn), up_.resize(c_.ffn), logits_.resize(c_.vocab);
  }

  /// Called for every layer of every step with the token's RoPE'd query [n_heads, head_dim] and
  /// key [n_kv_heads, head_dim]: calibration samples for skew/ (empty: not called).
  std::function<void(int layer, const float* q, const float* k)> on_qk;

  [[nodiscard]] int position() const { return lens_[0]; }
  [[nodiscard]] const llama_config& config() const { return c_; }
  [[nodiscard]] kv_view<layout, host_space> view(int l) const {
    const auto& k = k_[static_cast<std::size_t>(l)];
    const auto& v = v_[static_cast<std::size_t>(l)];
    return {layouts_[static_cast<std::size_t>(l)], as_bytes(host_span<const T>(k.data(), k.size())),
            as_bytes(host_span<const T>(v.data(), v.size()))};
  }
  [[nodiscard]] host_span<const int32_t> seq_lens() const { return {lens_.data(), lens_.size()}; }

  /// One token through every layer with dense attention; returns the logits [vocab].
  const std::vector<float>& step(int token) { return run<void>(token, nullptr); }

  /// One token through every layer, attention through `pipe` (a decode_pipeline_host over this
  /// session's layout): layers below its skip_layers dense, the others sparse over what it fetched.
  template <class Pipe>
  const std::vector<float>& step(int token, Pipe* pipe) { return run<Pipe>(token, pipe); }

 private:
  void matvec(const std::vector<float>& W, const float* x, int out, int in, float* y) {
    pool_.run([&](int part, int parts) noexcept {
      detail::matvec_rows(W.data(), x, in, out * part / parts, out * (part + 1) / parts, y);
    });
  }
  void rmsnorm(const float* x, const std::vector<float>& g, float* y) const {
    double ms = 0;
    for (int i = 0; i < c_.d_model; ++i) ms += static_cast<double>(x[i]) * x[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ms / c_.d_model + c_.rms_eps));
    for (int i = 0; i < c_.d_model; ++i) y[i] = x[i] * inv * g[static_cast<std::size_t>(i)];
  }

  template <class Pipe>
  const std::vector<float>& run(int token, Pipe* pipe) {
    KVSCOUT_EXPECTS(token >= 0 && token < c_.vocab, "token ", token, " is out of range [0, ",
                    c_.vocab, ")");
    const int t = lens_[0];
    KVSCOUT_EXPECTS(t < max_tokens_, "the session is full: ", t, " tokens of max_tokens = ", max_tokens_);
    const int H = c_.n_kv_heads, Hq = c_.n_heads, d = c_.d_model;
    std::copy_n(&w_.tok_embd[static_cast<std::size_t>(token) * d], d, h_.data());
    int32_t pos = t;
    const float scale = 1.f / std::sqrt(static_cast<float>(HeadDim));
    for (int l = 0; l < c_.n_layers; ++l) {
      const llama_layer& L = w_.layers[static_cast<std::size_t>(l)];
      rmsnorm(h_.data(), L.attn_norm, xn_.data());
      const score_context<host_space> early{{xn_.data(), xn_.size()}, {}, {&pos, 1}, {lens_.data(), 1}};
      if constexpr (!std::is_void_v<Pipe>) {
        if (pipe != nullptr && !Pipe::policy_type::needs_query && l + 1 < c_.n_layers &&
            l + 1 >= pipe->configuration().skip_layers)
          pipe->speculate(l + 1, early, view(l + 1));
      }
      matvec(L.wq, xn_.data(), Hq * HeadDim, d, q_.data());
      matvec(L.wk, xn_.data(), H * HeadDim, d, kpre_.data());
      matvec(L.wv, xn_.data(), H * HeadDim, d, v_cur_.data());
      rope_table rt;
      rt.fill(rope_freq_, pos);
      for (int qh = 0; qh < Hq; ++qh) rotate(q_.data() + qh * HeadDim, rt);
      kpost_ = kpre_;
      for (int h = 0; h < H; ++h) rotate(kpost_.data() + h * HeadDim, rt);
      if (on_qk) on_qk(l, q_.data(), kpost_.data());
      for (std::size_t i = 0; i < kc_.size(); ++i) {
        kc_[i] = from_float<T>(kpost_[i]);
        vc_[i] = from_float<T>(v_cur_[i]);
      }
      const current_token<T> cur{{kc_.data(), kc_.size()}, {vc_.data(), vc_.size()}};
      const score_context<host_space> late{{xn_.data(), xn_.size()}, {q_.data(), q_.size()}, {&pos, 1}, {lens_.data(), 1}};
      bool done = false;
      if constexpr (!std::is_void_v<Pipe>) {
        if (pipe != nullptr) {
          pipe->attend(l, late, view(l), cur, {attn_.data(), attn_.size()});
          done = true;
        }
      }
      if (!done)
        decode_attention_host(layout_rows_host<layout>(view(l)), cur, {q_.data(), q_.size()},
                              {attn_.data(), attn_.size()}, {Hq, scale}, {}, 0, host_exec{&pool_});
      // Append the token's K / V (after attention: the cache never holds the current token
      // while it attends).
      for (int h = 0; h < H; ++h) {
        const std::size_t dst = (static_cast<std::size_t>(h) * max_tokens_ + t) * HeadDim;
        std::copy_n(&kc_[static_cast<std::size_t>(h) * HeadDim], HeadDim, &k_[static_cast<std::size_t>(l)][dst]);
        std::copy_n(&vc_[static_cast<std::size_t>(h) * HeadDim], HeadDim, &v_[static_cast<std::size_t>(l)][dst]);
      }
      if constexpr (!std::is_void_v<Pipe>) {
        if (pipe != nullptr) pipe->append(l, 0, t, kpre_.data(), kpost_.data());
      }
      matvec(L.wo, attn_.data(), d, Hq * HeadDim, o_.data());
      for (int i = 0; i < d; ++i) h_[static_cast<std::size_t>(i)] += o_[static_cast<std::size_t>(i)];
      // SwiGLU MLP.
      rmsnorm(h_.data(), L.ffn_norm, xn_.data());
      matvec(L.w_gate, xn_.data(), c_.ffn, d, gate_.data());
      matvec(L.w_up, xn_.data(), c_.ffn, d, up_.data());
      for (int i = 0; i < c_.ffn; ++i) {
        const float g = gate_[static_cast<std::size_t>(i)];
        gate_[static_cast<std::size_t>(i)] = g / (1.f + std::exp(-g)) * up_[static_cast<std::size_t>(i)];
      }
      matvec(L.w_down, gate_.data(), d, c_.ffn, o_.data());
      for (int i = 0; i < d; ++i) h_[static_cast<std::size_t>(i)] += o_[static_cast<std::size_t>(i)];
    }
    ++lens_[0];
    rmsnorm(h_.data(), w_.out_norm, xn_.data());
    matvec(w_.tok_embd, xn_.data(), c_.vocab, d, logits_.data());
    return logits_;
  }

  // RoPE of one head at the table's position, in the model's channel convention.
  void rotate(float* x, const rope_table& rt) const {
    for (int j = 0; j < HeadDim / 2; ++j) {
      const kvscout::detail::rope_plane p = kvscout::detail::rope_plane_channels(rope_, j);
      kvscout::detail::rope_rotate(x[p.a], x[p.b], rt.cs[j], rt.sn[j]);
    }
  }

  const llama_weights& w_;
  llama_config c_;
  int max_tokens_;
  thread_pool pool_;
  rope_config rope_;
  rope_frequencies rope_freq_;   // rope_'s, computed once
  std::vector<int32_t> lens_;
  std::vector<std::vector<T>> k_, v_;  // per layer [kv_heads, max_tokens, head_dim]
  std::vector<layout> layouts_;
  std::vector<float> h_, xn_, q_, kpre_, kpost_, v_cur_, attn_, o_, gate_, up_, logits_;
  std::vector<T> kc_, vc_;
};

}  // namespace kvscout::model
