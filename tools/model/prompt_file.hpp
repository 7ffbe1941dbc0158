#pragma once
// Prompt files for the accuracy harness (issue 32): JSON lines, one object per line with the
// string fields "input" and "target" (other fields are allowed and ignored), e.g. a passkey set:
//
//   {"input": "... The pass key is 71432. Remember it. ... What is the pass key? The pass key is", "target": " 71432"}
//
// The harness scores each record by the teacher-forced likelihood of the target's tokens after
// the input's, and by greedy exact match. It tokenizes input and target separately, each with
// the model's tokenizer (special-token text such as "<|im_start|>" becomes that token). Blank lines are skipped. A bad file throws
// kvscout::error naming the file, the line and the field or the column: malformed JSON, a line
// that is not an object, a missing, duplicated, non-string or empty "input" / "target", a file
// without records.
//
// The JSON reader is the minimum this needs, written for it: strings with every JSON escape
// (\" \\ \/ \b \f \n \r \t \uXXXX, surrogate pairs joined, written as UTF-8), and other values
// (numbers, true / false / null, arrays, objects) checked for shape and skipped.
//
//   std::vector<kvscout::model::prompt_record> recs = kvscout::model::read_prompt_file("set.jsonl");
//
// Not part of the installed library (tools/).

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "kvscout/core/error.hpp"
#include "tokenizer.hpp"

namespace kvscout::model {

struct prompt_record {
  std::string input, target;
  int line = 0;  ///< 1-based line of the file
};

namespace detail::json {

// A cursor over one line; every failure names the source, the line and the 1-based column.
struct reader {
  std::string_view s;
  std::string_view source;
  int line;
  std::size_t i = 0;

  [[noreturn]] void fail(std::string_view what) const {
    KVSCOUT_FAIL(source, " line ", line, ", column ", i + 1, ": ", what);
  }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) ++i;
  }
  bool at_end() const { return i >= s.size(); }
  char peek() const { return i < s.size() ? s[i] : '\0'; }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'" + (at_end() ? ", found the end of the line" : ""));
    ++i;
  }

  // After a member or an element: the closing bracket (consumed) or a failure naming both.
  void close_or_comma(char close) {
    if (peek() == close) {
      ++i;
      return;
    }
    fail(std::string("expected ',' or '") + close + "'" + (at_end() ? ", found the end of the line" : ""));
  }

  unsigned hex4() {
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = peek();
      unsigned d;
      if (c >= '0' && c <= '9') d = static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') d = static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') d = static_cast<unsigned>(c - 'A' + 10);
      else fail("expected four hex digits after \\u");
      v = v * 16 + d;
      ++i;
    }
    return v;
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      const char c = s[i];
      if (c == '"') {
        ++i;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("raw control character in a string (write it escaped)");
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      ++i;
      const char e = peek();
      ++i;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("\\u escape is a lone low surrogate");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (peek() != '\\' || i + 1 >= s.size() || s[i + 1] != 'u')
              fail("\\u escape is a high surrogate without its low surrogate");
            i += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("\\u escape: a high surrogate followed by no low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          detail::bpe::append_utf8(out, static_cast<char32_t>(cp));  // tokenizer.hpp's
          break;
        }
        default:
          i -= 2;  // the backslash
          fail(e == '\0' ? std::string("unterminated escape") : std::string("unknown escape \\") + e);
      }
    }
  }

  // Any value but a string whose contents are wanted: checked for shape and skipped. Returns its
  // kind, for messages.
  const char* skip_value(int depth = 0) {
    if (depth > 64) fail("values nested deeper than 64");
    ws();
    const char c = peek();
    if (c == '"') {
      string();
      return "a string";
    }
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++i;
      ws();
      if (peek() == close) {
        ++i;
        return c == '{' ? "an object" : "an array";
      }
      for (;;) {
        ws();
        if (c == '{') {
          if (peek() != '"') fail("expected a string key");
          string();
          ws();
          expect(':');
        }
        skip_value(depth + 1);
        ws();
        if (peek() == ',') {
          ++i;
          continue;
        }
        close_or_comma(close);
        return c == '{' ? "an object" : "an array";
      }
    }
    for (const char* lit : {"true", "false", "null"}) {
      const std::string_view l(lit);
      if (s.substr(i, l.size()) == l) {
        i += l.size();
        return l == "null" ? "null" : "a boolean";
      }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
      if (peek() == '-') ++i;
      const auto digits = [&] {
        const std::size_t from = i;
        while (peek() >= '0' && peek() <= '9') ++i;
        if (i == from) fail("expected a digit");
      };
      if (peek() == '0') ++i;
      else digits();
      if (peek() == '.') ++i, digits();
      if (peek() == 'e' || peek() == 'E') {
        ++i;
        if (peek() == '+' || peek() == '-') ++i;
        digits();
      }
      return "a number";
    }
    fail(at_end() ? "expected a value, found the end of the line" : "expected a value");
  }
};

}  // namespace detail::json

/// The records of a JSON-lines text; `source` names it in errors (e.g. the path).
inline std::vector<prompt_record> parse_prompt_file(std::string_view text, std::string_view source) {
  std::vector<prompt_record> out;
  int line_no = 0;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t nl = text.find('\n', pos);
    const std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
    ++line_no;
    detail::json::reader r{line, source, line_no};
    r.ws();
    if (r.at_end()) continue;  // a blank line
    if (r.peek() != '{') r.fail("expected a JSON object ('{')");
    prompt_record rec;
    rec.line = line_no;
    bool has_input = false, has_target = false;
    r.expect('{');
    r.ws();
    if (r.peek() == '}') {
      ++r.i;
    } else {
      for (;;) {
        r.ws();
        if (r.peek() != '"') r.fail("expected a string key");
        const std::string key = r.string();
        r.ws();
        r.expect(':');
        r.ws();
        if (key == "input" || key == "target") {
          bool& seen = key == "input" ? has_input : has_target;
          if (seen) KVSCOUT_FAIL(source, " line ", line_no, ": field \"", key, "\" appears twice");
          seen = true;
          if (r.peek() != '"') {
            const char* kind = r.skip_value();
            KVSCOUT_FAIL(source, " line ", line_no, ": field \"", key, "\" is ", kind, ", expected a string");
          }
          (key == "input" ? rec.input : rec.target) = r.string();
        } else {
          r.skip_value();
        }
        r.ws();
        if (r.peek() == ',') {
          ++r.i;
          continue;
        }
        r.close_or_comma('}');
        break;
      }
    }
    r.ws();
    if (!r.at_end()) r.fail("unexpected text after the object (one object per line)");
    if (!has_input) KVSCOUT_FAIL(source, " line ", line_no, ": missing field \"input\" (a string)");
    if (!has_target) KVSCOUT_FAIL(source, " line ", line_no, ": missing field \"target\" (a string)");
    if (rec.input.empty()) KVSCOUT_FAIL(source, " line ", line_no, ": field \"input\" is empty, expected text");
    if (rec.target.empty()) KVSCOUT_FAIL(source, " line ", line_no, ": field \"target\" is empty, expected text");
    out.push_back(std::move(rec));
  }
  if (out.empty()) KVSCOUT_FAIL(source, ": no records, expected one JSON object per line");
  return out;
}

/// The records of the JSON-lines file at `path`.
inline std::vector<prompt_record> read_prompt_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) KVSCOUT_FAIL("cannot read the prompt file ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_prompt_file(ss.str(), path);
}

}  // namespace kvscout::model
