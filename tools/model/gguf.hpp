#pragma once
// A reader for GGUF (versions 2 and 3), the single-file model format of llama.cpp / ggml, and
// dequantisation of the tensor types kvscout's models use. Host-only; not part of the library
// (tools/ is for the accuracy harness and the demo).
//
//   kvscout::model::gguf_file f("SmolLM2-135M-Instruct.Q4_1.gguf");
//   std::string arch = f.get_string("general.architecture");           // "llama"
//   std::uint32_t layers = f.get_u32(arch + ".block_count");           // 30
//   const auto& emb = f.tensor("token_embd.weight");                   // ne = [576, 49152]
//   std::vector<float> w = f.dequantize("blk.0.attn_q.weight");        // [576 out][576 in]
//
// File layout (all integers little-endian):
//   header      magic "GGUF", u32 version, u64 n_tensors, u64 n_kv
//   metadata    n_kv x (string key, u32 value type, value)
//   tensor info n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)
//   padding     to general.alignment (default 32)
//   data        the tensors; each offset is relative to the start of this section and is a
//               multiple of the alignment
// A string is a u64 byte count and that many bytes (no terminator). An array value is a u32
// element type, a u64 count and the elements.
//
// Dimension order. ggml lists dimensions innermost first: ne[0] is the contiguous dimension.
// A tensor with ne = [a, b, c] is stored row-major as [c][b][a]. A linear layer's weight with
// ne = [in, out] is therefore a row-major [out][in] matrix (one row per output feature, the same
// bytes as a PyTorch nn.Linear weight of shape (out, in)), and the token embedding with
// ne = [hidden, vocab] is a [vocab][hidden] table: row t is token t's embedding. Quantised types
// pack blocks along ne[0] only, so ne[0] is a multiple of the block size and every row starts
// on a block boundary.
//
// Validation. Everything is checked when the file is opened, before a value is used: the magic,
// the version, every count against the bytes left, every read against the end of the file, the
// value types, the tensor types and shapes, alignment, and that every tensor's bytes lie inside
// the file. Problems throw kvscout::error naming the key / tensor / offset and what was expected.
// Nothing reads outside the file, whatever its contents.
//
// Lifetime. gguf_value, tensor_info::data and the string_views handed out point into the file's
// bytes (an mmap, or a heap copy with load_mode::read or gguf_file::from_bytes); they are valid
// while the gguf_file that produced them lives. gguf_file is move-only; moving it keeps them valid.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"

namespace kvscout::model {

static_assert(std::endian::native == std::endian::little,
              "gguf.hpp reads little-endian GGUF files on a little-endian host only");

// ---- value and tensor types ---------------------------------------------------------------------

/// The type tag of a metadata value, as stored in the file.
enum class gguf_type : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

inline constexpr std::uint32_t gguf_type_count = 13;

constexpr std::string_view to_string(gguf_type t) noexcept {
  switch (t) {
    case gguf_type::u8: return "u8";
    case gguf_type::i8: return "i8";
    case gguf_type::u16: return "u16";
    case gguf_type::i16: return "i16";
    case gguf_type::u32: return "u32";
    case gguf_type::i32: return "i32";
    case gguf_type::f32: return "f32";
    case gguf_type::boolean: return "bool";
    case gguf_type::string: return "string";
    case gguf_type::array: return "array";
    case gguf_type::u64: return "u64";
    case gguf_type::i64: return "i64";
    case gguf_type::f64: return "f64";
  }
  return "unknown";
}

inline std::ostream& operator<<(std::ostream& os, gguf_type t) {
  const auto s = to_string(t);
  if (s == "unknown") return os << "gguf_type(" << static_cast<std::uint32_t>(t) << ")";
  return os << s;
}

/// The ggml tensor types this reader sizes and dequantises. Other ggml types are rejected when
/// the file is opened (the message names the type and this set).
enum class ggml_type : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q8_0 = 8,
  bf16 = 30,
};

inline constexpr std::array<ggml_type, 6> supported_ggml_types = {ggml_type::f32,  ggml_type::f16,
                                                                  ggml_type::bf16, ggml_type::q4_0,
                                                                  ggml_type::q4_1, ggml_type::q8_0};

/// ggml's name for a type id, including types this reader does not support; "unknown" past the
/// ids ggml has defined.
constexpr std::string_view ggml_type_name(std::uint32_t id) noexcept {
  // clang-format off
  constexpr std::array<std::string_view, 31> names = {
      "f32",     "f16",    "q4_0",    "q4_1",  "q4_2 (removed)", "q4_3 (removed)", "q5_0",
      "q5_1",    "q8_0",   "q8_1",    "q2_K",  "q3_K",           "q4_K",           "q5_K",
      "q6_K",    "q8_K",   "iq2_xxs", "iq2_xs", "iq3_xxs",       "iq1_s",          "iq4_nl",
      "iq3_s",   "iq2_s",  "iq4_xs",  "i8",    "i16",            "i32",            "i64",
      "f64",     "iq1_m",  "bf16"};
  // clang-format on
  return id < names.size() ? names[id] : std::string_view("unknown");
}

constexpr std::string_view to_string(ggml_type t) noexcept {
  return ggml_type_name(static_cast<std::uint32_t>(t));
}

inline std::ostream& operator<<(std::ostream& os, ggml_type t) { return os << to_string(t); }

/// Elements per block and bytes per block of a supported type.
struct ggml_block {
  std::uint64_t elements;
  std::uint64_t bytes;
};

constexpr std::optional<ggml_block> ggml_block_of(std::uint32_t id) noexcept {
  switch (static_cast<ggml_type>(id)) {
    case ggml_type::f32: return ggml_block{1, 4};
    case ggml_type::f16: return ggml_block{1, 2};
    case ggml_type::bf16: return ggml_block{1, 2};
    case ggml_type::q4_0: return ggml_block{32, 2 + 16};      // fp16 d, 16 bytes of nibbles
    case ggml_type::q4_1: return ggml_block{32, 2 + 2 + 16};  // fp16 d, fp16 m, nibbles
    case ggml_type::q8_0: return ggml_block{32, 2 + 32};      // fp16 d, 32 x int8
  }
  return std::nullopt;
}

constexpr ggml_block ggml_block_of(ggml_type t) noexcept {
  return *ggml_block_of(static_cast<std::uint32_t>(t));
}

/// The largest number of dimensions a ggml tensor has.
inline constexpr std::uint32_t ggml_max_dims = 4;

// ---- internals: byte access and bounds-checked reading ------------------------------------------

namespace detail {

template <class T>
T load_le(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

inline float half_bits_to_float(std::uint16_t bits) noexcept {
  __half_raw raw;
  raw.x = bits;
  return ::kvscout::to_float(::kvscout::half(raw));
}

inline float bf16_bits_to_float(std::uint16_t bits) noexcept {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return ::kvscout::to_float(::kvscout::bfloat16(raw));
}

/// Quotes a name from the file for a message: at most 80 bytes, control bytes escaped.
inline std::string quoted_name(std::string_view s) {
  std::string out = "'";
  const std::size_t n = s.size() < 80 ? s.size() : 80;
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (n < s.size()) out += "...";
  out += "'";
  return out;
}

/// Minimum bytes one element of a value type occupies in the file (strings: the length field;
/// arrays: the element type and the count).
constexpr std::uint64_t min_value_bytes(gguf_type t) noexcept {
  switch (t) {
    case gguf_type::u8:
    case gguf_type::i8:
    case gguf_type::boolean: return 1;
    case gguf_type::u16:
    case gguf_type::i16: return 2;
    case gguf_type::u32:
    case gguf_type::i32:
    case gguf_type::f32: return 4;
    case gguf_type::u64:
    case gguf_type::i64:
    case gguf_type::f64:
    case gguf_type::string: return 8;
    case gguf_type::array: return 12;
  }
  return 1;
}

/// Reads the file front to back; every read is checked against the end. `what` says what is
/// being read, for the message.
class cursor {
 public:
  cursor(const std::byte* base, std::uint64_t size, std::uint64_t pos = 0) noexcept
      : base_(base), size_(size), pos_(pos) {}

  [[nodiscard]] std::uint64_t pos() const noexcept { return pos_; }
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] std::uint64_t left() const noexcept { return size_ - pos_; }
  [[nodiscard]] const std::byte* here() const noexcept { return base_ + pos_; }

  void need(std::uint64_t n, std::string_view what) const {
    if (n > left()) {
      KVSCOUT_FAIL("truncated file: ", what, " needs ", n, " bytes at offset ", pos_,
                   ", past the end of the file (", size_, " bytes)");
    }
  }

  void skip(std::uint64_t n, std::string_view what) {
    need(n, what);
    pos_ += n;
  }

  template <class T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v = load_le<T>(base_ + pos_);
    pos_ += sizeof(T);
    return v;
  }

  /// A u64 length and that many bytes.
  std::string_view read_string(std::string_view what) {
    const std::uint64_t at = pos_;
    const auto n = read<std::uint64_t>(what);
    if (n > left()) {
      KVSCOUT_FAIL("truncated or corrupt file: ", what, " has string length ", n, " at offset ", at,
                   ", which runs past the end of the file (", size_, " bytes, ", left(), " left)");
    }
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), static_cast<std::size_t>(n));
    pos_ += n;
    return s;
  }

 private:
  const std::byte* base_;
  std::uint64_t size_;
  std::uint64_t pos_;
};

/// A read-only view of a whole file: mmap (default) or a heap copy of exactly the file's size
/// (load_mode::read; lets AddressSanitizer see any read past the end).
class file_bytes {
 public:
  file_bytes() = default;
  file_bytes(const std::string& path, bool use_mmap) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      KVSCOUT_FAIL("cannot open ", quoted_name(path), ": ", std::strerror(err));
    }
    struct fd_guard {
      int fd;
      ~fd_guard() { ::close(fd); }
    } guard{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      KVSCOUT_FAIL("cannot stat ", quoted_name(path), ": ", std::strerror(err));
    }
    KVSCOUT_EXPECTS(S_ISREG(st.st_mode), quoted_name(path), " is not a regular file");
    size_ = static_cast<std::uint64_t>(st.st_size);
    if (size_ == 0) return;
    KVSCOUT_EXPECTS(size_ <= std::numeric_limits<std::size_t>::max(), quoted_name(path), " has ",
                    size_, " bytes, more than this process can address");
    const auto n = static_cast<std::size_t>(size_);
    if (use_mmap) {
      void* p = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        KVSCOUT_FAIL("cannot mmap ", quoted_name(path), " (", size_,
                     " bytes): ", std::strerror(err));
      }
      map_ = p;
      data_ = static_cast<const std::byte*>(p);
    } else {
      copy_ = std::make_unique<std::byte[]>(n);
      std::size_t done = 0;
      while (done < n) {
        const ::ssize_t r = ::read(fd, copy_.get() + done, n - done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          const int err = r < 0 ? errno : 0;
          KVSCOUT_FAIL("cannot read ", quoted_name(path), ": got ", done, " of ", size_, " bytes",
                       err ? ": " : "", err ? std::strerror(err) : "");
        }
        done += static_cast<std::size_t>(r);
      }
      data_ = copy_.get();
    }
  }
  /// A heap copy of bytes already in memory (exactly their size, as load_mode::read).
  explicit file_bytes(std::span<const std::byte> bytes) : size_(bytes.size()) {
    if (bytes.empty()) return;
    copy_ = std::make_unique<std::byte[]>(bytes.size());
    std::memcpy(copy_.get(), bytes.data(), bytes.size());
    data_ = copy_.get();
  }
  file_bytes(const file_bytes&) = delete;
  file_bytes& operator=(const file_bytes&) = delete;
  file_bytes(file_bytes&& o) noexcept { swap(o); }
  file_bytes& operator=(file_bytes&& o) noexcept {
    file_bytes tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  ~file_bytes() {
    if (map_ != nullptr) ::munmap(map_, static_cast<std::size_t>(size_));
  }

  [[nodiscard]] const std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }

 private:
  void swap(file_bytes& o) noexcept {
    std::swap(map_, o.map_);
    std::swap(copy_, o.copy_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }

  void* map_ = nullptr;
  std::unique_ptr<std::byte[]> copy_;
  const std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
};

template <class T>
constexpr gguf_type gguf_type_of() noexcept {
  if constexpr (std::is_same_v<T, std::uint8_t>) return gguf_type::u8;
  if constexpr (std::is_same_v<T, std::int8_t>) return gguf_type::i8;
  if constexpr (std::is_same_v<T, std::uint16_t>) return gguf_type::u16;
  if constexpr (std::is_same_v<T, std::int16_t>) return gguf_type::i16;
  if constexpr (std::is_same_v<T, std::uint32_t>) return gguf_type::u32;
  if constexpr (std::is_same_v<T, std::int32_t>) return gguf_type::i32;
  if constexpr (std::is_same_v<T, float>) return gguf_type::f32;
  if constexpr (std::is_same_v<T, bool>) return gguf_type::boolean;
  if constexpr (std::is_same_v<T, std::uint64_t>) return gguf_type::u64;
  if constexpr (std::is_same_v<T, std::int64_t>) return gguf_type::i64;
  if constexpr (std::is_same_v<T, double>) return gguf_type::f64;
  return gguf_type::string;  // std::string, std::string_view
}

/// Arrays nest at most this deep (each level costs 12 bytes, so a hostile file could otherwise
/// recurse millions of levels).
inline constexpr int max_array_depth = 8;

}  // namespace detail

/// A C++ type a metadata value can be read as: the scalar types of GGUF, bool, std::string and
/// std::string_view (a view into the file).
template <class T>
concept gguf_scalar = std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::int8_t> ||
    std::is_same_v<T, std::uint16_t> || std::is_same_v<T, std::int16_t> ||
    std::is_same_v<T, std::uint32_t> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, float> || std::is_same_v<T, bool> || std::is_same_v<T, std::uint64_t> ||
    std::is_same_v<T, std::int64_t> || std::is_same_v<T, double> ||
    std::is_same_v<T, std::string> || std::is_same_v<T, std::string_view>;

// ---- metadata values ----------------------------------------------------------------------------

class gguf_file;

/// One metadata value: a view into the file's bytes, cheap to copy, valid while the gguf_file
/// lives. Reading it as the wrong type throws kvscout::error naming the key and both types.
class gguf_value {
 public:
  gguf_value() = default;

  /// The key this value belongs to (for an array element, the array's key).
  [[nodiscard]] std::string_view key() const noexcept { return key_; }
  [[nodiscard]] gguf_type type() const noexcept { return type_; }
  /// Element type of an array; equals type() for anything else.
  [[nodiscard]] gguf_type element_type() const noexcept { return element_type_; }
  /// Number of elements of an array; 1 for anything else.
  [[nodiscard]] std::uint64_t size() const noexcept { return count_; }
  [[nodiscard]] bool is_array() const noexcept { return type_ == gguf_type::array; }

  /// The value as T, which must match the stored type exactly ("u32", not "any integer").
  template <gguf_scalar T>
  [[nodiscard]] T as() const {
    constexpr gguf_type want = detail::gguf_type_of<T>();
    if (type_ != want) {
      KVSCOUT_FAIL("metadata key ", detail::quoted_name(key_), " has type ", describe(),
                   ", expected ", want);
    }
    if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::string_view>) {
      return T(reinterpret_cast<const char*>(bytes_.data()), bytes_.size());
    } else {
      return element<T>(bytes_.data());
    }
  }

  /// The elements of an array of T.
  template <gguf_scalar T>
  [[nodiscard]] std::vector<T> as_array() const {
    constexpr gguf_type want = detail::gguf_type_of<T>();
    if (type_ != gguf_type::array || element_type_ != want) {
      KVSCOUT_FAIL("metadata key ", detail::quoted_name(key_), " has type ", describe(),
                   ", expected array[", want, "]");
    }
    std::vector<T> out;
    out.reserve(static_cast<std::size_t>(count_));
    if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::string_view>) {
      detail::cursor c(bytes_.data(), bytes_.size());
      for (std::uint64_t i = 0; i < count_; ++i) {
        out.emplace_back(c.read_string("a string element"));
      }
    } else {
      for (std::uint64_t i = 0; i < count_; ++i) {
        out.push_back(element<T>(bytes_.data() + i * sizeof(T)));
      }
    }
    return out;
  }

  /// The elements of an array of any element type (nested arrays included), as values.
  [[nodiscard]] std::vector<gguf_value> elements() const {
    if (type_ != gguf_type::array) {
      KVSCOUT_FAIL("metadata key ", detail::quoted_name(key_), " has type ", describe(),
                   ", expected an array");
    }
    std::vector<gguf_value> out;
    out.reserve(static_cast<std::size_t>(count_));
    detail::cursor c(bytes_.data(), bytes_.size());
    for (std::uint64_t i = 0; i < count_; ++i) {
      out.push_back(parse(key_, static_cast<std::uint32_t>(element_type_), c, 1));
    }
    return out;
  }

  /// "u32", "string", "array[string]" (the outer level of nested arrays only).
  [[nodiscard]] std::string describe() const {
    std::string s(to_string(type_));
    if (type_ == gguf_type::array) {
      s += '[';
      s += to_string(element_type_);
      s += ']';
    }
    return s;
  }

 private:
  friend class gguf_file;

  /// Parses one value of type `type_id` at the cursor, checking every byte against the end of
  /// the file. `depth` counts the arrays around it. An array value (top level or nested) is the
  /// element type, the count and the elements.
  static gguf_value parse(std::string_view key, std::uint32_t type_id, detail::cursor& c,
                          int depth) {
    if (type_id >= gguf_type_count) {
      KVSCOUT_FAIL("metadata key ", detail::quoted_name(key), " has unknown value type ", type_id,
                   " (valid types are 0..", gguf_type_count - 1,
                   ": u8 i8 u16 i16 u32 i32 f32 bool string array u64 i64 f64)");
    }
    gguf_value v;
    v.key_ = key;
    v.type_ = static_cast<gguf_type>(type_id);
    v.element_type_ = v.type_;
    const std::string what = "the value of metadata key " + detail::quoted_name(key);
    if (v.type_ == gguf_type::string) {
      const auto s = c.read_string(what);
      v.bytes_ = std::as_bytes(std::span(s.data(), s.size()));
      return v;
    }
    if (v.type_ != gguf_type::array) {
      const std::uint64_t n = detail::min_value_bytes(v.type_);
      c.need(n, what);
      v.bytes_ = std::span(c.here(), static_cast<std::size_t>(n));
      c.skip(n, what);
      return v;
    }
    if (depth >= detail::max_array_depth) {
      KVSCOUT_FAIL("metadata key ", detail::quoted_name(key), " nests arrays deeper than ",
                   detail::max_array_depth, " levels");
    }
    const auto elem = c.read<std::uint32_t>(what);
    if (elem >= gguf_type_count) {
      KVSCOUT_FAIL("metadata key ", detail::quoted_name(key), " is an array of unknown value type ",
                   elem, " (valid types are 0..", gguf_type_count - 1, ")");
    }
    const std::uint64_t count_at = c.pos();
    const auto count = c.read<std::uint64_t>(what);
    const auto et = static_cast<gguf_type>(elem);
    const std::uint64_t min_bytes = detail::min_value_bytes(et);
    if (count > c.left() / min_bytes) {
      KVSCOUT_FAIL("metadata key ", detail::quoted_name(key), ": array of ", et, " claims ", count,
                   " elements at offset ", count_at, ", more than the ", c.left(),
                   " bytes left in the file can hold (truncated or corrupt file)");
    }
    v.element_type_ = et;
    v.count_ = count;
    const std::byte* start = c.here();
    const std::uint64_t start_pos = c.pos();
    if (et == gguf_type::string) {
      for (std::uint64_t i = 0; i < count; ++i) (void)c.read_string(what);
    } else if (et == gguf_type::array) {
      for (std::uint64_t i = 0; i < count; ++i) (void)parse(key, elem, c, depth + 1);
    } else {
      c.skip(count * min_bytes, what);
    }
    v.bytes_ = std::span(start, static_cast<std::size_t>(c.pos() - start_pos));
    return v;
  }

  template <class T>
  static T element(const std::byte* p) noexcept {
    if constexpr (std::is_same_v<T, bool>) {
      return detail::load_le<std::uint8_t>(p) != 0;
    } else {
      return detail::load_le<T>(p);
    }
  }

  std::string_view key_;
  gguf_type type_ = gguf_type::u8;
  gguf_type element_type_ = gguf_type::u8;
  std::uint64_t count_ = 1;
  // scalar: its bytes; string: its characters; array: the elements (after type and count)
  std::span<const std::byte> bytes_;
};

// ---- tensors and dequantisation -----------------------------------------------------------------

/// Where one tensor lies in the file and what it holds.
struct tensor_info {
  std::string name;
  /// ggml order: dims[0] = ne0 is the contiguous (innermost) dimension; a weight with
  /// dims = [in, out] is a row-major [out][in] matrix. 0 to 4 entries.
  std::vector<std::uint64_t> dims;
  ggml_type type = ggml_type::f32;
  /// Byte offset from the start of the data section (gguf_file::data_offset()).
  std::uint64_t offset = 0;
  /// Bytes the tensor occupies: n_elements / block elements * block bytes.
  std::uint64_t n_bytes = 0;
  /// The tensor's bytes inside the file; valid while the gguf_file lives.
  std::span<const std::byte> data;

  /// ne[i], 1 past the stored dimensions (ggml's convention).
  [[nodiscard]] std::uint64_t ne(std::size_t i) const noexcept {
    return i < dims.size() ? dims[i] : 1;
  }
  [[nodiscard]] std::uint64_t n_elements() const noexcept {
    std::uint64_t n = 1;
    for (auto d : dims) n *= d;
    return n;
  }
  /// Number of ne0-long rows: n_elements / ne0 (0 when the tensor is empty).
  [[nodiscard]] std::uint64_t n_rows() const noexcept {
    return ne(0) == 0 ? 0 : n_elements() / ne(0);
  }
};

/// Dequantises `out.size()` elements of `type` from `src` (whole blocks: out.size() is a multiple
/// of the block's elements and src.size() is exactly the matching number of bytes).
///   f32, f16, bf16: one element per 4 / 2 / 2 bytes.
///   q4_0, 32 elements in 18 bytes: fp16 d, then 16 bytes q;
///     x[j] = d * ((q[j] & 15) - 8) and x[j + 16] = d * ((q[j] >> 4) - 8), j < 16.
///   q4_1, 32 elements in 20 bytes: fp16 d, fp16 m, then 16 bytes q;
///     x[j] = d * (q[j] & 15) + m and x[j + 16] = d * (q[j] >> 4) + m, j < 16.
///   q8_0, 32 elements in 34 bytes: fp16 d, then 32 x int8 q; x[j] = d * q[j].
inline void dequantize(ggml_type type, std::span<const std::byte> src, std::span<float> out) {
  const auto block = ggml_block_of(static_cast<std::uint32_t>(type));
  if (!block) {
    KVSCOUT_FAIL("cannot dequantize ggml type ", static_cast<std::uint32_t>(type), " (",
                 ggml_type_name(static_cast<std::uint32_t>(type)), ")");
  }
  KVSCOUT_EXPECTS(out.size() % block->elements == 0, "dequantize ", type, ": ", out.size(),
                  " elements is not a whole number of ", block->elements, "-element blocks");
  const std::uint64_t n_blocks = out.size() / block->elements;
  KVSCOUT_EXPECTS(src.size() == n_blocks * block->bytes, "dequantize ", type, ": ", out.size(),
                  " elements need ", n_blocks * block->bytes, " bytes, got ", src.size());
  const std::byte* p = src.data();
  float* y = out.data();
  switch (type) {
    case ggml_type::f32:
      if (!out.empty()) std::memcpy(y, p, out.size() * sizeof(float));
      return;
    case ggml_type::f16:
      for (std::size_t i = 0; i < out.size(); ++i) {
        y[i] = detail::half_bits_to_float(detail::load_le<std::uint16_t>(p + 2 * i));
      }
      return;
    case ggml_type::bf16:
      for (std::size_t i = 0; i < out.size(); ++i) {
        y[i] = detail::bf16_bits_to_float(detail::load_le<std::uint16_t>(p + 2 * i));
      }
      return;
    case ggml_type::q4_0:
      for (std::uint64_t b = 0; b < n_blocks; ++b, p += 18, y += 32) {
        const float d = detail::half_bits_to_float(detail::load_le<std::uint16_t>(p));
        for (int j = 0; j < 16; ++j) {
          const auto q = static_cast<unsigned>(p[2 + j]);
          y[j] = d * static_cast<float>(static_cast<int>(q & 15u) - 8);
          y[j + 16] = d * static_cast<float>(static_cast<int>(q >> 4) - 8);
        }
      }
      return;
    case ggml_type::q4_1:
      for (std::uint64_t b = 0; b < n_blocks; ++b, p += 20, y += 32) {
        const float d = detail::half_bits_to_float(detail::load_le<std::uint16_t>(p));
        const float m = detail::half_bits_to_float(detail::load_le<std::uint16_t>(p + 2));
        for (int j = 0; j < 16; ++j) {
          const auto q = static_cast<unsigned>(p[4 + j]);
          y[j] = d * static_cast<float>(q & 15u) + m;
          y[j + 16] = d * static_cast<float>(q >> 4) + m;
        }
      }
      return;
    case ggml_type::q8_0:
      for (std::uint64_t b = 0; b < n_blocks; ++b, p += 34, y += 32) {
        const float d = detail::half_bits_to_float(detail::load_le<std::uint16_t>(p));
        for (int j = 0; j < 32; ++j) {
          y[j] = d * static_cast<float>(static_cast<std::int8_t>(p[2 + j]));
        }
      }
      return;
  }
}

/// Dequantises the whole tensor into out[0, t.n_elements()), in storage order (ne0 fastest).
inline void dequantize(const tensor_info& t, float* out) {
  KVSCOUT_EXPECTS(t.data.size() == t.n_bytes, "tensor ", detail::quoted_name(t.name), " has ",
                  t.data.size(), " bytes of data, expected ", t.n_bytes);
  const auto n = t.n_elements();
  if (n == 0) return;
  KVSCOUT_EXPECTS(out != nullptr, "null output for tensor ", detail::quoted_name(t.name));
  dequantize(t.type, t.data, std::span(out, static_cast<std::size_t>(n)));
}

inline std::vector<float> dequantize(const tensor_info& t) {
  std::vector<float> out(static_cast<std::size_t>(t.n_elements()));
  dequantize(t, out.data());
  return out;
}

/// Dequantises row `row` (ne0 elements) of the tensor seen as [n_rows][ne0]: for the token
/// embedding, token `row`'s vector.
inline void dequantize_row(const tensor_info& t, std::uint64_t row, float* out) {
  KVSCOUT_EXPECTS(row < t.n_rows(), "row ", row, " out of range [0, ", t.n_rows(), ") for tensor ",
                  detail::quoted_name(t.name));
  KVSCOUT_EXPECTS(t.data.size() == t.n_bytes, "tensor ", detail::quoted_name(t.name), " has ",
                  t.data.size(), " bytes of data, expected ", t.n_bytes);
  const auto block = ggml_block_of(t.type);
  const std::uint64_t row_bytes = t.ne(0) / block.elements * block.bytes;
  dequantize(t.type,
             t.data.subspan(static_cast<std::size_t>(row * row_bytes),
                            static_cast<std::size_t>(row_bytes)),
             std::span(out, static_cast<std::size_t>(t.ne(0))));
}

// ---- the file -----------------------------------------------------------------------------------

/// How gguf_file gets the bytes: mmap (read-only, shared with the page cache) or one heap copy.
enum class load_mode { mmap, read };

/// An opened, validated GGUF file.
class gguf_file {
 public:
  static constexpr std::uint32_t magic = 0x46554747;  // "GGUF" read as a little-endian u32
  static constexpr std::uint64_t default_alignment = 32;

  explicit gguf_file(std::string path, load_mode mode = load_mode::mmap)
      : path_(std::move(path)), bytes_(path_, mode == load_mode::mmap) {
    parse();
  }

  /// A GGUF file already in memory (a test's or a fuzzer's buffer): the bytes are copied once,
  /// as with load_mode::read, and checked as a file is; `name` stands for the path in messages
  /// and path().
  [[nodiscard]] static gguf_file from_bytes(std::span<const std::byte> bytes,
                                            std::string name = "<memory>") {
    return gguf_file(from_memory{}, bytes, std::move(name));
  }

  gguf_file(const gguf_file&) = delete;
  gguf_file& operator=(const gguf_file&) = delete;
  gguf_file(gguf_file&&) noexcept = default;
  gguf_file& operator=(gguf_file&&) noexcept = default;

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] std::uint32_t version() const noexcept { return version_; }
  /// general.alignment, or 32 when absent.
  [[nodiscard]] std::uint64_t alignment() const noexcept { return alignment_; }
  [[nodiscard]] std::uint64_t file_size() const noexcept { return bytes_.size(); }
  /// File offset of the data section (tensor offsets count from here).
  [[nodiscard]] std::uint64_t data_offset() const noexcept { return data_offset_; }

  // -- metadata

  /// Every key/value, in file order.
  [[nodiscard]] const std::vector<gguf_value>& metadata() const noexcept { return metadata_; }
  [[nodiscard]] std::optional<gguf_value> find(std::string_view key) const {
    const auto it = key_index_.find(key);
    if (it == key_index_.end()) return std::nullopt;
    return metadata_[it->second];
  }
  [[nodiscard]] bool contains(std::string_view key) const { return key_index_.contains(key); }
  /// The value of `key`; throws kvscout::error naming the key when it is missing.
  [[nodiscard]] const gguf_value& at(std::string_view key) const {
    const auto it = key_index_.find(key);
    if (it == key_index_.end()) {
      KVSCOUT_FAIL("metadata key ", detail::quoted_name(key), " not found in ",
                   detail::quoted_name(path_), " (", metadata_.size(), " keys)");
    }
    return metadata_[it->second];
  }

  /// Typed getters: the key must exist and hold exactly this type.
  template <gguf_scalar T>
  [[nodiscard]] T get(std::string_view key) const {
    return at(key).template as<T>();
  }
  template <gguf_scalar T>
  [[nodiscard]] std::vector<T> get_array(std::string_view key) const {
    return at(key).template as_array<T>();
  }
  [[nodiscard]] std::uint8_t get_u8(std::string_view key) const { return get<std::uint8_t>(key); }
  [[nodiscard]] std::int8_t get_i8(std::string_view key) const { return get<std::int8_t>(key); }
  [[nodiscard]] std::uint16_t get_u16(std::string_view key) const {
    return get<std::uint16_t>(key);
  }
  [[nodiscard]] std::int16_t get_i16(std::string_view key) const { return get<std::int16_t>(key); }
  [[nodiscard]] std::uint32_t get_u32(std::string_view key) const {
    return get<std::uint32_t>(key);
  }
  [[nodiscard]] std::int32_t get_i32(std::string_view key) const { return get<std::int32_t>(key); }
  [[nodiscard]] std::uint64_t get_u64(std::string_view key) const {
    return get<std::uint64_t>(key);
  }
  [[nodiscard]] std::int64_t get_i64(std::string_view key) const { return get<std::int64_t>(key); }
  [[nodiscard]] float get_f32(std::string_view key) const { return get<float>(key); }
  [[nodiscard]] double get_f64(std::string_view key) const { return get<double>(key); }
  [[nodiscard]] bool get_bool(std::string_view key) const { return get<bool>(key); }
  [[nodiscard]] std::string get_string(std::string_view key) const { return get<std::string>(key); }
  [[nodiscard]] std::vector<std::string> get_string_array(std::string_view key) const {
    return get_array<std::string>(key);
  }
  [[nodiscard]] std::vector<std::int32_t> get_i32_array(std::string_view key) const {
    return get_array<std::int32_t>(key);
  }
  [[nodiscard]] std::vector<std::uint32_t> get_u32_array(std::string_view key) const {
    return get_array<std::uint32_t>(key);
  }
  [[nodiscard]] std::vector<float> get_f32_array(std::string_view key) const {
    return get_array<float>(key);
  }

  // -- tensors

  /// Every tensor, in file order.
  [[nodiscard]] const std::vector<tensor_info>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const tensor_info* find_tensor(std::string_view name) const {
    const auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }
  /// The tensor called `name`; throws kvscout::error naming it when it is missing.
  [[nodiscard]] const tensor_info& tensor(std::string_view name) const {
    const auto* t = find_tensor(name);
    if (t == nullptr) {
      KVSCOUT_FAIL("tensor ", detail::quoted_name(name), " not found in ",
                   detail::quoted_name(path_), " (", tensors_.size(), " tensors)");
    }
    return *t;
  }

  /// Dequantises a tensor of this file into out[0, t.n_elements()).
  void dequantize(const tensor_info& t, float* out) const { ::kvscout::model::dequantize(t, out); }
  /// The tensor called `name` as floats, in storage order (ne0 fastest).
  [[nodiscard]] std::vector<float> dequantize(std::string_view name) const {
    return ::kvscout::model::dequantize(tensor(name));
  }

 private:
  struct from_memory {};
  gguf_file(from_memory, std::span<const std::byte> bytes, std::string name)
      : path_(std::move(name)), bytes_(bytes) {
    parse();
  }

  static std::string supported_types_text() {
    std::string s;
    for (auto t : supported_ggml_types) {
      if (!s.empty()) s += ", ";
      s += to_string(t);
      s += " (";
      s += std::to_string(static_cast<std::uint32_t>(t));
      s += ')';
    }
    return s;
  }

  void parse() {
    const std::uint64_t size = bytes_.size();
    detail::cursor c(bytes_.data(), size);

    // Header.
    c.need(4, "the magic");
    const auto m = c.read<std::uint32_t>("the magic");
    if (m != magic) {
      std::string shown;
      for (int i = 0; i < 4; ++i) shown += static_cast<char>((m >> (8 * i)) & 0xffu);
      KVSCOUT_FAIL("not a GGUF file: ", detail::quoted_name(path_), " starts with ",
                   detail::quoted_name(shown), ", expected the magic 'GGUF'");
    }
    version_ = c.read<std::uint32_t>("the version");
    if (version_ != 2 && version_ != 3) {
      const std::uint32_t swapped = ((version_ & 0xffu) << 24) | ((version_ & 0xff00u) << 8) |
                                    ((version_ >> 8) & 0xff00u) | (version_ >> 24);
      if (swapped >= 1 && swapped <= 3) {
        KVSCOUT_FAIL("unsupported GGUF file: version field reads ", version_,
                     ", a big-endian file of version ", swapped,
                     "; only little-endian GGUF versions 2 and 3 are supported");
      }
      KVSCOUT_FAIL("unsupported GGUF version ", version_, " in ", detail::quoted_name(path_),
                   " (supported: 2, 3", version_ == 1 ? "; version 1 used 32-bit counts" : "", ")");
    }
    const auto n_tensors = c.read<std::uint64_t>("n_tensors in the header");
    const auto n_kv = c.read<std::uint64_t>("n_kv in the header");
    constexpr std::uint64_t min_kv_bytes = 8 + 4 + 1;          // key length, type, 1-byte value
    constexpr std::uint64_t min_tensor_bytes = 8 + 4 + 4 + 8;  // name length, n_dims, type, offset
    if (n_kv > c.left() / min_kv_bytes) {
      KVSCOUT_FAIL("header claims n_kv = ", n_kv, " metadata entries, more than the ", c.left(),
                   " bytes after the header can hold (at least ", min_kv_bytes,
                   " bytes each): truncated or corrupt file");
    }
    if (n_tensors > c.left() / min_tensor_bytes) {
      KVSCOUT_FAIL("header claims n_tensors = ", n_tensors, ", more than the ", c.left(),
                   " bytes after the header can hold (at least ", min_tensor_bytes,
                   " bytes each): truncated or corrupt file");
    }

    // Metadata.
    metadata_.reserve(static_cast<std::size_t>(n_kv));
    for (std::uint64_t i = 0; i < n_kv; ++i) {
      const std::string what = "metadata key #" + std::to_string(i);
      const auto key = c.read_string(what);
      const auto type_id =
          c.read<std::uint32_t>("the value type of metadata key " + detail::quoted_name(key));
      metadata_.push_back(gguf_value::parse(key, type_id, c, 0));
      if (!key_index_.emplace(key, metadata_.size() - 1).second) {
        KVSCOUT_FAIL("duplicate metadata key ", detail::quoted_name(key), " (entry #", i, ")");
      }
    }
    alignment_ = default_alignment;
    if (const auto a = find("general.alignment")) {
      if (a->type() != gguf_type::u32) {
        KVSCOUT_FAIL("general.alignment has type ", a->describe(), ", expected u32");
      }
      const auto v = a->as<std::uint32_t>();
      if (v == 0 || (v & (v - 1)) != 0) {
        KVSCOUT_FAIL("general.alignment is ", v, ", expected a non-zero power of two");
      }
      alignment_ = v;
    }

    // Tensor infos.
    if (n_tensors > c.left() / min_tensor_bytes) {
      KVSCOUT_FAIL("header claims n_tensors = ", n_tensors, ", more than the ", c.left(),
                   " bytes after the metadata can hold (at least ", min_tensor_bytes,
                   " bytes each): truncated or corrupt file");
    }
    tensors_.reserve(static_cast<std::size_t>(n_tensors));
    for (std::uint64_t i = 0; i < n_tensors; ++i) {
      const auto name = c.read_string("the name of tensor #" + std::to_string(i));
      const std::string what = "the info of tensor " + detail::quoted_name(name);
      tensor_info t;
      t.name = std::string(name);
      const auto n_dims = c.read<std::uint32_t>(what);
      if (n_dims > ggml_max_dims) {
        KVSCOUT_FAIL("tensor ", detail::quoted_name(name), " has n_dims = ", n_dims,
                     ", expected at most ", ggml_max_dims);
      }
      constexpr auto max_ne = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
      std::uint64_t n_elements = 1;
      for (std::uint32_t d = 0; d < n_dims; ++d) {
        const auto ne = c.read<std::uint64_t>(what);
        if (ne > max_ne || (ne != 0 && n_elements > max_ne / ne)) {
          KVSCOUT_FAIL("tensor ", detail::quoted_name(name), ": ne[", d, "] = ", ne,
                       " makes the element count overflow int64");
        }
        n_elements *= ne;
        t.dims.push_back(ne);
      }
      const auto type_id = c.read<std::uint32_t>(what);
      const auto block = ggml_block_of(type_id);
      if (!block) {
        KVSCOUT_FAIL("tensor ", detail::quoted_name(name), " has ggml type ", type_id, " (",
                     ggml_type_name(type_id),
                     "), which this reader does not support; supported: ", supported_types_text());
      }
      t.type = static_cast<ggml_type>(type_id);
      if (t.ne(0) % block->elements != 0) {
        KVSCOUT_FAIL("tensor ", detail::quoted_name(name), " of type ", t.type,
                     " has ne[0] = ", t.ne(0), ", not a multiple of its block size ",
                     block->elements);
      }
      const std::uint64_t n_blocks = n_elements / block->elements;
      if (n_blocks > std::numeric_limits<std::uint64_t>::max() / block->bytes) {
        KVSCOUT_FAIL("tensor ", detail::quoted_name(name), ": ", n_elements,
                     " elements overflow the byte count");
      }
      t.n_bytes = n_blocks * block->bytes;
      t.offset = c.read<std::uint64_t>(what);
      if (t.offset % alignment_ != 0) {
        KVSCOUT_FAIL("tensor ", detail::quoted_name(name), " has data offset ", t.offset,
                     ", which is misaligned: expected a multiple of the alignment ", alignment_);
      }
      tensors_.push_back(std::move(t));
      if (!tensor_index_.emplace(name, tensors_.size() - 1).second) {
        KVSCOUT_FAIL("duplicate tensor name ", detail::quoted_name(name), " (tensor #", i, ")");
      }
    }

    // Data section: starts at the next multiple of the alignment; every tensor lies inside it.
    data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
    for (auto& t : tensors_) {
      const bool inside = data_offset_ <= size && t.offset <= size - data_offset_ &&
                          t.n_bytes <= size - data_offset_ - t.offset;
      if (!inside) {
        KVSCOUT_FAIL("tensor ", detail::quoted_name(t.name), " (", t.type, ", ", t.n_bytes,
                     " bytes at data offset ", t.offset, ", data section at file offset ",
                     data_offset_, ") runs past the end of the file (", size,
                     " bytes): truncated file or bad offset");
      }
      t.data =
          std::span(bytes_.data() + data_offset_ + t.offset, static_cast<std::size_t>(t.n_bytes));
    }

    // No two tensors share bytes.
    std::vector<std::size_t> order(tensors_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return tensors_[a].offset < tensors_[b].offset;
    });
    for (std::size_t k = 1; k < order.size(); ++k) {
      const auto& prev = tensors_[order[k - 1]];
      const auto& next = tensors_[order[k]];
      if (prev.n_bytes != 0 && next.offset < prev.offset + prev.n_bytes) {
        KVSCOUT_FAIL("tensors ", detail::quoted_name(prev.name), " (bytes [", prev.offset, ", ",
                     prev.offset + prev.n_bytes, ")) and ", detail::quoted_name(next.name),
                     " (from ", next.offset, ") overlap in the data section");
      }
    }
  }

  std::string path_;
  detail::file_bytes bytes_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = default_alignment;
  std::uint64_t data_offset_ = 0;
  std::vector<gguf_value> metadata_;
  std::map<std::string_view, std::size_t, std::less<>> key_index_;
  std::vector<tensor_info> tensors_;
  std::map<std::string_view, std::size_t, std::less<>> tensor_index_;
};

}  // namespace kvscout::model
