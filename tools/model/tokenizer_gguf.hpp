#pragma once
// Builds the byte-level BPE tokenizer stored in a GGUF file's metadata.
//
//   kvscout::model::gguf_file f("SmolLM2-135M-Instruct.Q4_1.gguf");
//   kvscout::model::bpe_tokenizer tok = kvscout::model::tokenizer_from_gguf(f);
//   auto ids = tok.encode("<|im_start|>user\nHi<|im_end|>");   // 1, 4093, 198, 26843, 2
//
// Keys read (llama.cpp's names):
//   tokenizer.ggml.model         must be "gpt2" (byte-level BPE)
//   tokenizer.ggml.pre           pre-tokenizer name; "gpt2" -> pre_tokenizer::gpt2,
//                                "smollm" / "starcoder" / "refact" / "codeshell" ->
//                                pre_tokenizer::smollm; absent -> gpt2; others are rejected
//   tokenizer.ggml.tokens        array[string]
//   tokenizer.ggml.token_type    array[i32]; absent -> every token normal
//   tokenizer.ggml.merges        array[string]
//   tokenizer.ggml.bos_token_id  u32 or i32; absent -> -1 (likewise eos_token_id)

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvscout/core/error.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"

namespace kvscout::model {

namespace detail::bpe {

/// The pre-tokenizer named by tokenizer.ggml.pre.
inline pre_tokenizer pre_tokenizer_named(std::string_view name) {
  if (name == "gpt2") return pre_tokenizer::gpt2;
  static constexpr std::array<std::string_view, 4> digits_isolated = {"smollm", "starcoder",
                                                                      "refact", "codeshell"};
  for (const std::string_view n : digits_isolated) {
    if (name == n) return pre_tokenizer::smollm;
  }
  KVSCOUT_FAIL("tokenizer.ggml.pre is ", quoted(name),
               "; supported pre-tokenizers: gpt2, smollm, starcoder, refact, codeshell");
}

/// A token id stored as u32 or i32; -1 when the key is absent.
inline std::int32_t optional_token_id(const gguf_file& f, std::string_view key) {
  const std::optional<gguf_value> v = f.find(key);
  if (!v) return -1;
  if (v->type() == gguf_type::i32) return v->as<std::int32_t>();
  KVSCOUT_EXPECTS(v->type() == gguf_type::u32, key, " is ", v->describe(), ", expected u32 or i32");
  const std::uint32_t id = v->as<std::uint32_t>();
  KVSCOUT_EXPECTS(id <= 0x7fffffffu, key, " = ", id, " does not fit an int32 token id");
  return static_cast<std::int32_t>(id);
}

}  // namespace detail::bpe

/// The tokenizer in `f`'s metadata. Throws kvscout::error when a key is missing or has the wrong
/// type, when the model is not "gpt2" or the pre-tokenizer is unknown (naming what was found),
/// and for whatever bpe_tokenizer's constructor rejects.
inline bpe_tokenizer tokenizer_from_gguf(const gguf_file& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  KVSCOUT_EXPECTS(model == "gpt2", "tokenizer.ggml.model is ", detail::bpe::quoted(model), " in ",
                  f.path(), "; only \"gpt2\" (byte-level BPE) is supported");
  const std::optional<gguf_value> pre_value = f.find("tokenizer.ggml.pre");
  const pre_tokenizer pre = pre_value
                                ? detail::bpe::pre_tokenizer_named(pre_value->as<std::string>())
                                : pre_tokenizer::gpt2;
  std::vector<std::string> tokens = f.get_string_array("tokenizer.ggml.tokens");
  std::vector<std::int32_t> types = f.contains("tokenizer.ggml.token_type")
                                        ? f.get_i32_array("tokenizer.ggml.token_type")
                                        : std::vector<std::int32_t>(tokens.size(), 1);
  std::vector<std::string> merges = f.get_string_array("tokenizer.ggml.merges");
  const std::int32_t bos = detail::bpe::optional_token_id(f, "tokenizer.ggml.bos_token_id");
  const std::int32_t eos = detail::bpe::optional_token_id(f, "tokenizer.ggml.eos_token_id");
  return bpe_tokenizer(std::move(tokens), std::move(types), std::move(merges), bos, eos, pre);
}

}  // namespace kvscout::model
