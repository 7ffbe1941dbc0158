// tools/model/tokenizer.hpp and tokenizer_gguf.hpp: GPT-2 style byte-level BPE.
//
// Hand-made vocabularies give exact expected ids. Pre-tokenizer splits and the real-model ids
// below were computed outside this code: the splits with the Python `regex` package running the
// GPT-2 pattern, the ids with Hugging Face `tokenizers` (BPE over the GGUF's vocabulary and merges,
// pre-tokenizer Digits(individual_digits=True) + ByteLevel(add_prefix_space=False), the special
// tokens added). The test cases tagged [model] read the real SmolLM2 file from
// ${KVSCOUT_MODEL_DIR:-$HOME/.cache/kvscout} and skip (with a warning) when it is absent.

#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "kvscout/core/error.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"
#include "model/tokenizer_gguf.hpp"
#include "smollm2.hpp"

namespace {

namespace fs = std::filesystem;
namespace bpe = kvscout::model::detail::bpe;
using kvscout::model::bpe_tokenizer;
using kvscout::model::pre_tokenizer;
using kvscout::model::token_type;
using Catch::Contains;
using ids_t = std::vector<std::int32_t>;

// ---- a tiny vocabulary --------------------------------------------------------------------------

/// GPT-2's byte alphabet written out from its definition (not from the header): the printable
/// bytes stand for themselves, the others get U+0100... in byte order.
std::string byte_char(int b) {
  const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
  int cp = b;
  if (!printable) {
    cp = 0x100;
    for (int x = 0; x < b; ++x) {
      if (!((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || x >= 0xae)) ++cp;
    }
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

// Ids 0..255: the byte tokens, id = byte value. Then:
enum : std::int32_t {
  id_he = 256, id_ll, id_hell, id_hello, id_Gw, id_or, id_Gwor, id_Gworl, id_Gworld,
  id_yz, id_xy, id_aa, id_12, id_end, id_pad, tiny_size
};

struct tiny_vocab {
  std::vector<std::string> tokens;
  std::vector<std::int32_t> types;
  std::vector<std::string> merges;

  tiny_vocab() {
    for (int b = 0; b < 256; ++b) tokens.push_back(byte_char(b));
    for (const char* t : {"he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "Ġworl", "Ġworld",
                          "yz", "xy", "aa", "12", "<|end|>", "<pad>"}) {
      tokens.emplace_back(t);
    }
    types.assign(tokens.size(), 1);
    types[id_end] = 3;  // control
    types[id_pad] = 4;  // user-defined
    // Rank = index. "y z" ranks before "x y", so "xyz" is x + yz.
    merges = {"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d",
              "y z", "x y", "a a", "1 2"};
  }
  [[nodiscard]] bpe_tokenizer make(pre_tokenizer pre = pre_tokenizer::smollm) const {
    return bpe_tokenizer(tokens, types, merges, id_end, id_end, pre);
  }
};

ids_t bytes_of(std::string_view s) {
  ids_t v;
  for (const char c : s) v.push_back(static_cast<unsigned char>(c));
  return v;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// ---- a minimal GGUF writer (metadata only), from the format description -------------------------

enum : std::uint32_t { t_u32 = 4, t_i32 = 5, t_string = 8, t_array = 9 };

struct gguf_writer {
  std::string bytes;
  std::uint64_t n_kv = 0;

  template <class T>
  void put(T v) {
    char tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    bytes.append(tmp, sizeof(T));
  }
  void put_string(std::string_view s) {
    put<std::uint64_t>(s.size());
    bytes.append(s);
  }
  void key(std::string_view k, std::uint32_t type) {
    put_string(k);
    put<std::uint32_t>(type);
    ++n_kv;
  }
  void str(std::string_view k, std::string_view v) {
    key(k, t_string);
    put_string(v);
  }
  void u32(std::string_view k, std::uint32_t v) {
    key(k, t_u32);
    put<std::uint32_t>(v);
  }
  void strings(std::string_view k, const std::vector<std::string>& v) {
    key(k, t_array);
    put<std::uint32_t>(t_string);
    put<std::uint64_t>(v.size());
    for (const auto& s : v) put_string(s);
  }
  void i32s(std::string_view k, const std::vector<std::int32_t>& v) {
    key(k, t_array);
    put<std::uint32_t>(t_i32);
    put<std::uint64_t>(v.size());
    for (const auto x : v) put<std::int32_t>(x);
  }
  /// Header (version 3, no tensors) + metadata, padded to 32 bytes.
  [[nodiscard]] std::string file() const {
    gguf_writer h;
    h.bytes = "GGUF";
    h.put<std::uint32_t>(3);
    h.put<std::uint64_t>(0);
    h.put<std::uint64_t>(n_kv);
    std::string out = h.bytes + bytes;
    out.resize((out.size() + 31) / 32 * 32, '\0');
    return out;
  }
};

struct temp_file {
  fs::path path;
  explicit temp_file(const std::string& contents) {
    static int counter = 0;
    path = fs::temp_directory_path() / ("kvscout_tok_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(counter++) + ".gguf");
    std::ofstream(path, std::ios::binary) << contents;
  }
  ~temp_file() {
    std::error_code ec;
    fs::remove(path, ec);
  }
  temp_file(const temp_file&) = delete;
  temp_file& operator=(const temp_file&) = delete;
};

gguf_writer tiny_gguf(std::string_view model, std::string_view pre) {
  const tiny_vocab v;
  gguf_writer w;
  w.str("general.architecture", "llama");
  w.str("tokenizer.ggml.model", model);
  if (!pre.empty()) w.str("tokenizer.ggml.pre", pre);
  w.strings("tokenizer.ggml.tokens", v.tokens);
  w.i32s("tokenizer.ggml.token_type", v.types);
  w.strings("tokenizer.ggml.merges", v.merges);
  w.u32("tokenizer.ggml.bos_token_id", id_end);
  w.u32("tokenizer.ggml.eos_token_id", id_pad);
  return w;
}

// ---- the real model -----------------------------------------------------------------------------

fs::path model_path() { return smollm2::model_path(); }

/// pg19_firstbook.txt from ${KVSCOUT_DATA_DIR}, else tests/data in the repository (found from this
/// source file's path; tests/data/README.md); empty when neither has it.
fs::path pg19_path() {
  std::vector<fs::path> dirs;
  if (const char* d = std::getenv("KVSCOUT_DATA_DIR"); d != nullptr && *d != '\0') {
    dirs.emplace_back(d);
  }
  dirs.push_back(fs::path(__FILE__).parent_path() / ".." / "data");
  for (const auto& d : dirs) {
    std::error_code ec;
    if (fs::exists(d / "pg19_firstbook.txt", ec)) return d / "pg19_firstbook.txt";
  }
  return {};
}

/// The real tokenizer, built once; nullptr when the file is absent.
const bpe_tokenizer* real_tokenizer() {
  static const std::unique_ptr<bpe_tokenizer> tok = []() -> std::unique_ptr<bpe_tokenizer> {
    const fs::path p = model_path();
    if (!fs::exists(p)) return nullptr;
    const kvscout::model::gguf_file f(p.string());
    return std::make_unique<bpe_tokenizer>(kvscout::model::tokenizer_from_gguf(f));
  }();
  return tok.get();
}

#define KVSCOUT_REAL_TOKENIZER_OR_SKIP(name)                                                  \
  const bpe_tokenizer* name##_ptr = real_tokenizer();                                         \
  if (name##_ptr == nullptr) {                                                                \
    WARN("SKIP: " << model_path().string()                                                    \
                  << " not found; run scripts/fetch_model.sh (or set KVSCOUT_MODEL_DIR)");    \
    return;                                                                                   \
  }                                                                                           \
  const bpe_tokenizer& name = *name##_ptr

void check_round_trip(const bpe_tokenizer& tok, const std::string& text) {
  CAPTURE(text.size());
  const ids_t ids = tok.encode(text);
  const std::string back = tok.decode(ids);
  if (back != text) {
    std::size_t i = 0;
    while (i < back.size() && i < text.size() && back[i] == text[i]) ++i;
    FAIL("round trip differs at byte " << i << " of " << text.size());
  }
  CHECK(back == text);
}

}  // namespace

// ---- byte alphabet and Unicode classes ----------------------------------------------------------

TEST_CASE("byte alphabet: 256 distinct printable characters, invertible", "[tokenizer]") {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    CAPTURE(b);
    const char32_t cp = bpe::byte_to_unicode[b];
    seen.insert(cp);
    CHECK(cp > 0x20);
    CHECK_FALSE((cp >= 0x7f && cp <= 0xa0));  // DEL and the C1 controls
    CHECK(cp != 0xad);                        // soft hyphen
    CHECK(bpe::classify(cp) != bpe::char_class::space);
    REQUIRE(cp < bpe::byte_alphabet_end);
    CHECK(bpe::unicode_to_byte[cp] == b);
    std::string utf8;
    bpe::append_utf8(utf8, cp);
    CHECK(utf8 == byte_char(b));
  }
  CHECK(seen.size() == 256);
  CHECK(bpe::byte_to_unicode[' '] == U'\u0120');   // 'Ġ'
  CHECK(bpe::byte_to_unicode['\n'] == U'\u010a');  // 'Ċ'
  CHECK(bpe::byte_to_unicode['A'] == U'A');
  CHECK(bpe::byte_to_unicode[0x7f] == U'\u0121');
  CHECK(bpe::byte_to_unicode[0xad] == U'\u0143');
  int outside = 0;
  for (const auto x : bpe::unicode_to_byte) outside += x < 0 ? 1 : 0;
  CHECK(outside == static_cast<int>(bpe::byte_alphabet_end) - 256);
}

TEST_CASE("Unicode classes: letters, numbers, whitespace, the rest", "[tokenizer]") {
  using cc = bpe::char_class;
  const auto& t = bpe::unicode_class_ranges;
  CHECK((t[0] >> 2) == 0);
  for (std::size_t i = 1; i < std::size(t); ++i) {
    CAPTURE(i);
    REQUIRE((t[i] >> 2) > (t[i - 1] >> 2));
    REQUIRE((t[i] & 3u) != (t[i - 1] & 3u));
  }
  struct expect {
    char32_t cp;
    cc cls;
  };
  for (const expect e : {expect{U'a', cc::letter}, {U'Z', cc::letter}, {U'7', cc::number},
                         {U' ', cc::space},        {U'\t', cc::space}, {U'\r', cc::space},
                         {U'_', cc::other},        {U'\'', cc::other}, {U'\u00e9', cc::letter},
                         {U'\u00aa', cc::letter},  {U'\u00b2', cc::number},
                         {U'\u00bd', cc::number},  {U'\u00a0', cc::space},
                         {U'\u0085', cc::space},   {U'\u2003', cc::space},
                         {U'\u3000', cc::space},   {U'\u200b', cc::other},  // ZWSP: not \s
                         {U'\u0301', cc::other},   {U'\u2014', cc::other},
                         {U'\u201c', cc::other},   {U'\u4e2d', cc::letter},
                         {U'\u3042', cc::letter},  {U'\uac00', cc::letter},
                         {U'\u0416', cc::letter},  {U'\u0627', cc::letter},
                         {U'\u0661', cc::number},  {U'\u2162', cc::number},  // Roman numeral
                         {U'\uff11', cc::number},  {U'\U0001f600', cc::other},
                         {U'\u0378', cc::other},   {U'\U0010ffff', cc::other},
                         {U'\U00020000', cc::letter}}) {
    CAPTURE(static_cast<std::uint32_t>(e.cp));
    CHECK(bpe::classify(e.cp) == e.cls);
  }
}

TEST_CASE("UTF-8 decoding rejects malformed sequences byte by byte", "[tokenizer]") {
  const auto dec = [](std::string_view s) { return bpe::decode_utf8(s, 0); };
  CHECK(dec("\xc3\xa9").cp == U'\u00e9');
  CHECK(dec("\xc3\xa9").len == 2);
  CHECK(dec("\xf0\x9f\x98\x80").cp == U'\U0001f600');
  for (const std::string_view bad :
       {std::string_view("\xc3"), std::string_view("\xc0\xaf"),  // truncated, overlong
        std::string_view("\xed\xa0\x80"),                        // surrogate
        std::string_view("\xf4\x90\x80\x80"),                    // past U+10FFFF
        std::string_view("\x80"), std::string_view("\xff"), std::string_view("\xe2\x28\xa1")}) {
    CAPTURE(bad);
    const auto u = dec(bad);
    CHECK_FALSE(u.valid);
    CHECK(u.len == 1);
  }
}

// ---- pre-tokenizer ------------------------------------------------------------------------------

TEST_CASE("pre-tokenizer splits match the GPT-2 pattern", "[tokenizer]") {
  using sv = std::vector<std::string_view>;
  struct split_case {
    std::string_view text;
    sv gpt2;
    sv smollm;
  };
  const std::vector<split_case> cases = {
      {"Hello world", {"Hello", " world"}, {"Hello", " world"}},
      {"I'm   here!\n\nOK",
       {"I", "'m", "  ", " here", "!", "\n", "\n", "OK"},
       {"I", "'m", "  ", " here", "!", "\n", "\n", "OK"}},
      {"it's 'S 'll x''s",
       {"it", "'s", " '", "S", " '", "ll", " x", "''", "s"},
       {"it", "'s", " '", "S", " '", "ll", " x", "''", "s"}},
      {"abc 123 x", {"abc", " 123", " x"}, {"abc", " ", "1", "2", "3", " x"}},
      {"a  \t b\n", {"a", "  \t", " b", "\n"}, {"a", "  \t", " b", "\n"}},
      {"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e text\xe2\x80\xa6  ",  // 日本語 text…
       {"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", " text", "\xe2\x80\xa6", "  "},
       {"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", " text", "\xe2\x80\xa6", "  "}},
      {"v1.2 \xc2\xbd \xc2\xb2 x",  // v1.2 ½ ² x
       {"v", "1", ".", "2", " \xc2\xbd", " \xc2\xb2", " x"},
       {"v", "1", ".", "2", " ", "\xc2\xbd", " ", "\xc2\xb2", " x"}},
      {"", {}, {}},
      {" ", {" "}, {" "}},
      {"\n", {"\n"}, {"\n"}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    CHECK(kvscout::model::pre_tokenize(c.text, pre_tokenizer::gpt2) == c.gpt2);
    CHECK(kvscout::model::pre_tokenize(c.text, pre_tokenizer::smollm) == c.smollm);
  }
}

TEST_CASE("pre-tokenizer: invalid UTF-8 bytes become one-byte pieces of class other",
          "[tokenizer]") {
  const std::string_view text("ab\xff\xfe cd\xc3", 8);
  using sv = std::vector<std::string_view>;
  CHECK(kvscout::model::pre_tokenize(text, pre_tokenizer::gpt2) ==
        sv{"ab", "\xff\xfe", " cd", "\xc3"});
}

// ---- tiny vocabulary: exact ids -----------------------------------------------------------------

TEST_CASE("tiny vocabulary: merges by rank give the expected ids", "[tokenizer]") {
  const tiny_vocab v;
  const bpe_tokenizer tok = v.make();
  CHECK(tok.vocab_size() == static_cast<std::size_t>(tiny_size));
  CHECK(tok.merge_count() == v.merges.size());
  CHECK(tok.bos() == id_end);
  CHECK(tok.eos() == id_end);

  CHECK(tok.encode("hello world") == ids_t{id_hello, id_Gworld});
  CHECK(tok.encode("hello") == ids_t{id_hello});
  CHECK(tok.encode("hel") == ids_t{id_he, 'l'});
  CHECK(tok.encode("held") == ids_t{id_he, 'l', 'd'});
  CHECK(tok.encode("ll") == ids_t{id_ll});
  CHECK(tok.encode(" w") == ids_t{id_Gw});
  CHECK(tok.encode(" wor") == ids_t{id_Gwor});
  CHECK(tok.encode("xyz") == ids_t{'x', id_yz});  // "y z" ranks before "x y"
  CHECK(tok.encode("xy") == ids_t{id_xy});
  CHECK(tok.encode("aaa") == ids_t{id_aa, 'a'});  // equal ranks: leftmost pair first
  CHECK(tok.encode("aaaa") == ids_t{id_aa, id_aa});
  CHECK(tok.encode("") == ids_t{});
  CHECK(tok.encode("", true) == ids_t{id_end});
  CHECK(tok.encode("hello", true) == ids_t{id_end, id_hello});
  // Merges stop at piece boundaries: "o" and "r" are in different pieces here.
  CHECK(tok.encode("o r") == ids_t{'o', ' ', 'r'});
  CHECK(tok.encode("or") == ids_t{id_or});
}

TEST_CASE("tiny vocabulary: digits are isolated by smollm, merged by gpt2", "[tokenizer]") {
  const tiny_vocab v;
  CHECK(v.make(pre_tokenizer::smollm).encode("a12") == ids_t{'a', '1', '2'});
  CHECK(v.make(pre_tokenizer::gpt2).encode("a12") == ids_t{'a', id_12});
  CHECK(v.make(pre_tokenizer::gpt2).pre() == pre_tokenizer::gpt2);
}

TEST_CASE("tiny vocabulary: special tokens are matched in text", "[tokenizer]") {
  const tiny_vocab v;
  const bpe_tokenizer tok = v.make();
  CHECK(tok.encode("hello<|end|>") == ids_t{id_hello, id_end});
  CHECK(tok.encode("<|end|><pad>hello") == ids_t{id_end, id_pad, id_hello});
  CHECK(tok.encode("<|end|") == bytes_of("<|end|"));
  CHECK(tok.encode("<<|end|>>") == ids_t{'<', id_end, '>'});
  // The text around a special token is pre-tokenized on its own.
  CHECK(tok.encode("hel<|end|>lo") == ids_t{id_he, 'l', id_end, 'l', 'o'});
  // parse_special = false: the same bytes as ordinary text.
  ids_t plain = tok.encode("<|end|>", false, false);
  CHECK(plain == bytes_of("<|end|>"));
  CHECK(tok.decode(plain) == "<|end|>");
  CHECK(tok.type(id_end) == token_type::control);
  CHECK(tok.type(id_pad) == token_type::user_defined);
  CHECK(tok.type('a') == token_type::normal);
}

TEST_CASE("thousands of special tokens: the longest at each position, as a plain scan finds it",
          "[tokenizer]") {
  // 256 byte tokens and no merges, so ordinary text encodes byte by byte; 3,000 distinct
  // specials over a four-letter alphabet, many of them prefixes of others ("<a", "<ab", ...).
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_char(b));
  std::mt19937 rng(45);
  const std::string alphabet = "<ab>";
  std::set<std::string> seen;
  std::vector<std::string> specials;
  while (specials.size() < 3000) {
    std::string t = "<";
    const int len = 1 + static_cast<int>(rng() % 9);
    for (int i = 0; i < len; ++i) t += alphabet[rng() % alphabet.size()];
    if (seen.insert(t).second) specials.push_back(t);
  }
  for (const std::string& t : specials) tokens.push_back(t);
  std::vector<std::int32_t> types(tokens.size(), 1);
  std::fill(types.begin() + 256, types.end(), 3);  // control
  const bpe_tokenizer tok(tokens, types, {}, -1, -1);

  std::string text;
  for (int i = 0; i < 20000; ++i) text += alphabet[rng() % alphabet.size()];
  // The reference: at each position, every special tried, the longest match taken.
  ids_t want;
  for (std::size_t i = 0; i < text.size();) {
    std::int32_t hit = -1;
    std::size_t hit_len = 0;
    for (std::size_t k = 0; k < specials.size(); ++k) {
      if (specials[k].size() > hit_len && std::string_view(text).substr(i).starts_with(specials[k])) {
        hit = static_cast<std::int32_t>(256 + k);
        hit_len = specials[k].size();
      }
    }
    if (hit >= 0) {
      want.push_back(hit);
      i += hit_len;
    } else {
      want.push_back(static_cast<unsigned char>(text[i]));
      ++i;
    }
  }
  const ids_t got = tok.encode(text);
  REQUIRE(got.size() == want.size());
  CHECK(got == want);
  CHECK(std::count_if(got.begin(), got.end(), [](std::int32_t id) { return id >= 256; }) > 1000);
  CHECK(tok.decode(got) == text);
  // A control token spelled like a byte's character is not that byte's token.
  const bpe_tokenizer ctrl_space({byte_char(' '), byte_char('a')}, {3, 1}, {}, -1, -1);
  CHECK_FALSE(ctrl_space.has_byte_token(' '));
  CHECK(ctrl_space.has_byte_token('a'));
  CHECK(ctrl_space.encode(" a", false, false) == ids_t{1});
  // A prefix of a special that continues otherwise: the shorter special, then bytes.
  const bpe_tokenizer nested({byte_char('<'), byte_char('a'), byte_char('b'), "<a", "<ab", "<abb"},
                             {1, 1, 1, 3, 3, 3}, {}, -1, -1);
  CHECK(nested.encode("<abbb<aba<") == ids_t{5, 2, 4, 1, 0});
}

TEST_CASE("tiny vocabulary: decode and token lookups", "[tokenizer]") {
  const tiny_vocab v;
  const bpe_tokenizer tok = v.make();
  const ids_t ids{id_hello, id_Gworld, id_end};
  CHECK(tok.decode(ids) == "hello world<|end|>");
  CHECK(tok.decode(ids_t{}).empty());
  CHECK(tok.token_text(' ') == " ");
  CHECK(tok.token_string(' ') == "\xc4\xa0");  // "Ġ"
  CHECK(tok.token_text('\n') == "\n");
  CHECK(tok.token_text(id_Gworld) == " world");
  CHECK(tok.token_string(id_Gworld) == "\xc4\xa0world");
  CHECK(tok.token_text(id_end) == "<|end|>");
  CHECK(tok.token_id("\xc4\xa0world") == id_Gworld);
  CHECK(tok.token_id("hello") == id_hello);
  CHECK_FALSE(tok.token_id("nope").has_value());
}

TEST_CASE("tiny vocabulary: every byte string round-trips", "[tokenizer]") {
  const tiny_vocab v;
  const bpe_tokenizer tok = v.make();
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  CHECK(tok.decode(tok.encode(all)) == all);
  for (const std::string& s :
       {std::string("  \t\n\r\n  x  "), std::string("caf\xc3\xa9 \xf0\x9f\x98\x80!"),
        std::string("\xff\xfe\x80 bad \xc3"), std::string("hello world <|end|> 12 aaa")}) {
    CAPTURE(s);
    CHECK(tok.decode(tok.encode(s)) == s);
  }
}

// ---- bad input ----------------------------------------------------------------------------------

TEST_CASE("decode and lookups reject ids outside the vocabulary", "[tokenizer]") {
  const tiny_vocab v;
  const bpe_tokenizer tok = v.make();
  const std::string size = std::to_string(static_cast<int>(tiny_size));
  CHECK_THROWS_WITH(tok.decode(ids_t{id_hello, tiny_size}),
                    Contains("token id " + size) && Contains("position 1") &&
                        Contains("vocabulary size " + size));
  CHECK_THROWS_WITH(tok.decode(ids_t{-1}), Contains("token id -1") && Contains(size));
  CHECK_THROWS_AS(tok.decode(ids_t{-1}), kvscout::error);
  CHECK_THROWS_WITH(tok.token_text(tiny_size), Contains("token id " + size));
  CHECK_THROWS_WITH(tok.token_string(-5), Contains("token id -5"));
  CHECK_THROWS_WITH(tok.type(100000), Contains("token id 100000"));
}

TEST_CASE("constructor rejects malformed merges", "[tokenizer]") {
  for (const std::string bad : {"ab", "a  b", " ab", "ab ", "a b c", " ", ""}) {
    CAPTURE(bad);
    tiny_vocab v;
    v.merges.push_back(bad);
    CHECK_THROWS_WITH(v.make(), Contains("merge 13") && Contains("exactly one space"));
  }
}

TEST_CASE("constructor rejects merges of tokens not in the vocabulary", "[tokenizer]") {
  {
    tiny_vocab v;
    v.merges.insert(v.merges.begin() + 2, "hel lo");
    CHECK_THROWS_WITH(v.make(), Contains("merge 2 'hel lo'") && Contains("left part 'hel'") &&
                                    Contains("not in the vocabulary"));
  }
  {
    tiny_vocab v;
    v.merges.push_back("he zz");
    CHECK_THROWS_WITH(v.make(), Contains("right part 'zz'"));
  }
  {
    tiny_vocab v;
    v.merges.push_back("q r");  // "qr" is not a token
    CHECK_THROWS_WITH(v.make(), Contains("merged token 'qr'"));
  }
  {
    tiny_vocab v;
    v.merges.push_back("h e");
    CHECK_THROWS_WITH(v.make(), Contains("merge 13 'h e' repeats merge 0"));
  }
  CHECK_NOTHROW(tiny_vocab().make());
}

TEST_CASE("constructor rejects duplicate tokens, bad types, bad special ids", "[tokenizer]") {
  {
    tiny_vocab v;
    v.tokens[id_xy] = "hello";
    CHECK_THROWS_WITH(v.make(), Contains("duplicate token 'hello'") &&
                                    Contains("ids " + std::to_string(int{id_hello}) + " and " +
                                             std::to_string(int{id_xy})));
  }
  {
    tiny_vocab v;
    v.types.pop_back();
    CHECK_THROWS_WITH(v.make(), Contains("token_types has"));
  }
  {
    tiny_vocab v;
    v.types[7] = 9;
    CHECK_THROWS_WITH(v.make(), Contains("token 7") && Contains("type 9"));
  }
  {
    const tiny_vocab v;
    CHECK_THROWS_WITH(bpe_tokenizer(v.tokens, v.types, v.merges, tiny_size, 0),
                      Contains("bos id " + std::to_string(int{tiny_size})));
    CHECK_THROWS_WITH(bpe_tokenizer(v.tokens, v.types, v.merges, 0, -2), Contains("eos id -2"));
    CHECK_THROWS_WITH(bpe_tokenizer({}, {}, {}, -1, -1), Contains("empty vocabulary"));
    const bpe_tokenizer no_bos(v.tokens, v.types, v.merges, -1, -1);
    CHECK_THROWS_WITH(no_bos.encode("x", true), Contains("no bos token"));
  }
}

TEST_CASE("bytes without a token are left out; their neighbours merge", "[tokenizer]") {
  const std::vector<std::string> tokens{"a", "b", "ab", "!", "!!"};
  const bpe_tokenizer tok(tokens, {1, 1, 1, 1, 1}, {"a b", "! !"}, -1, -1);
  CHECK(tok.has_byte_token('a'));
  CHECK_FALSE(tok.has_byte_token('c'));
  CHECK(tok.encode("abba") == ids_t{2, 1, 0});
  CHECK(tok.encode("abc") == ids_t{2});
  CHECK(tok.encode("acb") == ids_t{2});  // same piece: a and b become adjacent
  CHECK(tok.encode("!\x04!") == ids_t{4});
  CHECK(tok.encode("a b") == ids_t{0, 1});  // the space has no token
  CHECK(tok.encode("ccc").empty());
}

// ---- from a GGUF file ---------------------------------------------------------------------------

TEST_CASE("tokenizer_from_gguf reads a written file", "[tokenizer]") {
  const temp_file f(tiny_gguf("gpt2", "smollm").file());
  const kvscout::model::gguf_file g(f.path.string());
  const bpe_tokenizer tok = kvscout::model::tokenizer_from_gguf(g);
  CHECK(tok.vocab_size() == static_cast<std::size_t>(tiny_size));
  CHECK(tok.bos() == id_end);
  CHECK(tok.eos() == id_pad);
  CHECK(tok.pre() == pre_tokenizer::smollm);
  CHECK(tok.encode("hello world<|end|>a12") == ids_t{id_hello, id_Gworld, id_end, 'a', '1', '2'});

  const temp_file f2(tiny_gguf("gpt2", "gpt2").file());
  CHECK(kvscout::model::tokenizer_from_gguf(kvscout::model::gguf_file(f2.path.string())).pre() ==
        pre_tokenizer::gpt2);
  const temp_file f3(tiny_gguf("gpt2", "").file());  // no tokenizer.ggml.pre
  CHECK(kvscout::model::tokenizer_from_gguf(kvscout::model::gguf_file(f3.path.string())).pre() ==
        pre_tokenizer::gpt2);
}

TEST_CASE("tokenizer_from_gguf names an unsupported model or pre-tokenizer", "[tokenizer]") {
  {
    const temp_file f(tiny_gguf("llama", "smollm").file());
    const kvscout::model::gguf_file g(f.path.string());
    CHECK_THROWS_WITH(kvscout::model::tokenizer_from_gguf(g),
                      Contains("tokenizer.ggml.model is 'llama'") && Contains("gpt2"));
  }
  {
    const temp_file f(tiny_gguf("gpt2", "llama-bpe").file());
    const kvscout::model::gguf_file g(f.path.string());
    CHECK_THROWS_WITH(kvscout::model::tokenizer_from_gguf(g),
                      Contains("tokenizer.ggml.pre is 'llama-bpe'") && Contains("smollm"));
  }
  {
    gguf_writer w;
    w.str("tokenizer.ggml.model", "gpt2");
    const temp_file f(w.file());
    const kvscout::model::gguf_file g(f.path.string());
    CHECK_THROWS_WITH(kvscout::model::tokenizer_from_gguf(g), Contains("tokenizer.ggml.tokens"));
  }
}

// ---- the real model -----------------------------------------------------------------------------

TEST_CASE("SmolLM2 tokenizer: vocabulary facts", "[tokenizer][model]") {
  KVSCOUT_REAL_TOKENIZER_OR_SKIP(tok);
  CHECK(tok.vocab_size() == 49152);
  CHECK(tok.merge_count() == 48900);
  CHECK(tok.bos() == 1);
  CHECK(tok.eos() == 2);
  CHECK(tok.pre() == pre_tokenizer::smollm);
  CHECK(tok.token_text(0) == "<|endoftext|>");
  CHECK(tok.token_text(1) == "<|im_start|>");
  CHECK(tok.token_text(2) == "<|im_end|>");
  CHECK(tok.type(1) == token_type::control);
}

TEST_CASE("SmolLM2 tokenizer: structural encodings", "[tokenizer][model]") {
  KVSCOUT_REAL_TOKENIZER_OR_SKIP(tok);
  const auto id = [&](std::string_view s) {
    const auto x = tok.token_id(s);
    REQUIRE(x.has_value());
    return *x;
  };
  CHECK(tok.encode("Hello") == ids_t{id("Hello")});
  CHECK(tok.encode(" world") == ids_t{id("\xc4\xa0world")});   // "Ġworld"
  CHECK(tok.encode("\n") == ids_t{id("\xc4\x8a")});            // "Ċ"
  CHECK(tok.encode("\n\n") == ids_t{id("\xc4\x8a\xc4\x8a")});  // "ĊĊ"
  CHECK(tok.encode(" ") == ids_t{id("\xc4\xa0")});             // "Ġ"
  CHECK(tok.token_text(id("\xc4\xa0world")) == " world");
  // Digits one by one, the space before them alone.
  CHECK(tok.encode(" 2024") == ids_t{id("\xc4\xa0"), id("2"), id("0"), id("2"), id("4")});
}

TEST_CASE("SmolLM2 tokenizer: ids agree with Hugging Face tokenizers", "[tokenizer][model]") {
  KVSCOUT_REAL_TOKENIZER_OR_SKIP(tok);
  struct known {
    std::string_view text;
    ids_t ids;
  };
  const std::vector<known> cases = {
      {"Hello world", {19556, 905}},
      {"Hello, world! 12345", {19556, 28, 905, 17, 216, 33, 34, 35, 36, 37}},
      {"<|im_start|>user\nHi<|im_end|>", {1, 4093, 198, 26843, 2}},
      {"The quick brown fox jumps over the lazy dog.",
       {504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30}},
      // Café naïve — “quoted” 日本語 😀
      {"Caf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 \xe2\x80\x9cquoted\xe2\x80\x9d "
       "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80",
       {51, 1939, 2756, 15486, 46494, 1841, 619, 385, 5036, 573, 17097, 241, 115, 40993, 179,
        120, 248, 40303, 218}},
      {"  indented\n\n\tline 3.14159  ",
       {216, 641, 6574, 1116, 197, 1311, 216, 35, 30, 33, 36, 33, 37, 41, 256}},
      {"I'm sure they'll say it's 2024, don't you?",
       {57, 5248, 2090, 502, 3060, 1643, 357, 506, 216, 34, 32, 34, 36, 28, 1326, 982, 346, 47}},
      {"def f(x):\n    return x**2\n", {1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 198}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    CHECK(tok.encode(c.text) == c.ids);
    CHECK(tok.decode(c.ids) == c.text);
  }
}

TEST_CASE("SmolLM2 tokenizer: special tokens", "[tokenizer][model]") {
  KVSCOUT_REAL_TOKENIZER_OR_SKIP(tok);
  const ids_t ids = tok.encode("<|im_start|>user\nHi<|im_end|>");
  REQUIRE(ids.size() >= 3);
  CHECK(ids.front() == 1);
  CHECK(ids.back() == 2);
  CHECK(tok.encode("<|endoftext|>") == ids_t{0});
  CHECK(tok.encode("x", true) == ids_t{1, tok.encode("x")[0]});
  // As plain text: no special ids, same bytes back.
  const ids_t plain = tok.encode("<|im_start|>user\nHi<|im_end|>", false, false);
  for (const auto i : plain) CHECK(tok.type(i) == token_type::normal);
  CHECK(tok.decode(plain) == "<|im_start|>user\nHi<|im_end|>");
}

TEST_CASE("SmolLM2 tokenizer: real text round-trips exactly", "[tokenizer][model]") {
  KVSCOUT_REAL_TOKENIZER_OR_SKIP(tok);
  SECTION("pg19 first book") {
    const fs::path p = pg19_path();
    if (p.empty()) {
      WARN("SKIP: pg19_firstbook.txt not found (set KVSCOUT_DATA_DIR)");
      return;
    }
    const std::string text = slurp(p);
    const ids_t ids = tok.encode(text);
    INFO("pg19_firstbook.txt: " << text.size() << " bytes -> " << ids.size() << " tokens");
    WARN("pg19_firstbook.txt: " << text.size() << " bytes -> " << ids.size() << " tokens");
    CHECK(ids.size() > text.size() / 8);
    CHECK(ids.size() < text.size() / 3);
    CHECK(tok.decode(ids) == text);
  }
  SECTION("licence texts") {
    int found = 0;
    for (const char* name : {"GPL-3", "Apache-2.0", "LGPL-2.1", "MPL-2.0", "Artistic"}) {
      const fs::path p = fs::path("/usr/share/common-licenses") / name;
      if (!fs::exists(p)) continue;
      ++found;
      CAPTURE(p.string());
      check_round_trip(tok, slurp(p));
    }
    if (found == 0) WARN("SKIP: no licence texts under /usr/share/common-licenses");
  }
  SECTION("UTF-8, whitespace, digits") {
    for (const std::string& s : {
             std::string("na\xc3\xafve caf\xc3\xa9 \xc3\x85ngstr\xc3\xb6m \xc3\x9f \xc5\x93"),
             std::string("\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97\xe7\xac\xa6\xe3\x80\x82"
                         "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82"
                         "\xad\xe3\x82\xb9\xe3\x83\x88 \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4"),
             std::string("\xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xe2\x9d\xa4\xef\xb8"
                         "\x8f \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f"
                         "\x91\xa7"),
             std::string("e\xcc\x81 \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 "
                         "\xd8\xa7\xd9\x84\xd8\xb9\xd8\xb1\xd8\xa8\xd9\x8a\xd8\xa9 "
                         "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8"
                         "\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80"),
             std::string("   leading\t\ttabs\n\n\n   trailing   \r\n\r\n \xc2\xa0\xe3\x80\x80"),
             std::string("0 1 22 333 4444 55555 3.14159 1,000,000 0xDEADBEEF 2024-01-01"),
             std::string(1000, ' ') + std::string(1000, 'a') + std::string(500, '\n'),
         }) {
      CAPTURE(s);
      check_round_trip(tok, s);
    }
  }
}

TEST_CASE("SmolLM2 tokenizer: bytes without a token", "[tokenizer][model]") {
  KVSCOUT_REAL_TOKENIZER_OR_SKIP(tok);
  std::vector<int> missing;
  for (int b = 0; b < 256; ++b) {
    if (!tok.has_byte_token(static_cast<unsigned char>(b))) missing.push_back(b);
  }
  CHECK(missing == std::vector<int>{0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xc0, 0xc1, 0xf1, 0xf2,
                                    0xf5, 0xf6, 0xf7, 0xf8, 0xf9, 0xfa, 0xfb, 0xfc, 0xfd, 0xfe,
                                    0xff});
  // Left out, as Hugging Face tokenizers does: "a", 0x04, "b" -> [81, 82]; "!", 0x04, "!" -> "!!".
  CHECK(tok.encode("a\x04" "b") == ids_t{81, 82});
  CHECK(tok.encode("!\x04!") == tok.encode("!!"));
  // Invalid UTF-8 whose bytes all have tokens still round-trips; 0xFF / 0xFE are dropped.
  check_round_trip(tok, "invalid \xc3 utf-8 \xed\xa0\x80 \x80\x80");
  CHECK(tok.decode(tok.encode("x\xff\xfey")) == "xy");
}

TEST_CASE("SmolLM2 tokenizer: 100 KB of text round-trips", "[tokenizer][model]") {
  // Its speed (linear in the text, whatever the number of special tokens) is bench_tokenizer's.
  KVSCOUT_REAL_TOKENIZER_OR_SKIP(tok);
  std::string base = "The quick brown fox jumps over the lazy dog 12345 times; \xc3\xa9t\xc3\xa9 "
                     "\xe6\x97\xa5\xe6\x9c\xac.\n";
  const fs::path gpl = "/usr/share/common-licenses/GPL-3";
  if (fs::exists(gpl)) base = slurp(gpl);
  std::string text;
  while (text.size() < 100 * 1024) text += base;
  const ids_t ids = tok.encode(text);
  CHECK(ids.size() > text.size() / 8);  // BPE merges, not one token per byte or per line
  CHECK(ids.size() < text.size() / 2);
  CHECK(tok.decode(ids) == text);
}
