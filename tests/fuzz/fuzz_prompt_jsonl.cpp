// libFuzzer target: tools/model/prompt_file.hpp (parse_prompt_file) on the input as the text of
// a prompt file (JSON lines with "input" and "target").
//
// Checked: only kvscout::error is thrown; an accepted file has at least one record, each with a
// non-empty input and target and a line number inside the file, in increasing order; and writing
// the records back as JSON lines (every string escaped) and parsing that gives the same records.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.hpp"
#include "kvscout/core/error.hpp"
#include "model/prompt_file.hpp"

namespace {

// A JSON string literal for arbitrary bytes: quotes, backslashes and control bytes escaped; other
// bytes (UTF-8 or not) as they are, which the reader keeps byte for byte.
void json_string(std::string& out, std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  out += '"';
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<kvscout::model::prompt_record> recs;
  try {
    recs = kvscout::model::parse_prompt_file(text, "fuzz input");
  } catch (const kvscout::error&) {
    return 0;
  }
  FUZZ_CHECK(!recs.empty());
  std::size_t lines = 1;
  for (const char c : text) lines += c == '\n';
  int prev = 0;
  for (const auto& r : recs) {
    FUZZ_CHECK(!r.input.empty() && !r.target.empty());
    FUZZ_CHECK(r.line > prev && static_cast<std::size_t>(r.line) <= lines);
    prev = r.line;
  }

  std::string again;
  for (const auto& r : recs) {
    again += "{\"target\": ";
    json_string(again, r.target);
    again += ", \"input\": ";
    json_string(again, r.input);
    again += "}\n";
  }
  std::vector<kvscout::model::prompt_record> back;
  try {
    back = kvscout::model::parse_prompt_file(again, "rewritten");
  } catch (const kvscout::error& e) {
    fuzz::finding("the records written back as JSON lines do not parse", e.what());
  }
  FUZZ_CHECK(back.size() == recs.size());
  for (std::size_t i = 0; i < recs.size(); ++i) {
    FUZZ_CHECK(back[i].input == recs[i].input && back[i].target == recs[i].target);
    FUZZ_CHECK(back[i].line == static_cast<int>(i) + 1);
  }
  return 0;
}
