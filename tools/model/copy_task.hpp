#pragma once
// A long-range copy task for the accuracy harness (issue 32): a span of random common words sits
// early in a long stretch of real prose; at the end of the prompt the span's first words appear
// again (the cue), and the rest of the span is the target, scored teacher-forced. To continue the
// span the model has to reach back to its first occurrence, thousands of tokens away: exactly
// what a sparse selection of the cached rows can drop. A control prompt holds other words at the
// first occurrence (same prose, same cue, same target): what a model scores without finding it.
//
// Sequence of one prompt (token ids; `sep` is the separator, e.g. the ids of "\n"):
//
//   prose[o, o + a)  sep  span  sep  prose[o + a, o + f)  sep  cue  |  target
//   `-------------------------------- prompt ------------------------'  `-----'
//
// where span = words w_0 .. w_{n-1}, cue = w_0 .. w_{c-1}, target = w_c .. w_{n-1}, f is the
// prose filler (total_tokens minus everything else), a = round(depth * f) and o a seeded offset
// into the prose. prompt.size() + target.size() == total_tokens; the span's first token is at
// prompt index a + |sep|. Every word is one token (a vocabulary of single-token words, e.g.
// " house"), so the span is span_words tokens and the control prompt has the prompt's length.
// The control's words are drawn from the vocabulary without the span's words.
//
//   auto words = kvscout::model::common_words(text, [&](const std::string& s) { return tok.encode(s); }, 400);
//   auto p = kvscout::model::make_copy_prompt(prose_ids, words, tok.encode("\n"),
//                                             {.span_words = 24, .depth = 0.3, .total_tokens = 4096});
//
// Deterministic for a seed: the random numbers are a splitmix64 stream drawn by this file's own
// code (not <random>'s distributions, whose output differs between standard libraries).
//
// Not part of the installed library (tools/).

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvscout/core/error.hpp"

namespace kvscout::model {

struct copy_task_options {
  int span_words = 24;       ///< words in the span (>= 2)
  double depth = 0.5;        ///< share of the prose filler before the span, in [0, 1]
  int total_tokens = 4096;   ///< prompt + target tokens
  int cue_words = 4;         ///< the span's first words repeated at the end, in [1, span_words)
  std::uint64_t seed = 1;
};

struct copy_prompt {
  std::vector<std::int32_t> prompt;    ///< prose, span, prose, cue
  std::vector<std::int32_t> control;   ///< the same with other words at the first occurrence
  std::vector<std::int32_t> target;    ///< the span's words after the cue
  std::vector<std::int32_t> span;      ///< the span's tokens (the first occurrence)
  std::vector<std::int32_t> control_span;
  int span_at = 0;      ///< index of the span's first token in prompt and control
  int prose_offset = 0; ///< o: where the filler starts in the prose
  int prose_tokens = 0; ///< f: filler tokens in the prompt
};

namespace detail::copy {

/// splitmix64 (Steele, Lea, Flood 2014), written out here.
struct rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n), n >= 1, without modulo bias (rejection).
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % n);
    std::uint64_t x = next();
    while (x >= limit) x = next();
    return x % n;
  }
};

/// k distinct entries of `pool` in a seeded random order (partial Fisher-Yates).
inline std::vector<std::int32_t> draw(std::vector<std::int32_t> pool, int k, rng& r) {
  for (int i = 0; i < k; ++i) {
    const auto j = static_cast<std::size_t>(i) + r.below(pool.size() - static_cast<std::size_t>(i));
    std::swap(pool[static_cast<std::size_t>(i)], pool[j]);
  }
  pool.resize(static_cast<std::size_t>(k));
  return pool;
}

}  // namespace detail::copy

/// One copy-task prompt and its control. `prose`: token ids of running text (the filler is one
/// contiguous stretch of it); `words`: the vocabulary of single-token words the spans are drawn
/// from (distinct ids, at least 2 * span_words of them: the control's words are disjoint from the
/// span's); `sep`: the separator's ids (may be empty). Throws kvscout::error naming a bad value.
inline copy_prompt make_copy_prompt(std::span<const std::int32_t> prose, std::span<const std::int32_t> words,
                                    std::span<const std::int32_t> sep, const copy_task_options& o) {
  KVSCOUT_EXPECTS(o.span_words >= 2, "copy task: span_words = ", o.span_words, ", expected at least 2");
  KVSCOUT_EXPECTS(o.cue_words >= 1 && o.cue_words < o.span_words, "copy task: cue_words = ", o.cue_words,
                  ", expected in [1, span_words = ", o.span_words, ")");
  KVSCOUT_EXPECTS(o.depth >= 0.0 && o.depth <= 1.0, "copy task: depth = ", o.depth,
                  ", expected a share of the context in [0, 1]");
  const auto nsep = static_cast<long long>(sep.size());
  const long long fixed = 3 * nsep + o.span_words + o.span_words;  // seps, span, cue + target
  KVSCOUT_EXPECTS(o.total_tokens > fixed, "copy task: total_tokens = ", o.total_tokens,
                  ", expected more than the ", fixed, " tokens of span, cue, target and separators");
  const long long f = o.total_tokens - fixed;
  KVSCOUT_EXPECTS(static_cast<long long>(prose.size()) >= f, "copy task: the prose has ", prose.size(),
                  " tokens, expected at least ", f, " for total_tokens = ", o.total_tokens);
  KVSCOUT_EXPECTS(static_cast<int>(words.size()) >= 2 * o.span_words, "copy task: the vocabulary has ",
                  words.size(), " words, expected at least 2 * span_words = ", 2 * o.span_words);
  {
    std::vector<std::int32_t> sorted(words.begin(), words.end());
    std::sort(sorted.begin(), sorted.end());
    const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    KVSCOUT_EXPECTS(dup == sorted.end(), "copy task: word id ", dup == sorted.end() ? 0 : *dup,
                    " appears twice in the vocabulary, expected distinct ids");
  }

  detail::copy::rng r{o.seed};
  copy_prompt p;
  p.prose_tokens = static_cast<int>(f);
  p.prose_offset = static_cast<int>(r.below(static_cast<std::uint64_t>(static_cast<long long>(prose.size()) - f + 1)));
  const std::vector<std::int32_t> all(words.begin(), words.end());
  p.span = detail::copy::draw(all, o.span_words, r);
  std::vector<std::int32_t> rest;
  for (std::int32_t w : all)
    if (std::find(p.span.begin(), p.span.end(), w) == p.span.end()) rest.push_back(w);
  p.control_span = detail::copy::draw(rest, o.span_words, r);

  const auto a = static_cast<long long>(std::llround(o.depth * static_cast<double>(f)));
  const auto fill = prose.subspan(static_cast<std::size_t>(p.prose_offset), static_cast<std::size_t>(f));
  const auto build = [&](const std::vector<std::int32_t>& first) {
    std::vector<std::int32_t> s;
    s.reserve(static_cast<std::size_t>(o.total_tokens));
    s.insert(s.end(), fill.begin(), fill.begin() + a);
    s.insert(s.end(), sep.begin(), sep.end());
    s.insert(s.end(), first.begin(), first.end());
    s.insert(s.end(), sep.begin(), sep.end());
    s.insert(s.end(), fill.begin() + a, fill.end());
    s.insert(s.end(), sep.begin(), sep.end());
    s.insert(s.end(), p.span.begin(), p.span.begin() + o.cue_words);
    return s;
  };
  p.prompt = build(p.span);
  p.control = build(p.control_span);
  p.target.assign(p.span.begin() + o.cue_words, p.span.end());
  p.span_at = static_cast<int>(a + nsep);
  return p;
}

/// Single-token common words of a text: the lowercase alphabetic words of at least min_letters
/// letters that encode(" " + word) makes exactly one token of, most frequent first (ties in
/// alphabetical order), the `skip` most frequent left out (the function words), at most `count`.
/// `encode` maps a string to token ids (e.g. bpe_tokenizer::encode).
template <class Encode>
std::vector<std::int32_t> common_words(std::string_view text, Encode&& encode, int count, int min_letters = 4,
                                       int skip = 0, std::vector<std::string>* names = nullptr) {
  KVSCOUT_EXPECTS(count >= 1, "common_words: count = ", count, ", expected at least 1");
  std::map<std::string, int> freq;
  std::size_t i = 0;
  while (i < text.size()) {
    if (!std::isalpha(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    std::size_t j = i;
    bool lower = true;
    while (j < text.size() && std::isalpha(static_cast<unsigned char>(text[j]))) {
      lower = lower && std::islower(static_cast<unsigned char>(text[j]));
      ++j;
    }
    // Only whole words: not glued to digits, apostrophes or other word characters.
    const bool bounded = (i == 0 || (!std::isalnum(static_cast<unsigned char>(text[i - 1])) && text[i - 1] != '\'')) &&
                         (j == text.size() || (!std::isalnum(static_cast<unsigned char>(text[j])) && text[j] != '\''));
    if (lower && bounded && static_cast<int>(j - i) >= min_letters) ++freq[std::string(text.substr(i, j - i))];
    i = j;
  }
  std::vector<std::pair<int, std::string>> ranked;
  for (auto& [w, n] : freq) ranked.emplace_back(-n, w);
  std::sort(ranked.begin(), ranked.end());
  std::vector<std::int32_t> out;
  int skipped = 0;
  for (const auto& [neg, w] : ranked) {
    if (static_cast<int>(out.size()) == count) break;
    const std::vector<std::int32_t> ids = encode(" " + w);
    if (ids.size() != 1) continue;
    if (skipped < skip) {
      ++skipped;
      continue;
    }
    if (std::find(out.begin(), out.end(), ids[0]) != out.end()) continue;
    out.push_back(ids[0]);
    if (names != nullptr) names->push_back(w);
  }
  return out;
}

}  // namespace kvscout::model
