// libFuzzer target: tools/model/tokenizer.hpp (bpe_tokenizer) and tokenizer_gguf.hpp on a
// vocabulary, merges and a text taken from the input.
//
// Input framing (little-endian; fields past the end of the input read as zero):
//   u8  flags   bit 0: pre-tokenizer smollm (else gpt2)
//               bit 1: encode with add_bos (when the vocabulary has a bos)
//               bit 2: the vocabulary starts with the 256 single-byte tokens of GPT-2's byte
//                      alphabet (normal), so that every byte has a token
//               bit 3: also build the tokenizer from a GGUF file written from the same
//                      vocabulary (tokenizer_from_gguf), which must agree with the direct one
//               bit 4: each merge's joined token is added to the vocabulary (normal) if missing
//               bit 5: tokens that repeat an earlier one are skipped (else they reach the
//                      constructor, which must reject them)
//               bit 6: a long text: the text is repeated `repeat` times (below)
//   u16 n_tokens, then n_tokens x { u8 type, u8 len, len bytes }
//                 type: the byte & 7 (7 is invalid), or -1 for 0xff
//   u16 n_merges, then n_merges x { u16 left, u16 right }
//                 left < 0x8000: the merge "tokens[left % n] tokens[right % n]" (n tokens so far)
//                 else: the merge string is tokens[right % n] as it is (mostly malformed)
//                 A merge whose two sides hold more than 1 KiB together is skipped: merges of
//                 merges double a token each time, so a few hundred input bytes asked for
//                 gigabytes (corpus: regress_oom_merge_doubling, 2 GB and 13 s before).
//   i16 bos, i16 eos
//   u32 repeat    with flag bit 6, the text is the rest of the input repeated max(repeat, 1)
//                 times, at most 1 MiB (otherwise ignored: long texts are slow to fuzz, so only
//                 inputs that ask for one get one)
//   the text
//
// Checked: only kvscout::error is thrown; every id encode returns is in the vocabulary (decode
// takes it); and the round trip decode(encode(text)) == text with parse_special on and off where
// tokenizer.hpp promises it: every byte of the text has a single-byte token, and no single-byte
// token or merge result is a control / user-defined token (those decode to their stored
// spelling, not to the bytes they were merged from). With parse_special off, bytes without a
// token are left out: decode gives the text without them.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "fuzz_common.hpp"
#include "kvscout/core/error.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"
#include "model/tokenizer_gguf.hpp"

namespace {

namespace m = kvscout::model;
namespace bpe = kvscout::model::detail::bpe;

constexpr std::size_t max_text = std::size_t{1} << 20;
constexpr std::size_t max_joined = 1024;  // bytes of a merge's two sides together

struct vocabulary {
  std::vector<std::string> tokens;
  std::vector<std::int32_t> types;
  std::vector<std::string> merges;
  std::int32_t bos = -1, eos = -1;
  m::pre_tokenizer pre = m::pre_tokenizer::gpt2;
};

std::string byte_token(int b) {
  std::string s;
  bpe::append_utf8(s, bpe::byte_to_unicode[static_cast<std::size_t>(b)]);
  return s;
}

bool literal(m::token_type t) {
  return t == m::token_type::control || t == m::token_type::user_defined;
}

// Whether decode(encode(.)) must give the text back (see the top of the file).
bool round_trip_promised(const m::bpe_tokenizer& tok, const vocabulary& v) {
  for (int b = 0; b < 256; ++b) {
    if (!tok.has_byte_token(static_cast<unsigned char>(b))) continue;
    if (literal(tok.type(*tok.token_id(byte_token(b))))) return false;
  }
  for (const std::string& mg : v.merges) {
    const std::size_t sp = mg.find(' ');
    const auto joined = tok.token_id(mg.substr(0, sp) + mg.substr(sp + 1));
    if (!joined || literal(tok.type(*joined))) return false;
  }
  return true;
}

void check_tokenizer(const m::bpe_tokenizer& tok, const vocabulary& v, std::string_view text,
                     bool add_bos) {
  FUZZ_CHECK(tok.vocab_size() == v.tokens.size());
  for (std::size_t id = 0; id < tok.vocab_size(); ++id) {
    const auto i = static_cast<std::int32_t>(id);
    FUZZ_CHECK(tok.token_id(tok.token_string(i)) == i);
    (void)tok.token_text(i);
  }
  const bool bos = add_bos && tok.bos() >= 0;
  const bool promised = round_trip_promised(tok, v);
  bool all_bytes = true;
  std::string kept;  // the text less the bytes without a token
  for (const char c : text) {
    if (tok.has_byte_token(static_cast<unsigned char>(c))) {
      kept += c;
    } else {
      all_bytes = false;
    }
  }
  for (const bool special : {true, false}) {
    const std::vector<std::int32_t> ids = tok.encode(text, bos, special);
    for (const std::int32_t id : ids) {
      FUZZ_CHECK(id >= 0 && static_cast<std::size_t>(id) < tok.vocab_size());
    }
    if (bos) FUZZ_CHECK(!ids.empty() && ids[0] == tok.bos());
    const std::span<const std::int32_t> body = std::span(ids).subspan(bos ? 1 : 0);
    std::string back;
    try {
      back = tok.decode(body);
    } catch (const kvscout::error& e) {
      fuzz::finding("decode rejected ids that encode returned", e.what());
    }
    if (!promised) continue;
    if (all_bytes) {
      FUZZ_CHECK(back == text, special ? "parse_special on" : "parse_special off");
    } else if (!special) {
      FUZZ_CHECK(back == kept, "parse_special off, bytes without a token left out");
    }
  }
}

m::bpe_tokenizer from_gguf(const vocabulary& v) {
  fuzz::gguf_writer w;
  w.string("tokenizer.ggml.model", "gpt2");
  w.string("tokenizer.ggml.pre", v.pre == m::pre_tokenizer::smollm ? "smollm" : "gpt2");
  w.string_array("tokenizer.ggml.tokens", v.tokens);
  w.i32_array("tokenizer.ggml.token_type", v.types);
  w.string_array("tokenizer.ggml.merges", v.merges);
  w.i32("tokenizer.ggml.bos_token_id", v.bos);
  w.i32("tokenizer.ggml.eos_token_id", v.eos);
  const std::vector<std::byte> file = w.bytes();
  const m::gguf_file f = m::gguf_file::from_bytes(file, "fuzz vocabulary");
  return m::tokenizer_from_gguf(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::reader in(data, size);
  const std::uint8_t flags = in.u8();
  vocabulary v;
  v.pre = (flags & 1) ? m::pre_tokenizer::smollm : m::pre_tokenizer::gpt2;
  const bool add_bos = flags & 2;
  const bool via_gguf = flags & 8;
  const bool add_joined = flags & 16;
  const bool dedupe = flags & 32;
  std::unordered_set<std::string> seen;
  auto add = [&](std::string s, std::int32_t type) {
    if (dedupe && !seen.insert(s).second) return;
    v.tokens.push_back(std::move(s));
    v.types.push_back(type);
  };
  if (flags & 4) {
    for (int b = 0; b < 256; ++b) add(byte_token(b), 1);
  }
  const std::uint16_t n_tokens = in.u16();
  for (std::uint16_t i = 0; i < n_tokens && in.left() > 0; ++i) {
    const std::uint8_t t = in.u8();
    const std::uint8_t len = in.u8();
    add(std::string(in.bytes(len)), t == 0xff ? -1 : (t & 7));
  }
  const std::uint16_t n_merges = in.u16();
  for (std::uint16_t i = 0; i < n_merges && in.left() > 0 && !v.tokens.empty(); ++i) {
    const std::uint16_t l = in.u16();
    const std::uint16_t r = in.u16();
    const std::size_t n = v.tokens.size();
    if (l >= 0x8000) {
      v.merges.push_back(v.tokens[r % n]);
      continue;
    }
    const std::string left = v.tokens[l % n];
    const std::string right = v.tokens[r % n];
    if (left.size() + right.size() > max_joined) continue;
    v.merges.push_back(left + " " + right);
    if (add_joined && std::find(v.tokens.begin(), v.tokens.end(), left + right) == v.tokens.end()) {
      v.tokens.push_back(left + right);
      v.types.push_back(1);
      seen.insert(left + right);
    }
  }
  v.bos = in.i16();
  v.eos = in.i16();
  const std::uint32_t repeat_field = in.u32();
  const std::uint32_t repeat = (flags & 64) ? std::max<std::uint32_t>(repeat_field, 1) : 1;
  const std::string_view unit = in.rest();
  std::string text;
  if (!unit.empty()) {
    const std::size_t times = std::min<std::size_t>(repeat, max_text / unit.size());
    text.reserve(unit.size() * std::max<std::size_t>(times, 1));
    for (std::size_t k = 0; k < std::max<std::size_t>(times, 1); ++k) text += unit;
  }

  std::optional<m::bpe_tokenizer> direct;
  try {
    direct.emplace(v.tokens, v.types, v.merges, v.bos, v.eos, v.pre);
  } catch (const kvscout::error&) {
  }
  if (via_gguf) {
    std::optional<m::bpe_tokenizer> stored;
    try {
      stored.emplace(from_gguf(v));
    } catch (const kvscout::error& e) {
      if (direct) fuzz::finding("tokenizer_from_gguf rejected a vocabulary the constructor took",
                                e.what());
    }
    FUZZ_CHECK(direct.has_value() == stored.has_value());
    if (stored) {
      FUZZ_CHECK(stored->pre() == direct->pre() && stored->merge_count() == direct->merge_count());
      for (const bool special : {true, false}) {
        FUZZ_CHECK(stored->encode(text, false, special) == direct->encode(text, false, special));
      }
    }
  }
  if (direct) check_tokenizer(*direct, v, text, add_bos);
  return 0;
}
