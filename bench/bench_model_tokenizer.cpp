// The tokenizer's special-token scan (tools/model/tokenizer.hpp), at 50 and at 5,000 special
// tokens over the same 1 MiB of text: the scan walks a trie of the specials, so its cost per
// byte does not grow with their number. Before the trie it tried every special at every byte
// that starts one (O(text x specials)): a fuzzing run found 5,000 control tokens over 1 MB
// that did not finish (issue 45).
//
//   BM_encode_specials/50     50 control tokens "<|ctrl_N|>"
//   BM_encode_specials/5000   5,000 of them; goal: < 2x the time at 50
//
// The vocabulary is the 256 byte tokens and the specials, without merges, so the time is the
// pre-tokenizer's, the special scan's and the byte lookups'. The text is pg19's opening
// (tests/data, or KVSCOUT_DATA_DIR) repeated to 1 MiB with a special every 200 bytes and a
// stray "<|ctrl_" (a special's prefix that matches none) every 50.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kvscout/core/error.hpp"
#include "model/tokenizer.hpp"

namespace {

std::string pg19() {
  const char* dir = std::getenv("KVSCOUT_DATA_DIR");
  const std::string path = std::string(dir ? dir : KVSCOUT_SOURCE_DIR "/tests/data") +
                           "/pg19_firstbook.txt";
  std::ifstream f(path, std::ios::binary);
  KVSCOUT_EXPECTS(f.good(), "cannot read ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string byte_token(int b) {  // the token of byte b in GPT-2's byte alphabet
  std::string s;
  kvscout::model::detail::bpe::append_utf8(s, kvscout::model::detail::bpe::byte_to_unicode[b]);
  return s;
}

void BM_encode_specials(benchmark::State& state) {
  const auto specials = static_cast<int>(state.range(0));
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_token(b));
  for (int i = 0; i < specials; ++i) tokens.push_back("<|ctrl_" + std::to_string(i) + "|>");
  std::vector<std::int32_t> types(tokens.size(), 1);
  for (std::size_t i = 256; i < types.size(); ++i) types[i] = 3;  // control
  const kvscout::model::bpe_tokenizer tok(tokens, types, {}, -1, -1);

  const std::string book = pg19();
  std::string text;
  std::size_t k = 0;
  while (text.size() < (1u << 20)) {
    text.append(book, k % book.size(), 50);
    text += (k / 50) % 4 == 3 ? "<|ctrl_" + std::to_string((k / 200) % 50) + "|>" : "<|ctrl_";
    k += 50;
  }
  std::size_t ids = 0;
  for (auto _ : state) {
    const std::vector<std::int32_t> out = tok.encode(text);
    ids = out.size();
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
  state.counters["ids"] = static_cast<double>(ids);
}
BENCHMARK(BM_encode_specials)->Arg(50)->Arg(5000)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
