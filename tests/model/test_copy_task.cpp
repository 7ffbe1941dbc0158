// The retrieval stages of the accuracy harness (issue 32): the copy-task generator
// (tools/model/copy_task.hpp), the JSON-lines prompt files (tools/model/prompt_file.hpp), and on
// the real model ([model], skipped without the file), that greedy exact match is what the
// harness reads off the teacher-forced argmaxes and that the copy task is one SmolLM2 solves.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "model/copy_task.hpp"
#include "model/llama_eval.hpp"
#include "model/prompt_file.hpp"
#include "smollm2.hpp"

namespace {

namespace km = kvscout::model;

// Prose ids 1000, 1001, ... (each position tells where it came from), a vocabulary of 100 word
// ids 100-199, a two-token separator 7 8.
struct fixture {
  std::vector<std::int32_t> prose, words, sep{7, 8};
  fixture() {
    prose.resize(10000);
    std::iota(prose.begin(), prose.end(), 1000);
    words.resize(100);
    std::iota(words.begin(), words.end(), 100);
  }
  km::copy_prompt make(const km::copy_task_options& o) const { return km::make_copy_prompt(prose, words, sep, o); }
};

std::vector<std::int32_t> slice(const std::vector<std::int32_t>& v, std::size_t from, std::size_t n) {
  REQUIRE(from + n <= v.size());
  return {v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(from + n)};
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kvscout::error& e) {
    return e.message();
  }
  return "(no kvscout::error thrown)";
}

}  // namespace

TEST_CASE("copy task: lengths are exact and the sequence is prose, span, prose, cue", "[copy]") {
  const fixture fx;
  for (int total : {120, 1000, 2048, 6144})
    for (double depth : {0.0, 0.1, 0.37, 0.5, 0.9, 1.0}) {
      km::copy_task_options o;
      o.span_words = 24;
      o.cue_words = 4;
      o.total_tokens = total;
      o.depth = depth;
      o.seed = 11;
      CAPTURE(total, depth);
      const km::copy_prompt p = fx.make(o);
      const std::size_t ns = fx.sep.size();
      const auto f = static_cast<std::size_t>(total) - 3 * ns - 2 * 24;
      REQUIRE(p.prompt.size() + p.target.size() == static_cast<std::size_t>(total));
      REQUIRE(p.control.size() == p.prompt.size());
      REQUIRE(p.span.size() == 24);
      REQUIRE(p.target.size() == 20);
      REQUIRE(p.prose_tokens == static_cast<int>(f));
      // The span sits after round(depth * f) tokens of prose and one separator.
      const auto a = static_cast<std::size_t>(std::llround(depth * static_cast<double>(f)));
      REQUIRE(p.span_at == static_cast<int>(a + ns));
      const auto off = static_cast<std::size_t>(p.prose_offset);
      REQUIRE(off + f <= fx.prose.size());
      CHECK(slice(p.prompt, 0, a) == slice(fx.prose, off, a));
      CHECK(slice(p.prompt, a, ns) == fx.sep);
      CHECK(slice(p.prompt, a + ns, 24) == p.span);
      CHECK(slice(p.prompt, a + ns + 24, ns) == fx.sep);
      CHECK(slice(p.prompt, a + 2 * ns + 24, f - a) == slice(fx.prose, off + a, f - a));
      // At the end: separator, the cue = the span's first 4 words; the target is the rest.
      const std::size_t end = p.prompt.size();
      CHECK(slice(p.prompt, end - 4 - ns, ns) == fx.sep);
      CHECK(slice(p.prompt, end - 4, 4) == slice(p.span, 0, 4));
      CHECK(p.target == slice(p.span, 4, 20));
    }
}

TEST_CASE("copy task: the control differs only in the first occurrence, with other words", "[copy]") {
  const fixture fx;
  for (std::uint64_t seed : {1, 2, 3, 99}) {
    km::copy_task_options o;
    o.span_words = 16;
    o.cue_words = 3;
    o.total_tokens = 3000;
    o.depth = 0.25;
    o.seed = seed;
    CAPTURE(seed);
    const km::copy_prompt p = fx.make(o);
    REQUIRE(p.control.size() == p.prompt.size());
    for (std::size_t j = 0; j < p.prompt.size(); ++j) {
      const bool in_span = j >= static_cast<std::size_t>(p.span_at) && j < static_cast<std::size_t>(p.span_at) + 16;
      CAPTURE(j);
      if (in_span) CHECK(p.control[j] != p.prompt[j]);
      else CHECK(p.control[j] == p.prompt[j]);
    }
    CHECK(slice(p.control, static_cast<std::size_t>(p.span_at), 16) == p.control_span);
    // Distinct vocabulary words, the control's disjoint from the span's.
    const std::set<std::int32_t> s(p.span.begin(), p.span.end()), c(p.control_span.begin(), p.control_span.end());
    CHECK(s.size() == 16);
    CHECK(c.size() == 16);
    for (std::int32_t w : p.span) CHECK((w >= 100 && w < 200 && c.count(w) == 0));
    for (std::int32_t w : p.control_span) CHECK((w >= 100 && w < 200));
  }
}

TEST_CASE("copy task: deterministic for a seed, different across seeds", "[copy]") {
  const fixture fx;
  km::copy_task_options o;
  o.total_tokens = 2048;
  o.depth = 0.6;
  o.seed = 42;
  const km::copy_prompt a = fx.make(o), b = fx.make(o);
  CHECK(a.prompt == b.prompt);
  CHECK(a.control == b.control);
  CHECK(a.target == b.target);
  CHECK(a.prose_offset == b.prose_offset);
  // Over 60 seeds: the first word and the prose offset take many values; every vocabulary word
  // can be drawn.
  std::set<std::int32_t> first, offsets, seen;
  for (std::uint64_t s = 0; s < 60; ++s) {
    o.seed = s;
    const km::copy_prompt p = fx.make(o);
    first.insert(p.span[0]);
    offsets.insert(p.prose_offset);
    seen.insert(p.span.begin(), p.span.end());
  }
  CHECK(first.size() >= 30);
  CHECK(offsets.size() >= 55);
  CHECK(seen.size() == 100);
  // The same prompt for the same seed whatever was drawn before (no hidden state).
  o.seed = 42;
  CHECK(fx.make(o).prompt == a.prompt);
}

TEST_CASE("copy task: bad arguments throw kvscout::error naming the value", "[copy]") {
  const fixture fx;
  const auto with = [&](auto change) {
    return message_of([&] {
      km::copy_task_options o;
      o.total_tokens = 1000;
      change(o);
      fx.make(o);
    });
  };
  using Catch::Contains;
  CHECK_THAT(with([](auto& o) { o.span_words = 1; }), Contains("span_words = 1, expected at least 2"));
  CHECK_THAT(with([](auto& o) { o.cue_words = 0; }), Contains("cue_words = 0, expected in [1, span_words = 24)"));
  CHECK_THAT(with([](auto& o) { o.cue_words = 24; }), Contains("cue_words = 24"));
  CHECK_THAT(with([](auto& o) { o.depth = 1.5; }), Contains("depth = 1.5, expected"));
  CHECK_THAT(with([](auto& o) { o.depth = -0.1; }), Contains("depth = -0.1"));
  CHECK_THAT(with([](auto& o) { o.total_tokens = 54; }), Contains("total_tokens = 54, expected more than the 54 tokens"));
  CHECK(with([](auto& o) { o.total_tokens = 55; }) == "(no kvscout::error thrown)");
  CHECK_THAT(with([](auto& o) { o.total_tokens = 20000; }),
             Contains("the prose has 10000 tokens, expected at least 19946 for total_tokens = 20000"));
  CHECK_THAT(message_of([&] {
               const std::vector<std::int32_t> few(fx.words.begin(), fx.words.begin() + 47);
               km::make_copy_prompt(fx.prose, few, fx.sep, {});
             }),
             Contains("the vocabulary has 47 words, expected at least 2 * span_words = 48"));
  CHECK_THAT(message_of([&] {
               std::vector<std::int32_t> dup = fx.words;
               dup[70] = 105;
               km::make_copy_prompt(fx.prose, dup, fx.sep, {});
             }),
             Contains("word id 105 appears twice"));
}

TEST_CASE("copy task: common_words ranks single-token lowercase words by frequency", "[copy]") {
  // A fake tokenizer: " word" is one token for the words of `single`, two otherwise.
  const std::map<std::string, std::int32_t> single = {{" river", 1}, {" stone", 2}, {" house", 3}, {" tree", 4},
                                                      {" boat", 5},  {" the", 6},   {" light", 7}};
  const auto encode = [&](const std::string& s) {
    const auto it = single.find(s);
    return it != single.end() ? std::vector<std::int32_t>{it->second} : std::vector<std::int32_t>{90, 91};
  };
  const std::string text =
      "The river, the river and the stone. House house house? tree tree tree boat river stone; "
      "riverbank lighthouse3 light's the the the the ice ice ice ice ice";
  std::vector<std::string> names;
  // "the" has 3 letters, "ice" is two tokens, "House" is capitalised once, "riverbank" is not
  // "river", "light's" and "lighthouse3" are not whole words.
  const std::vector<std::int32_t> w = km::common_words(text, encode, 10, 4, 0, &names);
  // river 3, tree 3, house 2, stone 2, boat 1 (ties alphabetical).
  CHECK(names == std::vector<std::string>{"river", "tree", "house", "stone", "boat"});
  CHECK(w == std::vector<std::int32_t>{1, 4, 3, 2, 5});
  CHECK(km::common_words(text, encode, 2) == std::vector<std::int32_t>{1, 4});
  CHECK(km::common_words(text, encode, 10, 4, 2) == std::vector<std::int32_t>{3, 2, 5});
  CHECK(km::common_words(text, encode, 10, 3).front() == 6);  // "the", 3 letters, most frequent
  CHECK_THAT(message_of([&] { km::common_words(text, encode, 0); }), Catch::Contains("count = 0"));
}

TEST_CASE("prompt files: records, other fields, blank lines, escapes", "[prompts]") {
  const std::string text =
      "{\"input\": \"The pass key is 123.\", \"target\": \" 123\", \"id\": 7}\n"
      "\n"
      "  {\"meta\": {\"len\": [1, 2.5e3, -0.25, true, false, null, {}, []], \"s\": \"x\\\"}\"},"
      " \"target\":\"b\", \"input\":\"a\"}  \r\n"
      "{\"input\": \"q\\\"uote\\\\ \\/ \\n\\t\\r\\b\\f\", \"target\": \"\\u00e9\\u20AC\\ud83d\\ude00\\u0041\"}";
  const std::vector<km::prompt_record> r = km::parse_prompt_file(text, "set.jsonl");
  REQUIRE(r.size() == 3);
  CHECK(r[0].input == "The pass key is 123.");
  CHECK(r[0].target == " 123");
  CHECK(r[0].line == 1);
  CHECK(r[1].input == "a");
  CHECK(r[1].target == "b");
  CHECK(r[1].line == 3);
  CHECK(r[2].input == "q\"uote\\ / \n\t\r\b\f");
  CHECK(r[2].target == "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80" "A");
  CHECK(r[2].line == 4);
}

TEST_CASE("prompt files: each bad case throws kvscout::error naming the line and the field", "[prompts]") {
  const auto err = [](const std::string& text) {
    return message_of([&] { km::parse_prompt_file(text, "p.jsonl"); });
  };
  using Catch::Contains;
  const std::string good = "{\"input\": \"a\", \"target\": \"b\"}\n";
  CHECK(err(good) == "(no kvscout::error thrown)");
  CHECK_THAT(err(good + "{\"input\": \"a\", \"target\": \"\"}"), Contains("p.jsonl line 2: field \"target\" is empty"));
  CHECK_THAT(err("{\"input\": \"\", \"target\": \"b\"}"), Contains("p.jsonl line 1: field \"input\" is empty"));
  CHECK_THAT(err(good + good + "{\"input\": \"a\"}"), Contains("p.jsonl line 3: missing field \"target\""));
  CHECK_THAT(err("{\"target\": \"b\", \"inputs\": \"a\"}"), Contains("p.jsonl line 1: missing field \"input\""));
  CHECK_THAT(err("{\"input\": \"a\", \"target\": 5}"), Contains("line 1: field \"target\" is a number, expected a string"));
  CHECK_THAT(err("{\"input\": [\"a\"], \"target\": \"b\"}"), Contains("field \"input\" is an array, expected a string"));
  CHECK_THAT(err("{\"input\": \"a\", \"target\": \"b\", \"target\": \"c\"}"),
             Contains("line 1: field \"target\" appears twice"));
  CHECK_THAT(err(good + "{\"input\" \"a\", \"target\": \"b\"}"), Contains("p.jsonl line 2, column 10: expected ':'"));
  CHECK_THAT(err("[\"input\", \"target\"]"), Contains("line 1, column 1: expected a JSON object"));
  CHECK_THAT(err("{\"input\": \"a\", \"target\": \"b\"} x"), Contains("column 31: unexpected text after the object"));
  CHECK_THAT(err("{\"input\": \"a\", \"target\": \"b\""), Contains("expected ',' or '}', found the end of the line"));
  CHECK_THAT(err("{\"input\": \"a, \"target\": \"b\"}"), Contains("line 1, column"));
  CHECK_THAT(err("{\"input\": \"abc"), Contains("unterminated string"));
  CHECK_THAT(err("{\"input\": \"a\\x\", \"target\": \"b\"}"), Contains("column 13: unknown escape \\x"));
  CHECK_THAT(err("{\"input\": \"a\\u12g4\", \"target\": \"b\"}"), Contains("expected four hex digits after \\u"));
  CHECK_THAT(err("{\"input\": \"\\ud83d\", \"target\": \"b\"}"), Contains("high surrogate without its low surrogate"));
  CHECK_THAT(err("{\"input\": \"\\ude00\", \"target\": \"b\"}"), Contains("lone low surrogate"));
  CHECK_THAT(err("{\"input\": \"a\tb\", \"target\": \"b\"}"), Contains("raw control character"));
  CHECK_THAT(err("{\"input\": \"a\", \"target\": \"b\", \"n\": 01}"), Contains("column 37: expected ',' or '}'"));
  CHECK_THAT(err("{\"input\": \"a\", \"target\": \"b\", \"n\": tru}"), Contains("expected a value"));
  CHECK_THAT(err("{\"input\": \"a\", \"target\": \"b\", 3: 4}"), Contains("expected a string key"));
  CHECK_THAT(err("\n  \n"), Contains("p.jsonl: no records"));
  CHECK_THAT(message_of([] { km::read_prompt_file("/nonexistent/prompts.jsonl"); }),
             Contains("cannot read the prompt file /nonexistent/prompts.jsonl"));
}

TEST_CASE("greedy exact match is every teacher-forced argmax right; SmolLM2 copies a span", "[model][copy]") {
#if !defined(__OPTIMIZE__)
  WARN("SKIP: built without optimisation");
  return;
#endif
  smollm2::loaded* m = smollm2::model();
  if (m == nullptr) {
    WARN("SKIP: " << smollm2::model_path() << " not found (run scripts/fetch_model.sh)");
    return;
  }
  const std::string story =
      "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps as his "
      "father had taught him. At the top he trimmed the wick, polished the great lens, and watched the "
      "first ships of the night slip past the reef. In the village below, the baker was already setting "
      "out the dough for the morning bread. She knew every family by the sound of their footsteps. ";
  const std::vector<std::int32_t> prompt = m->tok.encode(story + "The keeper");
  // Greedy decoding of 6 tokens, one dense run per token.
  std::vector<std::int32_t> seq = prompt;
  for (int k = 0; k < 6; ++k) {
    km::layer_major_eval ev(m->weights, seq);
    ev.run({.score_from = static_cast<int>(seq.size()) - 1});
    const std::vector<float> lg = ev.logits(static_cast<int>(seq.size()) - 1);
    seq.push_back(static_cast<std::int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin()));
  }
  const std::vector<std::int32_t> greedy(seq.begin() + static_cast<std::ptrdiff_t>(prompt.size()), seq.end());
  // Teacher-forced on the greedy continuation: every argmax right, predicted == the continuation.
  km::layer_major_eval ev(m->weights, seq);
  const km::eval_result r = ev.run({.score_from = static_cast<int>(prompt.size()) - 1});
  REQUIRE(r.scored == 6);
  CHECK(r.correct == 6);
  CHECK(r.predicted == greedy);
  double sum = 0;
  for (double x : r.token_nll) sum += x;
  CHECK(sum == Approx(r.nll).epsilon(1e-12));
  // One target token changed: that prediction is wrong, the exact match gone.
  std::vector<std::int32_t> other = seq;
  other[prompt.size() + 2] = greedy[2] == 13 ? 14 : 13;
  km::layer_major_eval ev2(m->weights, other);
  const km::eval_result r2 = ev2.run({.score_from = static_cast<int>(prompt.size()) - 1});
  CHECK(r2.predicted[2] != other[prompt.size() + 2]);
  CHECK(r2.correct < 6);

  // A short copy task: dense finds the span 300 tokens back, the control cannot.
  std::string text;
  for (int k = 0; k < 8; ++k) text += story;
  const std::vector<std::int32_t> prose = m->tok.encode(text);
  const std::vector<std::int32_t> words =
      km::common_words(text, [&](const std::string& s) { return m->tok.encode(s); }, 200, 3);
  REQUIRE(words.size() >= 24);
  km::copy_task_options o;
  o.span_words = 12;
  o.cue_words = 3;
  o.total_tokens = 400;
  o.depth = 0.1;
  o.seed = 5;
  const km::copy_prompt p = km::make_copy_prompt(prose, words, m->tok.encode("\n"), o);
  std::vector<std::int32_t> a = p.prompt, c = p.control;
  a.insert(a.end(), p.target.begin(), p.target.end());
  c.insert(c.end(), p.target.begin(), p.target.end());
  km::layer_major_eval eva(m->weights, a), evc(m->weights, c);
  const int from = static_cast<int>(p.prompt.size()) - 1;
  const km::eval_result ra = eva.run({.score_from = from}), rc = evc.run({.score_from = from});
  REQUIRE(ra.scored == 9);
  CHECK(ra.correct >= 6);
  CHECK(rc.correct <= 1);
  CHECK(ra.nll < rc.nll);
}
