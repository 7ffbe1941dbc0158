#pragma once
// Layer-major, teacher-forced evaluation of a Llama model whose attention goes through kvscout's
// speculation policies and selectors (the accuracy harness, tools/accuracy/).
//
// For a fixed token sequence [T], layer l is computed for all T tokens at once: the Q / K / V / O
// and MLP projections are GEMMs (Eigen), then attention runs per token t, in order, over the
// tokens the policy selected for (t, l) plus the current token. This equals step-by-step decoding
// with speculation (llama_session + decode_pipeline_host): token t's K / V at layer l depend only
// on token t's own hidden state at layer l - 1, which already holds its sparse attention of the
// earlier layers; speculation for layer l at step t reads layer l - 1's normalised input of token
// t (kept from the previous layer); H2O's accumulated attention is a running sum over the earlier
// steps of the layer (tokens run in order within a layer). Layers below skip_layers attend densely
// and are computed once per KV format, then shared by every configuration.
//
// Attention of a block of B query tokens and one KV head: logits by one GEMM against the keys
// [0, t_end) (the KV cache as stored: fp16-rounded, or KIVI rows dequantised as
// attention/kivi_rows.hpp reads them, by KIVI's rule: keys and values each with its own
// full-precision window, kv/kivi.hpp), then per token the
// policy's scores, the selector, and the softmax over the selected rows, written as a sparse row
// of P; the output is one GEMM P x V. Quantities a step does not see (keys >= t) are masked.
//
//   kvscout::model::layer_major_eval ev(weights, tokens);
//   kvscout::model::eval_result r = ev.run({.policy = kvscout::model::eval_policy::infinigen,
//                                           .budget = 0.1, .plans = &plans, .score_from = T / 2});
//
// Not part of the installed library (tools/). Needs Eigen.

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvscout/attention/kivi_rows.hpp"
#include "kvscout/cache/host_pool.hpp"
#include "kvscout/core/detail/host_vec.hpp"
#include "kvscout/core/rope.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/eval/metrics.hpp"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/kivi.hpp"
#include "kvscout/select/budgets.hpp"
#include "kvscout/select/correction.hpp"
#include "kvscout/select/pooled.hpp"
#include "kvscout/select/threshold.hpp"
#include "kvscout/select/topk.hpp"
#include "kvscout/skew/detail/eigen.hpp"
#include "kvscout/skew/plan.hpp"
#include "kvscout/score/h2o.hpp"
#include "kvscout/score/infinigen.hpp"
#include "kvscout/score/oracle.hpp"
#include "kvscout/score/quest.hpp"
#include "kvscout/score/streaming.hpp"
#include "model/llama.hpp"

namespace kvscout::model {

/// How the KV cache is stored (and therefore what attention reads and a fetch moves).
// fp32: no rounding (validation only). fp8: e4m3 rows, one scale per layer for K and one for V,
// the layer's largest |value| over the text mapped to 448 (a calibration on the evaluated text).
enum class kv_format { fp16, kivi2, kivi4, fp32, fp8 };
inline constexpr int kv_format_count = 5;
/// Which tokens attention reads at each (step, layer >= skip_layers).
enum class eval_policy { dense, oracle, infinigen, quest, h2o, streaming };

inline const char* to_string(kv_format f) {
  switch (f) {
    case kv_format::fp16: return "fp16";
    case kv_format::kivi2: return "kivi2";
    case kv_format::kivi4: return "kivi4";
    case kv_format::fp32: return "fp32";
    case kv_format::fp8: return "fp8";
  }
  return "?";
}
inline const char* to_string(eval_policy p) {
  switch (p) {
    case eval_policy::dense: return "dense";
    case eval_policy::oracle: return "oracle";
    case eval_policy::infinigen: return "infinigen";
    case eval_policy::quest: return "quest";
    case eval_policy::h2o: return "h2o";
    case eval_policy::streaming: return "streaming";
  }
  return "?";
}
inline const char* to_string(gqa_aggregation a) {
  switch (a) {
    case gqa_aggregation::max_logit: return "max_logit";
    case gqa_aggregation::mean_logit: return "mean_logit";
    case gqa_aggregation::sum_prob: return "sum_prob";
  }
  return "?";
}

struct eval_options {
  eval_policy policy = eval_policy::dense;
  kv_format format = kv_format::fp16;
  /// Per-step cap per KV head: max(ceil(budget * t), keep.sinks + keep.recent) of the t cached
  /// tokens, keep-set included; a row with no more tokens than that attends to all of them.
  double budget = 1.0;
  /// Always selected: sinks and a recent window. For h2o, sinks + recent = cap / 2 instead
  /// (H2O's heavy / recent split: recent = cap / 2 - sinks).
  keep_set keep{4, 16};
  // infinigen
  const std::vector<std::vector<skew_plan>>* plans = nullptr;  // [layer][kv head], empty below skip
  gqa_aggregation aggregation = gqa_aggregation::max_logit;
  /// The correction step (kvscout's; select/correction.hpp): at each step, layer l's own query
  /// scored against the partial keys (infinigen_policy_host::score_query) ranks the rows the
  /// speculation did not select, and the best are added up to max(ceil((budget + correct) * t),
  /// keep) rows in all. 0: no correction.
  double correct = 0;
  /// Score with layer l's own query instead of speculating from layer l - 1's input (the
  /// correction's ranking alone: what a perfect layer-ahead prediction of the query would give
  /// with these partial keys). A diagnostic, not a schedule a pipeline can run ahead of layer l.
  bool late_scores = false;
  /// The GQA aggregation of the late ranking (the correction step's and late_scores'), where it
  /// differs from `aggregation` (the speculation's): infinigen_config::query_aggregation.
  std::optional<gqa_aggregation> late_aggregation{};
  /// Ranking keys quantised (a diagnostic of what a quantised partial key cache would rank like):
  /// 0, the partial keys in float; b in [2, 8], each complete group of rank_key_group tokens'
  /// keys quantised per channel to b bits (KIVI's key scheme: asymmetric, the group's min and
  /// max), the incomplete group's in float, as KIVI keeps its newest tokens. rope_planes plans
  /// only (their partial keys are channels of the key, so quantising the key per channel is
  /// quantising the partial keys).
  int rank_key_bits = 0;
  int rank_key_group = 32;
  /// With rank_key_bits: keep the keys in the library's quantised cache
  /// (infinigen_policy_host<quantized_keys<rank_key_bits>>, groups of 32) instead of simulating it.
  bool library_keys = false;
  /// Plans of the late ranking (the correction step's and late_scores'), where it reads more
  /// channels than the speculation; null: the speculation's plans. With library_keys, one
  /// policy's cache read at two widths (infinigen_policy_host's correction plans); otherwise a
  /// second policy over the same keys (float keys, or the simulated quantisation).
  const std::vector<std::vector<skew_plan>>* late_plans = nullptr;
  float alpha = -1.f;  // < 0: exact top-k at the cap; >= 0: threshold selector (max - alpha), capped
  /// Head-pooled top-k (kvscout's; select/pooled.hpp): the KV heads of a step share cap * H rows
  /// (each keeps its keep-set), compared by each head's softmax of the scores (logit scale), or
  /// as they are where they are attention mass (the oracle, sum_prob). Top-k only (alpha < 0).
  /// The metrics' oracle (recall_oracle, overlap) is then pooled too: the same rule, exact scores.
  bool pool_heads = false;
  pooled_rule pool_rule = pooled_rule::mass;  // the most mass in all, or equal coverage per head
  /// Per-layer budgets (kvscout's; issue 32 part 2): layer l's cap is budget * layer_shares[l]
  /// (and the correction's total (budget + correct) * layer_shares[l]); null: 1 everywhere.
  const std::vector<double>* layer_shares = nullptr;
  /// The oracle's attention-mass curves (for layer_shares): at steps t in [curve_from, curve_to)
  /// with t % 16 == 0, each layer's exact group mass sorted, and the share of it the top
  /// ceil(b / curve_bins * n) rows hold, b = 1..curve_bins, summed into eval_result::mass_curve.
  int curve_bins = 0;
  int curve_from = 0, curve_to = 0;
  /// The curves of the rows outside the keep-set only (the mass a selection decides about; the
  /// sinks' often large mass is always kept).
  bool curve_outside_keep = false;
  threshold_rule rule = threshold_rule::per_head;
  /// A bounded host pool (kvscout::host_pool, issue 31) at layers >= skip_layers: each (layer,
  /// KV head) holds at most pool_tokens cached tokens (0: unbounded); evicted tokens are gone
  /// for good: their scores are NaN before selection, and they are dropped from any selection
  /// (the keep-set's, a full one) before attention reads it. The keep-set's sinks are pinned.
  /// fp16 / fp32 / fp8 only.
  int pool_tokens = 0;
  eviction pool_eviction = eviction::counter;
  // quest
  int quest_page = 16;
  // KIVI
  int kivi_group = 32;
  int kivi_residual = 128;
  /// KIVI only: the steps before score_from (the prompt) attend to every row in fp16 and the
  /// cache is quantised from there on, as KIVI's own evaluation runs the prompt in full precision
  /// and only then quantises its cache. false: quantised from token 0, which is harsher (the
  /// prompt's own hidden states, and so its keys and values, already carry the quantisation).
  bool kivi_fp16_prompt = false;
  /// Negative log-likelihood of the predictions made at positions [score_from, T - 1); bytes and
  /// rows fetched are counted over the same steps.
  int score_from = 0;
  /// Steps t < sparse_from attend to every cached row, whatever the policy: a dense prefill, as
  /// an engine runs a prompt before it decodes. The policy still receives every token's keys, and
  /// its selection starts at step sparse_from. 0: every step through the policy.
  int sparse_from = 0;
  /// Attention-mass recall and overlap with the oracle every metric_every-th step >= metric_from
  /// (0: none).
  int metric_every = 0;
  int metric_from = 0;
  /// Every k-th step of every layer, the oracle's driver-computed scores are compared with
  /// kvscout::oracle_policy_host::score on the same cache (fp16 only; 0: never).
  int check_oracle_every = 0;
};

// The infinigen policy the evaluation drives, whatever its partial-key format (float, or the
// library's quantised cache: eval_options::library_keys).
struct infinigen_scorer {
  virtual ~infinigen_scorer() = default;
  virtual void score(int layer, const score_context<host_space>& ctx, const score_buffer<host_space>& out) = 0;
  virtual void score_query(int layer, const score_context<host_space>& ctx, const score_buffer<host_space>& out) = 0;
  virtual void append(int layer, int s, int t, const float* k_pre, const float* k_post) = 0;
};
template <class PkT>
struct infinigen_scorer_of final : infinigen_scorer {
  policy_layers<infinigen_policy_host<PkT>> p;  // one per speculated layer
  infinigen_scorer_of(const infinigen_config& c, const std::vector<std::vector<skew_plan>>& plans,
                      const std::vector<host_span<const float>>& wq, const std::vector<host_span<const float>>& bq)
      : p(infinigen_policy_host<PkT>::layers(c, plans, wq, bq)) {}
  // One cache read at two widths: score() reads plans' channels, score_query() wide's.
  infinigen_scorer_of(const infinigen_config& c, const std::vector<std::vector<skew_plan>>& plans,
                      const std::vector<std::vector<skew_plan>>& wide,
                      const std::vector<host_span<const float>>& wq, const std::vector<host_span<const float>>& bq)
      : p(infinigen_policy_host<PkT>::layers(c, plans, wide, wq, bq)) {}
  void score(int l, const score_context<host_space>& ctx, const score_buffer<host_space>& out) override {
    p.score(l, ctx, out);
  }
  void score_query(int l, const score_context<host_space>& ctx, const score_buffer<host_space>& out) override {
    p.score_query(l, ctx, out);
  }
  void append(int l, int s, int t, const float* k_pre, const float* k_post) override {
    p.append(l, s, t, k_pre, k_post);
  }
};

struct eval_result {
  double nll = 0;  // summed over the scored predictions
  int scored = 0;
  int correct = 0;                   // scored predictions whose argmax is the next token
  std::vector<std::int32_t> predicted;  // argmax of each scored prediction, in order
  std::vector<double> token_nll;        // negative log-likelihood of each scored prediction
  std::vector<double> rows_fetched;  // [layer] rows fetched over the scored steps (all KV heads)
  std::vector<double> rows_dense;    // [layer] rows a full fetch would move over the same steps
  std::vector<double> rows_corrected;  // [layer] of rows_fetched, those the correction step added
  std::vector<double> mass_curve;      // [layer, curve_bins] summed (eval_options::curve_bins)
  std::vector<int> curve_samples;      // [layer] (step, kv head) samples summed there
  std::vector<double> recall;        // [layer] summed attention-mass recall of the selection
  std::vector<double> recall_oracle; // [layer] summed recall of the oracle's top-k, same cap
  std::vector<double> overlap;       // [layer] summed |selection n oracle| / |oracle|
  std::vector<int> samples;          // [layer] (step, kv head) samples of the three above
  double row_bytes = 0;              // bytes of one fetched K + V row (one token, one KV head)
  double oracle_check_max_rel = 0;   // largest relative difference seen by check_oracle_every
  int oracle_checks = 0;
  double seconds = 0;

  [[nodiscard]] double ppl() const { return scored > 0 ? std::exp(nll / scored) : 0.0; }
  /// Rows fetched over rows a full fetch moves, over the given layers.
  [[nodiscard]] double fetch_fraction(int from_layer) const {
    double a = 0, b = 0;
    for (std::size_t l = static_cast<std::size_t>(from_layer); l < rows_fetched.size(); ++l)
      a += rows_fetched[l], b += rows_dense[l];
    return b > 0 ? a / b : 0.0;
  }
  /// Mean over layers >= from_layer of the per-layer means.
  [[nodiscard]] double mean_of(const std::vector<double>& v, int from_layer) const {
    double s = 0;
    int n = 0;
    for (std::size_t l = static_cast<std::size_t>(from_layer); l < v.size(); ++l)
      if (samples[l] > 0) s += v[l] / samples[l], ++n;
    return n > 0 ? s / n : 0.0;
  }
};

namespace detail {

/// out[i] = exp(x[i] - m) for x[i] - m <= 0 (clamped at -87), relative error ~2e-7; written
/// without branches or calls so that the compiler vectorises it.
inline void exp_shifted(const float* x, float m, int n, float* out) {
  for (int i = 0; i < n; ++i) {
    float y = x[i] - m;
    y = y < -87.f ? -87.f : y;
    const float k = (y * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round to nearest
    const float r = y - k * 0.693359375f - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    const std::int32_t e = (static_cast<std::int32_t>(k) + 127) << 23;
    out[i] = p * std::bit_cast<float>(e);
  }
}

// The library's row maximum (largest non-NaN, -inf for none).
inline float max_of(const float* x, int n) { return kvscout::detail::max_non_nan(x, n); }

}  // namespace detail

class layer_major_eval {
 public:
  using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  static constexpr int D = 64;  // head_dim (SmolLM2); checked against the weights
  static constexpr int block = 64;  // query tokens per attention GEMM

  /// Called in every layer of every run with [T, Hq * D] queries and [T, H * D] keys, after and
  /// before RoPE: calibration samples for skew/ (empty: not called).
  std::function<void(int layer, const row_matrix& q_post, const row_matrix& k_post,
                     const row_matrix& q_pre, const row_matrix& k_pre)>
      on_qk;

  layer_major_eval(const llama_weights& w, std::vector<int32_t> tokens, int skip_layers = 2)
      : w_(w), c_(w.cfg), tokens_(std::move(tokens)), skip_(skip_layers) {
    KVSCOUT_EXPECTS(c_.head_dim == D, "layer_major_eval is built for head_dim ", D, ", the model has ",
                    c_.head_dim);
    KVSCOUT_EXPECTS(!tokens_.empty() && static_cast<int>(tokens_.size()) <= c_.context,
                    "token count ", tokens_.size(), " must be in [1, ", c_.context, "]");
    KVSCOUT_EXPECTS(skip_layers >= 1 && skip_layers < c_.n_layers, "skip_layers = ", skip_layers,
                    " must be in [1, ", c_.n_layers, ")");
    for (int id : tokens_)
      KVSCOUT_EXPECTS(id >= 0 && id < c_.vocab, "token ", id, " is out of range [0, ", c_.vocab, ")");
    rope_ = {D, c_.rope_theta, c_.rope};
    rope_freq_ = rope_frequencies(rope_);
    T_ = static_cast<int>(tokens_.size());
  }

  [[nodiscard]] int tokens() const { return T_; }
  [[nodiscard]] int skip_layers() const { return skip_; }
  /// The normalised final hidden states of the last run, [T, d_model] (logits = h . tok_embd^T).
  [[nodiscard]] const row_matrix& final_hidden() const { return final_; }

  /// Logits of position t from the last run, [vocab].
  [[nodiscard]] std::vector<float> logits(int t) const {
    std::vector<float> out(static_cast<std::size_t>(c_.vocab));
    for (int v = 0; v < c_.vocab; ++v)
      out[static_cast<std::size_t>(v)] =
          kvscout::detail::dot(&w_.tok_embd[static_cast<std::size_t>(v) * c_.d_model], &final_(t, 0), c_.d_model);
    return out;
  }

  eval_result run(const eval_options& o) {
    const auto t_start = std::chrono::steady_clock::now();
    KVSCOUT_EXPECTS(o.budget > 0 && o.budget <= 1, "budget ", o.budget, " must be in (0, 1]");
    KVSCOUT_EXPECTS(o.sparse_from >= 0 && o.sparse_from <= T_, "sparse_from ", o.sparse_from,
                    " must be in [0, ", T_, "], the sequence's tokens");
    KVSCOUT_EXPECTS(o.policy != eval_policy::infinigen || o.plans != nullptr,
                    "the infinigen policy needs skew plans");
    KVSCOUT_EXPECTS(o.correct >= 0 && o.budget + o.correct <= 1, "correct ", o.correct,
                    " must be in [0, 1 - budget = ", 1 - o.budget, "]");
    KVSCOUT_EXPECTS((o.correct == 0 && !o.late_scores) || o.policy == eval_policy::infinigen,
                    "correct / late_scores need the infinigen policy, got ", to_string(o.policy));
    KVSCOUT_EXPECTS(o.rank_key_bits == 0 || (o.policy == eval_policy::infinigen && o.rank_key_bits >= 2 &&
                                             o.rank_key_bits <= 8 && o.rank_key_group >= 1),
                    "rank_key_bits = ", o.rank_key_bits, " (group ", o.rank_key_group,
                    "): expected 0, or 2..8 bits with the infinigen policy and a group >= 1");
    if (o.rank_key_bits > 0)
      for (const auto* plans : {o.plans, o.late_plans}) {
        if (plans == nullptr) continue;
        for (const auto& layer : *plans)
          for (const skew_plan& p : layer)
            KVSCOUT_EXPECTS(p.mode == rope_mode::rope_planes, "rank_key_bits needs rope_planes plans, got ",
                            to_string(p.mode));
      }
    KVSCOUT_EXPECTS(!o.library_keys || ((o.rank_key_bits == 2 || o.rank_key_bits == 4 || o.rank_key_bits == 8) &&
                                        o.rank_key_group == 32),
                    "library_keys needs rank_key_bits 2, 4 or 8 and rank_key_group 32, got ", o.rank_key_bits,
                    " and ", o.rank_key_group);
    KVSCOUT_EXPECTS(o.correct == 0 || o.pool_tokens == 0, "correct = ", o.correct,
                    " with a bounded host pool (pool_tokens = ", o.pool_tokens, ") is not supported");
    const int L = c_.n_layers, H = c_.n_kv_heads;
    KVSCOUT_EXPECTS(o.layer_shares == nullptr || o.layer_shares->size() == static_cast<std::size_t>(L),
                    "layer_shares holds ", o.layer_shares ? o.layer_shares->size() : 0, " entries, expected ",
                    L, " (one per layer)");
    KVSCOUT_EXPECTS(o.curve_bins == 0 || o.policy == eval_policy::oracle, "curve_bins = ", o.curve_bins,
                    " needs the oracle policy, got ", to_string(o.policy));
    KVSCOUT_EXPECTS(!o.pool_heads || o.alpha < 0 || o.policy != eval_policy::infinigen, "pool_heads with alpha = ",
                    o.alpha, ": the pooled selector is top-k only (alpha < 0)");
    eval_result r;
    r.rows_fetched.assign(static_cast<std::size_t>(L), 0);
    r.rows_dense.assign(static_cast<std::size_t>(L), 0);
    r.rows_corrected.assign(static_cast<std::size_t>(L), 0);
    r.mass_curve.assign(static_cast<std::size_t>(L) * static_cast<std::size_t>(std::max(0, o.curve_bins)), 0);
    r.curve_samples.assign(static_cast<std::size_t>(L), 0);
    r.recall.assign(static_cast<std::size_t>(L), 0);
    r.recall_oracle.assign(static_cast<std::size_t>(L), 0);
    r.overlap.assign(static_cast<std::size_t>(L), 0);
    r.samples.assign(static_cast<std::size_t>(L), 0);
    r.row_bytes = static_cast<double>(row_bytes(o));

    run_state st(*this, o);
    // Layers below skip_layers: dense, shared by every configuration of the format.
    prefix& p = prefix_of(o);
    st.h = p.h;
    st.xprev = p.xprev;
    for (int l = skip_; l < L; ++l) layer(l, st, r);
    // The dense layers fetch every cached row at every step.
    for (int l = 0; l < skip_; ++l)
      for (int t = std::max(o.score_from, 0); t < T_ - 1; ++t) {
        r.rows_dense[static_cast<std::size_t>(l)] += static_cast<double>(H) * visible(o, t);
        r.rows_fetched[static_cast<std::size_t>(l)] += static_cast<double>(H) * visible(o, t);
      }
    finish(st, r);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    return r;
  }

  /// Bytes of one fetched K + V row of a KV head in the given format (the layout's row sizes).
  [[nodiscard]] std::size_t row_bytes(const eval_options& o) const {
    const int32_t len = 0;
    const kivi_options ko{o.kivi_group, o.kivi_residual};
    switch (o.format) {
      case kv_format::fp32: return 2 * D * sizeof(float);
      case kv_format::fp16: {
        const auto l = contiguous_layout<half, D, hnd>::padded(1, 1, &len, 1);
        return l.k_row_bytes() + l.v_row_bytes();
      }
      case kv_format::fp8: {
        const auto l = contiguous_layout<fp8_e4m3, D, hnd>::padded(1, 1, &len, 1);
        return l.k_row_bytes() + l.v_row_bytes();
      }
      case kv_format::kivi2: {
        const auto l = kivi_layout<half, D, 2>::padded(1, 0, &len, 1, ko);
        return l.k_row_bytes() + l.v_row_bytes();
      }
      case kv_format::kivi4: {
        const auto l = kivi_layout<half, D, 4>::padded(1, 0, &len, 1, ko);
        return l.k_row_bytes() + l.v_row_bytes();
      }
    }
    return 0;
  }

 private:
  struct prefix {
    bool done = false;
    int group = 0, residual = 0, score_from = 0;
    row_matrix h, xprev;
  };

  // Everything one run owns: activations, the layer's cache copies, the policies.
  struct run_state {
    const eval_options& o;
    row_matrix h, xprev, xn, q, kpre, kpost, v, attn, tmp, gate, up, qpre;
    row_matrix kf, vf, kq, vq;  // [H * T, D] per head blocks: fp16-rounded / dequantised rows
    std::vector<float> scores;  // [H, T]
    std::vector<int32_t> sel_idx, sel_cnt, orc_idx, orc_cnt;  // [H, T], [H]
    std::vector<int32_t> attended;                               // [T + 1]
    std::vector<float> e, probs, oscore;                         // scratch
    std::vector<std::byte> sel_ws;
    // The correction step: late scores [H, T], added rows [H, T] / [H], a merge row [T].
    std::vector<float> late;
    std::vector<int32_t> add_idx, add_cnt, merged;
    std::vector<std::byte> corr_ws;
    std::unique_ptr<infinigen_scorer> ig;
    std::unique_ptr<infinigen_scorer> ig_late;  // o.late_plans: the late ranking's policy
    infinigen_scorer& late_policy() { return ig_late ? *ig_late : *ig; }
    row_matrix kgroup;                            // o.rank_key_bits: one quantised group [G, H * D]
    std::unique_ptr<quest_policy_host<D>> quest;
    std::unique_ptr<h2o_policy_host> h2o;
    std::unique_ptr<streaming_policy_host> stream;
    std::unique_ptr<host_pool> pool;  // o.pool_tokens > 0
    std::vector<row_matrix> lg;  // [H] logits / probabilities of one block [block * g, T]

    run_state(const layer_major_eval& ev, const eval_options& opt) : o(opt) {
      const int T = ev.T_, H = ev.c_.n_kv_heads, Hq = ev.c_.n_heads, L = ev.c_.n_layers;
      const int g = Hq / H;
      scores.assign(static_cast<std::size_t>(H) * T, 0.f);
      sel_idx.assign(static_cast<std::size_t>(H) * T, 0);
      orc_idx.assign(sel_idx.size(), 0);
      sel_cnt.assign(static_cast<std::size_t>(H), 0);
      orc_cnt.assign(sel_cnt.size(), 0);
      attended.assign(static_cast<std::size_t>(T) + 1, 0);
      e.assign(static_cast<std::size_t>(g) * (T + 1), 0.f);
      probs.assign(static_cast<std::size_t>(T) + 1, 0.f);
      oscore.assign(static_cast<std::size_t>(T) + 1, 0.f);
      // Either selector runs in this workspace: the larger of the two (infinigen_mean also keeps
      // 8 bytes per row).
      const topk_selector_host::config sc{{.num_seqs = 1, .num_kv_heads = H,
                                           .max_tokens = T}, T, T,
                                          {}};
      const threshold_selector_host::config tc{{.num_seqs = 1, .num_kv_heads = H,
                                                .max_tokens = T},
                                               T, 0.f, T, threshold_rule::infinigen_mean, {}};
      const pooled_topk_selector_host::config pc{{.num_seqs = 1, .num_kv_heads = H,
                                                  .max_tokens = T}, T, T, {}, pooled_scale::logit};
      sel_ws.resize(std::max({topk_selector_host::workspace_bytes(sc),
                              threshold_selector_host::workspace_bytes(tc),
                              pooled_topk_selector_host::workspace_bytes(pc)}));
      lg.resize(static_cast<std::size_t>(H));
      for (auto& m : lg) m.resize(block * g, T);
      if (opt.correct > 0) {
        late.assign(scores.size(), 0.f);
        add_idx.assign(sel_idx.size(), 0);
        add_cnt.assign(sel_cnt.size(), 0);
        merged.assign(static_cast<std::size_t>(T), 0);
        corr_ws.resize(correction_selector_host::workspace_bytes({{.num_seqs = 1, .num_kv_heads = H,
                                                                  .max_tokens = T}, T, T}));
      }
      const float scale = 1.f / std::sqrt(static_cast<float>(D));
      switch (opt.policy) {
        case eval_policy::infinigen: {
          std::vector<host_span<const float>> wq, bq(static_cast<std::size_t>(L));
          for (const auto& layer : ev.w_.layers) wq.push_back({layer.wq.data(), layer.wq.size()});
          infinigen_config ic{.shape = {.num_layers = L, .num_seqs = 1, .num_kv_heads = H,
                               .num_q_heads = Hq, .head_dim = D, .d_model = ev.c_.d_model,
                               .max_tokens = T, .scale = scale},
                              .aggregation = opt.aggregation};
          ic.query_aggregation = opt.late_aggregation;
          const auto make = [&](const std::vector<std::vector<skew_plan>>& plans) -> std::unique_ptr<infinigen_scorer> {
            if (opt.library_keys) {
              // With late plans, one cache for both widths.
              const auto one = [&](auto tag) -> std::unique_ptr<infinigen_scorer> {
                using scorer = infinigen_scorer_of<decltype(tag)>;
                if (opt.late_plans != nullptr) return std::make_unique<scorer>(ic, plans, *opt.late_plans, wq, bq);
                return std::make_unique<scorer>(ic, plans, wq, bq);
              };
              if (opt.rank_key_bits == 2) return one(quantized_keys<2>{});
              if (opt.rank_key_bits == 4) return one(quantized_keys<4>{});
              return one(quantized_keys<8>{});
            }
            return std::make_unique<infinigen_scorer_of<float>>(ic, plans, wq, bq);
          };
          ig = make(*opt.plans);
          if (opt.late_plans != nullptr && !opt.library_keys) ig_late = make(*opt.late_plans);
          if (opt.rank_key_bits > 0 && !opt.library_keys) kgroup.resize(opt.rank_key_group, H * D);
          break;
        }
        case eval_policy::quest:
          quest = std::make_unique<quest_policy_host<D>>(
              quest_policy_host<D>::config{{.num_layers = L, .num_seqs = 1,
                                            .num_kv_heads = H, .num_q_heads = Hq, .max_tokens = T,
                                            .scale = scale},
                                           opt.quest_page, opt.aggregation});
          break;
        case eval_policy::h2o:
          h2o = std::make_unique<h2o_policy_host>(h2o_policy_host::config{{.num_layers = L,
                                                                           .num_seqs = 1,
                                                                           .num_kv_heads = H,
                                                                           .max_tokens = T}});
          break;
        case eval_policy::streaming:
          stream = std::make_unique<streaming_policy_host>(
              streaming_policy_host::config{{.num_kv_heads = H}, opt.keep.sinks});
          break;
        default:
          break;
      }
      if (opt.pool_tokens > 0) {
        KVSCOUT_EXPECTS(opt.format != kv_format::kivi2 && opt.format != kv_format::kivi4,
                        "the host pool (pool_tokens = ", opt.pool_tokens, ") needs an fp16, fp32 "
                        "or fp8 cache, got ", to_string(opt.format));
        pool = std::make_unique<host_pool>(host_pool::config{{.num_layers = L,
                                                              .num_seqs = 1, .num_kv_heads = H,
                                                              .max_tokens = T},
                                                             std::min(opt.pool_tokens, T),
                                                             opt.pool_eviction, opt.keep.sinks});
      }
    }
  };

  // At step t (t cached tokens, the current token excluded): how many have a quantised key, a
  // quantised value, and both (the rows a selector sees and an executor fetches; the rest, the
  // window, is resident and always attended). KIVI's rule, as the layout states it
  // (kv/kivi.hpp); every row of fp16, fp32 and fp8 is visible and none quantised this way.
  struct kivi_lens {
    int keys = 0, values = 0, visible = 0;
  };
  [[nodiscard]] static kivi_lens kivi_at(const eval_options& o, int t) {
    if (o.format != kv_format::kivi2 && o.format != kv_format::kivi4) return {0, 0, t};
    // The prompt in fp16: every row resident and unquantised (dense attention) before score_from.
    if (o.kivi_fp16_prompt && t < o.score_from) return {0, 0, 0};
    const int32_t len = 0;
    const auto l = kivi_layout<half, D, 2>::padded(1, 0, &len, 1, {o.kivi_group, o.kivi_residual});
    return {l.key_quantized_len_for(t), l.value_quantized_len_for(t), l.quantized_len_for(t)};
  }
  [[nodiscard]] static int visible(const eval_options& o, int t) { return kivi_at(o, t).visible; }
  [[nodiscard]] static double share(const eval_options& o, int l) {
    return o.layer_shares ? (*o.layer_shares)[static_cast<std::size_t>(l)] : 1.0;
  }
  [[nodiscard]] static int cap(const eval_options& o, int t, int l) {
    const int keep = o.keep.sinks + o.keep.recent;
    const int b = static_cast<int>(std::ceil(o.budget * share(o, l) * t - 1e-9));
    return std::max(b, keep);
  }

  // The rows of step t moved in all with a correction step: max(ceil((budget + correct) t),
  // keep), at most the n visible ones.
  [[nodiscard]] static int total_cap(const eval_options& o, int t, int n, int l) {
    return std::min(n, std::max(static_cast<int>(std::ceil((o.budget + o.correct) * share(o, l) * t - 1e-9)),
                                o.keep.sinks + o.keep.recent));
  }

  // The oracle's scores of step t (st.scores, [H, T], group mass) as mass curves.
  void add_curve(int l, int n, run_state& st, eval_result& r) const {
    const int H = c_.n_kv_heads, B = st.o.curve_bins;
    const kvscout::detail::keep_range kr = st.o.curve_outside_keep
                                               ? kvscout::detail::keep_bounds(st.o.keep, n)
                                               : kvscout::detail::keep_range{0, n};
    for (int h = 0; h < H; ++h) {
      kvscout::detail::add_mass_curve(
          {st.scores.data() + static_cast<std::size_t>(h) * T_ + kr.head_end,
           static_cast<std::size_t>(kr.tail_begin - kr.head_end)},
          {st.e.data(), st.e.size()},
          {r.mass_curve.data() + static_cast<std::size_t>(l) * B, static_cast<std::size_t>(B)});
      ++r.curve_samples[static_cast<std::size_t>(l)];
    }
  }

  prefix& prefix_of(const eval_options& o) {
    const bool fp16_prompt = o.kivi_fp16_prompt && (o.format == kv_format::kivi2 || o.format == kv_format::kivi4);
    prefix& p = prefixes_[fp16_prompt ? 1 : 0][static_cast<int>(o.format)];
    if (!p.done || p.group != o.kivi_group || p.residual != o.kivi_residual || p.score_from != o.score_from) {
      eval_options d;
      d.format = o.format;
      d.kivi_group = o.kivi_group;
      d.kivi_residual = o.kivi_residual;
      d.kivi_fp16_prompt = fp16_prompt;
      d.score_from = o.score_from;
      eval_result dummy;
      dummy.rows_fetched.assign(static_cast<std::size_t>(c_.n_layers), 0);
      dummy.rows_dense = dummy.recall = dummy.recall_oracle = dummy.overlap = dummy.rows_fetched;
      dummy.samples.assign(static_cast<std::size_t>(c_.n_layers), 0);
      run_state st(*this, d);
      st.h.resize(T_, c_.d_model);
      for (int t = 0; t < T_; ++t)
        std::copy_n(&w_.tok_embd[static_cast<std::size_t>(tokens_[static_cast<std::size_t>(t)]) * c_.d_model],
                    c_.d_model, &st.h(t, 0));
      for (int l = 0; l < skip_; ++l) layer(l, st, dummy);
      p.h = st.h;
      p.xprev = st.xprev;
      p.group = o.kivi_group;
      p.residual = o.kivi_residual;
      p.score_from = o.score_from;
      p.done = true;
    }
    return p;
  }

  void rmsnorm(const row_matrix& x, const std::vector<float>& g, row_matrix& y) const {
    y.resize(x.rows(), x.cols());
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      double ms = 0;
      for (int i = 0; i < c_.d_model; ++i) ms += static_cast<double>(x(t, i)) * x(t, i);
      const float inv = static_cast<float>(1.0 / std::sqrt(ms / c_.d_model + c_.rms_eps));
      for (int i = 0; i < c_.d_model; ++i) y(t, i) = x(t, i) * inv * g[static_cast<std::size_t>(i)];
    }
  }

  static void project(const row_matrix& x, const std::vector<float>& W, int out, row_matrix& y) {
    const Eigen::Map<const row_matrix> w(W.data(), out, x.cols());
    y.resize(x.rows(), out);
    y.noalias() = x * w.transpose();
  }

  void rotate(float* x, const rope_table& rt) const {
    for (int j = 0; j < D / 2; ++j) {
      const kvscout::detail::rope_plane p = kvscout::detail::rope_plane_channels(rope_, j);
      kvscout::detail::rope_rotate(x[p.a], x[p.b], rt.cs[j], rt.sn[j]);
    }
  }

  void layer(int l, run_state& st, eval_result& r) {
    const llama_layer& W = w_.layers[static_cast<std::size_t>(l)];
    const int H = c_.n_kv_heads, Hq = c_.n_heads, d = c_.d_model;
    rmsnorm(st.h, W.attn_norm, st.xn);
    project(st.xn, W.wq, Hq * D, st.q);
    project(st.xn, W.wk, H * D, st.kpre);
    project(st.xn, W.wv, H * D, st.v);
    if (on_qk) st.qpre = st.q;
    st.kpost = st.kpre;
    rope_table rt;
    for (int t = 0; t < T_; ++t) {
      rt.fill(rope_freq_, t);
      for (int qh = 0; qh < Hq; ++qh) rotate(&st.q(t, qh * D), rt);
      for (int h = 0; h < H; ++h) rotate(&st.kpost(t, h * D), rt);
    }
    if (on_qk) on_qk(l, st.q, st.kpost, st.qpre, st.kpre);
    // The cache as stored: fp16 rows, [H * T, D] (head h's rows at h * T). An fp8 cache holds
    // the fp16 rows divided by the layer's scale, rounded to e4m3; attention reads them times it.
    st.kf.resize(static_cast<Eigen::Index>(H) * T_, D);
    st.vf.resize(st.kf.rows(), D);
    for (int t = 0; t < T_; ++t)
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < D; ++c) {
          const float k = st.kpost(t, h * D + c), v = st.v(t, h * D + c);
          st.kf(h * T_ + t, c) = st.o.format == kv_format::fp32 ? k : to_float(from_float<half>(k));
          st.vf(h * T_ + t, c) = st.o.format == kv_format::fp32 ? v : to_float(from_float<half>(v));
        }
    if (st.o.format == kv_format::fp8) {
      const float ks = st.kf.cwiseAbs().maxCoeff() / 448.f;
      const float vs = st.vf.cwiseAbs().maxCoeff() / 448.f;
      const auto fp8 = [](float x, float scale) {
        return scale > 0.f ? to_float(from_float<fp8_e4m3>(x / scale)) * scale : x;
      };
      st.kf = st.kf.unaryExpr([&](float x) { return fp8(x, ks); });
      st.vf = st.vf.unaryExpr([&](float x) { return fp8(x, vs); });
    }
    if (st.o.format == kv_format::kivi2) dequantised<2>(st);
    if (st.o.format == kv_format::kivi4) dequantised<4>(st);
    attention(l, st, r);
    // Output projection, residual, SwiGLU MLP.
    project(st.attn, W.wo, d, st.tmp);
    st.h += st.tmp;
    rmsnorm(st.h, W.ffn_norm, st.tmp);
    project(st.tmp, W.w_gate, c_.ffn, st.gate);
    project(st.tmp, W.w_up, c_.ffn, st.up);
    for (Eigen::Index t = 0; t < st.gate.rows(); ++t)
      for (int i = 0; i < c_.ffn; ++i) {
        const float g = st.gate(t, i);
        st.gate(t, i) = g / (1.f + std::exp(-g)) * st.up(t, i);
      }
    project(st.gate, W.w_down, d, st.tmp);
    st.h += st.tmp;
    std::swap(st.xprev, st.xn);  // layer l's normalised input: speculation of layer l + 1
  }

  // The KIVI cache of the layer: every token appended through kivi_append_host, then the
  // quantised keys and values read back from their records in float (attention reads a fetched
  // row the same way; the window's quantised keys it reads from the ring, rounded once to half,
  // which this evaluation does not do: a difference below half's rounding). A
  // token's dequantised key does not depend on when it is read (a key group is quantised once,
  // from its own G tokens), nor its value, so the rows of step t are: keys dequantised for
  // t' < key_quantized_len(t), values for t' < value_quantized_len(t), fp16 after (kivi_at).
  template <int Bits>
  void dequantised(run_state& st) const {
    using layout = kivi_layout<half, D, Bits>;
    const int H = c_.n_kv_heads;
    std::vector<int32_t> lens(1, 0);
    const layout l = layout::padded(H, T_, lens.data(), 1, {st.o.kivi_group, st.o.kivi_residual});
    kivi_host_storage store(l);
    kivi_append_host<layout> wr(l, store.buffers(), lens.data());
    std::vector<half> k(static_cast<std::size_t>(T_) * H * D), v(k.size());
    for (int t = 0; t < T_; ++t)
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < D; ++c) {
          const std::size_t i = (static_cast<std::size_t>(t) * H + h) * D + c;
          k[i] = from_float<half>(st.kf(h * T_ + t, c));
          v[i] = from_float<half>(st.vf(h * T_ + t, c));
        }
    wr.append(0, T_, {k.data(), k.size()}, {v.data(), v.size()});
    const auto b = store.buffers();
    st.kq = st.kf;
    st.vq = st.vf;
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < l.key_quantized_len_for(T_); ++t)
        kvscout::detail::kivi_load_key(l, b.k_codes.data() + l.k_offset(0, t, h), b.k_params.data(), 0, t,
                              h, &st.kq(h * T_ + t, 0));
      for (int t = 0; t < l.value_quantized_len_for(T_); ++t)
        kvscout::detail::kivi_load_value(l, b.v_records.data() + l.v_offset(0, t, h), &st.vq(h * T_ + t, 0));
    }
  }

  // Writes sum over the group of each head's softmax over [0, n) (the oracle's sum_prob score,
  // score/detail/aggregate.hpp) into out[0, n), from the scaled logits rows lg[row0 + j].
  void group_mass(const row_matrix& lg, int row0, int g, int n, run_state& st, float* out) const {
    std::fill(out, out + n, 0.f);
    if (n == 0) return;
    for (int j = 0; j < g; ++j) {
      const float* x = &lg(row0 + j, 0);
      const float m = detail::max_of(x, n);
      float* e = st.e.data();
      detail::exp_shifted(x, m, n, e);
      double z = 0;
      for (int i = 0; i < n; ++i) z += e[i];
      const float inv = static_cast<float>(1.0 / z);
      for (int i = 0; i < n; ++i) out[i] += e[i] * inv;
    }
  }

  // Selection of the step's visible tokens [0, n) with a cap: exact top-k (or threshold) over
  // scores [H, T] (row stride T) into idx [H, T] / cnt [H].
  // mass: the scores are attention mass (the oracle's, sum_prob's), for the pooled selector.
  void select(const eval_options& o, bool threshold, int n, int budget, keep_set keep,
              const float* scores, int32_t* idx, int32_t* cnt, run_state& st, bool mass) const {
    const int H = c_.n_kv_heads;
    const int32_t len = n;
    const score_view<host_space> sv{{scores, static_cast<std::size_t>(H) * T_}, {&len, 1}, 1, H, T_};
    const selection_buffers<host_space> out{{idx, static_cast<std::size_t>(H) * T_},
                                            {cnt, static_cast<std::size_t>(H)}, 1, H, T_};
    if (threshold) {
      const threshold_selector_host::config sc{{.num_seqs = 1, .num_kv_heads = H,
                                                .max_tokens = T_},
                                               T_, o.alpha, budget, o.rule, keep};
      threshold_selector_host sel(sc, {st.sel_ws.data(), st.sel_ws.size()});
      sel.select(sv, out);
    } else if (o.pool_heads) {
      const pooled_topk_selector_host::config pc{{.num_seqs = 1, .num_kv_heads = H,
                                                  .max_tokens = T_}, T_, budget, keep,
                                                 mass ? pooled_scale::mass : pooled_scale::logit,
                                                 o.pool_rule};
      pooled_topk_selector_host sel(pc, {st.sel_ws.data(), st.sel_ws.size()});
      sel.select(sv, out);
    } else {
      const topk_selector_host::config sc{{.num_seqs = 1, .num_kv_heads = H,
                                           .max_tokens = T_}, T_,
                                          budget, keep};
      topk_selector_host sel(sc, {st.sel_ws.data(), st.sel_ws.size()});
      sel.select(sv, out);
    }
  }

  void attention(int l, run_state& st, eval_result& r) {
    const eval_options& o = st.o;
    const int H = c_.n_kv_heads, Hq = c_.n_heads, g = Hq / H;
    const bool quant = o.format == kv_format::kivi2 || o.format == kv_format::kivi4;
    const bool sparse = l >= skip_ && o.policy != eval_policy::dense;
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    st.attn.resize(T_, Hq * D);
    row_matrix qb(block * g, D), lq, lf, pf, out;
    std::vector<int32_t> ql(block);
    const score_buffer<host_space> sb{{st.scores.data(), st.scores.size()}, 1, H, T_};
    for (int t0 = 0; t0 < T_; t0 += block) {
      const int t1 = std::min(T_, t0 + block), nb = t1 - t0;
      // Keys dequantised below khi for some row of the block; values below vhi (all rows: vlo).
      const int khi = quant ? kivi_at(o, t1 - 1).keys : 0;
      const int vlo = quant ? kivi_at(o, t0).values : 0, vhi = quant ? kivi_at(o, t1 - 1).values : 0;
      // Logits of the block: [nb * g, t1] per KV head, row i * g + j = token t0 + i, head h * g + j.
      for (int h = 0; h < H; ++h) {
        for (int i = 0; i < nb; ++i)
          for (int j = 0; j < g; ++j)
            for (int c = 0; c < D; ++c) qb(i * g + j, c) = st.q(t0 + i, (h * g + j) * D + c) * scale;
        row_matrix& lg = st.lg[static_cast<std::size_t>(h)];
        const auto qbb = qb.topRows(nb * g);
        lg.leftCols(t1).topRows(nb * g).noalias() =
            qbb * st.kf.middleRows(static_cast<Eigen::Index>(h) * T_, t1).transpose();
        if (khi > 0) {
          lq.resize(nb * g, khi);
          lq.noalias() = qbb * st.kq.middleRows(static_cast<Eigen::Index>(h) * T_, khi).transpose();
          for (int i = 0; i < nb; ++i) {
            const int qt = kivi_at(o, t0 + i).keys;
            for (int j = 0; j < g; ++j) std::copy_n(&lq(i * g + j, 0), qt, &lg(i * g + j, 0));
          }
        }
      }
      for (int i = 0; i < nb; ++i) {
        const int t = t0 + i;
        const int n = visible(o, t);
        const int budget = cap(o, t, l);
        const bool select_all = !sparse || n <= budget || t < o.sparse_from;
        const bool counted = t >= o.score_from && t < T_ - 1;
        // ---- the policy's selection of [0, n) per KV head ----
        keep_set keep = o.keep;
        if (o.policy == eval_policy::h2o) keep.recent = std::max(0, budget / 2 - keep.sinks);
        if (!select_all) {
          const int32_t pos = t, len = n;
          const score_context<host_space> ctx{{&st.xprev(t, 0), static_cast<std::size_t>(c_.d_model)},
                                 {&st.q(t, 0), static_cast<std::size_t>(Hq * D)},
                                 {&pos, 1},
                                 {&len, 1}};
          switch (o.policy) {
            case eval_policy::oracle:
              for (int h = 0; h < H; ++h)
                group_mass(st.lg[static_cast<std::size_t>(h)], i * g, g, n, st, sb.row(0, h));
              if (o.check_oracle_every > 0 && t % o.check_oracle_every == 0 && !quant)
                check_oracle(l, st, t, n, r);
              if (o.curve_bins > 0 && t >= o.curve_from && t < o.curve_to && t % 16 == 0)
                add_curve(l, n, st, r);
              break;
            case eval_policy::infinigen:
              if (o.late_scores) {
                st.late_policy().score_query(l, ctx, sb);
              } else {
                st.ig->score(l, ctx, sb);
              }
              break;
            case eval_policy::quest: st.quest->score(l, ctx, sb); break;
            case eval_policy::h2o: st.h2o->score(l, ctx, sb); break;
            case eval_policy::streaming: st.stream->score(l, ctx, sb); break;
            default: break;
          }
          if (st.pool && l >= skip_) exclude_evicted(l, n, st);
          const bool threshold = o.policy == eval_policy::infinigen && o.alpha >= 0;
          const bool mass = o.policy == eval_policy::oracle ||
                            (o.policy == eval_policy::infinigen && o.aggregation == gqa_aggregation::sum_prob);
          select(o, threshold, n, budget, keep, st.scores.data(), st.sel_idx.data(), st.sel_cnt.data(), st, mass);
          if (o.correct > 0) {
            const int added = correct_step(l, ctx, n, t, st);
            if (counted) r.rows_corrected[static_cast<std::size_t>(l)] += added;
          }
        } else {
          for (int h = 0; h < H; ++h) {
            for (int x = 0; x < n; ++x) st.sel_idx[static_cast<std::size_t>(h) * T_ + x] = x;
            st.sel_cnt[static_cast<std::size_t>(h)] = n;
          }
        }
        if (st.pool && l >= skip_) {
          const selection_buffers<host_space> sel{{st.sel_idx.data(), st.sel_idx.size()},
                                                  {st.sel_cnt.data(), st.sel_cnt.size()}, 1, H, T_};
          st.pool->drop_evicted(l, sel);
          st.pool->observe(l, sel.view());
        }
        if (counted && l >= skip_)
          for (int h = 0; h < H; ++h) {
            r.rows_fetched[static_cast<std::size_t>(l)] += st.sel_cnt[static_cast<std::size_t>(h)];
            r.rows_dense[static_cast<std::size_t>(l)] += n;
          }
        // ---- metrics: recall of the true attention mass, overlap with the oracle's top-k ----
        // (The oracle at the rows this step moved in total: with a correction step, its cap.)
        if (sparse && !select_all && o.metric_every > 0 && t >= o.metric_from && t % o.metric_every == 0)
          metrics(l, st, i, t, n, o.correct > 0 ? total_cap(o, t, n, l) : budget, keep, r);
        // ---- softmax over the attended rows: selection, residual window, current token ----
        for (int h = 0; h < H; ++h) {
          row_matrix& lg = st.lg[static_cast<std::size_t>(h)];
          const int cnt = st.sel_cnt[static_cast<std::size_t>(h)];
          const int32_t* sel = st.sel_idx.data() + static_cast<std::size_t>(h) * T_;
          int na = 0;
          const bool contiguous = cnt == n;
          if (!contiguous) {
            std::copy_n(sel, cnt, st.attended.data());
            na = cnt;
            for (int x = n; x <= t; ++x) st.attended[static_cast<std::size_t>(na++)] = x;
          }
          float* mass = st.probs.data();
          if (st.h2o) std::fill(mass, mass + (contiguous ? t + 1 : na), 0.f);
          for (int j = 0; j < g; ++j) {
            float* row = &lg(i * g + j, 0);
            float* e = st.e.data();
            if (contiguous) {
              const float m = detail::max_of(row, t + 1);
              detail::exp_shifted(row, m, t + 1, e);
              double z = 0;
              for (int x = 0; x <= t; ++x) z += e[x];
              const float inv = static_cast<float>(1.0 / z);
              for (int x = 0; x <= t; ++x) row[x] = e[x] * inv;
              if (st.h2o)
                for (int x = 0; x <= t; ++x) mass[x] += row[x];
              std::fill(row + t + 1, row + t1, 0.f);
            } else {
              float m = -std::numeric_limits<float>::infinity();
              for (int a = 0; a < na; ++a) m = std::max(m, row[st.attended[static_cast<std::size_t>(a)]]);
              for (int a = 0; a < na; ++a) e[a] = row[st.attended[static_cast<std::size_t>(a)]];
              detail::exp_shifted(e, m, na, e);
              double z = 0;
              for (int a = 0; a < na; ++a) z += e[a];
              const float inv = static_cast<float>(1.0 / z);
              std::fill(row, row + t1, 0.f);
              for (int a = 0; a < na; ++a) row[st.attended[static_cast<std::size_t>(a)]] = e[a] * inv;
              if (st.h2o)
                for (int a = 0; a < na; ++a) mass[a] += e[a] * inv;
            }
          }
          if (st.h2o && l >= skip_) {
            // observe(): the attended cached rows with their group mass, then the current token.
            if (contiguous) {
              for (int x = 0; x < t; ++x) st.attended[static_cast<std::size_t>(x)] = x;
              na = t + 1;
            }
            const int32_t pos = t;
            const score_context<host_space> octx{{}, {}, {&pos, 1}, {&pos, 1}};
            observe_head(l, h, octx, na - 1, mass, st);
          }
        }
        if (l >= skip_) {
          if (st.ig) {
            st.ig->append(l, 0, t, &st.kpre(t, 0), &st.kpost(t, 0));
            if (st.ig_late) st.ig_late->append(l, 0, t, &st.kpre(t, 0), &st.kpost(t, 0));
            if (o.rank_key_bits > 0 && !o.library_keys && (t + 1) % o.rank_key_group == 0)
              quantise_ranking_keys(l, t + 1 - o.rank_key_group, st);
          }
          if (st.quest) st.quest->append(l, 0, t, &st.kpre(t, 0), &st.kpost(t, 0));
          if (st.pool) st.pool->append(l, 0, t);
        }
      }
      // Output of the block: P x V, with V as stored at each step.
      for (int h = 0; h < H; ++h) {
        row_matrix& p = st.lg[static_cast<std::size_t>(h)];
        const auto vf = st.vf.middleRows(static_cast<Eigen::Index>(h) * T_, t1);
        if (vhi > 0) {
          // Columns [vlo, t1) of a row read fp16 values from value_quantized_len(t) on,
          // dequantised ones before it; columns below vlo are dequantised for every row.
          pf = p.block(0, vlo, nb * g, t1 - vlo);
          for (int i = 0; i < nb; ++i) {
            const int qt = kivi_at(o, t0 + i).values;
            for (int j = 0; j < g; ++j) {
              std::fill(&pf(i * g + j, 0), &pf(i * g + j, 0) + (qt - vlo), 0.f);
              std::fill(&p(i * g + j, 0) + qt, &p(i * g + j, 0) + vhi, 0.f);
            }
          }
          out.noalias() = p.block(0, 0, nb * g, vhi) * st.vq.middleRows(static_cast<Eigen::Index>(h) * T_, vhi);
          out.noalias() += pf * vf.bottomRows(t1 - vlo);
        } else {
          out.noalias() = p.block(0, 0, nb * g, t1) * vf;
        }
        for (int i = 0; i < nb; ++i)
          for (int j = 0; j < g; ++j)
            std::copy_n(&out(i * g + j, 0), D, &st.attn(t0 + i, (h * g + j) * D));
      }
    }
  }

  // The correction step of step t: the best total - budget rows by layer l's own query that the
  // speculation (st.sel_*) did not select, merged into st.sel_*. Returns how many rows were
  // added over the KV heads.
  int correct_step(int l, const score_context<host_space>& ctx, int n, int t, run_state& st) {
    const eval_options& o = st.o;
    const int H = c_.n_kv_heads;
    const int total = total_cap(o, t, n, l);
    const int extra = std::max(0, total - cap(o, t, l));
    if (extra == 0) return 0;
    const score_buffer<host_space> lb{{st.late.data(), st.late.size()}, 1, H, T_};
    st.late_policy().score_query(l, ctx, lb);
    const int32_t len = n;
    const correction_selector_host::config cc{{.num_seqs = 1, .num_kv_heads = H,
                                               .max_tokens = T_},
                                              T_, extra};
    correction_selector_host corr(cc, {st.corr_ws.data(), st.corr_ws.size()});
    corr.select(lb.view({&len, 1}),
                {{st.sel_idx.data(), st.sel_idx.size()}, {st.sel_cnt.data(), st.sel_cnt.size()}, 1, H, T_},
                {{st.add_idx.data(), st.add_idx.size()}, {st.add_cnt.data(), st.add_cnt.size()}, 1, H, T_});
    int added = 0;
    for (int h = 0; h < H; ++h) {
      int32_t* sel = st.sel_idx.data() + static_cast<std::size_t>(h) * T_;
      const int32_t* add = st.add_idx.data() + static_cast<std::size_t>(h) * T_;
      const int ns = st.sel_cnt[static_cast<std::size_t>(h)], na = st.add_cnt[static_cast<std::size_t>(h)];
      const int m = static_cast<int>(std::merge(sel, sel + ns, add, add + na, st.merged.data()) - st.merged.data());
      std::copy_n(st.merged.data(), m, sel);
      st.sel_cnt[static_cast<std::size_t>(h)] = m;
      added += na;
    }
    return added;
  }

  // eval_options::rank_key_bits: the ranking keys of the complete group [t0, t0 + G) written
  // again, quantised per (head, channel) to b bits over the group (min / max, round to nearest).
  void quantise_ranking_keys(int l, int t0, run_state& st) const {
    const int G = st.o.rank_key_group, HD = c_.n_kv_heads * D;
    const float levels = static_cast<float>((1 << st.o.rank_key_bits) - 1);
    for (int c = 0; c < HD; ++c) {
      float lo = st.kpost(t0, c), hi = lo;
      for (int i = 1; i < G; ++i) lo = std::min(lo, st.kpost(t0 + i, c)), hi = std::max(hi, st.kpost(t0 + i, c));
      const float step = (hi - lo) / levels;
      for (int i = 0; i < G; ++i) {
        const float x = st.kpost(t0 + i, c);
        st.kgroup(i, c) = step > 0.f ? lo + std::nearbyint((x - lo) / step) * step : x;
      }
    }
    for (int i = 0; i < G; ++i) {
      st.ig->append(l, 0, t0 + i, &st.kpre(t0 + i, 0), &st.kgroup(i, 0));
      if (st.ig_late) st.ig_late->append(l, 0, t0 + i, &st.kpre(t0 + i, 0), &st.kgroup(i, 0));
    }
  }

  // Scores of the tokens the host pool evicted, NaN: never selected by score.
  void exclude_evicted(int l, int n, run_state& st) const {
    for (int h = 0; h < c_.n_kv_heads; ++h) {
      const auto slots = st.pool->slots(l, 0, h);
      float* row = st.scores.data() + static_cast<std::size_t>(h) * T_;
      for (int x = 0; x < n; ++x)
        if (slots[static_cast<std::size_t>(x)] < 0) row[x] = std::numeric_limits<float>::quiet_NaN();
    }
  }

  // A row source that holds only token positions, for h2o_policy_host::observe: head `head` has
  // `count` rows, the other heads none (observe() walks every KV head of a source).
  struct head_rows {
    static constexpr int head_dim = D;
    const int32_t* tokens;
    int count, head, heads;
    int num_seqs() const { return 1; }
    int num_kv_heads() const { return heads; }
    int rows(int, int hh) const { return hh == head ? count : 0; }
    int token(int, int, int i) const { return tokens[i]; }
    void load_k(int, int, int, float*) const {}
    void load_v(int, int, int, float*) const {}
  };
  static_assert(attention_rows<head_rows>);

  // h2o_policy_host::observe for one KV head: probs of the `rows` attended cached tokens
  // (st.attended) then the current token.
  void observe_head(int l, int h, const score_context<host_space>& ctx, int rows, const float* mass, run_state& st) {
    const int H = c_.n_kv_heads;
    const int stride = T_ + 1;
    std::vector<float>& buf = obs_;
    if (buf.size() != static_cast<std::size_t>(H) * stride) buf.assign(static_cast<std::size_t>(H) * stride, 0.f);
    float* seg = buf.data() + static_cast<std::size_t>(h) * stride;
    std::copy_n(mass, rows + 1, seg);
    // Heads other than h: zero rows and a zero current-token mass, so nothing changes for them.
    const head_rows hr{st.attended.data(), rows, h, H};
    st.h2o->observe(l, ctx, hr, {buf.data(), buf.size()}, stride, true);
    std::fill(seg, seg + rows + 1, 0.f);
  }

  void metrics(int l, run_state& st, int i, int t, int n, int budget, keep_set keep, eval_result& r) {
    const int H = c_.n_kv_heads, g = c_.n_heads / H;
    // The oracle at the same cap: sum_prob over the visible tokens, exact top-k (head-pooled
    // where the run pools its heads).
    for (int h = 0; h < H; ++h)
      group_mass(st.lg[static_cast<std::size_t>(h)], i * g, g, n, st,
                 st.scores.data() + static_cast<std::size_t>(h) * T_);
    select(st.o, false, n, budget, keep, st.scores.data(), st.orc_idx.data(), st.orc_cnt.data(), st, true);
    for (int h = 0; h < H; ++h) {
      // True attention of the cached tokens [0, t): the group's mass (what attention would put
      // there with every row present); the residual window [n, t) is always attended.
      group_mass(st.lg[static_cast<std::size_t>(h)], i * g, g, t, st, st.oscore.data());
      const int32_t* sel = st.sel_idx.data() + static_cast<std::size_t>(h) * T_;
      const int32_t* orc = st.orc_idx.data() + static_cast<std::size_t>(h) * T_;
      const int cs = st.sel_cnt[static_cast<std::size_t>(h)], co = st.orc_cnt[static_cast<std::size_t>(h)];
      auto with_window = [&](const int32_t* s, int c) {
        std::copy_n(s, c, st.attended.data());
        for (int x = n; x < t; ++x) st.attended[static_cast<std::size_t>(c + x - n)] = x;
        return c + (t - n);
      };
      int na = with_window(sel, cs);
      const double rec = attention_mass_recall(st.oscore.data(), t, st.attended.data(), na);
      na = with_window(orc, co);
      const double rec_o = attention_mass_recall(st.oscore.data(), t, st.attended.data(), na);
      r.recall[static_cast<std::size_t>(l)] += rec;
      r.recall_oracle[static_cast<std::size_t>(l)] += rec_o;
      r.overlap[static_cast<std::size_t>(l)] += overlap(sel, cs, orc, co);
      r.samples[static_cast<std::size_t>(l)] += 1;
    }
  }

  // kvscout::oracle_policy_host over an fp16 copy of this layer's cache at step t, against the scores
  // the driver wrote (sb rows) for the same step.
  void check_oracle(int l, run_state& st, int t, int n, eval_result& r) const {
    using layout = contiguous_layout<half, D, hnd>;
    const int H = c_.n_kv_heads;
    std::vector<half> k(static_cast<std::size_t>(H) * T_ * D), v(k.size());
    for (int h = 0; h < H; ++h)
      for (int x = 0; x < t; ++x)
        for (int c = 0; c < D; ++c) {
          k[(static_cast<std::size_t>(h) * T_ + x) * D + c] = from_float<half>(st.kf(h * T_ + x, c));
          v[(static_cast<std::size_t>(h) * T_ + x) * D + c] = from_float<half>(st.vf(h * T_ + x, c));
        }
    const int32_t len = n;
    const layout lay = layout::padded(H, T_, &len, 1);
    const kv_view<layout, host_space> view{lay, as_bytes(host_span<const half>(k.data(), k.size())),
                                           as_bytes(host_span<const half>(v.data(), v.size()))};
    std::vector<kv_view<layout, host_space>> layers(static_cast<std::size_t>(l) + 1, view);
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    oracle_policy_host<layout> oracle({{.num_q_heads = c_.n_heads, .scale = scale},
                                       gqa_aggregation::sum_prob}, layers);
    std::vector<float> ref(static_cast<std::size_t>(H) * T_, 0.f);
    const int32_t pos = t;
    oracle.score(l, {{}, {&st.q(t, 0), static_cast<std::size_t>(c_.n_heads * D)}, {&pos, 1}, {&len, 1}},
                 {{ref.data(), ref.size()}, 1, H, T_});
    for (int h = 0; h < H; ++h)
      for (int x = 0; x < n; ++x) {
        const double a = st.scores[static_cast<std::size_t>(h) * T_ + x];
        const double b = ref[static_cast<std::size_t>(h) * T_ + x];
        r.oracle_check_max_rel = std::max(r.oracle_check_max_rel, std::abs(a - b) / std::max(std::abs(b), 1e-6));
      }
    ++r.oracle_checks;
  }

  void finish(run_state& st, eval_result& r) {
    rmsnorm(st.h, w_.out_norm, final_);
    const int from = std::max(0, st.o.score_from);
    const Eigen::Map<const row_matrix> emb(w_.tok_embd.data(), c_.vocab, c_.d_model);
    row_matrix lg;
    std::vector<float> e(static_cast<std::size_t>(c_.vocab));
    constexpr int chunk = 128;
    for (int t0 = from; t0 < T_ - 1; t0 += chunk) {
      const int nb = std::min(chunk, T_ - 1 - t0);
      lg.resize(nb, c_.vocab);
      lg.noalias() = final_.middleRows(t0, nb) * emb.transpose();
      for (int i = 0; i < nb; ++i) {
        const float* x = &lg(i, 0);
        int best = 0;  // the first of equal maxima, as a greedy decoder's argmax
        for (int v = 1; v < c_.vocab; ++v) best = x[v] > x[best] ? v : best;
        const float m = x[best];
        detail::exp_shifted(x, m, c_.vocab, e.data());
        double z = 0;
        for (float y : e) z += y;
        const int target = tokens_[static_cast<std::size_t>(t0 + i + 1)];
        const double nll = -(static_cast<double>(x[target] - m) - std::log(z));
        r.nll += nll;
        r.token_nll.push_back(nll);
        r.predicted.push_back(best);
        r.correct += best == target ? 1 : 0;
        ++r.scored;
      }
    }
  }

  const llama_weights& w_;
  llama_config c_;
  std::vector<int32_t> tokens_;
  int skip_;
  int T_ = 0;
  rope_config rope_;
  rope_frequencies rope_freq_;   // rope_'s, computed once
  prefix prefixes_[2][kv_format_count];  // by KIVI's prompt in fp16 (1) or not, kv_format
  row_matrix final_;
  std::vector<float> obs_;
};

}  // namespace kvscout::model
