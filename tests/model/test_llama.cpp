// The Llama runner on the real SmolLM2-135M-Instruct (tools/model/llama.hpp): greedy generation
// answers a factual question coherently, and decoding through a kvscout pipeline that fetches
// every token gives the dense logits. [model]: needs the file scripts/fetch_model.sh places.

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include "kvscout/pipeline/host_pipeline.hpp"
#include "kvscout/core/workspace.hpp"
#include "kvscout/select/topk.hpp"
#include "kvscout/score/streaming.hpp"
#include "model/llama.hpp"
#include "model/tokenizer_gguf.hpp"
#include "smollm2.hpp"

namespace {

using smollm2::loaded;
using smollm2::model;
using smollm2::model_path;

int argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

TEST_CASE("SmolLM2 answers a question with greedy decoding", "[model][llama]") {
  loaded* m = model();
  if (m == nullptr) {
    WARN("SKIP: " << model_path() << " not found (run scripts/fetch_model.sh)");
    return;
  }
  const auto& c = m->weights.cfg;
  REQUIRE(c.n_layers == 30);
  REQUIRE(c.n_heads == 9);
  REQUIRE(c.n_kv_heads == 3);
  REQUIRE(c.head_dim == 64);
  kvscout::model::llama_session<> s(m->weights, 256, 2);
  const std::string prompt =
      "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
  const auto ids = m->tok.encode(prompt);
  const std::vector<float>* logits = nullptr;
  for (int id : ids) logits = &s.step(id);
  std::vector<int32_t> out;
  for (int i = 0; i < 16; ++i) {
    const int next = argmax(*logits);
    if (next == m->tok.eos() || m->tok.token_string(next) == "<|im_end|>") break;
    out.push_back(next);
    logits = &s.step(next);
  }
  const std::string text = m->tok.decode(out);
  INFO("generated: " << text);
  CHECK(text.find("Paris") != std::string::npos);
}

TEST_CASE("decoding through a pipeline that fetches every token equals dense decoding",
          "[model][llama][pipeline]") {
  loaded* m = model();
  if (m == nullptr) {
    WARN("SKIP: " << model_path() << " not found (run scripts/fetch_model.sh)");
    return;
  }
  using session_t = kvscout::model::llama_session<>;
  using layout = session_t::layout;
  const auto& c = m->weights.cfg;
  constexpr int max_tokens = 64;
  session_t dense(m->weights, max_tokens, 2), sparse(m->weights, max_tokens, 2);
  kvscout::streaming_policy_host policy({{.num_kv_heads = c.n_kv_heads}, 4});
  kvscout::topk_selector_host::config sc{{.num_seqs = 1, .num_kv_heads = c.n_kv_heads,
                                          .max_tokens = max_tokens}, max_tokens, max_tokens, {}};
  auto ws = kvscout::make_workspace<kvscout::topk_selector_host>(sc);
  kvscout::topk_selector_host sel(sc, ws.span());
  using pipe_t = kvscout::decode_pipeline_host<layout, kvscout::streaming_policy_host, kvscout::topk_selector_host>;
  const kvscout::host_pipeline_config pc{{.num_layers = c.n_layers, .num_seqs = 1,
                                          .num_kv_heads = c.n_kv_heads, .num_q_heads = c.n_heads,
                                          .max_tokens = max_tokens, .scale = 0.125f}, 2, max_tokens,
                                         1};
  auto gws = kvscout::make_workspace<kvscout::gather_executor_host<layout>>(pc.gather_config());
  kvscout::gather_executor_host<layout> gather(pc.gather_config(), gws.span());
  auto pws = kvscout::make_workspace<pipe_t>(pc);
  pipe_t pipe(pc, policy, sel, gather, pws.span());
  const auto ids = m->tok.encode("The quick brown fox jumps over the lazy dog. It was a bright cold day in April");
  double worst = 0;
  for (int id : ids) {
    const auto& a = dense.step(id);
    const auto& b = sparse.step(id, &pipe);
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
  }
  INFO("worst logit difference over " << ids.size() << " tokens: " << worst);
  REQUIRE(worst <= 1e-4);
  REQUIRE(pipe.stats().rows[29] > 0);  // the speculated layers really fetched
}
