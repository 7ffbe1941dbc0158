#pragma once
// Where the model tests find SmolLM2-135M-Instruct (scripts/fetch_model.sh places it), and one
// loaded copy of it shared by every test of the binary (the weights are ~540 MB of floats).
//
//   if (auto* m = smollm2::model()) { ... m->weights ... m->tok ... } else WARN("SKIP: ...");

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "model/gguf.hpp"
#include "model/llama.hpp"
#include "model/tokenizer_gguf.hpp"

namespace smollm2 {

/// ${KVSCOUT_MODEL_DIR:-$HOME/.cache/kvscout}/SmolLM2-135M-Instruct.Q4_1.gguf
inline std::string model_path() {
  const char* dir = std::getenv("KVSCOUT_MODEL_DIR");
  std::string d;
  if (dir != nullptr && *dir != '\0') {
    d = dir;
  } else {
    const char* home = std::getenv("HOME");
    d = std::string(home != nullptr ? home : "") + "/.cache/kvscout";
  }
  return d + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

struct loaded {
  kvscout::model::gguf_file file;
  kvscout::model::llama_weights weights;
  kvscout::model::bpe_tokenizer tok;
  explicit loaded(const std::string& p)
      : file(p), weights(kvscout::model::load_llama(file)), tok(kvscout::model::tokenizer_from_gguf(file)) {}
};

/// The model, loaded on first use; null when the file is missing.
inline loaded* model() {
  static std::unique_ptr<loaded> m;
  if (!m && std::filesystem::exists(model_path())) m = std::make_unique<loaded>(model_path());
  return m.get();
}

}  // namespace smollm2
