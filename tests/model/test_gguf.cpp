// tools/model/gguf.hpp: the GGUF reader and dequantisation.
//
// Files are written by the test itself (a small writer below, independent of the reader), so
// every expected value comes from the format's definition, not from the code under test. The
// test cases tagged [model] read the real SmolLM2 file when scripts/fetch_model.sh has placed it
// in ${KVSCOUT_MODEL_DIR:-$HOME/.cache/kvscout}, and skip (with a warning) otherwise.

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kvscout/core/error.hpp"
#include "model/gguf.hpp"
#include "smollm2.hpp"

namespace {

namespace fs = std::filesystem;
using Catch::Contains;
using kvscout::model::gguf_file;
using kvscout::model::gguf_type;
using kvscout::model::load_mode;
using bytes = std::vector<unsigned char>;

// ---- a GGUF writer, written from the format description -----------------------------------------

// GGUF value type ids and ggml type ids, spelled out here rather than taken from the reader.
// clang-format off
enum : std::uint32_t {
  t_u8 = 0, t_i8 = 1, t_u16 = 2, t_i16 = 3, t_u32 = 4, t_i32 = 5, t_f32 = 6, t_bool = 7,
  t_string = 8, t_array = 9, t_u64 = 10, t_i64 = 11, t_f64 = 12
};
enum : std::uint32_t { g_f32 = 0, g_f16 = 1, g_q4_0 = 2, g_q4_1 = 3, g_q8_0 = 8, g_bf16 = 30 };
// clang-format on

template <class T>
void put(bytes& b, T v) {
  unsigned char tmp[sizeof(T)];
  std::memcpy(tmp, &v, sizeof(T));
  b.insert(b.end(), tmp, tmp + sizeof(T));
}
void put_string(bytes& b, std::string_view s) {
  put<std::uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}

struct meta_entry {
  std::string key;
  std::uint32_t type;
  bytes payload;  // the value's bytes after the type tag
};

template <class T>
meta_entry scalar(std::string key, std::uint32_t type, T v) {
  bytes p;
  put(p, v);
  return {std::move(key), type, std::move(p)};
}
meta_entry string_entry(std::string key, std::string_view s) {
  bytes p;
  put_string(p, s);
  return {std::move(key), t_string, std::move(p)};
}
// An array payload: element type, count, elements (already encoded).
bytes array_payload(std::uint32_t elem_type, std::uint64_t count, const bytes& elements) {
  bytes p;
  put(p, elem_type);
  put(p, count);
  p.insert(p.end(), elements.begin(), elements.end());
  return p;
}
template <class T>
meta_entry array_entry(std::string key, std::uint32_t elem_type, const std::vector<T>& v) {
  bytes e;
  for (const auto& x : v) put(e, x);
  return {std::move(key), t_array, array_payload(elem_type, v.size(), e)};
}
meta_entry string_array_entry(std::string key, const std::vector<std::string>& v) {
  bytes e;
  for (const auto& s : v) put_string(e, s);
  return {std::move(key), t_array, array_payload(t_string, v.size(), e)};
}

struct tensor_spec {
  std::string name;
  std::vector<std::uint64_t> dims;
  std::uint32_t type;
  bytes data;
  std::optional<std::uint64_t> offset;  // default: packed, each aligned
};

struct file_options {
  std::uint32_t version = 3;
  std::uint64_t alignment = 32;  // used for layout; written only through a metadata entry
};

bytes build_gguf(const std::vector<meta_entry>& meta, const std::vector<tensor_spec>& tensors,
                 const file_options& o = {}) {
  bytes b = {'G', 'G', 'U', 'F'};
  put<std::uint32_t>(b, o.version);
  put<std::uint64_t>(b, tensors.size());
  put<std::uint64_t>(b, meta.size());
  for (const auto& m : meta) {
    put_string(b, m.key);
    put(b, m.type);
    b.insert(b.end(), m.payload.begin(), m.payload.end());
  }
  auto align_up = [&](std::uint64_t x) {
    return (x + o.alignment - 1) / o.alignment * o.alignment;
  };
  std::vector<std::uint64_t> offsets;
  std::uint64_t running = 0;
  for (const auto& t : tensors) {
    offsets.push_back(t.offset.value_or(running));
    running = align_up(running + t.data.size());
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    put_string(b, t.name);
    put<std::uint32_t>(b, static_cast<std::uint32_t>(t.dims.size()));
    for (auto d : t.dims) put(b, d);
    put(b, t.type);
    put(b, offsets[i]);
  }
  if (tensors.empty()) return b;
  while (b.size() % o.alignment != 0) b.push_back(0);
  const std::size_t data_start = b.size();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].offset) continue;  // hand-placed tensors get no bytes
    b.resize(data_start + offsets[i], 0);
    b.insert(b.end(), tensors[i].data.begin(), tensors[i].data.end());
  }
  return b;
}

// ---- temp files ---------------------------------------------------------------------------------

struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("kvscout_gguf_test_" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string write_file(const std::string& name, const bytes& b) {
  static temp_dir dir;
  const auto p = dir.path / name;
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  f.close();
  REQUIRE(f.good());
  return p.string();
}

// ---- the formats' formulas, independent of the reader -------------------------------------------

// IEEE binary16 by definition: sign, 5-bit exponent (bias 15), 10-bit fraction.
double half_value(std::uint16_t h) {
  const int sign = h >> 15;
  const int e = (h >> 10) & 31;
  const int m = h & 1023;
  double v;
  if (e == 0) {
    v = std::ldexp(m, -24);
  } else if (e == 31) {
    v = m != 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(1024 + m, e - 25);
  }
  return sign ? -v : v;
}

// bfloat16 is the top half of a binary32.
float bf16_value(std::uint16_t h) {
  const std::uint32_t bits = std::uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Exact float of a double that the test made exactly representable.
float exact(double v) {
  const auto f = static_cast<float>(v);
  REQUIRE(static_cast<double>(f) == v);
  return f;
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof(float)) == 0;  // distinguishes -0 from +0
}

// A quantised tensor built from known values, with the floats its blocks stand for.
struct quantised {
  bytes data;
  std::vector<float> expected;
};

// Scales (and, for q4_1, mins paired with them block by block) chosen so that d * q and
// d * q + m are exact in float for every 4- and 8-bit q: the comparison can then be exact
// whatever the compiler does (FMA contraction included). exact() checks it.
constexpr std::uint16_t scale_bits[] = {0x3400 /* 0.25 */,  0xBE00 /* -1.5 */,
                                        0x1400 /* 2^-10 */, 0x3555 /* 0.33325 */,
                                        0x5640 /* 100 */,   0x0001 /* 2^-24, subnormal */};
constexpr std::uint16_t min_bits[] = {0xBC00 /* -1 */,       0x3800 /* 0.5 */,  0x0000 /* 0 */,
                                      0xB555 /* -0.33325 */, 0xD640 /* -100 */, 0x2E66 /* ~0.1 */};

quantised make_q4_0(std::size_t n_blocks, std::mt19937& rng) {
  quantised q;
  for (std::size_t b = 0; b < n_blocks; ++b) {
    const std::uint16_t d = scale_bits[b % std::size(scale_bits)];
    put(q.data, d);
    unsigned char qs[16];
    for (auto& x : qs) x = static_cast<unsigned char>(rng() & 0xff);
    if (b == 0) qs[0] = 0x0f, qs[1] = 0xf0, qs[2] = 0x88;  // the extremes: -8, 7, 0
    q.data.insert(q.data.end(), qs, qs + 16);
    float block[32];
    for (int j = 0; j < 16; ++j) {
      block[j] = exact(half_value(d) * ((qs[j] & 15) - 8));       // low nibble: element j
      block[j + 16] = exact(half_value(d) * ((qs[j] >> 4) - 8));  // high nibble: element j+16
    }
    q.expected.insert(q.expected.end(), block, block + 32);
  }
  return q;
}

quantised make_q4_1(std::size_t n_blocks, std::mt19937& rng) {
  quantised q;
  for (std::size_t b = 0; b < n_blocks; ++b) {
    const std::uint16_t d = scale_bits[b % std::size(scale_bits)];
    const std::uint16_t m = min_bits[(b / std::size(scale_bits) + b) % std::size(min_bits)];
    put(q.data, d);
    put(q.data, m);
    unsigned char qs[16];
    for (auto& x : qs) x = static_cast<unsigned char>(rng() & 0xff);
    if (b == 0) qs[0] = 0x0f, qs[1] = 0xf0;
    q.data.insert(q.data.end(), qs, qs + 16);
    float block[32];
    for (int j = 0; j < 16; ++j) {
      block[j] = exact(half_value(d) * (qs[j] & 15) + half_value(m));
      block[j + 16] = exact(half_value(d) * (qs[j] >> 4) + half_value(m));
    }
    q.expected.insert(q.expected.end(), block, block + 32);
  }
  return q;
}

quantised make_q8_0(std::size_t n_blocks) {
  quantised q;
  for (std::size_t b = 0; b < n_blocks; ++b) {
    const std::uint16_t d = scale_bits[b % std::size(scale_bits)];
    put(q.data, d);
    for (int j = 0; j < 32; ++j) {
      // Blocks 0..7 together hold every int8 value once.
      const auto v = static_cast<std::int8_t>(static_cast<int>((b % 8) * 32 + j) - 128);
      put(q.data, v);
      q.expected.push_back(exact(half_value(d) * v));
    }
  }
  return q;
}

void require_same_floats(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first_bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!same_float(got[i], want[i])) {
      if (bad++ == 0) first_bad = i;
    }
  }
  CAPTURE(bad, first_bad, got[first_bad], want[first_bad]);
  CHECK(bad == 0);
}

// A small valid file with a bit of everything, for the corruption tests.
bytes small_valid_file() {
  std::mt19937 rng(7);
  std::vector<meta_entry> meta = {
      string_entry("general.architecture", "llama"),
      scalar<std::uint32_t>("llama.block_count", t_u32, 2),
      string_array_entry("tokenizer.ggml.tokens", {"<s>", "a", "bc"}),
      array_entry<float>("scores", t_f32, {0.5f, -1.0f}),
  };
  std::vector<tensor_spec> tensors = {
      {"w.q4_1", {32, 2}, g_q4_1, make_q4_1(2, rng).data, std::nullopt},
      {"norm", {3}, g_f32, {}, std::nullopt},
  };
  for (float v : {1.0f, 2.0f, 3.0f}) put(tensors[1].data, v);
  return build_gguf(meta, tensors);
}

using smollm2::model_path;

}  // namespace

// =================================================================================================

TEST_CASE("gguf: metadata of every value type round-trips", "[gguf]") {
  const auto version = GENERATE(2u, 3u);
  const auto mode = GENERATE(load_mode::mmap, load_mode::read);
  CAPTURE(version, mode == load_mode::mmap);

  std::vector<meta_entry> meta = {
      scalar<std::uint8_t>("u8", t_u8, 200),
      scalar<std::int8_t>("i8", t_i8, -100),
      scalar<std::uint16_t>("u16", t_u16, 60000),
      scalar<std::int16_t>("i16", t_i16, -30000),
      scalar<std::uint32_t>("u32", t_u32, 4000000000u),
      scalar<std::int32_t>("i32", t_i32, -2000000000),
      scalar<float>("f32", t_f32, 1.5e-3f),
      scalar<std::uint8_t>("bool.true", t_bool, 1),
      scalar<std::uint8_t>("bool.false", t_bool, 0),
      string_entry("string", "h\xc3\xa9llo, gguf"),
      string_entry("string.empty", ""),
      scalar<std::uint64_t>("u64", t_u64, (std::uint64_t{1} << 63) + 5),
      scalar<std::int64_t>("i64", t_i64, -(std::int64_t{1} << 62) - 3),
      scalar<double>("f64", t_f64, 3.141592653589793),
      string_array_entry("array.string", {"a", "", "ccc", "<|im_end|>"}),
      array_entry<std::int32_t>("array.i32", t_i32,
                                {-1, 0, 7, std::numeric_limits<std::int32_t>::min()}),
      array_entry<std::uint32_t>("array.u32", t_u32, {0u, 4294967295u}),
      array_entry<float>("array.f32", t_f32, {0.5f, -2.0f, 1e30f}),
      array_entry<std::uint8_t>("array.u8", t_u8, {1, 2, 255}),
      array_entry<std::int64_t>("array.i64", t_i64, {-5, 5}),
      array_entry<double>("array.f64", t_f64, {0.25}),
      array_entry<std::uint8_t>("array.bool", t_bool, {1, 0, 1}),
      array_entry<std::int32_t>("array.empty", t_i32, {}),
  };
  {  // an array of arrays of i32: [[1, 2], [], [3]]
    bytes inner;
    auto add_inner = [&](std::vector<std::int32_t> v) {
      bytes e;
      for (auto x : v) put(e, x);
      const auto p = array_payload(t_i32, v.size(), e);
      inner.insert(inner.end(), p.begin(), p.end());
    };
    add_inner({1, 2});
    add_inner({});
    add_inner({3});
    meta.push_back({"array.nested", t_array, array_payload(t_array, 3, inner)});
  }
  const auto path = write_file("roundtrip.gguf", build_gguf(meta, {}, file_options{version, 32}));
  const gguf_file f(path, mode);

  CHECK(f.version() == version);
  CHECK(f.alignment() == 32);
  CHECK(f.tensors().empty());
  REQUIRE(f.metadata().size() == meta.size());
  for (std::size_t i = 0; i < meta.size(); ++i) {
    CHECK(f.metadata()[i].key() == meta[i].key);
    CHECK(static_cast<std::uint32_t>(f.metadata()[i].type()) == meta[i].type);
  }

  CHECK(f.get_u8("u8") == 200);
  CHECK(f.get_i8("i8") == -100);
  CHECK(f.get_u16("u16") == 60000);
  CHECK(f.get_i16("i16") == -30000);
  CHECK(f.get_u32("u32") == 4000000000u);
  CHECK(f.get_i32("i32") == -2000000000);
  CHECK(f.get_f32("f32") == 1.5e-3f);
  CHECK(f.get_bool("bool.true"));
  CHECK_FALSE(f.get_bool("bool.false"));
  CHECK(f.get_string("string") == "h\xc3\xa9llo, gguf");
  CHECK(f.get<std::string_view>("string") == "h\xc3\xa9llo, gguf");
  CHECK(f.get_string("string.empty").empty());
  CHECK(f.get_u64("u64") == (std::uint64_t{1} << 63) + 5);
  CHECK(f.get_i64("i64") == -(std::int64_t{1} << 62) - 3);
  CHECK(f.get_f64("f64") == 3.141592653589793);
  CHECK(f.get_string_array("array.string") ==
        std::vector<std::string>{"a", "", "ccc", "<|im_end|>"});
  CHECK(f.get_i32_array("array.i32") ==
        std::vector<std::int32_t>{-1, 0, 7, std::numeric_limits<std::int32_t>::min()});
  CHECK(f.get_u32_array("array.u32") == std::vector<std::uint32_t>{0u, 4294967295u});
  CHECK(f.get_f32_array("array.f32") == std::vector<float>{0.5f, -2.0f, 1e30f});
  CHECK(f.get_array<std::uint8_t>("array.u8") == std::vector<std::uint8_t>{1, 2, 255});
  CHECK(f.get_array<std::int64_t>("array.i64") == std::vector<std::int64_t>{-5, 5});
  CHECK(f.get_array<double>("array.f64") == std::vector<double>{0.25});
  CHECK(f.get_array<bool>("array.bool") == std::vector<bool>{true, false, true});
  CHECK(f.get_i32_array("array.empty").empty());

  const auto nested = f.at("array.nested");
  CHECK(nested.describe() == "array[array]");
  CHECK(nested.size() == 3);
  const auto rows = nested.elements();
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].as_array<std::int32_t>() == std::vector<std::int32_t>{1, 2});
  CHECK(rows[1].as_array<std::int32_t>().empty());
  CHECK(rows[2].as_array<std::int32_t>() == std::vector<std::int32_t>{3});
  const auto strings = f.at("array.string").elements();
  REQUIRE(strings.size() == 4);
  CHECK(strings[3].as<std::string>() == "<|im_end|>");

  // find / contains
  REQUIRE(f.find("u32").has_value());
  CHECK(f.find("u32")->as<std::uint32_t>() == 4000000000u);
  CHECK_FALSE(f.find("no.such.key").has_value());
  CHECK(f.contains("f64"));
  CHECK_FALSE(f.contains("f6"));

  // Missing keys and wrong types name the key and both types.
  REQUIRE_THROWS_WITH(f.get_u32("no.such.key"), Contains("metadata key 'no.such.key' not found"));
  REQUIRE_THROWS_WITH(f.get_f32("u32"),
                      Contains("'u32'") && Contains("has type u32") && Contains("expected f32"));
  REQUIRE_THROWS_WITH(f.get_string("i32"), Contains("has type i32, expected string"));
  REQUIRE_THROWS_WITH(f.get_u64("u32"), Contains("expected u64"));
  REQUIRE_THROWS_WITH(f.get_i32_array("array.string"), Contains("'array.string'") &&
                                                           Contains("array[string]") &&
                                                           Contains("expected array[i32]"));
  REQUIRE_THROWS_WITH(f.get_string_array("string"),
                      Contains("has type string, expected array[string]"));
  REQUIRE_THROWS_WITH(f.get_u32("array.u32"), Contains("has type array[u32], expected u32"));
  REQUIRE_THROWS_WITH(f.at("u8").elements(), Contains("expected an array"));
}

TEST_CASE("gguf: each supported tensor type dequantises to the format's values", "[gguf]") {
  const auto mode = GENERATE(load_mode::mmap, load_mode::read);
  std::mt19937 rng(12345);

  // f32: bit-exact, including -0, a subnormal, the largest float, inf and NaN.
  const std::vector<float> f32_values = {0.0f,
                                         -0.0f,
                                         1.0f,
                                         -2.5f,
                                         1e-40f,
                                         std::numeric_limits<float>::max(),
                                         std::numeric_limits<float>::infinity(),
                                         std::numeric_limits<float>::quiet_NaN()};
  bytes f32_data;
  for (float v : f32_values) put(f32_data, v);

  // f16 and bf16: bit patterns through their definitions.
  const std::vector<std::uint16_t> f16_bits = {0x0000, 0x8000, 0x3C00, 0xC000, 0x7BFF, 0x0001,
                                               0x03FF, 0x0400, 0x3555, 0x7C00, 0xFC00, 0x7E00};
  bytes f16_data;
  std::vector<float> f16_expected;
  for (auto h : f16_bits) {
    put(f16_data, h);
    f16_expected.push_back(static_cast<float>(half_value(h)));
  }
  const std::vector<std::uint16_t> bf16_bits = {0x0000, 0x8000, 0x3F80, 0xC020, 0x7F7F,
                                                0x0001, 0x7F80, 0x7FC0, 0x3EAB, 0x4049};
  bytes bf16_data;
  std::vector<float> bf16_expected;
  for (auto h : bf16_bits) {
    put(bf16_data, h);
    bf16_expected.push_back(bf16_value(h));
  }

  // Quantised types: ne = [64, 3] (two blocks per row, three rows), so block and row order show.
  const auto q4_0 = make_q4_0(6, rng);
  const auto q4_1 = make_q4_1(6, rng);
  const auto q8_0 = make_q8_0(8);  // ne = [128, 2]: every int8 value

  std::vector<tensor_spec> tensors = {
      {"t.f32", {4, 2}, g_f32, f32_data, std::nullopt},
      {"t.f16", {12}, g_f16, f16_data, std::nullopt},
      {"t.bf16", {5, 2}, g_bf16, bf16_data, std::nullopt},
      {"t.q4_0", {64, 3}, g_q4_0, q4_0.data, std::nullopt},
      {"t.q4_1", {64, 3}, g_q4_1, q4_1.data, std::nullopt},
      {"t.q8_0", {128, 2}, g_q8_0, q8_0.data, std::nullopt},
  };
  const std::map<std::string, std::vector<float>> expected = {
      {"t.f32", f32_values},     {"t.f16", f16_expected},   {"t.bf16", bf16_expected},
      {"t.q4_0", q4_0.expected}, {"t.q4_1", q4_1.expected}, {"t.q8_0", q8_0.expected},
  };
  const auto path = write_file("types.gguf", build_gguf({}, tensors));
  const gguf_file f(path, mode);
  REQUIRE(f.tensors().size() == tensors.size());

  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& spec = tensors[i];
    CAPTURE(spec.name);
    const auto& t = f.tensor(spec.name);
    CHECK(&f.tensors()[i] == &t);
    CHECK(t.name == spec.name);
    CHECK(t.dims == spec.dims);
    CHECK(static_cast<std::uint32_t>(t.type) == spec.type);
    CHECK(t.n_bytes == spec.data.size());
    CHECK(t.offset % 32 == 0);
    CHECK(f.data_offset() % 32 == 0);
    REQUIRE(t.data.size() == spec.data.size());
    CHECK(std::memcmp(t.data.data(), spec.data.data(), spec.data.size()) == 0);

    const auto& want = expected.at(spec.name);
    REQUIRE(t.n_elements() == want.size());
    require_same_floats(f.dequantize(spec.name), want);

    // The pointer form writes every element (poisoned first).
    std::vector<float> out(want.size() + 1, -12345.0f);
    f.dequantize(t, out.data());
    CHECK(out.back() == -12345.0f);
    out.pop_back();
    require_same_floats(out, want);

    // Row by row (rows of ne0).
    for (std::uint64_t r = 0; r < t.n_rows(); ++r) {
      std::vector<float> row(static_cast<std::size_t>(t.ne(0)), -12345.0f);
      kvscout::model::dequantize_row(t, r, row.data());
      const auto first = want.begin() + static_cast<std::ptrdiff_t>(r * t.ne(0));
      require_same_floats(row,
                          std::vector<float>(first, first + static_cast<std::ptrdiff_t>(t.ne(0))));
    }
    REQUIRE_THROWS_WITH(kvscout::model::dequantize_row(t, t.n_rows(), nullptr),
                        Contains("out of range"));
  }
  // Spot checks by hand of the layouts' ordering (block 0 of q4_0: qs[0] = 0x0f, qs[1] = 0xf0).
  const auto q40 = f.dequantize("t.q4_0");
  CHECK(q40[0] == 0.25f * 7);    // low nibble of qs[0]: 15 - 8
  CHECK(q40[16] == 0.25f * -8);  // high nibble of qs[0]: 0 - 8
  CHECK(q40[1] == 0.25f * -8);
  CHECK(q40[17] == 0.25f * 7);
  const auto q41 = f.dequantize("t.q4_1");
  CHECK(q41[0] == 0.25f * 15 - 1.0f);
  CHECK(q41[16] == -1.0f);
  const auto q80 = f.dequantize("t.q8_0");
  CHECK(q80[0] == 0.25f * -128);
  CHECK(q80[31] == 0.25f * -97);

  REQUIRE_THROWS_WITH(f.tensor("t.none"), Contains("tensor 't.none' not found"));
  CHECK(f.find_tensor("t.none") == nullptr);
}

TEST_CASE("gguf: general.alignment places the data section and the tensors", "[gguf]") {
  std::vector<tensor_spec> tensors = {{"a", {3}, g_f32, {}, std::nullopt},
                                      {"b", {2}, g_f16, {}, std::nullopt}};
  for (float v : {1.0f, 2.0f, 3.0f}) put(tensors[0].data, v);
  put<std::uint16_t>(tensors[1].data, 0x3C00);
  put<std::uint16_t>(tensors[1].data, 0xC000);
  const auto path =
      write_file("align64.gguf", build_gguf({scalar<std::uint32_t>("general.alignment", t_u32, 64)},
                                            tensors, file_options{3, 64}));
  const gguf_file f(path);
  CHECK(f.alignment() == 64);
  CHECK(f.data_offset() % 64 == 0);
  CHECK(f.tensor("b").offset == 64);
  CHECK(f.dequantize("a") == std::vector<float>{1.0f, 2.0f, 3.0f});
  CHECK(f.dequantize("b") == std::vector<float>{1.0f, -2.0f});

  const auto bad = write_file(
      "align48.gguf", build_gguf({scalar<std::uint32_t>("general.alignment", t_u32, 48)}, {}));
  REQUIRE_THROWS_WITH(gguf_file(bad),
                      Contains("general.alignment is 48") && Contains("power of two"));
  const auto zero = write_file(
      "align0.gguf", build_gguf({scalar<std::uint32_t>("general.alignment", t_u32, 0)}, {}));
  REQUIRE_THROWS_WITH(gguf_file(zero), Contains("general.alignment is 0"));
  const auto typed = write_file(
      "align_u64.gguf", build_gguf({scalar<std::uint64_t>("general.alignment", t_u64, 32)}, {}));
  REQUIRE_THROWS_WITH(gguf_file(typed), Contains("general.alignment has type u64, expected u32"));
}

TEST_CASE("gguf: bad header", "[gguf][corrupt]") {
  bytes b = small_valid_file();
  SECTION("wrong magic") {
    b[0] = 'G', b[1] = 'G', b[2] = 'M', b[3] = 'L';
    REQUIRE_THROWS_WITH(gguf_file(write_file("magic.gguf", b)),
                        Contains("starts with 'GGML'") && Contains("expected the magic 'GGUF'"));
    b[0] = 0x7f, b[1] = 'E', b[2] = 'L', b[3] = 'F';
    REQUIRE_THROWS_WITH(gguf_file(write_file("magic.gguf", b)),
                        Contains("starts with '\\x7fELF'") && Contains("'GGUF'"));
  }
  SECTION("version 1, 99, 0 and a big-endian version") {
    for (std::uint32_t v : {1u, 99u, 0u}) {
      CAPTURE(v);
      std::memcpy(&b[4], &v, 4);
      REQUIRE_THROWS_WITH(
          gguf_file(write_file("version.gguf", b)),
          Contains("unsupported GGUF version " + std::to_string(v)) && Contains("supported: 2, 3"));
    }
    const unsigned char be3[4] = {0, 0, 0, 3};
    std::memcpy(&b[4], be3, 4);
    REQUIRE_THROWS_WITH(gguf_file(write_file("version.gguf", b)),
                        Contains("big-endian file of version 3"));
  }
  SECTION("n_tensors and n_kv larger than the file") {
    const std::uint64_t huge = std::uint64_t{1} << 40;
    std::memcpy(&b[8], &huge, 8);
    REQUIRE_THROWS_WITH(gguf_file(write_file("ntensors.gguf", b)),
                        Contains("n_tensors = 1099511627776") && Contains("truncated or corrupt"));
    b = small_valid_file();
    const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
    std::memcpy(&b[16], &max, 8);
    REQUIRE_THROWS_WITH(gguf_file(write_file("nkv.gguf", b)),
                        Contains("n_kv = 18446744073709551615"));
  }
  SECTION("n_tensors larger than the tensor infos present (but within the file size)") {
    // Claims one more tensor than written: the reader runs into the data section and then EOF.
    const std::uint64_t three = 3;
    std::memcpy(&b[8], &three, 8);
    REQUIRE_THROWS_AS(gguf_file(write_file("ntensors3.gguf", b)), kvscout::error);
  }
}

TEST_CASE("gguf: from_bytes reads a file held in memory as the file itself", "[gguf]") {
  const bytes b = small_valid_file();
  const gguf_file disk(write_file("memory.gguf", b), load_mode::read);
  std::vector<std::byte> buffer(b.size());
  std::memcpy(buffer.data(), b.data(), b.size());
  const gguf_file mem = gguf_file::from_bytes(buffer, "a buffer");
  CHECK(mem.path() == "a buffer");
  CHECK(mem.file_size() == disk.file_size());
  CHECK(mem.data_offset() == disk.data_offset());
  CHECK(mem.metadata().size() == disk.metadata().size());
  CHECK(mem.get_string_array("tokenizer.ggml.tokens") == std::vector<std::string>{"<s>", "a", "bc"});
  REQUIRE(mem.tensors().size() == disk.tensors().size());
  // The bytes are copied: the buffer may go away.
  std::fill(buffer.begin(), buffer.end(), std::byte{0});
  for (std::size_t i = 0; i < mem.tensors().size(); ++i) {
    CHECK(mem.tensors()[i].name == disk.tensors()[i].name);
    CHECK(mem.dequantize(mem.tensors()[i].name) == disk.dequantize(disk.tensors()[i].name));
  }
  // Moving keeps the views valid, as for a file.
  gguf_file first = gguf_file::from_bytes(std::as_bytes(std::span(b.data(), b.size())));
  const gguf_file moved = std::move(first);
  CHECK(moved.path() == "<memory>");
  CHECK(moved.dequantize("norm") == std::vector<float>{1.0f, 2.0f, 3.0f});
  // Errors name the buffer; every truncation is one.
  REQUIRE_THROWS_WITH(gguf_file::from_bytes({}), Contains("truncated file: the magic"));
  bytes wrong = b;
  wrong[0] = 'X';
  REQUIRE_THROWS_WITH(gguf_file::from_bytes(std::as_bytes(std::span(wrong.data(), wrong.size())),
                                            "the download"),
                      Contains("not a GGUF file: 'the download'"));
  for (std::size_t n = 0; n < b.size(); ++n) {
    CAPTURE(n);
    REQUIRE_THROWS_WITH(gguf_file::from_bytes(std::as_bytes(std::span(b.data(), n))),
                        Contains("truncated"));
  }
}

TEST_CASE("gguf: every truncation of a valid file throws kvscout::error", "[gguf][corrupt]") {
  const bytes full = small_valid_file();
  {
    const gguf_file ok(write_file("full.gguf", full));  // the whole file is valid
    CHECK(ok.tensors().size() == 2);
  }
  const auto mode = GENERATE(load_mode::read, load_mode::mmap);
  std::size_t failures = 0;
  for (std::size_t n = 0; n < full.size(); ++n) {
    const bytes prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    const auto path = write_file("prefix.gguf", prefix);
    try {
      gguf_file f(path, mode);
      FAIL("prefix of " << n << " of " << full.size() << " bytes was accepted");
    } catch (const kvscout::error& e) {
      const std::string msg = e.what();
      if (msg.find("truncated") == std::string::npos) {
        ++failures;
        INFO("prefix " << n << ": " << msg);
        CHECK(msg.find("truncated") != std::string::npos);
      }
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("gguf: corrupt metadata", "[gguf][corrupt]") {
  SECTION("a key whose string length runs past the end") {
    bytes b = {'G', 'G', 'U', 'F'};
    put<std::uint32_t>(b, 3);
    put<std::uint64_t>(b, 0);
    put<std::uint64_t>(b, 1);
    put<std::uint64_t>(b, 1000000);  // key length
    b.insert(b.end(), {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'});
    REQUIRE_THROWS_WITH(gguf_file(write_file("keylen.gguf", b)),
                        Contains("metadata key #0") && Contains("string length 1000000") &&
                            Contains("past the end of the file"));
  }
  SECTION("a string value whose length runs past the end") {
    bytes b = build_gguf({string_entry("general.name", "abc")}, {});
    const std::uint64_t len = std::uint64_t{1} << 62;
    std::memcpy(&b[b.size() - 3 - 8], &len, 8);
    REQUIRE_THROWS_WITH(gguf_file(write_file("strlen.gguf", b)),
                        Contains("'general.name'") &&
                            Contains("string length 4611686018427387904") &&
                            Contains("past the end of the file"));
  }
  SECTION("an array count larger than the file") {
    bytes b = build_gguf({array_entry<std::int32_t>("arr", t_i32, {1, 2, 3})}, {});
    const std::uint64_t count = 1000;
    std::memcpy(&b[b.size() - 12 - 8], &count, 8);
    REQUIRE_THROWS_WITH(gguf_file(write_file("arrcount.gguf", b)),
                        Contains("'arr'") && Contains("claims 1000 elements"));
  }
  SECTION("an unknown value type") {
    bytes b = build_gguf({scalar<std::uint32_t>("general.x", t_u32, 1)}, {});
    const std::uint32_t type = 13;
    std::memcpy(&b[b.size() - 4 - 4], &type, 4);
    REQUIRE_THROWS_WITH(
        gguf_file(write_file("vtype.gguf", b)),
        Contains("'general.x'") && Contains("unknown value type 13") && Contains("0..12"));
  }
  SECTION("an array of an unknown value type") {
    bytes b = build_gguf({array_entry<std::int32_t>("arr", t_i32, {1})}, {});
    const std::uint32_t type = 0xdead;
    std::memcpy(&b[b.size() - 4 - 8 - 4], &type, 4);
    REQUIRE_THROWS_WITH(gguf_file(write_file("atype.gguf", b)),
                        Contains("'arr'") && Contains("unknown value type 57005"));
  }
  SECTION("arrays nested too deeply") {
    bytes p = array_payload(t_i32, 0, {});
    for (int i = 0; i < 12; ++i) p = array_payload(t_array, 1, p);
    REQUIRE_THROWS_WITH(gguf_file(write_file("deep.gguf", build_gguf({{"deep", t_array, p}}, {}))),
                        Contains("'deep' nests arrays deeper than 8"));
  }
  SECTION("a duplicate key") {
    REQUIRE_THROWS_WITH(
        gguf_file(write_file("dupkey.gguf", build_gguf({scalar<std::uint32_t>("k", t_u32, 1),
                                                        scalar<std::uint32_t>("k", t_u32, 2)},
                                                       {}))),
        Contains("duplicate metadata key 'k'"));
  }
  SECTION("a control byte in a key is escaped in the message") {
    bytes b = build_gguf({scalar<std::uint32_t>(std::string("a\nb", 3), 13, 1)}, {});
    REQUIRE_THROWS_WITH(gguf_file(write_file("ctl.gguf", b)), Contains("'a\\x0ab'"));
  }
}

TEST_CASE("gguf: corrupt tensor infos and data", "[gguf][corrupt]") {
  auto one_tensor = [](std::vector<std::uint64_t> dims, std::uint32_t type, std::size_t n_bytes,
                       std::optional<std::uint64_t> offset = std::nullopt) {
    return build_gguf({}, {{"blk.0.w", std::move(dims), type, bytes(n_bytes, 0), offset}});
  };
  SECTION("an unknown or unsupported tensor type names the id and the supported set") {
    REQUIRE_THROWS_WITH(gguf_file(write_file("q4k.gguf", one_tensor({256}, 12, 144))),
                        Contains("'blk.0.w' has ggml type 12 (q4_K)") && Contains("not support") &&
                            Contains("q4_1 (3)") && Contains("q8_0 (8)") && Contains("bf16 (30)"));
    REQUIRE_THROWS_WITH(gguf_file(write_file("t99.gguf", one_tensor({32}, 99, 32))),
                        Contains("ggml type 99 (unknown)"));
  }
  SECTION("tensor data past the end of the file") {
    REQUIRE_THROWS_WITH(gguf_file(write_file("past.gguf", one_tensor({32}, g_q4_1, 20, 1024))),
                        Contains("'blk.0.w'") && Contains("20 bytes at data offset 1024") &&
                            Contains("runs past the end of the file"));
    const std::uint64_t far = std::numeric_limits<std::uint64_t>::max() / 32 * 32;
    REQUIRE_THROWS_WITH(gguf_file(write_file("far.gguf", one_tensor({32}, g_q4_1, 20, far))),
                        Contains("runs past the end of the file"));
  }
  SECTION("a misaligned offset") {
    bytes b = build_gguf(
        {}, {{"a", {8}, g_f32, bytes(32, 0), std::nullopt}, {"b", {8}, g_f32, bytes(32, 0), 16}});
    REQUIRE_THROWS_WITH(
        gguf_file(write_file("misaligned.gguf", b)),
        Contains("'b' has data offset 16") && Contains("misaligned") && Contains("alignment 32"));
  }
  SECTION("too many dimensions, ragged blocks, overflowing shapes") {
    REQUIRE_THROWS_WITH(gguf_file(write_file("dims.gguf", one_tensor({1, 1, 1, 1, 1}, g_f32, 4))),
                        Contains("n_dims = 5, expected at most 4"));
    REQUIRE_THROWS_WITH(gguf_file(write_file("ragged.gguf", one_tensor({48}, g_q8_0, 68))),
                        Contains("ne[0] = 48, not a multiple of its block size 32"));
    REQUIRE_THROWS_WITH(gguf_file(write_file("overflow.gguf",
                                             one_tensor({1u << 31, 1u << 31, 1u << 31}, g_f32, 0))),
                        Contains("overflow"));
  }
  SECTION("duplicate names and overlapping tensors") {
    REQUIRE_THROWS_WITH(
        gguf_file(write_file("duptensor.gguf",
                             build_gguf({}, {{"x", {8}, g_f32, bytes(32, 0), std::nullopt},
                                             {"x", {8}, g_f32, bytes(32, 0), std::nullopt}}))),
        Contains("duplicate tensor name 'x'"));
    REQUIRE_THROWS_WITH(
        gguf_file(write_file("overlap.gguf",
                             build_gguf({}, {{"x", {16}, g_f32, bytes(64, 0), std::nullopt},
                                             {"y", {8}, g_f32, bytes(32, 0), 32}}))),
        Contains("'x'") && Contains("'y'") && Contains("overlap"));
  }
  SECTION("files that are not there or not files") {
    REQUIRE_THROWS_WITH(gguf_file("/nonexistent/kvscout/model.gguf"),
                        Contains("cannot open '/nonexistent/kvscout/model.gguf'"));
    REQUIRE_THROWS_WITH(gguf_file(fs::temp_directory_path().string()),
                        Contains("not a regular file"));
  }
}

TEST_CASE("gguf: random byte corruption never crashes", "[gguf][corrupt]") {
  // Each mutant either opens (and then every value and tensor reads without fault) or throws
  // kvscout::error. Run under ASan with load_mode::read, where a stray read would be reported.
  const bytes full = small_valid_file();
  std::mt19937 rng(2024);
  int opened = 0, rejected = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    bytes b = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const std::size_t at = rng() % b.size();
      b[at] = static_cast<unsigned char>(rng() % 3 == 0 ? 0xff : rng() & 0xff);
    }
    try {
      const gguf_file f(write_file("mutant.gguf", b), load_mode::read);
      for (const auto& v : f.metadata()) {
        if (v.is_array()) (void)v.elements();
        if (v.type() == gguf_type::string) (void)v.as<std::string>();
      }
      for (const auto& t : f.tensors()) (void)kvscout::model::dequantize(t);
      ++opened;
    } catch (const kvscout::error&) {
      ++rejected;
    }
  }
  INFO("opened " << opened << ", rejected " << rejected);
  CHECK(rejected > 0);
}

// ---- the real model -----------------------------------------------------------------------------

TEST_CASE("gguf: SmolLM2-135M-Instruct Q4_1 metadata and shapes", "[model][gguf]") {
  const auto path = model_path();
  if (!fs::exists(path)) {
    WARN("SKIP: " << path << " not found; run scripts/fetch_model.sh (or set KVSCOUT_MODEL_DIR)");
    return;
  }
  const gguf_file f(path);
  CHECK(f.version() == 3);
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_u32("llama.block_count") == 30);
  CHECK(f.get_u32("llama.attention.head_count") == 9);
  CHECK(f.get_u32("llama.attention.head_count_kv") == 3);
  CHECK(f.get_u32("llama.embedding_length") == 576);
  CHECK(f.get_u32("llama.context_length") == 8192);
  CHECK(f.get_u32("llama.feed_forward_length") == 1536);
  REQUIRE(f.contains("llama.rope.freq_base"));
  CHECK(f.get_f32("llama.rope.freq_base") > 0.0f);
  CHECK(f.get_f32("llama.attention.layer_norm_rms_epsilon") > 0.0f);

  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  const auto& emb = f.tensor("token_embd.weight");
  // ggml order: ne0 = 576 (hidden, contiguous), ne1 = vocab; stored as [vocab][576].
  REQUIRE(emb.dims.size() == 2);
  CHECK(emb.dims[0] == 576);
  CHECK(emb.dims[1] == tokens.size());
  CHECK(tokens.size() == 49152);
  CHECK(f.get_i32_array("tokenizer.ggml.token_type").size() == tokens.size());
  CHECK(f.tensor("blk.0.attn_q.weight").dims == std::vector<std::uint64_t>{576, 576});
  CHECK(f.tensor("blk.0.attn_k.weight").dims == std::vector<std::uint64_t>{576, 192});  // 3 x 64
  CHECK(f.tensor("blk.29.ffn_down.weight").dims == std::vector<std::uint64_t>{1536, 576});
  CHECK(f.tensor("output_norm.weight").dims == std::vector<std::uint64_t>{576});
  CHECK(f.tensors().size() == 2 + 9 * 30);

  std::map<std::string, int> histogram;
  for (const auto& t : f.tensors()) ++histogram[std::string(to_string(t.type))];
  std::string text;
  for (const auto& [type, count] : histogram) text += type + ": " + std::to_string(count) + "  ";
  INFO("tensor types in " << path << ": " << text);
  CHECK(histogram["q4_1"] > 0);
  SUCCEED("histogram: " << text);
}

TEST_CASE("gguf: SmolLM2-135M-Instruct every tensor dequantises to finite values",
          "[model][gguf]") {
  const auto path = model_path();
  if (!fs::exists(path)) {
    WARN("SKIP: " << path << " not found; run scripts/fetch_model.sh (or set KVSCOUT_MODEL_DIR)");
    return;
  }
  const gguf_file f(path);
  std::vector<float> buf;
  std::uint64_t total = 0;
  for (const auto& t : f.tensors()) {
    CAPTURE(t.name);
    buf.assign(static_cast<std::size_t>(t.n_elements()), std::numeric_limits<float>::quiet_NaN());
    f.dequantize(t, buf.data());
    std::size_t non_finite = 0;
    double sum_sq = 0;
    for (float v : buf) {
      if (!std::isfinite(v)) ++non_finite;
      sum_sq += static_cast<double>(v) * v;
    }
    CHECK(non_finite == 0);
    CHECK(sum_sq > 0);  // no tensor of a trained model is all zeros
    total += t.n_elements();
  }
  INFO("parameters: " << total);
  CHECK(total > 130'000'000);
  CHECK(total < 140'000'000);

  // A token's row equals the same slice of the whole table.
  const auto& emb = f.tensor("token_embd.weight");
  const auto all = f.dequantize("token_embd.weight");
  std::vector<float> row(576);
  for (std::uint64_t tok : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{49151}}) {
    kvscout::model::dequantize_row(emb, tok, row.data());
    CHECK(std::equal(row.begin(), row.end(), all.begin() + static_cast<std::ptrdiff_t>(tok * 576)));
  }
}
