// The accuracy harness's evaluator (tools/model/llama_eval.hpp) on the real SmolLM2-135M-Instruct,
// a small form of tools/accuracy: layer-major teacher-forced evaluation equals step-by-step
// decoding, the oracle with every token equals dense, a dense prefill is dense up to where it
// ends, so is KIVI's prompt in fp16, the oracle's attention-mass recall bounds InfiniGen's at the same budget. [model]: needs
// the file scripts/fetch_model.sh places.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "kvscout/skew/calibrate.hpp"
#include "model/llama_eval.hpp"
#include "model/tokenizer_gguf.hpp"
#include "smollm2.hpp"

namespace {

using smollm2::loaded;
using smollm2::model;
using smollm2::model_path;

// ~330 tokens of English prose (the harness reads long texts from disk; this one is inline so
// the test does not depend on what a machine installed).
std::vector<int32_t> prose(const kvscout::model::bpe_tokenizer& tok) {
  std::string text;
  const char* parts[] = {
      "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps as "
      "his father had taught him. There were one hundred and twelve of them, worn smooth in the "
      "middle by generations of boots. At the top he trimmed the wick, polished the great lens, and "
      "watched the first ships of the night slip past the reef. ",
      "In the village below, the baker was already setting out the dough for the morning bread. She "
      "had lived there all her life and knew every family by the sound of their footsteps on the "
      "cobbles. When the storm came in October, it was she who noticed that the light had gone dark. ",
      "She ran up the hill through the rain, her lantern swinging, and found the keeper at the foot "
      "of the stairs with a twisted ankle. Together they climbed, one step at a time, and together "
      "they lit the lamp again before the fishing boats came home. ",
      "Years later, when the lighthouse was replaced by an automatic beacon, the village gathered on "
      "the cliff to watch the old lamp burn for the last time. The keeper, now white-haired, told "
      "the story of the storm to the children, and the baker, beside him, corrected every detail. "};
  for (int i = 0; i < 2; ++i)
    for (const char* p : parts) text += p;
  return tok.encode(text);
}

double log_softmax_at(const std::vector<float>& logits, int target) {
  float m = logits[0];
  for (float x : logits) m = std::max(m, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - m));
  return static_cast<double>(logits[static_cast<std::size_t>(target)] - m) - std::log(sum);
}

}  // namespace

TEST_CASE("layer-major evaluation equals step-by-step decoding, and the oracle bounds InfiniGen",
          "[model][accuracy]") {
#if !defined(__OPTIMIZE__)
  // Some 10^11 flops of GEMMs: minutes without optimisation (the sanitizer build); the optimised
  // builds run it.
  WARN("SKIP: built without optimisation");
  return;
#endif
  loaded* m = model();
  if (m == nullptr) {
    WARN("SKIP: " << model_path() << " not found (run scripts/fetch_model.sh)");
    return;
  }
  namespace km = kvscout::model;
  const auto& c = m->weights.cfg;
  const std::vector<int32_t> all = prose(m->tok);
  REQUIRE(all.size() >= 300);
  // Calibration on the first 96 tokens, evaluation on the next 200 (never the same tokens).
  const int n_cal = 96, T = 200;
  const std::vector<int32_t> ids(all.begin() + n_cal, all.begin() + n_cal + T);
  km::layer_major_eval ev(m->weights, ids);

  // 1. Dense layer-major perplexity equals llama_session's step-by-step dense perplexity (fp16
  //    cache in both), and with an fp32 cache the logits agree to float tolerance.
  km::eval_options dense;
  const km::eval_result rd = ev.run(dense);
  {
    km::llama_session<> s(m->weights, T, 1);
    double nll = 0;
    for (int t = 0; t < T; ++t) {
      const auto& a = s.step(ids[static_cast<std::size_t>(t)]);
      if (t + 1 < T) nll -= log_softmax_at(a, ids[static_cast<std::size_t>(t) + 1]);
    }
    const double ppl_step = std::exp(nll / (T - 1));
    INFO("layer-major " << rd.ppl() << ", step-by-step " << ppl_step);
    REQUIRE(rd.scored == T - 1);
    REQUIRE(std::abs(rd.ppl() / ppl_step - 1) <= 1e-3);
  }
  {
    constexpr int n = 48;
    const std::vector<int32_t> few(ids.begin(), ids.begin() + n);
    km::layer_major_eval ev32(m->weights, few);
    km::eval_options o;
    o.format = km::kv_format::fp32;
    ev32.run(o);
    km::llama_session<64, float> s(m->weights, n, 1);
    double worst = 0;
    for (int t = 0; t < n; ++t) {
      const auto& a = s.step(few[static_cast<std::size_t>(t)]);
      const std::vector<float> b = ev32.logits(t);
      for (std::size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])) / (1.0 + std::abs(a[i])));
    }
    INFO("worst relative logit difference, fp32 cache: " << worst);
    REQUIRE(worst <= 1e-3);
  }

  // 2. The oracle with every token selected is dense (and its scores are oracle_policy_host's).
  km::eval_options full;
  full.policy = km::eval_policy::oracle;
  full.budget = 1.0;
  const km::eval_result rf = ev.run(full);
  REQUIRE(std::abs(rf.ppl() / rd.ppl() - 1) <= 1e-6);

  // 2b. A dense prefill (sparse_from): with sparse_from = T the oracle at 20 % is dense; with
  //     sparse_from = 120 its predictions before step 120 are dense's, bit for bit, and some of
  //     the later ones are not (its cap, 20 % of 120+ rows, is far below the rows).
  {
    km::eval_options p = full;
    p.budget = 0.2;
    p.sparse_from = T;
    const km::eval_result all_dense = ev.run(p);
    REQUIRE(all_dense.token_nll == rd.token_nll);
    p.sparse_from = 120;
    const km::eval_result pre = ev.run(p);
    REQUIRE(pre.token_nll.size() == rd.token_nll.size());
    double before = 0, after = 0;
    for (std::size_t t = 0; t < pre.token_nll.size(); ++t) {
      double& worst = t < 120 ? before : after;
      worst = std::max(worst, std::abs(pre.token_nll[t] - rd.token_nll[t]));
    }
    INFO("largest NLL difference from dense before step 120: " << before << ", after: " << after);
    CHECK(before == 0);
    CHECK(after > 1e-4);
    p.sparse_from = T + 1;
    REQUIRE_THROWS_WITH(ev.run(p), Catch::Contains("sparse_from " + std::to_string(T + 1)));
  }

  // 2c. KIVI's prompt in fp16 (eval_options::kivi_fp16_prompt): the final hidden states of the
  //     steps before score_from are dense fp16's bit for bit and later ones are not; quantised
  //     from token 0 the prompt's already differ. The evaluator's cached dense layers are keyed by
  //     it: runs in any order, or on a fresh evaluator, give the same results.
  {
    using M = km::layer_major_eval::row_matrix;
    ev.run(dense);
    const M fd = ev.final_hidden();
    km::eval_options k0;
    k0.format = km::kv_format::kivi2;
    k0.kivi_residual = 32;  // quantisation starts within the 200 tokens
    k0.score_from = 120;
    km::eval_options kp = k0;
    kp.kivi_fp16_prompt = true;
    const km::eval_result r0 = ev.run(k0);
    const M f0 = ev.final_hidden();
    const km::eval_result rp = ev.run(kp);
    const M fp = ev.final_hidden();
    REQUIRE(ev.run(k0).token_nll == r0.token_nll);
    km::layer_major_eval fresh(m->weights, ids);
    REQUIRE(fresh.run(kp).token_nll == rp.token_nll);
    CHECK(rp.token_nll != r0.token_nll);
    const auto worst = [&](const M& a, int from, int to) {
      double w = 0;
      for (int t = from; t < to; ++t)
        for (Eigen::Index i = 0; i < a.cols(); ++i) w = std::max(w, static_cast<double>(std::abs(a(t, i) - fd(t, i))));
      return w;
    };
    INFO("largest final hidden-state difference from dense fp16: prompt in fp16 " << worst(fp, 0, 120)
         << " before step 120, " << worst(fp, 120, T) << " after; quantised from token 0 " << worst(f0, 0, 120)
         << " before step 120");
    CHECK(worst(fp, 0, 120) == 0);
    CHECK(worst(fp, 120, T) > 1e-3);
    CHECK(worst(f0, 0, 120) > 1e-3);
  }

  // 3. At a 20 % budget: the oracle's recall bounds InfiniGen's (same cap, same keep-set), and
  //    the driver's oracle scores match kvscout::oracle_policy_host::score.
  std::vector<std::vector<float>> qs(static_cast<std::size_t>(c.n_layers)), ks(qs.size());
  {
    km::layer_major_eval cal(m->weights, std::vector<int32_t>(all.begin(), all.begin() + n_cal));
    using M = km::layer_major_eval::row_matrix;
    cal.on_qk = [&](int l, const M& q, const M& k, const M&, const M&) {
      qs[static_cast<std::size_t>(l)].assign(q.data(), q.data() + q.size());
      ks[static_cast<std::size_t>(l)].assign(k.data(), k.data() + k.size());
    };
    cal.run({});
  }
  const int D = c.head_dim, H = c.n_kv_heads, g = c.n_heads / H;
  std::vector<std::vector<kvscout::skew_plan>> plans(static_cast<std::size_t>(c.n_layers));
  for (int l = 2; l < c.n_layers; ++l)
    for (int h = 0; h < H; ++h) {
      std::vector<float> q(static_cast<std::size_t>(n_cal) * g * D), k(static_cast<std::size_t>(n_cal) * D);
      for (int t = 0; t < n_cal; ++t) {
        std::copy_n(&qs[static_cast<std::size_t>(l)][(static_cast<std::size_t>(t) * c.n_heads + h * g) * D], g * D,
                    &q[static_cast<std::size_t>(t) * g * D]);
        std::copy_n(&ks[static_cast<std::size_t>(l)][(static_cast<std::size_t>(t) * H + h) * D], D,
                    &k[static_cast<std::size_t>(t) * D]);
      }
      kvscout::skew_options opt;
      opt.r = 16;
      opt.rope = {D, c.rope_theta, c.rope};
      plans[static_cast<std::size_t>(l)].push_back(
          kvscout::calibrate_skew({q.data(), q.size()}, {k.data(), k.size()}, n_cal, g, D, opt));
    }
  km::eval_options o;
  o.budget = 0.2;
  o.keep = {4, 8};
  o.metric_every = 4;
  o.metric_from = 64;
  o.score_from = 64;
  o.policy = km::eval_policy::oracle;
  o.check_oracle_every = 13;
  const km::eval_result ro = ev.run(o);
  o.check_oracle_every = 0;
  o.policy = km::eval_policy::infinigen;
  o.plans = &plans;
  const km::eval_result ri = ev.run(o);
  const double rec_o = ro.mean_of(ro.recall, 2), rec_i = ri.mean_of(ri.recall, 2);
  INFO("oracle recall " << rec_o << ", infinigen recall " << rec_i << " (oracle top-k beside it "
                        << ri.mean_of(ri.recall_oracle, 2) << "); ppl dense " << rd.ppl() << ", oracle "
                        << ro.ppl() << ", infinigen " << ri.ppl() << "; oracle_policy_host check: "
                        << ro.oracle_checks << " steps, max rel " << ro.oracle_check_max_rel);
  REQUIRE(ro.oracle_checks > 0);
  CHECK(ro.oracle_check_max_rel <= 1e-4);
  CHECK(std::abs(ro.mean_of(ro.overlap, 2) - 1) <= 1e-9);  // the oracle is its own top-k
  CHECK(rec_o >= rec_i);
  CHECK(ri.mean_of(ri.recall_oracle, 2) >= rec_i);
  CHECK(rec_i > 0.5);  // speculation finds real attention mass, far above the budget's share
  CHECK(ri.fetch_fraction(2) < 0.35);
  CHECK(ro.fetch_fraction(2) == Approx(ri.fetch_fraction(2)));
}
