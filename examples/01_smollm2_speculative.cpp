// 01_smollm2_speculative: a real model decoding with its KV cache offloaded and InfiniGen-style
// speculation, on the CPU through kvscout's host backend.
//
// 1. Loads SmolLM2-135M-Instruct (GGUF, fetched by scripts/fetch_model.sh) and its tokenizer.
// 2. Calibrates presets::kvscout_default, kvscout's best measured configuration, in one call on
//    another text (the first 1024 tokens of --calibration): its skew plans (RoPE planes, 32 of
//    64 channels), its correction plans (all 64) and its per-layer budget shares.
// 3. Feeds a prompt (a passage of 2,000 tokens of real text and a question) densely and with
//    speculation (--budget 0.10: each step fetches 10 % of the cached rows per KV head, a quarter
//    of them chosen by the correction step), and compares the passage's perplexity.
// 4. Generates an answer with speculation and prints, per layer, the fraction of cached rows
//    fetched and the bytes moved against fetching everything.
//
//   ./examples/01_smollm2_speculative --model PATH.gguf --text FILE [--calibration FILE]
//       [--budget 0.10] [--tokens 2000]

#include <kvscout/calibrate.hpp>
#include <kvscout/kvscout.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/llama.hpp"
#include "model/tokenizer_gguf.hpp"

namespace {

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  KVSCOUT_EXPECTS(in.good(), "cannot read ", what, " ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

double log_softmax_at(const std::vector<float>& logits, int target) {
  float m = logits[0];
  for (float x : logits) m = std::max(m, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - m));
  return static_cast<double>(logits[static_cast<std::size_t>(target)] - m) - std::log(sum);
}

int argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

int main(int argc, char** argv) try {
  using namespace kvscout;
  const std::string path = arg(argc, argv, "--model", "");
  const std::string text_path = arg(argc, argv, "--text", "");
  const std::string cal_path = arg(argc, argv, "--calibration", text_path.c_str());
  const double budget = std::atof(arg(argc, argv, "--budget", "0.10").c_str());
  const int n_text = std::atoi(arg(argc, argv, "--tokens", "2000").c_str());
  const int n_gen = std::atoi(arg(argc, argv, "--generate", "24").c_str());
  KVSCOUT_EXPECTS(!path.empty() && !text_path.empty(), "usage: --model PATH.gguf --text FILE");
  KVSCOUT_EXPECTS(budget > 0 && budget <= 0.5, "--budget ", budget,
                  ": expected a share of the cached rows in (0, 0.5]");
  const std::string text = read_file(text_path, "--text");
  const std::string cal_text = read_file(cal_path, "--calibration");

  const auto t_load = std::chrono::steady_clock::now();
  model::gguf_file file(path);
  const model::llama_weights w = model::load_llama(file);
  const model::bpe_tokenizer tok = model::tokenizer_from_gguf(file);
  const auto& c = w.cfg;
  std::printf("model: %s, %d layers, %d query / %d KV heads, head_dim %d (loaded in %.1f s)\n",
              file.get_string("general.name").c_str(), c.n_layers, c.n_heads, c.n_kv_heads,
              c.head_dim,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count());

  const std::vector<int32_t> all = tok.encode(text), cal_tokens = tok.encode(cal_text);
  constexpr int n_cal = 1024;
  // The calibration text's first n_cal tokens; the passage from the text's start, or after them
  // where both are the same text.
  const std::size_t from = cal_path == text_path ? n_cal : 0;
  KVSCOUT_EXPECTS(static_cast<int>(all.size()) >= static_cast<int>(from) + n_text &&
                      static_cast<int>(cal_tokens.size()) >= n_cal,
                  "the text has ", all.size(), " tokens and the calibration text ",
                  cal_tokens.size(), ", need ", from + static_cast<std::size_t>(n_text), " and ",
                  n_cal);
  const auto p = presets::kvscout_default(64);
  const int skip = p.skip_layers;
  const int max_tokens = n_text + 64 + n_gen;
  using session_t = model::llama_session<64>;
  using layout = session_t::layout;

  // The step's dimensions, once: every part's config holds them.
  const decode_shape shape{.num_layers = c.n_layers, .num_seqs = 1, .num_kv_heads = c.n_kv_heads,
                           .num_q_heads = c.n_heads, .head_dim = 64, .d_model = c.d_model,
                           .max_tokens = max_tokens, .scale = 0.125f};

  // ---- 2. calibration: the queries and keys (after RoPE) of every layer at n_cal tokens --------
  std::printf("calibrating %s on %d tokens of %s ...\n", p.name, n_cal, cal_path.c_str());
  std::vector<std::vector<float>> qs(static_cast<std::size_t>(c.n_layers)), ks(qs.size());
  {
    session_t cal(w, n_cal, 2);
    cal.on_qk = [&](int l, const float* q, const float* k) {
      qs[static_cast<std::size_t>(l)].insert(qs[static_cast<std::size_t>(l)].end(), q, q + c.n_heads * 64);
      ks[static_cast<std::size_t>(l)].insert(ks[static_cast<std::size_t>(l)].end(), k, k + c.n_kv_heads * 64);
    };
    for (int i = 0; i < n_cal; ++i) cal.step(cal_tokens[static_cast<std::size_t>(i)]);
  }
  const auto cal = presets::calibrate(p, shape, {64, c.rope_theta, c.rope}, qs, ks, n_cal);

  // ---- 3. the prompt: dense vs speculative ----------------------------------------------------
  // A user turn holding the passage (scored for perplexity) and a question about it.
  const auto head = tok.encode("<|im_start|>user\n");
  std::vector<int32_t> prompt(head.begin(), head.end());
  const std::size_t scored_from = prompt.size();
  prompt.insert(prompt.end(), all.begin() + static_cast<std::ptrdiff_t>(from),
                all.begin() + static_cast<std::ptrdiff_t>(from) + n_text);
  const auto question = tok.encode(
      "\n\nIn one sentence, what is this passage about?<|im_end|>\n<|im_start|>assistant\n");
  std::vector<host_span<const float>> wq;  // each layer's W_Q (SmolLM2 has no query bias)
  for (const auto& L : w.layers) wq.push_back({L.wq.data(), L.wq.size()});
  // The policy (2-bit partial keys), one top-k selector per layer at its share of the budget, the
  // gather, the pipeline and their workspaces, owned by one object.
  presets::pipeline_host<layout> owned(p, shape, cal, budget, wq, {}, /*threads=*/2);
  auto& pipe = owned.pipeline();

  session_t dense(w, max_tokens, 2), spec(w, max_tokens, 2);
  double nll_dense = 0, nll_spec = 0;
  // The passage's second half too: a step moves 10 % of what is cached, so early steps, with few
  // tokens cached, move few rows (at least the 20 of the keep-set).
  double late_dense = 0, late_spec = 0;
  const std::size_t late_from = scored_from + static_cast<std::size_t>(n_text) / 2;
  std::int64_t dense_rows = 0;  // rows a full fetch would move per speculated layer
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    dense_rows += static_cast<std::int64_t>(spec.position()) * c.n_kv_heads;
    const bool scored = i + 1 < prompt.size() && i + 1 > scored_from;
    const auto& a = dense.step(prompt[i]);
    if (scored) nll_dense -= log_softmax_at(a, prompt[i + 1]);
    if (scored && i + 1 > late_from) late_dense -= log_softmax_at(a, prompt[i + 1]);
    const auto& b = spec.step(prompt[i], &pipe);
    if (scored) nll_spec -= log_softmax_at(b, prompt[i + 1]);
    if (scored && i + 1 > late_from) late_spec -= log_softmax_at(b, prompt[i + 1]);
    if ((i + 1) % 100 == 0 || i + 1 == prompt.size())
      std::printf("  prompt %zu / %zu tokens (%.1f s)\n", i + 1, prompt.size(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double scored_tokens = static_cast<double>(prompt.size() - scored_from - 1);
  const double ppl_dense = std::exp(nll_dense / scored_tokens);
  const double ppl_spec = std::exp(nll_spec / scored_tokens);
  std::printf(
      "passage perplexity over %.0f tokens: dense %.3f, speculative (%s, %.0f %% of the "
      "cached rows per step) %.3f (%+.2f %%)\n",
      scored_tokens, ppl_dense, p.name, 100 * budget, ppl_spec, 100.0 * (ppl_spec / ppl_dense - 1));
  const double late_tokens = static_cast<double>(prompt.size() - late_from - 1);
  const double late_ppl_dense = std::exp(late_dense / late_tokens);
  const double late_ppl_spec = std::exp(late_spec / late_tokens);
  std::printf("  its second half, %.0f tokens: dense %.3f, speculative %.3f (%+.2f %%)\n",
              late_tokens, late_ppl_dense, late_ppl_spec,
              100.0 * (late_ppl_spec / late_ppl_dense - 1));

  // ---- 4. generation with speculation ---------------------------------------------------------
  const std::vector<float>* logits = nullptr;
  for (int id : question) {
    dense_rows += static_cast<std::int64_t>(spec.position()) * c.n_kv_heads;
    logits = &spec.step(id, &pipe);
  }
  std::vector<int32_t> out;
  for (int i = 0; i < n_gen; ++i) {
    const int next = argmax(*logits);
    if (next == tok.eos() || tok.token_string(next) == "<|im_end|>") break;
    out.push_back(next);
    dense_rows += static_cast<std::int64_t>(spec.position()) * c.n_kv_heads;
    logits = &spec.step(next, &pipe);
  }
  std::printf("answer (speculative, %d cached tokens, %.0f %% fetched per KV head and layer): %s\n",
              spec.position(), 100 * budget, tok.decode(out).c_str());

  // ---- per-layer report -------------------------------------------------------------------------
  const std::size_t row_bytes = 2 * 64 * sizeof(half);
  // "re-selected": the share of fetched rows that the layer's previous step had fetched too; a
  // device-side row cache keeps those, so they need not cross the link again.
  std::printf("\nlayer  fetched rows / cached rows   bytes moved vs dense       re-selected\n");
  std::int64_t moved = 0, full = 0, reused = 0, speculated = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const auto li = static_cast<std::size_t>(l);
    const std::int64_t rows = l < skip ? dense_rows : pipe.stats().rows[li];
    moved += rows;
    full += dense_rows;
    if (l >= skip) reused += pipe.stats().reused[li], speculated += rows;
    char reuse[32] = "";
    if (l >= skip && rows > 0)
      std::snprintf(reuse, sizeof reuse, "%11.3f",
                    static_cast<double>(pipe.stats().reused[li]) / static_cast<double>(rows));
    std::printf("%5d  %26.3f   %6.1f MiB vs %6.1f MiB  %s%s\n", l,
                static_cast<double>(rows) / static_cast<double>(dense_rows),
                static_cast<double>(rows) * row_bytes / (1 << 20),
                static_cast<double>(dense_rows) * row_bytes / (1 << 20), reuse,
                l < skip ? "  (dense layer)" : "");
  }
  std::printf("all layers: %.3f of the dense bytes moved; %.3f of the fetched rows were fetched at the "
              "previous step too (a device row cache would not move them again)\n",
              static_cast<double>(moved) / static_cast<double>(full),
              speculated > 0 ? static_cast<double>(reused) / static_cast<double>(speculated) : 0.0);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
}
