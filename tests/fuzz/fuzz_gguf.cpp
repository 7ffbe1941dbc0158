// libFuzzer target: tools/model/gguf.hpp on the input as a whole GGUF file.
//
// The input is parsed from memory (gguf_file::from_bytes, a heap copy of exactly its size, so
// AddressSanitizer sees any read past the end). When it is accepted, every metadata value is read
// as its own type (arrays element by element, nested arrays recursively) and as a wrong one (which
// must throw kvscout::error), every tensor is looked up and dequantised, tokenizer_from_gguf runs
// on it, and the same bytes are opened from a file with both load modes, which must agree.
// kvscout::error is the only exception allowed; anything else, a crash or a sanitizer report is a
// finding.

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "kvscout/core/error.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer_gguf.hpp"

namespace {

using kvscout::model::gguf_file;
using kvscout::model::gguf_type;
using kvscout::model::gguf_value;

std::string temp_path;

void remove_temp() {
  if (!temp_path.empty()) ::unlink(temp_path.c_str());
}

// Reads `v` as T, which must be its type.
template <class T>
void read_as(const gguf_value& v) {
  if (v.is_array()) {
    const std::vector<T> xs = v.as_array<T>();
    FUZZ_CHECK(xs.size() == v.size());
  } else {
    volatile T x = v.as<T>();
    (void)x;
  }
}

// Reading as a type the value does not have must throw kvscout::error (and nothing else).
template <class T>
void read_as_wrong(const gguf_value& v) {
  try {
    if (v.is_array()) {
      (void)v.as_array<T>();
    } else {
      (void)v.as<T>();
    }
    fuzz::finding("a value was read as a type it does not have", v.describe());
  } catch (const kvscout::error&) {
  }
}

void visit(const gguf_value& v, int depth) {
  FUZZ_CHECK(depth <= kvscout::model::detail::max_array_depth + 1);
  (void)v.describe();
  switch (v.element_type()) {
    case gguf_type::u8: read_as<std::uint8_t>(v), read_as_wrong<std::int8_t>(v); break;
    case gguf_type::i8: read_as<std::int8_t>(v), read_as_wrong<std::uint8_t>(v); break;
    case gguf_type::u16: read_as<std::uint16_t>(v), read_as_wrong<std::int16_t>(v); break;
    case gguf_type::i16: read_as<std::int16_t>(v), read_as_wrong<std::uint16_t>(v); break;
    case gguf_type::u32: read_as<std::uint32_t>(v), read_as_wrong<std::int32_t>(v); break;
    case gguf_type::i32: read_as<std::int32_t>(v), read_as_wrong<std::uint32_t>(v); break;
    case gguf_type::f32: read_as<float>(v), read_as_wrong<double>(v); break;
    case gguf_type::boolean: read_as<bool>(v), read_as_wrong<std::uint8_t>(v); break;
    case gguf_type::u64: read_as<std::uint64_t>(v), read_as_wrong<std::int64_t>(v); break;
    case gguf_type::i64: read_as<std::int64_t>(v), read_as_wrong<std::uint64_t>(v); break;
    case gguf_type::f64: read_as<double>(v), read_as_wrong<float>(v); break;
    case gguf_type::string:
      read_as<std::string>(v), read_as<std::string_view>(v), read_as_wrong<std::uint64_t>(v);
      break;
    case gguf_type::array: break;  // an array of arrays: its elements are visited below
  }
  if (v.is_array()) {
    const std::vector<gguf_value> elems = v.elements();
    FUZZ_CHECK(elems.size() == v.size());
    for (const gguf_value& e : elems) {
      FUZZ_CHECK(e.type() == v.element_type());
      FUZZ_CHECK(e.key() == v.key());
      visit(e, depth + 1);
    }
  }
}

void visit_file(const gguf_file& f) {
  FUZZ_CHECK(f.version() == 2 || f.version() == 3);
  FUZZ_CHECK(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0);
  FUZZ_CHECK(f.data_offset() % f.alignment() == 0);
  for (const gguf_value& v : f.metadata()) {
    FUZZ_CHECK(f.contains(v.key()));
    FUZZ_CHECK(f.at(v.key()).type() == v.type());
    visit(v, 0);
  }
  std::vector<float> out;
  for (const auto& t : f.tensors()) {
    FUZZ_CHECK(f.find_tensor(t.name) == &f.tensor(t.name));
    FUZZ_CHECK(t.data.size() == t.n_bytes);
    FUZZ_CHECK(t.offset % f.alignment() == 0);
    FUZZ_CHECK(f.data_offset() + t.offset + t.n_bytes <= f.file_size());
    const std::uint64_t n = t.n_elements();
    // The bytes are inside the input, so n is bounded by the input's size (2 elements a byte at
    // most, for q4_0): no allocation the input does not pay for.
    FUZZ_CHECK(n <= 2 * f.file_size() || t.n_bytes == 0);
    if (n > (std::uint64_t{1} << 22)) continue;  // (zero-byte tensors with huge dims)
    out.assign(static_cast<std::size_t>(n), 0.0f);
    f.dequantize(t, out.data());
    if (t.n_rows() > 0) {
      kvscout::model::dequantize_row(t, 0, out.data());
      kvscout::model::dequantize_row(t, t.n_rows() - 1, out.data());
    }
  }
  try {
    const auto tok = kvscout::model::tokenizer_from_gguf(f);
    const std::string text = "Hello <|im_start|> world 42\n";
    const auto ids = tok.encode(text, false, true);
    (void)tok.decode(ids);
  } catch (const kvscout::error&) {
  }
}

// The same bytes from a file, by mmap and by read: the same metadata and tensors.
void reopen(const gguf_file& mem, const std::uint8_t* data, std::size_t size) {
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) fuzz::finding("cannot open the temp file", temp_path);
  std::size_t done = 0;
  while (done < size) {
    const ::ssize_t w = ::write(fd, data + done, size - done);
    if (w <= 0) fuzz::finding("cannot write the temp file", temp_path);
    done += static_cast<std::size_t>(w);
  }
  ::close(fd);
  for (const auto mode : {kvscout::model::load_mode::mmap, kvscout::model::load_mode::read}) {
    std::optional<gguf_file> opened;
    try {
      opened.emplace(temp_path, mode);
    } catch (const kvscout::error& e) {
      fuzz::finding("accepted from memory, rejected from a file", e.what());
    }
    const gguf_file& f = *opened;
    FUZZ_CHECK(f.metadata().size() == mem.metadata().size());
    FUZZ_CHECK(f.tensors().size() == mem.tensors().size());
    FUZZ_CHECK(f.data_offset() == mem.data_offset());
    for (std::size_t i = 0; i < f.tensors().size(); ++i) {
      const auto& a = f.tensors()[i];
      const auto& b = mem.tensors()[i];
      FUZZ_CHECK(a.name == b.name && a.offset == b.offset && a.n_bytes == b.n_bytes);
      FUZZ_CHECK(a.n_bytes == 0 || std::memcmp(a.data.data(), b.data.data(), a.n_bytes) == 0);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char tmpl[] = "/tmp/kvscout_fuzz_gguf_XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd < 0) fuzz::finding("mkstemp failed");
  ::close(fd);
  temp_path = tmpl;
  std::atexit(remove_temp);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  try {
    const gguf_file f = gguf_file::from_bytes(bytes, "fuzz input");
    FUZZ_CHECK(f.file_size() == size);
    visit_file(f);
    reopen(f, data, size);
  } catch (const kvscout::error&) {
  }
  return 0;
}
