#pragma once
// Shared by the libFuzzer targets of tests/fuzz (scripts/fuzz.sh builds and runs them): a reader
// that takes little-endian fields from the front of the input (past the end every field reads as
// zero, so any input is a complete framing), a finding that aborts with a message, and a GGUF
// writer for targets that build files from their input. Python's tests/fuzz/make_seeds.py writes
// the same framings for the seed corpus.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace fuzz {

/// A finding: print what was wrong and abort, so that libFuzzer saves the input.
[[noreturn]] inline void finding(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "FUZZ FINDING: %s%s%s\n", what, detail.empty() ? "" : ": ", detail.c_str());
  std::fflush(stderr);
  __builtin_trap();
}

#define FUZZ_CHECK(cond, ...)                                                 \
  do {                                                                        \
    if (!(cond)) ::fuzz::finding("check failed: " #cond, std::string(__VA_ARGS__)); \
  } while (0)

/// Fields from the front of the input, little-endian; zero past its end.
class reader {
 public:
  reader(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}

  template <class T>
  T take() {
    unsigned char b[sizeof(T)] = {};
    const std::size_t k = left() < sizeof(T) ? left() : sizeof(T);
    if (k != 0) std::memcpy(b, p_ + i_, k);
    i_ += k;
    T v;
    std::memcpy(&v, b, sizeof(T));
    return v;
  }
  std::uint8_t u8() { return take<std::uint8_t>(); }
  std::uint16_t u16() { return take<std::uint16_t>(); }
  std::int16_t i16() { return take<std::int16_t>(); }
  std::int32_t i32() { return take<std::int32_t>(); }
  std::uint32_t u32() { return take<std::uint32_t>(); }

  /// Up to n bytes (fewer at the end of the input).
  std::string_view bytes(std::size_t n) {
    const std::size_t k = left() < n ? left() : n;
    std::string_view s(reinterpret_cast<const char*>(p_ + i_), k);
    i_ += k;
    return s;
  }
  /// Everything not read yet.
  std::string_view rest() { return bytes(left()); }

  [[nodiscard]] std::size_t left() const { return n_ - i_; }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
  std::size_t i_ = 0;
};

/// A minimal GGUF (version 3) writer: metadata only, no tensors.
class gguf_writer {
 public:
  enum : std::uint32_t { t_i32 = 5, t_string = 8, t_array = 9 };

  void string(std::string_view key, std::string_view value) {
    entry(key, t_string);
    put_string(value);
  }
  void i32(std::string_view key, std::int32_t v) {
    entry(key, t_i32);
    put(v);
  }
  void string_array(std::string_view key, const std::vector<std::string>& v) {
    entry(key, t_array);
    put(t_string);
    put(static_cast<std::uint64_t>(v.size()));
    for (const auto& s : v) put_string(s);
  }
  void i32_array(std::string_view key, const std::vector<std::int32_t>& v) {
    entry(key, t_array);
    put(t_i32);
    put(static_cast<std::uint64_t>(v.size()));
    for (const auto x : v) put(x);
  }

  /// The file: header, then the entries.
  [[nodiscard]] std::vector<std::byte> bytes() const {
    std::vector<std::byte> out;
    auto raw = [&](const void* p, std::size_t n) {
      const auto* b = static_cast<const std::byte*>(p);
      out.insert(out.end(), b, b + n);
    };
    raw("GGUF", 4);
    const std::uint32_t version = 3;
    const std::uint64_t n_tensors = 0;
    raw(&version, 4);
    raw(&n_tensors, 8);
    raw(&n_kv_, 8);
    raw(body_.data(), body_.size());
    return out;
  }

 private:
  template <class T>
  void put(T v) {
    const auto* b = reinterpret_cast<const std::byte*>(&v);
    body_.insert(body_.end(), b, b + sizeof(T));
  }
  void put_string(std::string_view s) {
    put(static_cast<std::uint64_t>(s.size()));
    const auto* b = reinterpret_cast<const std::byte*>(s.data());
    body_.insert(body_.end(), b, b + s.size());
  }
  void entry(std::string_view key, std::uint32_t type) {
    put_string(key);
    put(type);
    ++n_kv_;
  }

  std::vector<std::byte> body_;
  std::uint64_t n_kv_ = 0;
};

}  // namespace fuzz
