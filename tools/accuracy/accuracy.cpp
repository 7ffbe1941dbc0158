// kvscout_accuracy: the accuracy harness (issue 6). Teacher-forced perplexity of SmolLM2-135M-
// Instruct on real text when attention at layers >= 2 reads only the rows a speculation policy
// selected, for policies x budgets x KV formats, with per-layer attention-mass recall and overlap
// with the oracle's top-k. Layer-major evaluation (tools/model/llama_eval.hpp); the policies,
// selectors, skew calibration, KIVI layout / writer / rows and metrics are kvscout's.
//
// Stages (each row of the CSV is written and flushed as soon as it is measured):
//   sweep   the speculation's knobs at a 10 % budget on the long text (fp16): partial dim r, GQA
//           aggregation, selector (exact top-k at the cap vs threshold max - alpha, capped); the
//           best by perplexity become kvscout's defaults for the later stages; plus InfiniGen's
//           own configuration (presets::infinigen_paper) for reference
//   matrix  {dense, oracle, kvscout's speculation x 3 RoPE modes, InfiniGen (paper), quest, h2o,
//           streaming} x budgets x formats on the long text, fp16 on the second text
//   paper   InfiniGen (paper) alone, every format and budget and the second text: the matrix's
//           rows for it, for a run that appends them to a CSV measured before it had them
//           (--stages paper --append; skipped where the matrix runs, which has them)
//   pool    a bounded host pool (kvscout::host_pool, issue 31): kvscout's default
//           configuration at a 10 % budget, fp16, with the pool at 100 / 75 / 50 / 25 % of the
//           context and counter / LRU eviction; dense at 50 / 25 %; anchors dense and unbounded
//   copy    (issue 32) a long-range copy task (tools/model/copy_task.hpp): --copy-prompts N
//           prompts (20), depths 10-90 %, lengths --copy-min-tokens to --copy-max-tokens
//           (2048-6144), a span of --copy-span words (24) whose first --copy-cue (4) are repeated
//           at the end; the rest of the span scored teacher-forced (token accuracy, mean NLL) for
//           the configurations of --copy-policies (dense, control = dense on a prompt with other
//           words at the first occurrence, oracle, kvscout_default, infinigen_paper; also quest,
//           h2o, streaming) at --copy-budgets (5,10 %), fp16, every token through the policy;
//           writes accuracy_copy.csv (one row per prompt and configuration, "all" rows summed)
//   correction  (issue 32, part 1) kvscout's default with the correction step (share 0.25 / 0.5
//           of the budget held back for it) and ranked by the layer's own query (late), at 5 / 10
//           / 20 %, every --formats format on the long text, fp16 on the short one; stage copy
//           takes the configurations kvscout_corrected (--correct-share, 0.5) and kvscout_late
//   budgets (issue 32, part 2) budgets that follow the attention at the same rows per step:
//           per-layer shares from the oracle's mass curves of the long text's unscored half
//           (--layer-rule coverage|mass), and the KV heads sharing one budget (head-pooled top-k,
//           --pool-rule mass|coverage); the oracle and kvscout's default, with and without the
//           correction step (share 0.25), at --pool-budgets (5,10,20 %), fp16 on both texts,
//           KIVI-4 and KIVI-2 (if --formats names them) at --kivi-budgets (10 %); stage copy takes the configurations oracle_pooled, kvscout_pooled,
//           kvscout_pooled_corrected, oracle_layers, kvscout_layers, kvscout_layers_corrected
//   kivi_prompt KIVI-4 and KIVI-2 (those --formats names) on the long text, dense and kvscout's
//           default at 10 %, quantised from token 0 (as every other stage) and with the prompt
//           (the steps before the first scored prediction) in fp16 as KIVI's own evaluation runs
//           it; the latter rows' format column reads "kivi2_fp16_prompt" / "kivi4_fp16_prompt"
//   prompts a prompt file (--prompts FILE.jsonl, tools/model/prompt_file.hpp: "input" and
//           "target" per line), scored the same way plus greedy exact match; accuracy_prompts.csv.
//           --prompts without --stages runs this stage alone
//   Stages copy and prompts alone leave accuracy.csv / accuracy_layers.csv untouched.
//   --dense-prefill (any stage): the steps before the first scored prediction attend densely
//   (the prompt's prefill, as an engine runs it), the policy selects from there on; the sparse
//   rows' selector column (and in stages copy and prompts, their names) end in "+dense_prefill".
//
// Names: "infinigen_paper" (CSV policy column) is presets::infinigen_paper, InfiniGen as its
// authors' code runs it; "infinigen" rows are infinigen_policy_host with kvscout's knobs, of which
// rope_planes / r = 32 / max_logit / top-k is presets::kvscout_default.
//
//   kvscout_accuracy --model M.gguf --long /usr/share/common-licenses/GPL-3
//                    --short tests/data/pg19_firstbook.txt --out docs [--quick]

#include <kvscout/kvscout.hpp>
#include <kvscout/skew/calibrate.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "model/copy_task.hpp"
#include "model/llama_eval.hpp"
#include "model/prompt_file.hpp"
#include "model/tokenizer_gguf.hpp"

namespace {

using namespace kvscout;
using model::eval_options;
using model::eval_policy;
using model::eval_result;
using model::kv_format;
using model::to_string;

std::string arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}
bool flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  KVSCOUT_EXPECTS(in.good(), "cannot read ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Calibration samples of one text chunk, per layer: RoPE'd and raw queries [n, Hq, D] and keys
// [n, H, D].
struct samples {
  int n = 0;
  std::vector<std::vector<float>> q_post, k_post, q_pre, k_pre;
};

samples collect(const model::llama_weights& w, const std::vector<int32_t>& ids) {
  samples s;
  s.n = static_cast<int>(ids.size());
  const auto L = static_cast<std::size_t>(w.cfg.n_layers);
  s.q_post.resize(L), s.k_post.resize(L), s.q_pre.resize(L), s.k_pre.resize(L);
  model::layer_major_eval ev(w, ids);
  using M = model::layer_major_eval::row_matrix;
  ev.on_qk = [&](int l, const M& qp, const M& kp, const M& qr, const M& kr) {
    const auto i = static_cast<std::size_t>(l);
    s.q_post[i].assign(qp.data(), qp.data() + qp.size());
    s.k_post[i].assign(kp.data(), kp.data() + kp.size());
    s.q_pre[i].assign(qr.data(), qr.data() + qr.size());
    s.k_pre[i].assign(kr.data(), kr.data() + kr.size());
  };
  ev.run({});
  return s;
}

// Skew plans of every layer >= skip for one (mode, r), calibrated on the samples.
std::vector<std::vector<skew_plan>> calibrate(const model::llama_weights& w, const samples& s, int skip,
                                              rope_mode mode, int r) {
  const auto& c = w.cfg;
  const int D = c.head_dim, H = c.n_kv_heads, Hq = c.n_heads, g = Hq / H, n = s.n;
  const bool raw = mode == rope_mode::pre_rope_folded;
  std::vector<std::vector<skew_plan>> plans(static_cast<std::size_t>(c.n_layers));
  for (int l = skip; l < c.n_layers; ++l) {
    const auto& qs = raw ? s.q_pre[static_cast<std::size_t>(l)] : s.q_post[static_cast<std::size_t>(l)];
    const auto& ks = raw ? s.k_pre[static_cast<std::size_t>(l)] : s.k_post[static_cast<std::size_t>(l)];
    for (int h = 0; h < H; ++h) {
      std::vector<float> q(static_cast<std::size_t>(n) * g * D), k(static_cast<std::size_t>(n) * D);
      for (int t = 0; t < n; ++t) {
        std::copy_n(&qs[(static_cast<std::size_t>(t) * Hq + h * g) * D], g * D, &q[static_cast<std::size_t>(t) * g * D]);
        std::copy_n(&ks[(static_cast<std::size_t>(t) * H + h) * D], D, &k[static_cast<std::size_t>(t) * D]);
      }
      skew_options opt;
      opt.r = r;
      opt.mode = mode;
      opt.rope = {D, c.rope_theta, c.rope};
      plans[static_cast<std::size_t>(l)].push_back(
          calibrate_skew({q.data(), q.size()}, {k.data(), k.size()}, n, g, D, opt));
    }
  }
  return plans;
}

struct infinigen_knobs {
  rope_mode mode = rope_mode::post_rope_skew;
  int r = 16;
  gqa_aggregation aggregation = gqa_aggregation::max_logit;
  float alpha = -1.f;  // < 0: top-k
  threshold_rule rule = threshold_rule::per_head;
  keep_set keep{4, 16};
  const char* preset = nullptr;  // the presets:: name these knobs are, where they are one
  // The correction step (eval_options::correct): this share of the budget is held back from the
  // speculation for the rows layer l's own query finds missing; 0: none.
  double correct_share = 0;
  bool late = false;  // eval_options::late_scores: rank with layer l's own query (a diagnostic)
  // eval_options::late_aggregation (stage ranking): the late ranking's own GQA aggregation.
  std::optional<gqa_aggregation> late_aggregation;
  int key_bits = 0;  // eval_options::rank_key_bits (stage ranking): quantised ranking keys
  int late_r = 0;    // eval_options::late_plans: the late ranking's r (0: r)
  bool library_keys = false;  // eval_options::library_keys: the library's quantised cache
  // eval_options::pool_heads: the KV heads share the budget (select/pooled.hpp); the oracle's
  // rows take it too.
  bool pooled = false;
  pooled_rule pool_rule = pooled_rule::mass;
  // eval_options::layer_shares (empty: none), and the rule that made them, for the name.
  std::vector<double> layer_shares;
  const char* layer_rule = "";
  // eval_options::sparse_from = score_from: the steps before the first scored prediction attend
  // densely (a dense prefill; --dense-prefill). Named "+dense_prefill" in the selector column.
  bool dense_prefill = false;
  // A preset's per-layer budget shares (speculation_preset::layer_rule), computed for each budget
  // by harness::run from the long text's mass curves; empty: none.
  std::optional<layer_budget_rule> preset_layer_rule;
  double preset_layer_floor = 0;
};

// eval_options' budget / correct / late_scores for knobs k at a total budget.
void apply_budget(eval_options& o, double budget, const infinigen_knobs& k) {
  o.budget = budget * (1 - k.correct_share);
  o.correct = budget * k.correct_share;
  o.late_scores = k.late;
}

// A preset's knobs (its skip_layers must be the harness's).
infinigen_knobs knobs_of(const presets::speculation_preset& p, int skip) {
  KVSCOUT_EXPECTS(p.skip_layers == skip, p.name, " skips ", p.skip_layers, " layers, the harness ", skip);
  infinigen_knobs k;
  k.mode = p.mode;
  k.r = p.r;
  k.aggregation = p.aggregation;
  k.late_aggregation = p.query_aggregation;
  k.alpha = p.selector == presets::selector_kind::threshold ? p.alpha : -1.f;
  k.rule = p.rule;
  k.keep = p.keep;
  k.preset = p.name;
  // The correction step, its channels, the partial keys' bits and the layer shares: the preset's
  // own, as the library runs it (presets::budgets, infinigen_policy_host<partial_keys_t<bits>>).
  k.correct_share = p.correction_share;
  if (p.correction_share > 0) k.late_r = p.correction_channels();
  k.key_bits = p.key_bits;
  k.library_keys = p.key_bits > 0;
  k.preset_layer_rule = p.layer_rule;
  k.preset_layer_floor = p.layer_floor;
  return k;
}

// The CSV's policy column: InfiniGen's own configuration under its preset's name.
const char* policy_name(eval_policy p, const infinigen_knobs& k) {
  if (p == eval_policy::infinigen && k.preset != nullptr &&
      (std::strcmp(k.preset, "infinigen_paper") == 0 ||
       std::strcmp(k.preset, "kvscout_default") == 0))
    return k.preset;
  return to_string(p);
}

std::string selector_name(const infinigen_knobs& k) {
  // A keep-set other than the harness's 4 + 16 is named, where the knobs are no preset's (stage
  // ablation); every other row keeps its name.
  char keep[32] = "";
  if (k.preset == nullptr && (k.keep.sinks != 4 || k.keep.recent != 16))
    std::snprintf(keep, sizeof keep, "_keep%d+%d", k.keep.sinks, k.keep.recent);
  // The correction step and the late ranking (issue 32) are named after the selector.
  char late[96] = "";
  std::snprintf(late, sizeof late, "%s%s", k.correct_share > 0 ? "+corrected" : "", k.late ? "+late" : "");
  if (k.correct_share > 0)
    std::snprintf(late, sizeof late, "+corrected%g%s", k.correct_share, k.late ? "+late" : "");
  if (k.late_aggregation && (k.correct_share > 0 || k.late)) {
    std::strncat(late, "+late_", sizeof late - std::strlen(late) - 1);
    std::strncat(late, to_string(*k.late_aggregation), sizeof late - std::strlen(late) - 1);
  }
  if (k.late_r > 0 && (k.correct_share > 0 || k.late)) {
    char lr[24];
    std::snprintf(lr, sizeof lr, "+late_r%d", k.late_r);
    std::strncat(late, lr, sizeof late - std::strlen(late) - 1);
  }
  if (k.key_bits > 0) {
    char kb[24];
    std::snprintf(kb, sizeof kb, k.library_keys ? "+qkeys%db" : "+keys%db", k.key_bits);
    std::strncat(late, kb, sizeof late - std::strlen(late) - 1);
  }
  if (!k.layer_shares.empty()) {
    std::strncat(late, "+layers_", sizeof late - std::strlen(late) - 1);
    std::strncat(late, k.layer_rule, sizeof late - std::strlen(late) - 1);
  }
  if (k.pooled)
    std::strncat(late, k.pool_rule == pooled_rule::coverage ? "+covered" : "+pooled", sizeof late - std::strlen(late) - 1);
  if (k.alpha < 0) return std::string("topk") + keep + late;
  char b[128];
  std::snprintf(b, sizeof b, "threshold_a%g_%s%s%s", static_cast<double>(k.alpha),
                k.rule == threshold_rule::per_head ? "per_head" : "infinigen_mean", keep, late);
  return b;
}

// The CSV's selector column: kvscout's knobs for infinigen rows, top-k (head-pooled or not) for
// the other sparse policies.
std::string selector_column(eval_policy p, const infinigen_knobs& k) {
  if (p == eval_policy::dense) return "";
  std::string n;
  if (p == eval_policy::infinigen) {
    n = selector_name(k);
  } else {
    n = !k.pooled ? "topk" : k.pool_rule == pooled_rule::coverage ? "topk+covered" : "topk+pooled";
    if (!k.layer_shares.empty()) n += std::string("+layers_") + k.layer_rule;
  }
  if (k.dense_prefill) n += "+dense_prefill";
  return n;
}

// Per-layer budgets from mass curves (harness::mass_curves): kvscout::layer_budget_shares
// (select/budgets.hpp) over the speculated layers, rule "coverage" or "mass".
std::vector<double> layer_shares(const std::vector<std::vector<double>>& curves, int skip, double budget,
                                 const std::string& rule, double min_share = 0) {
  const int L = static_cast<int>(curves.size()), bins = L > 0 ? static_cast<int>(curves[0].size()) : 0;
  std::vector<double> flat, out(curves.size());
  for (const auto& c : curves) flat.insert(flat.end(), c.begin(), c.end());
  layer_budget_shares({flat.data(), flat.size()}, L, bins, skip, budget,
                      rule == "mass" ? layer_budget_rule::mass : layer_budget_rule::coverage,
                      {out.data(), out.size()}, min_share);
  return out;
}

struct text_run {
  std::string name;
  std::unique_ptr<model::layer_major_eval> ev;
  int tokens = 0, score_from = 0;
  std::map<int, double> dense_ppl;  // per kv_format
};

class harness {
 public:
  // open_csv: false where only stages copy / prompts run, which write their own CSVs (and must
  // not truncate accuracy.csv in the same directory).
  harness(const model::llama_weights& w, const samples& cal, std::string out_dir, int skip, bool append,
          bool open_csv = true)
      : w_(w), cal_(cal), skip_(skip) {
    if (!open_csv) return;
    const auto mode = append ? std::ios::app : std::ios::trunc;
    csv_.open(out_dir + "/accuracy.csv", std::ios::out | mode);
    layers_.open(out_dir + "/accuracy_layers.csv", std::ios::out | mode);
    KVSCOUT_EXPECTS(csv_.good() && layers_.good(), "cannot write the CSV files under ", out_dir);
    if (append) return;
    csv_ << "stage,text,tokens,scored_from,scored,format,policy,rope_mode,r,aggregation,selector,"
            "budget_pct,ppl,ppl_vs_dense_fp16,ppl_vs_dense_format,fetch_fraction,row_bytes,"
            "bytes_per_step,bytes_vs_dense_fp16,recall,recall_oracle,recall_ratio,overlap,"
            "metric_samples,seconds,pool_pct,eviction\n";
    layers_ << "stage,text,format,policy,rope_mode,r,aggregation,selector,budget_pct,layer,"
               "fetch_fraction,recall,recall_oracle,overlap,samples,pool_pct,eviction\n";
  }

  const std::vector<std::vector<skew_plan>>& plans(rope_mode m, int r) {
    const auto key = std::make_pair(static_cast<int>(m), r);
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      const auto t0 = std::chrono::steady_clock::now();
      it = plans_.emplace(key, calibrate(w_, cal_, skip_, m, r)).first;
      std::printf("  calibrated %s r=%d in %.1f s\n", to_string(m), r, seconds_since(t0));
    }
    return it->second;
  }

  eval_result run(const std::string& stage, text_run& tx, kv_format f, eval_policy p, double budget,
                  const infinigen_knobs& knobs) {
    infinigen_knobs k = knobs;
    k.dense_prefill = k.dense_prefill || dense_prefill;
    if (k.preset_layer_rule && k.layer_shares.empty() && p != eval_policy::dense) {
      KVSCOUT_EXPECTS(static_cast<bool>(preset_shares), k.preset,
                      " needs layer shares: no mass curves to take them from");
      k.layer_shares = preset_shares(k, budget);
      k.layer_rule = "preset";
    }
    eval_options o;
    o.policy = p;
    o.format = f;
    o.budget = p == eval_policy::dense ? 1.0 : budget;
    o.score_from = tx.score_from;
    o.metric_every = metric_every;
    o.metric_from = tx.score_from;
    o.check_oracle_every = p == eval_policy::oracle && f == kv_format::fp16 ? 997 : 0;
    o.kivi_residual = kivi_residual;
    o.kivi_group = kivi_group;
    o.quest_page = quest_page;
    o.pool_tokens = pool_tokens;
    o.pool_eviction = pool_eviction;
    o.kivi_fp16_prompt = kivi_fp16_prompt;
    apply_knobs(o, p, budget, k);
    const eval_result r = tx.ev->run(o);
    if (p == eval_policy::dense && pool_tokens == 0) tx.dense_ppl[dense_key(o)] = r.ppl();
    write(stage, tx, o, k, r);
    ++done_;
    const double el = seconds_since(start_);
    std::printf("[%3d] %-6s %-5s %-15s %-16s r=%-2d %-10s %-28s %5.1f%%  ppl %8.4f  fetch %.3f  recall %.3f "
                "(oracle %.3f)  %5.1f s  (elapsed %.0f s)\n",
                done_, stage.c_str(), format_label(o), policy_name(p, k),
                p == eval_policy::infinigen ? to_string(k.mode) : "-", p == eval_policy::infinigen ? k.r : 0,
                p == eval_policy::infinigen ? to_string(k.aggregation) : "-",
                selector_column(p, k).c_str(), 100 * (o.budget + o.correct), r.ppl(),
                r.fetch_fraction(skip_), r.mean_of(r.recall, skip_), r.mean_of(r.recall_oracle, skip_),
                r.seconds, el);
    if (o.pool_tokens > 0)
      std::printf("      host pool: %d tokens (%s), %s eviction\n", o.pool_tokens, pool_pct(tx, o).c_str(),
                  to_string(o.pool_eviction));
    if (r.oracle_checks > 0)
      std::printf("      oracle_policy_host cross-check: %d steps, largest relative score difference %.3g\n",
                  r.oracle_checks, r.oracle_check_max_rel);
    std::fflush(stdout);
    return r;
  }

  // One configuration on a sequence of its own (stages copy and prompts): fp16, every token
  // through the policy, scored on the predictions at [score_from, T - 1), no metrics, no CSV row.
  eval_result evaluate(model::layer_major_eval& ev, int score_from, eval_policy p, double budget,
                       const infinigen_knobs& k) {
    eval_options o;
    o.policy = p;
    o.format = kv_format::fp16;
    o.budget = p == eval_policy::dense ? 1.0 : budget;
    o.score_from = score_from;
    o.quest_page = quest_page;
    apply_knobs(o, p, budget, k);
    return ev.run(o);
  }

  // The knobs' part of eval_options, the same for every stage (policy p at `budget`; after
  // o.score_from is set).
  void apply_knobs(eval_options& o, eval_policy p, double budget, const infinigen_knobs& k) {
    o.sparse_from = k.dense_prefill && p != eval_policy::dense ? o.score_from : 0;
    o.aggregation = p == eval_policy::infinigen ? k.aggregation : gqa_aggregation::max_logit;
    o.pool_heads = k.pooled && p != eval_policy::dense;
    o.pool_rule = k.pool_rule;
    o.layer_shares = k.layer_shares.empty() || p == eval_policy::dense ? nullptr : &k.layer_shares;
    if (p == eval_policy::infinigen) {
      o.plans = &plans(k.mode, k.r);
      o.alpha = k.alpha;
      o.rule = k.rule;
      o.keep = k.keep;
      apply_budget(o, budget, k);
      o.late_aggregation = k.late_aggregation;
      o.rank_key_bits = k.key_bits;
      o.library_keys = k.library_keys;
      if (k.late_r > 0 && k.late_r != k.r) o.late_plans = &plans(k.mode, k.late_r);
    }
  }

  // The oracle's attention-mass curves of tx's unscored first half (steps [T / 8, T / 2), every
  // 16th): curves[l][b] = the share of layer l's exact attention mass the top (b + 1) / bins of
  // the cached rows hold, averaged over steps and KV heads. What an engine can measure at prefill.
  std::vector<std::vector<double>> mass_curves(text_run& tx, int bins, bool outside_keep = false) {
    eval_options o;
    o.curve_outside_keep = outside_keep;
    o.policy = eval_policy::oracle;
    o.budget = 0.5;  // every step is scored by the oracle (a cap below the length)
    o.curve_bins = bins;
    o.curve_from = tx.tokens / 8;
    o.curve_to = tx.score_from;
    const auto t0 = std::chrono::steady_clock::now();
    const eval_result r = tx.ev->run(o);
    std::vector<std::vector<double>> c(r.curve_samples.size());
    for (std::size_t l = 0; l < c.size(); ++l) {
      const int n = r.curve_samples[l];
      for (int b = 0; b < bins; ++b)
        c[l].push_back(n > 0 ? r.mass_curve[l * static_cast<std::size_t>(bins) + static_cast<std::size_t>(b)] / n : 0.0);
    }
    std::printf("  mass curves of %s from steps [%d, %d) in %.1f s\n", tx.name.c_str(), o.curve_from,
                o.curve_to, seconds_since(t0));
    return c;
  }

  // The layer shares of a preset's knobs at a budget (main: from the long text's mass curves).
  std::function<std::vector<double>(const infinigen_knobs&, double)> preset_shares;
  int metric_every = 8;
  // --dense-prefill: in every stage, the steps before the first scored prediction attend densely
  // (the prompt's prefill, as an engine runs it); the policy selects from there on.
  bool dense_prefill = false;
  int kivi_residual = 128, kivi_group = 32, quest_page = 16;
  // KIVI's prompt in fp16 (eval_options::kivi_fp16_prompt): stage kivi_prompt sets it for its
  // second half; its rows say so in the format column ("kivi2_fp16_prompt").
  bool kivi_fp16_prompt = false;
  int pool_tokens = 0;  // host pool capacity per (layer, KV head); 0: unbounded
  eviction pool_eviction = eviction::counter;

 private:
  static bool kivi_prompt_row(const eval_options& o) {
    return o.kivi_fp16_prompt && (o.format == kv_format::kivi2 || o.format == kv_format::kivi4);
  }
  // The key of a run's dense perplexity: its format, and KIVI's prompt in fp16 or not.
  static int dense_key(const eval_options& o) { return static_cast<int>(o.format) + (kivi_prompt_row(o) ? 100 : 0); }
  static const char* format_label(const eval_options& o) {
    if (!kivi_prompt_row(o)) return to_string(o.format);
    return o.format == kv_format::kivi2 ? "kivi2_fp16_prompt" : "kivi4_fp16_prompt";
  }
  // The pool as a percentage of the text's tokens, "" when unbounded.
  static std::string pool_pct(const text_run& tx, const eval_options& o) {
    if (o.pool_tokens <= 0) return "";
    char b[32];
    std::snprintf(b, sizeof b, "%g", 100.0 * o.pool_tokens / tx.tokens);
    return b;
  }
  // The pool's two CSV columns, appended to a row that ends in '\n'.
  static void add_pool_columns(char* b, std::size_t size, const text_run& tx, const eval_options& o) {
    const std::size_t n = std::strlen(b);
    if (n == 0 || n >= size) return;
    std::snprintf(b + n - 1, size - (n - 1), ",%s,%s\n", pool_pct(tx, o).c_str(),
                  o.pool_tokens > 0 ? to_string(o.pool_eviction) : "");
  }

  void write(const std::string& stage, text_run& tx, const eval_options& o, const infinigen_knobs& k,
             const eval_result& r) {
    const bool ig = o.policy == eval_policy::infinigen;
    const double dense16 = tx.dense_ppl.count(static_cast<int>(kv_format::fp16))
                               ? tx.dense_ppl[static_cast<int>(kv_format::fp16)] : 0.0;
    const double densef = tx.dense_ppl.count(dense_key(o)) ? tx.dense_ppl[dense_key(o)] : 0.0;
    // Bytes per decode step over all layers (the dense layers below skip fetch every row).
    double rows = 0, rows_dense = 0;
    for (std::size_t l = 0; l < r.rows_fetched.size(); ++l) rows += r.rows_fetched[l], rows_dense += r.rows_dense[l];
    const double steps = r.scored > 0 ? r.scored : 1;
    const double bytes = rows * r.row_bytes / steps;
    eval_options o16 = o;
    o16.format = kv_format::fp16;
    // A dense fp16 step fetches every cached token of every layer: the fp16 row bytes times the
    // cached tokens (rows_dense counts visible rows, which for KIVI excludes the residual window).
    double dense16_rows = 0;
    for (int t = tx.score_from; t < tx.tokens - 1; ++t) dense16_rows += static_cast<double>(t);
    const double dense16_bytes = dense16_rows * w_.cfg.n_kv_heads * w_.cfg.n_layers *
                                 static_cast<double>(tx.ev->row_bytes(o16)) / steps;
    char b[1024];
    const double rec = r.mean_of(r.recall, skip_), reco = r.mean_of(r.recall_oracle, skip_);
    int samples = 0;
    for (int s : r.samples) samples += s;
    std::snprintf(b, sizeof b,
                  "%s,%s,%d,%d,%d,%s,%s,%s,%d,%s,%s,%g,%.6f,%.6f,%.6f,%.6f,%g,%.1f,%.6f,%.6f,%.6f,%.6f,%.6f,%d,%.2f\n",
                  stage.c_str(), tx.name.c_str(), tx.tokens, tx.score_from, r.scored, format_label(o),
                  policy_name(o.policy, k), ig ? to_string(k.mode) : "", ig ? k.r : 0,
                  ig ? to_string(k.aggregation) : "", selector_column(o.policy, k).c_str(),
                  100 * (o.budget + o.correct), r.ppl(), dense16 > 0 ? r.ppl() / dense16 : 0.0, densef > 0 ? r.ppl() / densef : 0.0,
                  r.fetch_fraction(skip_), r.row_bytes, bytes, dense16_bytes > 0 ? bytes / dense16_bytes : 0.0, rec, reco,
                  reco > 0 ? rec / reco : 0.0, r.mean_of(r.overlap, skip_), samples, r.seconds);
    add_pool_columns(b, sizeof b, tx, o);
    csv_ << b;
    csv_.flush();
    for (std::size_t l = 0; l < r.rows_fetched.size(); ++l) {
      const int n = r.samples[l];
      std::snprintf(b, sizeof b, "%s,%s,%s,%s,%s,%d,%s,%s,%g,%zu,%.6f,%.6f,%.6f,%.6f,%d\n", stage.c_str(),
                    tx.name.c_str(), format_label(o), policy_name(o.policy, k), ig ? to_string(k.mode) : "",
                    ig ? k.r : 0, ig ? to_string(k.aggregation) : "",
                    selector_column(o.policy, k).c_str(), 100 * (o.budget + o.correct), l,
                    r.rows_dense[l] > 0 ? r.rows_fetched[l] / r.rows_dense[l] : 0.0, n > 0 ? r.recall[l] / n : 0.0,
                    n > 0 ? r.recall_oracle[l] / n : 0.0, n > 0 ? r.overlap[l] / n : 0.0, n);
      add_pool_columns(b, sizeof b, tx, o);
      layers_ << b;
    }
    layers_.flush();
  }

  const model::llama_weights& w_;
  const samples& cal_;
  int skip_;
  std::map<std::pair<int, int>, std::vector<std::vector<skew_plan>>> plans_;
  std::ofstream csv_, layers_;
  int done_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// ---- stages copy and prompts (issue 32): retrieval over a long context ---------------------------

// One configuration of the retrieval stages: a policy at a budget, or dense on the control prompts.
struct retrieval_config {
  std::string name;  // CSV / table name
  eval_policy policy = eval_policy::dense;
  double budget = 1.0;
  infinigen_knobs knobs;
  bool control = false;  // dense attention on the control prompt (stage copy only)
};

// The configurations named in `list` (a comma list of dense, control, oracle, kvscout_default,
// infinigen_paper, quest, h2o, streaming), in that order: dense and control once, the others at
// every budget. control is dense attention on the control prompts (stage copy only).
std::vector<retrieval_config> retrieval_configs(const std::vector<double>& budgets, const infinigen_knobs& def,
                                                const infinigen_knobs& paper, const std::string& list,
                                                bool with_control, double correct_share,
                                                const std::function<std::vector<double>(double)>& shares_at) {
  static const char* const known[] = {"dense", "control", "oracle", "oracle_pooled", "kvscout_default",
                                      "kvscout_corrected", "kvscout_late", "kvscout_pooled",
                                      "kvscout_pooled_corrected", "oracle_layers", "kvscout_layers",
                                      "kvscout_layers_corrected", "infinigen_paper", "quest", "h2o",
                                      "streaming"};
  std::vector<std::string> names;
  std::stringstream ss(list);
  for (std::string x; std::getline(ss, x, ',');) {
    bool ok = false;
    for (const char* k : known) ok = ok || x == k;
    KVSCOUT_EXPECTS(ok, "--copy-policies: \"", x, "\" in \"", list,
                    "\", expected dense, control, oracle, oracle_pooled, kvscout_default, kvscout_corrected, "
                    "kvscout_late, kvscout_pooled, kvscout_pooled_corrected, oracle_layers, kvscout_layers, "
                    "kvscout_layers_corrected, infinigen_paper, quest, h2o or streaming");
    names.push_back(x);
  }
  const auto has = [&](const char* k) { return std::find(names.begin(), names.end(), k) != names.end(); };
  std::vector<retrieval_config> out;
  if (has("dense")) out.push_back({"dense", eval_policy::dense, 1.0, {}, false});
  if (with_control && has("control")) out.push_back({"control", eval_policy::dense, 1.0, {}, true});
  for (double b : budgets) {
    if (has("oracle")) out.push_back({"oracle", eval_policy::oracle, b, {}, false});
    if (has("kvscout_default")) out.push_back({"kvscout_default", eval_policy::infinigen, b, def, false});
    if (has("kvscout_corrected")) {
      infinigen_knobs c = def;
      c.correct_share = correct_share;
      out.push_back({"kvscout_corrected", eval_policy::infinigen, b, c, false});
    }
    if (has("kvscout_late")) {
      infinigen_knobs c = def;
      c.late = true;
      out.push_back({"kvscout_late", eval_policy::infinigen, b, c, false});
    }
    // Head-pooled budgets (issue 32, part 2): the oracle and kvscout's default with the KV heads
    // sharing the budget, the latter also with the correction step.
    if (has("oracle_pooled")) {
      infinigen_knobs c;
      c.pooled = true;
      out.push_back({"oracle_pooled", eval_policy::oracle, b, c, false});
    }
    if (has("kvscout_pooled") || has("kvscout_pooled_corrected")) {
      infinigen_knobs c = def;
      c.pooled = true;
      if (has("kvscout_pooled")) out.push_back({"kvscout_pooled", eval_policy::infinigen, b, c, false});
      c.correct_share = correct_share;
      if (has("kvscout_pooled_corrected"))
        out.push_back({"kvscout_pooled_corrected", eval_policy::infinigen, b, c, false});
    }
    // Per-layer budgets (issue 32, part 2): the model's layer shares at this budget (shares_at).
    if (has("oracle_layers") || has("kvscout_layers") || has("kvscout_layers_corrected")) {
      infinigen_knobs o, c = def;
      o.layer_shares = c.layer_shares = shares_at(b);
      o.layer_rule = c.layer_rule = "coverage_floor0.5";
      if (has("oracle_layers")) out.push_back({"oracle_layers", eval_policy::oracle, b, o, false});
      if (has("kvscout_layers")) out.push_back({"kvscout_layers", eval_policy::infinigen, b, c, false});
      c.correct_share = correct_share;
      if (has("kvscout_layers_corrected"))
        out.push_back({"kvscout_layers_corrected", eval_policy::infinigen, b, c, false});
    }
    if (has("infinigen_paper")) out.push_back({"infinigen_paper", eval_policy::infinigen, b, paper, false});
    for (eval_policy p : {eval_policy::quest, eval_policy::h2o, eval_policy::streaming})
      if (has(to_string(p))) out.push_back({to_string(p), p, b, {}, false});
  }
  KVSCOUT_EXPECTS(!out.empty(), "--copy-policies \"", list, "\" names no configuration to run");
  return out;
}

// Teacher-forced scores of a target span: sums over its tokens.
struct span_score {
  int tokens = 0, correct = 0, prompts = 0, exact = 0;
  double nll = 0, fetched = 0, dense_rows = 0, corrected = 0, seconds = 0;
  void add(const eval_result& r, int skip) {
    tokens += r.scored, correct += r.correct, nll += r.nll, ++prompts;
    exact += r.correct == r.scored ? 1 : 0;
    for (std::size_t l = static_cast<std::size_t>(skip); l < r.rows_fetched.size(); ++l)
      fetched += r.rows_fetched[l], dense_rows += r.rows_dense[l], corrected += r.rows_corrected[l];
    seconds += r.seconds;
  }
  [[nodiscard]] double accuracy() const { return tokens > 0 ? static_cast<double>(correct) / tokens : 0.0; }
  [[nodiscard]] double mean_nll() const { return tokens > 0 ? nll / tokens : 0.0; }
  [[nodiscard]] double fetch() const { return dense_rows > 0 ? fetched / dense_rows : 0.0; }
  [[nodiscard]] double corrected_fraction() const { return dense_rows > 0 ? corrected / dense_rows : 0.0; }
};

std::vector<double> parse_budgets(const std::string& list) {
  std::vector<double> out;
  std::stringstream ss(list);
  for (std::string x; std::getline(ss, x, ',');) {
    char* end = nullptr;
    const double pct = std::strtod(x.c_str(), &end);
    KVSCOUT_EXPECTS(end != x.c_str() && *end == '\0' && pct > 0 && pct <= 100, "budget \"", x,
                    "\" in \"", list, "\": expected a percentage in (0, 100]");
    out.push_back(pct / 100);
  }
  KVSCOUT_EXPECTS(!out.empty(), "--copy-budgets \"", list, "\": expected a comma list of percentages");
  return out;
}

int int_arg(int argc, char** argv, const char* name, const char* fallback, int lo, int hi) {
  const std::string v = arg(argc, argv, name, fallback);
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  KVSCOUT_EXPECTS(end != v.c_str() && *end == '\0' && x >= lo && x <= hi, name, " ", v, ": expected an integer in [",
                  lo, ", ", hi, "]");
  return static_cast<int>(x);
}

// The table of a retrieval stage: one line per configuration, over all prompts.
void print_table(const std::vector<retrieval_config>& cfgs, const std::vector<span_score>& sc, bool exact) {
  std::printf("\n%-16s %7s %8s %9s %8s%s\n", "configuration", "budget", "tok.acc", "mean NLL", "fetched",
              exact ? "  exact match" : "");
  for (std::size_t c = 0; c < cfgs.size(); ++c) {
    char b[16] = "-";
    if (cfgs[c].policy != eval_policy::dense) std::snprintf(b, sizeof b, "%g %%", 100 * cfgs[c].budget);
    std::printf("%-16s %7s %8.4f %9.4f %8.3f", cfgs[c].name.c_str(), b, sc[c].accuracy(), sc[c].mean_nll(),
                sc[c].fetch());
    if (exact) std::printf("  %d / %d", sc[c].exact, sc[c].prompts);
    std::printf("   (%d tokens, %d prompts)\n", sc[c].tokens, sc[c].prompts);
  }
  std::fflush(stdout);
}

const char* csv_header =
    "stage,prompt,tokens,target_tokens,depth,span_at,distance,config,policy,rope_mode,r,selector,budget_pct,"
    "correct,token_accuracy,nll_sum,mean_nll,exact_match,fetch_fraction,seconds,correct_share,corrected_fraction\n";

// One CSV row; prompt "all" for the sums over prompts (depth, span_at, distance empty there).
void csv_row(std::ofstream& f, const std::string& stage, const std::string& prompt, int tokens, const std::string& depth,
             const std::string& span_at, const std::string& distance, const retrieval_config& c, const span_score& s) {
  const bool ig = c.policy == eval_policy::infinigen;
  char b[768];
  std::snprintf(b, sizeof b, "%s,%s,%d,%d,%s,%s,%s,%s,%s,%s,%d,%s,%g,%d,%.6f,%.6f,%.6f,%d,%.6f,%.2f,%g,%.6f\n",
                stage.c_str(), prompt.c_str(), tokens, s.tokens, depth.c_str(), span_at.c_str(), distance.c_str(),
                c.name.c_str(), to_string(c.policy), ig ? to_string(c.knobs.mode) : "", ig ? c.knobs.r : 0,
                selector_column(c.policy, c.knobs).c_str(),
                c.policy == eval_policy::dense ? 100.0 : 100 * c.budget, s.correct, s.accuracy(), s.nll,
                s.mean_nll(), s.exact, s.fetch(), s.seconds, ig ? c.knobs.correct_share : 0.0, s.corrected_fraction());
  f << b;
  f.flush();
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string model_path = arg(argc, argv, "--model", "");
  const std::string long_path = arg(argc, argv, "--long", "/usr/share/common-licenses/GPL-3");
  const std::string short_path = arg(argc, argv, "--short", "");
  const std::string out_dir = arg(argc, argv, "--out", "docs");
  const bool quick = flag(argc, argv, "--quick");
  const int n_long = std::atoi(arg(argc, argv, "--tokens", quick ? "1024" : "4096").c_str());
  const int n_short = std::atoi(arg(argc, argv, "--short-tokens", quick ? "512" : "2048").c_str());
  const int n_cal = std::atoi(arg(argc, argv, "--calibration", quick ? "256" : "512").c_str());
  const std::string formats_arg = arg(argc, argv, "--formats", "fp16,kivi4,kivi2");
  // Stages to run (all by default); without the sweep, kvscout's knobs are
  // presets::kvscout_default's (--r overrides its r). --append adds rows to existing CSVs.
  // --prompts FILE without --stages runs stage prompts alone.
  const std::string prompts_path = arg(argc, argv, "--prompts", "");
  const std::string stages = arg(argc, argv, "--stages", prompts_path.empty() ? "sweep,matrix,planes,kivi_rest" : "prompts");
  const bool append = flag(argc, argv, "--append");
  const std::string r_arg = arg(argc, argv, "--r", "");
  // Without the fp16 matrix (which picks it), the RoPE mode the other formats' matrix runs.
  const std::string mode_arg = arg(argc, argv, "--mode", "");
  constexpr int skip = 2;
  KVSCOUT_EXPECTS(!model_path.empty(), "usage: --model PATH.gguf [--long FILE] [--short FILE] [--out DIR] [--quick]");

  const auto t_all = std::chrono::steady_clock::now();
  model::gguf_file file(model_path);
  const model::llama_weights w = model::load_llama(file);
  const model::bpe_tokenizer tok = model::tokenizer_from_gguf(file);
  std::printf("model: %s; %d layers, %d query / %d KV heads, head_dim %d\n",
              file.get_string("general.name").c_str(), w.cfg.n_layers, w.cfg.n_heads, w.cfg.n_kv_heads,
              w.cfg.head_dim);

  // ---- texts: calibration on the first n_cal tokens of the long text, evaluation after them ----
  const std::vector<int32_t> long_ids = tok.encode(read_text(long_path));
  KVSCOUT_EXPECTS(static_cast<int>(long_ids.size()) >= n_cal + n_long, long_path, " has ", long_ids.size(),
                  " tokens, need ", n_cal + n_long);
  std::printf("long text %s: %zu tokens; calibration [0, %d), evaluation [%d, %d)\n", long_path.c_str(),
              long_ids.size(), n_cal, n_cal, n_cal + n_long);
  const auto t_cal = std::chrono::steady_clock::now();
  const samples cal = collect(w, std::vector<int32_t>(long_ids.begin(), long_ids.begin() + n_cal));
  std::printf("calibration samples collected in %.1f s\n", seconds_since(t_cal));

  bool main_stages = false;  // stages that write accuracy.csv / accuracy_layers.csv
  for (const char* st : {"sweep", "matrix", "paper", "planes", "kivi_rest", "kivi_prompt", "ablation", "pool",
                         "correction", "budgets", "ranking", "default"})
    main_stages = main_stages || stages.find(st) != std::string::npos;
  harness hz(w, cal, out_dir, skip, append, main_stages);
  hz.dense_prefill = flag(argc, argv, "--dense-prefill");
  text_run lt;
  lt.name = long_path.substr(long_path.find_last_of('/') + 1);
  lt.tokens = n_long;
  lt.score_from = n_long / 2;
  lt.ev = std::make_unique<model::layer_major_eval>(
      w, std::vector<int32_t>(long_ids.begin() + n_cal, long_ids.begin() + n_cal + n_long), skip);

  // The presets' layer shares: the oracle's mass curves of the long text's unscored half, measured
  // once on first use (what an engine measures at prefill or on a calibration text).
  std::vector<std::vector<double>> preset_curves;
  hz.preset_shares = [&](const infinigen_knobs& k, double b) {
    if (preset_curves.empty()) preset_curves = hz.mass_curves(lt, 400);
    std::ostringstream rule;
    rule << *k.preset_layer_rule;
    return layer_shares(preset_curves, skip, b, rule.str(), k.preset_layer_floor);
  };
  // ---- stage default: presets::kvscout_default by its name alone at --pool-budgets (5,10,20 %),
  // fp16 on the long text, against dense
  // ------------------------------------------------------------
  if (stages.find("default") != std::string::npos) {
    if (!lt.dense_ppl.count(static_cast<int>(kv_format::fp16)))
      hz.run("default", lt, kv_format::fp16, eval_policy::dense, 1.0, {});
    const infinigen_knobs def = knobs_of(presets::kvscout_default(w.cfg.head_dim), skip);
    for (double b : parse_budgets(arg(argc, argv, "--pool-budgets", "5,10,20")))
      hz.run("default", lt, kv_format::fp16, eval_policy::infinigen, b, def);
  }

  // kvscout's default (the sweep below re-derives it) and InfiniGen's own configuration.
  const infinigen_knobs paper = knobs_of(presets::infinigen_paper(w.cfg.head_dim), skip);
  infinigen_knobs best = knobs_of(presets::kvscout_speculation_only(w.cfg.head_dim), skip);
  best.preset = nullptr;  // --r, --mode and the sweep may change it
  if (!r_arg.empty()) best.r = std::atoi(r_arg.c_str());

  // --rank-r R, --rank-bits B, --late-agg A (stages budgets and copy): kvscout's configurations
  // with r = R, B-bit ranking keys (eval_options::rank_key_bits) and the late ranking's own
  // aggregation (infinigen_config::query_aggregation); default: the preset's.
  const int rank_r = int_arg(argc, argv, "--rank-r", "0", 0, w.cfg.head_dim);
  const int rank_bits = int_arg(argc, argv, "--rank-bits", "0", 0, 8);
  const int late_r = int_arg(argc, argv, "--late-r", "0", 0, w.cfg.head_dim);
  // --library-keys: the ranking keys in the library's quantised cache, not the simulation.
  const bool library_keys = flag(argc, argv, "--library-keys");
  const std::string late_agg = arg(argc, argv, "--late-agg", "");
  std::optional<gqa_aggregation> late_aggregation;
  for (gqa_aggregation x : {gqa_aggregation::max_logit, gqa_aggregation::mean_logit, gqa_aggregation::sum_prob})
    if (late_agg == to_string(x)) late_aggregation = x;
  KVSCOUT_EXPECTS(late_agg.empty() || late_aggregation, "--late-agg ", late_agg,
                  ": expected max_logit, mean_logit or sum_prob");
  const auto rank_overrides = [&](infinigen_knobs& k) {
    if (rank_r > 0) k.r = rank_r, k.preset = nullptr;
    k.key_bits = rank_bits;
    if (late_aggregation) k.late_aggregation = late_aggregation;
    k.late_r = late_r;
    k.library_keys = library_keys;
  };

  // ---- stage 1: the speculation's knobs at 10 % on the long text, fp16 ---------------------------
  const double b10 = 0.10;
  double best_ppl = 1e300;
  if (stages.find("sweep") != std::string::npos) {
    hz.run("sweep", lt, kv_format::fp16, eval_policy::dense, 1.0, {});
    best = {};
    auto consider = [&](const infinigen_knobs& k) {
      const double p = hz.run("sweep", lt, kv_format::fp16, eval_policy::infinigen, b10, k).ppl();
      if (p < best_ppl) best_ppl = p, best = k;
    };
    for (int r : quick ? std::vector<int>{16} : std::vector<int>{8, 16, 32}) {
      infinigen_knobs k;
      k.r = r;
      consider(k);
    }
    if (!quick) {
      for (gqa_aggregation a : {gqa_aggregation::mean_logit, gqa_aggregation::sum_prob}) {
        infinigen_knobs k = best;
        k.aggregation = a;
        consider(k);
      }
      const infinigen_knobs topk = best;
      for (float alpha : {2.f, 4.f, 6.f, 8.f}) {
        infinigen_knobs k = topk;
        k.alpha = alpha;
        consider(k);
      }
      infinigen_knobs k = topk;
      k.alpha = 4.f;
      k.rule = threshold_rule::infinigen_mean;
      consider(k);
    }
    std::printf("kvscout's defaults from the sweep: r = %d, aggregation %s, selector %s (ppl %.4f at 10 %%)\n",
                best.r, to_string(best.aggregation), selector_name(best).c_str(), best_ppl);
    // InfiniGen's own configuration at the same cap, for reference (not a candidate).
    hz.run("sweep", lt, kv_format::fp16, eval_policy::infinigen, b10, paper);
  }

  // ---- stage 2: the matrix -------------------------------------------------------------------------
  const std::vector<double> budgets = {0.02, 0.05, 0.10, 0.20, 0.50};
  // The full policy set runs on fp16; the KIVI formats run the oracle, kvscout's speculation in
  // the RoPE mode that did best at 10 % on fp16, InfiniGen (paper), Quest and streaming (compute:
  // see docs/accuracy_log.md, "KV formats").
  rope_mode best_mode = best.mode;
  if (!mode_arg.empty()) {
    bool known = false;
    for (rope_mode m :
         {rope_mode::post_rope_skew, rope_mode::rope_planes, rope_mode::pre_rope_folded})
      if (mode_arg == to_string(m)) best_mode = best.mode = m, known = true;
    KVSCOUT_EXPECTS(known, "--mode ", mode_arg,
                    ": expected post_rope_skew, rope_planes or pre_rope_folded");
  }
  double best_mode_ppl = 1e300;
  auto matrix = [&](text_run& tx, kv_format f) {
    const bool full_set = f == kv_format::fp16;
    // Dense fp16 first where the run has none (a KIVI-only run): every row's ppl_vs_dense_fp16.
    if (f != kv_format::fp16 && !tx.dense_ppl.count(static_cast<int>(kv_format::fp16)))
      hz.run("matrix", tx, kv_format::fp16, eval_policy::dense, 1.0, {});
    if (!tx.dense_ppl.count(static_cast<int>(f))) hz.run("matrix", tx, f, eval_policy::dense, 1.0, {});
    for (double b : budgets) {
      hz.run("matrix", tx, f, eval_policy::oracle, b, {});
      for (rope_mode m : {rope_mode::post_rope_skew, rope_mode::rope_planes, rope_mode::pre_rope_folded}) {
        if (!full_set && m != best_mode) continue;
        infinigen_knobs k = best;
        k.mode = m;
        const double p = hz.run("matrix", tx, f, eval_policy::infinigen, b, k).ppl();
        if (&tx == &lt && f == kv_format::fp16 && b == 0.10 && p < best_mode_ppl) best_mode_ppl = p, best_mode = m;
      }
      hz.run("matrix", tx, f, eval_policy::infinigen, b, paper);
      hz.run("matrix", tx, f, eval_policy::quest, b, {});
      if (full_set) hz.run("matrix", tx, f, eval_policy::h2o, b, {});
      hz.run("matrix", tx, f, eval_policy::streaming, b, {});
    }
  };
  std::vector<kv_format> formats;
  for (kv_format f : {kv_format::fp16, kv_format::kivi4, kv_format::kivi2, kv_format::fp8})
    if (formats_arg.find(to_string(f)) != std::string::npos) formats.push_back(f);
  const bool run_matrix = stages.find("matrix") != std::string::npos;
  if (run_matrix && !formats.empty() && formats[0] == kv_format::fp16) {
    matrix(lt, kv_format::fp16);
    std::printf("kvscout's default RoPE mode (best perplexity at 10 %% on fp16): %s\n", to_string(best_mode));
  }
  const auto short_text = [&](text_run& st) {
    const std::vector<int32_t> ids = tok.encode(read_text(short_path));
    KVSCOUT_EXPECTS(static_cast<int>(ids.size()) >= n_short, short_path, " has ", ids.size(), " tokens, need ",
                    n_short);
    std::printf("short text %s: %zu tokens; evaluation [0, %d) (skew calibrated on the long text)\n",
                short_path.c_str(), ids.size(), n_short);
    st.name = short_path.substr(short_path.find_last_of('/') + 1);
    st.tokens = n_short;
    st.score_from = n_short / 2;
    st.ev = std::make_unique<model::layer_major_eval>(w, std::vector<int32_t>(ids.begin(), ids.begin() + n_short), skip);
  };
  if (run_matrix && !short_path.empty()) {
    text_run st;
    short_text(st);
    matrix(st, kv_format::fp16);
  }
  for (kv_format f : formats)
    if (run_matrix && f != kv_format::fp16) matrix(lt, f);

  // ---- stage paper: the matrix's InfiniGen (paper) rows alone, where the matrix does not run ----
  if (!run_matrix && stages.find("paper") != std::string::npos) {
    const auto paper_rows = [&](text_run& tx, kv_format f) {
      if (f != kv_format::fp16 && !tx.dense_ppl.count(static_cast<int>(kv_format::fp16)))
        hz.run("matrix", tx, kv_format::fp16, eval_policy::dense, 1.0, {});
      if (!tx.dense_ppl.count(static_cast<int>(f))) hz.run("matrix", tx, f, eval_policy::dense, 1.0, {});
      for (double b : budgets) hz.run("matrix", tx, f, eval_policy::infinigen, b, paper);
    };
    for (kv_format f : formats) paper_rows(lt, f);
    if (!short_path.empty()) {
      text_run st;
      short_text(st);
      paper_rows(st, kv_format::fp16);
    }
  }

  // ---- stage 3: the RoPE-plane mode's own knobs at 10 % (the sweep ran in InfiniGen's
  // post-RoPE skew mode; the matrix showed rope_planes ahead) ----------------------------------------
  if (stages.find("planes") != std::string::npos) {
    if (!lt.dense_ppl.count(static_cast<int>(kv_format::fp16)))
      hz.run("planes", lt, kv_format::fp16, eval_policy::dense, 1.0, {});
    infinigen_knobs base = best;
    base.mode = rope_mode::rope_planes;
    for (int r : {8, 16, 64}) {
      if (r == base.r) continue;
      infinigen_knobs k = base;
      k.r = r;
      hz.run("planes", lt, kv_format::fp16, eval_policy::infinigen, b10, k);
    }
    infinigen_knobs k = base;
    k.aggregation = gqa_aggregation::mean_logit;
    hz.run("planes", lt, kv_format::fp16, eval_policy::infinigen, b10, k);
    k = base;
    k.alpha = 8.f;
    hz.run("planes", lt, kv_format::fp16, eval_policy::infinigen, b10, k);
  }
  // ---- stage 4: the rest of the KIVI matrix (the matrix ran the KIVI formats with the oracle,
  // InfiniGen in the chosen mode, Quest and streaming): InfiniGen's other RoPE modes and H2O ------
  if (stages.find("kivi_rest") != std::string::npos) {
    for (kv_format f : formats) {
      if (f == kv_format::fp16) continue;
      if (!lt.dense_ppl.count(static_cast<int>(f))) hz.run("kivi_rest", lt, f, eval_policy::dense, 1.0, {});
      for (double b : budgets) {
        for (rope_mode m : {rope_mode::post_rope_skew, rope_mode::pre_rope_folded}) {
          infinigen_knobs k = best;
          k.mode = m;
          hz.run("kivi_rest", lt, f, eval_policy::infinigen, b, k);
        }
        hz.run("kivi_rest", lt, f, eval_policy::h2o, b, {});
      }
    }
  }
  // ---- stage kivi_prompt: KIVI's formats quantised from token 0 (as every other stage runs them)
  // and with the prompt in fp16, as KIVI's own evaluation runs it: dense, and kvscout's default
  // at 10 % of the rows ------------------------------------------------------------------------
  if (stages.find("kivi_prompt") != std::string::npos) {
    if (!lt.dense_ppl.count(static_cast<int>(kv_format::fp16)))
      hz.run("kivi_prompt", lt, kv_format::fp16, eval_policy::dense, 1.0, {});
    for (const bool fp16_prompt : {false, true}) {
      hz.kivi_fp16_prompt = fp16_prompt;
      for (kv_format f : formats) {
        if (f != kv_format::kivi2 && f != kv_format::kivi4) continue;
        hz.run("kivi_prompt", lt, f, eval_policy::dense, 1.0, {});
        hz.run("kivi_prompt", lt, f, eval_policy::infinigen, 0.10, best);
      }
    }
    hz.kivi_fp16_prompt = false;
  }
  // ---- stage pool: a bounded host pool (issue 31), the default InfiniGen configuration at 10 %,
  // fp16 (rope_planes unless the matrix or --mode chose otherwise) ---------------------------------
  // ---- stage ablation: from InfiniGen (paper) towards kvscout's default, one knob at a time, at
  // 10 % on the long text, fp16: what each of kvscout's choices gains on a GQA + RoPE model ------
  if (stages.find("ablation") != std::string::npos) {
    if (!lt.dense_ppl.count(static_cast<int>(kv_format::fp16)))
      hz.run("ablation", lt, kv_format::fp16, eval_policy::dense, 1.0, {});
    const infinigen_knobs def = knobs_of(presets::kvscout_speculation_only(w.cfg.head_dim), skip);
    infinigen_knobs k = paper;
    k.preset = nullptr;
    const auto with = [&](auto&& change) {
      infinigen_knobs x = k;
      change(x);
      hz.run("ablation", lt, kv_format::fp16, eval_policy::infinigen, b10, x);
    };
    with([&](infinigen_knobs& x) { x.keep = def.keep; });                  // + kvscout's keep-set
    with([&](infinigen_knobs& x) { x.r = def.r; });                        // + r = head_dim / 2
    with([&](infinigen_knobs& x) { x.alpha = -1.f; });                     // + exact top-k
    with([&](infinigen_knobs& x) { x.mode = def.mode; });                  // + RoPE planes
    with([&](infinigen_knobs& x) { x.keep = def.keep, x.r = def.r; });     // keep-set and r
    with([&](infinigen_knobs& x) { x.keep = def.keep, x.r = def.r, x.mode = def.mode; });
  }
  if (stages.find("pool") != std::string::npos) {
    if (!lt.dense_ppl.count(static_cast<int>(kv_format::fp16)))
      hz.run("pool", lt, kv_format::fp16, eval_policy::dense, 1.0, {});
    infinigen_knobs k = best;
    k.mode = run_matrix || !mode_arg.empty() ? best_mode : rope_mode::rope_planes;
    const double unbounded = hz.run("pool", lt, kv_format::fp16, eval_policy::infinigen, b10, k).ppl();
    for (int pct : {100, 75, 50, 25})
      for (eviction e : {eviction::counter, eviction::lru}) {
        hz.pool_tokens = lt.tokens * pct / 100;
        hz.pool_eviction = e;
        const double p = hz.run("pool", lt, kv_format::fp16, eval_policy::infinigen, b10, k).ppl();
        // A pool of the whole context evicts nothing: the unbounded run's perplexity, exactly.
        KVSCOUT_EXPECTS(pct != 100 || p == unbounded, "a pool of every token gave perplexity ", p,
                        ", the unbounded run ", unbounded);
      }
    for (int pct : {50, 25})
      for (eviction e : {eviction::counter, eviction::lru}) {
        hz.pool_tokens = lt.tokens * pct / 100;
        hz.pool_eviction = e;
        hz.run("pool", lt, kv_format::fp16, eval_policy::dense, 1.0, {});
      }
    hz.pool_tokens = 0;
  }
  // ---- stage correction (issue 32, part 1): kvscout's default with and without the correction
  // step, and ranked by the layer's own query (the correction's bound), at 5 / 10 / 20 % of the
  // rows in total, for every format on the long text and fp16 on the short one -----------------
  if (stages.find("correction") != std::string::npos) {
    const infinigen_knobs def = knobs_of(presets::kvscout_speculation_only(w.cfg.head_dim), skip);
    const auto rows = [&](text_run& tx, kv_format f) {
      if (!tx.dense_ppl.count(static_cast<int>(kv_format::fp16)))
        hz.run("correction", tx, kv_format::fp16, eval_policy::dense, 1.0, {});
      if (!tx.dense_ppl.count(static_cast<int>(f))) hz.run("correction", tx, f, eval_policy::dense, 1.0, {});
      for (double b : {0.05, 0.10, 0.20}) {
        hz.run("correction", tx, f, eval_policy::infinigen, b, def);
        for (double share : {0.25, 0.5}) {
          if (share == 0.25 && b != 0.10) continue;
          infinigen_knobs c = def;
          c.correct_share = share;
          hz.run("correction", tx, f, eval_policy::infinigen, b, c);
        }
      }
      infinigen_knobs c = def;
      c.late = true;
      hz.run("correction", tx, f, eval_policy::infinigen, 0.10, c);
    };
    for (kv_format f : formats) rows(lt, f);
    if (!short_path.empty()) {
      text_run st;
      short_text(st);
      rows(st, kv_format::fp16);
    }
  }

  // ---- stage ranking (issue 32): what limits the late ranking. Layer l's own query (late
  // scores, no layer-ahead prediction) against partial keys of r channels, each GQA aggregation,
  // at 10 % on fp16: with r = head_dim the keys are whole and only the aggregation separates it
  // from the oracle.
  if (stages.find("ranking") != std::string::npos) {
    const infinigen_knobs def = knobs_of(presets::kvscout_speculation_only(w.cfg.head_dim), skip);
    const auto rows = [&](text_run& tx) {
      if (!tx.dense_ppl.count(static_cast<int>(kv_format::fp16)))
        hz.run("ranking", tx, kv_format::fp16, eval_policy::dense, 1.0, {});
      hz.run("ranking", tx, kv_format::fp16, eval_policy::oracle, 0.10, {});
      for (int r : {def.r, (def.r + w.cfg.head_dim) / 2, w.cfg.head_dim})
        for (gqa_aggregation a : {gqa_aggregation::max_logit, gqa_aggregation::mean_logit, gqa_aggregation::sum_prob}) {
          infinigen_knobs k = def;
          k.preset = nullptr;
          k.r = r;
          k.aggregation = a;
          k.late_aggregation.reset();  // the late ranking in aggregation a
          k.late = true;
          hz.run("ranking", tx, kv_format::fp16, eval_policy::infinigen, 0.10, k);
        }
    };
    if (stages.find("ranking_grid") == std::string::npos) rows(lt);
    // Quantised ranking keys (rank_key_bits) and the late ranking's own aggregation, alone and
    // in the corrected schedule: --rank-configs "r:bits:late_agg:share,..." (late_agg one of
    // max_logit / mean_logit / sum_prob / spec (the speculation's); share 0: late ranking alone,
    // -1: speculation alone).
    const std::string grid = arg(argc, argv, "--rank-configs", "");
    // Every format of --formats (fp16 by default), each against its own dense run.
    const auto grid_rows = [&](text_run& tx) {
    for (const kv_format f : formats) {
    if (!grid.empty() && !tx.dense_ppl.count(static_cast<int>(f)))
      hz.run("ranking", tx, f, eval_policy::dense, 1.0, {});
    std::stringstream gs(grid);
    for (std::string item; std::getline(gs, item, ',');) {
      int r = 0, bits = 0;
      char agg[32] = "";
      double share = 0;
      int lr = 0;
      const int got = std::sscanf(item.c_str(), "%d:%d:%31[a-z_]:%lf:%d", &r, &bits, agg, &share, &lr);
      KVSCOUT_EXPECTS(got == 4 || got == 5, "--rank-configs: \"", item,
                      "\": expected r:bits:aggregation:share[:late_r]");
      infinigen_knobs k = def;
      k.preset = nullptr;
      k.r = r;
      k.key_bits = bits;
      k.late_r = lr;
      k.library_keys = library_keys;
      const std::string a = agg;
      k.late_aggregation.reset();
      if (a != "spec") {
        bool known = false;
        for (gqa_aggregation x : {gqa_aggregation::max_logit, gqa_aggregation::mean_logit, gqa_aggregation::sum_prob})
          if (a == to_string(x)) k.late_aggregation = x, known = true;
        KVSCOUT_EXPECTS(known, "--rank-configs: aggregation \"", a, "\": expected max_logit, mean_logit, sum_prob or spec");
      }
      if (share == 0) k.late = true;
      if (share > 0) k.correct_share = share;
      hz.run("ranking", tx, f, eval_policy::infinigen, 0.10, k);
    }
    }
    };
    grid_rows(lt);
    if (!short_path.empty()) {
      text_run st;
      short_text(st);
      if (stages.find("ranking_grid") == std::string::npos) rows(st);
      grid_rows(st);
    }
  }

  // ---- stage budgets (issue 32, part 2): budgets that follow the attention, the rows moved per
  // step unchanged. Per layer: shares of the budget from the oracle's mass curves of the long
  // text's unscored half (harness::mass_curves, layer_shares, --layer-rule coverage|mass; the
  // model's shares, used for every text; the short text also with its own). Per head: the KV
  // heads of a step share one budget (select/pooled.hpp, --pool-rule mass|coverage). Each for
  // the oracle and kvscout's default, the latter also with the correction step (--correct-share,
  // 0.25), at --pool-budgets (5 / 10 / 20 %), fp16 on both texts, KIVI-4 at 10 % on the long one.
  if (stages.find("budgets") != std::string::npos) {
    const std::vector<double> pbudgets = parse_budgets(arg(argc, argv, "--pool-budgets", "5,10,20"));
    const std::string pool_arg = arg(argc, argv, "--pool-rule", "mass");
    KVSCOUT_EXPECTS(pool_arg == "mass" || pool_arg == "coverage", "--pool-rule ", pool_arg,
                    ": expected mass or coverage");
    const std::string layer_rule = arg(argc, argv, "--layer-rule", "coverage");
    KVSCOUT_EXPECTS(layer_rule == "mass" || layer_rule == "coverage", "--layer-rule ", layer_rule,
                    ": expected mass or coverage");
    const double share = std::strtod(arg(argc, argv, "--correct-share", "0.25").c_str(), nullptr);
    KVSCOUT_EXPECTS(share > 0 && share < 1, "--correct-share ", share, ": expected a fraction in (0, 1)");
    // --layer-curve outside_keep: curves of the rows outside the keep-set (default: all rows).
    const bool outside = arg(argc, argv, "--layer-curve", "all") == "outside_keep";
    // --layer-floor F: every layer keeps at least F of its even share (layer_budget_shares'
    // min_share; 0.5 by default, the better of 0 and 0.5 at 5 and 10 % on GPL-3).
    const double floor_share = std::strtod(arg(argc, argv, "--layer-floor", "0.5").c_str(), nullptr);
    char fl[32] = "";
    if (floor_share > 0) std::snprintf(fl, sizeof fl, "_floor%g", floor_share);
    const std::string layer_name = layer_rule + (outside ? "_outside" : "") + fl;
    const std::string own_rule = layer_name + "_own";
    // --budget-ways: which of the two ways run (layers, heads).
    const std::string ways = arg(argc, argv, "--budget-ways", "layers,heads");
    const bool by_layer = ways.find("layers") != std::string::npos, by_head = ways.find("heads") != std::string::npos;
    std::vector<std::vector<double>> model_curves;
    if (by_layer) model_curves = hz.mass_curves(lt, 400, outside);

    // The three configurations of one way of sharing the budget.
    const auto triple = [&](text_run& tx, kv_format f, double b, const infinigen_knobs& way) {
      infinigen_knobs orc;
      orc.pooled = way.pooled, orc.pool_rule = way.pool_rule;
      orc.layer_shares = way.layer_shares, orc.layer_rule = way.layer_rule;
      infinigen_knobs def = knobs_of(presets::kvscout_speculation_only(w.cfg.head_dim), skip);
      def.pooled = way.pooled, def.pool_rule = way.pool_rule;
      def.layer_shares = way.layer_shares, def.layer_rule = way.layer_rule;
      rank_overrides(def);
      infinigen_knobs cor = def;
      cor.correct_share = share;
      hz.run("budgets", tx, f, eval_policy::oracle, b, orc);
      hz.run("budgets", tx, f, eval_policy::infinigen, b, def);
      hz.run("budgets", tx, f, eval_policy::infinigen, b, cor);
    };
    const auto rows = [&](text_run& tx, kv_format f, const std::vector<double>& bs, bool own) {
      if (!tx.dense_ppl.count(static_cast<int>(kv_format::fp16)))
        hz.run("budgets", tx, kv_format::fp16, eval_policy::dense, 1.0, {});
      if (!tx.dense_ppl.count(static_cast<int>(f))) hz.run("budgets", tx, f, eval_policy::dense, 1.0, {});
      std::vector<std::vector<double>> own_curves;
      if (own && by_layer) own_curves = hz.mass_curves(tx, 400, outside);
      for (double b : bs) {
        if (by_layer) {
          infinigen_knobs layers;
          layers.layer_shares = layer_shares(model_curves, skip, b, layer_rule, floor_share);
          layers.layer_rule = layer_name.c_str();
          std::printf("  layer shares at %g %% (%s):", 100 * b, layer_name.c_str());
          for (double x : layers.layer_shares) std::printf(" %.2f", x);
          std::printf("\n");
          triple(tx, f, b, layers);
          if (own) {
            layers.layer_shares = layer_shares(own_curves, skip, b, layer_rule, floor_share);
            layers.layer_rule = own_rule.c_str();
            triple(tx, f, b, layers);
          }
        }
        if (!by_head) continue;
        infinigen_knobs heads;
        heads.pooled = true;
        heads.pool_rule = pool_arg == "mass" ? pooled_rule::mass : pooled_rule::coverage;
        triple(tx, f, b, heads);
      }
    };
    rows(lt, kv_format::fp16, pbudgets, false);
    // KIVI-4 and KIVI-2 at --kivi-budgets (10 % by default; KIVI-2 at 10 % of the rows is about
    // 3 % of a dense fp16 step's bytes, the goal's bound).
    const std::vector<double> kbudgets = parse_budgets(arg(argc, argv, "--kivi-budgets", "10"));
    for (kv_format f : {kv_format::kivi4, kv_format::kivi2})
      if (std::find(formats.begin(), formats.end(), f) != formats.end()) rows(lt, f, kbudgets, false);
    if (!short_path.empty()) {
      text_run st;
      short_text(st);
      rows(st, kv_format::fp16, pbudgets, true);
    }
  }

  // ---- stages copy and prompts (issue 32): retrieval over a long context, fp16, every token of
  // prompt and target through the policy, the target scored teacher-forced ---------------------
  const bool run_copy = stages.find("copy") != std::string::npos;
  const bool run_prompts = stages.find("prompts") != std::string::npos;
  if (run_copy || run_prompts) {
    const std::vector<double> rbudgets = parse_budgets(arg(argc, argv, "--copy-budgets", "5,10"));
    const std::string extra =
        arg(argc, argv, "--copy-policies", "dense,control,oracle,kvscout_default,infinigen_paper");
    infinigen_knobs def = knobs_of(presets::kvscout_speculation_only(w.cfg.head_dim), skip);
    rank_overrides(def);
    // kvscout's configurations with --rank-* overrides carry them in their names; with
    // --dense-prefill, every sparse configuration carries "+dense_prefill".
    const auto rank_labelled = [&](std::vector<retrieval_config> v) {
      char tag[80];
      std::snprintf(tag, sizeof tag, "+r%d_keys%db_late_r%d_%s", def.r, rank_bits, late_r > 0 ? late_r : def.r,
                    to_string(def.late_aggregation.value_or(def.aggregation)));
      const bool ranked = rank_r != 0 || rank_bits != 0 || late_aggregation || late_r != 0;
      for (auto& c : v) {
        if (ranked && c.policy == eval_policy::infinigen && c.name.rfind("kvscout", 0) == 0) c.name += tag;
        if (hz.dense_prefill && c.policy != eval_policy::dense) {
          c.name += "+dense_prefill";
          c.knobs.dense_prefill = true;
        }
      }
      return v;
    };
    // kvscout_corrected: the share of each budget held back for the correction step.
    const double correct_share = std::strtod(arg(argc, argv, "--correct-share", "0.5").c_str(), nullptr);
    KVSCOUT_EXPECTS(correct_share > 0 && correct_share < 1, "--correct-share ", correct_share,
                    ": expected a fraction in (0, 1)");
    // The *_layers configurations: the model's layer shares (coverage rule, floor 0.5) from the
    // long text's unscored half, measured once, on first use.
    std::vector<std::vector<double>> model_curves;
    const std::function<std::vector<double>(double)> shares_at = [&](double b) {
      if (model_curves.empty()) model_curves = hz.mass_curves(lt, 400);
      return layer_shares(model_curves, skip, b, "coverage", 0.5);
    };
    const auto stage_csv = [&](const char* name) {
      std::ofstream f(out_dir + "/" + name, std::ios::out | (append ? std::ios::app : std::ios::trunc));
      KVSCOUT_EXPECTS(f.good(), "cannot write ", out_dir, "/", name);
      if (!append) f << csv_header;
      return f;
    };
    const auto fmt = [](const char* f, double x) {
      char b[32];
      std::snprintf(b, sizeof b, f, x);
      return std::string(b);
    };

    if (run_copy) {
      const int n_prompts = int_arg(argc, argv, "--copy-prompts", "20", 1, 100000);
      const int span = int_arg(argc, argv, "--copy-span", "24", 2, 4096);
      const int cue = int_arg(argc, argv, "--copy-cue", "4", 1, span - 1);
      const int min_t = int_arg(argc, argv, "--copy-min-tokens", "2048", 64, w.cfg.context);
      const int max_t = int_arg(argc, argv, "--copy-max-tokens", "6144", min_t, w.cfg.context);
      const int seed = int_arg(argc, argv, "--copy-seed", "1", 0, 1 << 30);
      const int n_words = int_arg(argc, argv, "--copy-words", "400", 2 * span, 100000);
      // The prose: the long text after its calibration tokens, or --copy-text (all of it).
      const std::string copy_path = arg(argc, argv, "--copy-text", long_path.c_str());
      const std::string copy_text = read_text(copy_path);
      std::vector<int32_t> prose = tok.encode(copy_text);
      if (copy_path == long_path) prose.erase(prose.begin(), prose.begin() + n_cal);
      std::vector<std::string> names;
      const std::vector<int32_t> words = model::common_words(
          copy_text, [&](const std::string& x) { return tok.encode(x); }, n_words, 4, 0, &names);
      const std::vector<int32_t> sep = tok.encode("\n");
      std::printf("\ncopy task: %d prompts, span %d words (cue %d, target %d), %d-%d tokens, depths 10-90 %%, "
                  "prose %s (%zu tokens), %zu single-token words of >= 4 letters (%s, %s, %s, ...)\n",
                  n_prompts, span, cue, span - cue, min_t, max_t, copy_path.c_str(), prose.size(), words.size(),
                  names.size() > 0 ? names[0].c_str() : "", names.size() > 1 ? names[1].c_str() : "",
                  names.size() > 2 ? names[2].c_str() : "");
      const std::vector<retrieval_config> cfgs = rank_labelled(retrieval_configs(rbudgets, def, paper, extra, true, correct_share, shares_at));
      std::vector<span_score> total(cfgs.size());
      std::ofstream csv = stage_csv("accuracy_copy.csv");
      for (int i = 0; i < n_prompts; ++i) {
        model::copy_task_options o;
        o.span_words = span;
        o.cue_words = cue;
        o.depth = n_prompts == 1 ? 0.5 : 0.1 + 0.8 * i / (n_prompts - 1);
        // Five lengths from min to max, in turn (depth rises with i, length cycles).
        o.total_tokens = static_cast<int>(std::lround(min_t + (max_t - min_t) * (i % 5) / 4.0));
        o.seed = static_cast<std::uint64_t>(seed) * 1000003ULL + static_cast<std::uint64_t>(i);
        const model::copy_prompt cp = model::make_copy_prompt(prose, words, sep, o);
        std::vector<int32_t> seq = cp.prompt, ctl = cp.control;
        seq.insert(seq.end(), cp.target.begin(), cp.target.end());
        ctl.insert(ctl.end(), cp.target.begin(), cp.target.end());
        model::layer_major_eval ev(w, seq, skip), evc(w, ctl, skip);
        const int from = static_cast<int>(cp.prompt.size()) - 1;
        const int distance = static_cast<int>(cp.prompt.size()) - cp.span_at;
        std::printf("[copy %2d/%d] %d tokens, depth %.2f, span at %d (%d tokens before the target): \"%s\"\n", i + 1,
                    n_prompts, o.total_tokens, o.depth, cp.span_at, distance,
                    tok.decode(cp.span).substr(0, 60).c_str());
        for (std::size_t c = 0; c < cfgs.size(); ++c) {
          const eval_result r =
              hz.evaluate(cfgs[c].control ? evc : ev, from, cfgs[c].policy, cfgs[c].budget, cfgs[c].knobs);
          span_score one;
          one.add(r, skip);
          total[c].add(r, skip);
          csv_row(csv, "copy", std::to_string(i), o.total_tokens, fmt("%.4f", o.depth), std::to_string(cp.span_at),
                  std::to_string(distance), cfgs[c], one);
          std::printf("    %-16s %6s  acc %.3f  nll %.3f  fetched %.3f  %5.1f s  (elapsed %.0f s)\n", cfgs[c].name.c_str(),
                      cfgs[c].policy == eval_policy::dense ? "" : fmt("%g %%", 100 * cfgs[c].budget).c_str(),
                      one.accuracy(), one.mean_nll(), one.fetch(), r.seconds, seconds_since(t_all));
          std::fflush(stdout);
        }
      }
      for (std::size_t c = 0; c < cfgs.size(); ++c) csv_row(csv, "copy", "all", 0, "", "", "", cfgs[c], total[c]);
      std::printf("\ncopy task, all prompts (the target span only, teacher-forced):");
      print_table(cfgs, total, true);
    }

    if (run_prompts) {
      KVSCOUT_EXPECTS(!prompts_path.empty(), "stage prompts needs --prompts FILE.jsonl");
      const std::vector<model::prompt_record> recs = model::read_prompt_file(prompts_path);
      const std::vector<retrieval_config> cfgs = rank_labelled(retrieval_configs(rbudgets, def, paper, extra, false, correct_share, shares_at));
      std::vector<span_score> total(cfgs.size());
      std::ofstream csv = stage_csv("accuracy_prompts.csv");
      std::printf("\nprompt file %s: %zu records\n", prompts_path.c_str(), recs.size());
      for (const model::prompt_record& rec : recs) {
        std::vector<int32_t> seq = tok.encode(rec.input);
        const std::vector<int32_t> target = tok.encode(rec.target);
        KVSCOUT_EXPECTS(!seq.empty() && !target.empty(), prompts_path, " line ", rec.line, ": \"",
                        seq.empty() ? "input" : "target", "\" encodes to no tokens");
        const int n_in = static_cast<int>(seq.size());
        seq.insert(seq.end(), target.begin(), target.end());
        KVSCOUT_EXPECTS(static_cast<int>(seq.size()) <= w.cfg.context, prompts_path, " line ", rec.line, ": input ",
                        n_in, " + target ", target.size(), " tokens, expected at most the model's context of ",
                        w.cfg.context);
        model::layer_major_eval ev(w, seq, skip);
        std::printf("[line %d] %zu tokens, target %zu tokens\n", rec.line, seq.size(), target.size());
        for (std::size_t c = 0; c < cfgs.size(); ++c) {
          const eval_result r = hz.evaluate(ev, n_in - 1, cfgs[c].policy, cfgs[c].budget, cfgs[c].knobs);
          span_score one;
          one.add(r, skip);
          total[c].add(r, skip);
          csv_row(csv, "prompts", std::to_string(rec.line), static_cast<int>(seq.size()), "", "", "", cfgs[c], one);
          // Greedy decoding makes the target exactly when every teacher-forced argmax is the target's
          // token (its first wrong token is the first argmax that is not): what it makes up to there.
          std::size_t k = 0;
          while (k < target.size() && r.predicted[k] == target[k]) ++k;
          const std::string greedy =
              k == target.size() ? "" : tok.decode(std::span<const int32_t>(r.predicted.data(), k + 1));
          std::printf("    %-16s %6s  acc %.3f  nll %.3f  exact %s%s%s%s\n", cfgs[c].name.c_str(),
                      cfgs[c].policy == eval_policy::dense ? "" : fmt("%g %%", 100 * cfgs[c].budget).c_str(),
                      one.accuracy(), one.mean_nll(), one.exact ? "yes" : "no", greedy.empty() ? "" : " (greedy: \"",
                      greedy.c_str(), greedy.empty() ? "" : "\"...)");
          std::fflush(stdout);
        }
      }
      for (std::size_t c = 0; c < cfgs.size(); ++c) csv_row(csv, "prompts", "all", 0, "", "", "", cfgs[c], total[c]);
      std::printf("\nprompt file, all records (the target only, teacher-forced; exact match = greedy):");
      print_table(cfgs, total, true);
    }
  }
  std::printf("done in %.1f s\n", seconds_since(t_all));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
}
