// The KIVI layout (kv/kivi.hpp, kv/detail/kivi_pack.hpp) and its row sources
// (attention/kivi_rows.hpp): bit-exact packing against hand-computed bytes, the quantisation
// error against its analytic bound in fp64, the residual-window rule at every boundary (bulk and
// one-token appends, several sequences of different lengths), the address math against the
// documented shapes, gathers through gather_executor_host, decode attention over dequantised rows
// against an fp64 reference, and bad input. Seeded random data, never zeros.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvscout/core/workspace.hpp"
#include "kvscout/attention/decode.hpp"
#include "kvscout/attention/kivi_rows.hpp"
#include "kvscout/fetch/host_gather.hpp"
#include "kvscout/kv/detail/kivi_pack.hpp"
#include "kvscout/kv/kivi.hpp"
#include "kvscout/select/topk.hpp"
#include "kvscout/score/h2o.hpp"
#include "kvscout/score/oracle.hpp"
#include "kvscout/score/streaming.hpp"

namespace {

using kvscout::bfloat16;
using kvscout::half;
using Catch::Matchers::Contains;

template <class S>
double unit_roundoff() {
  return std::is_same_v<S, half> ? 0x1p-11 : 0x1p-24;
}
// Absolute rounding error below the normal range of S (fp16 subnormal spacing / 2).
template <class S>
double subnormal_error() {
  return std::is_same_v<S, half> ? 0x1p-25 : 0x1p-150;
}

template <class S>
double read_param(const std::byte* p) {
  S x;
  std::memcpy(&x, p, sizeof(S));
  return static_cast<double>(kvscout::to_float(x));
}

// The documented bit position: element c in byte c / (8 / bits), bits (c % (8 / bits)) * bits.
int ref_code(const std::uint8_t* packed, int c, int bits) {
  const int per = 8 / bits;
  return (packed[c / per] >> ((c % per) * bits)) & ((1 << bits) - 1);
}

// The analytic bound of kv/kivi.hpp for one group: min mn, max mx, stored scale s.
template <int Bits, class S>
double group_bound(double mn, double mx, double s) {
  constexpr double L = (1 << Bits) - 1;
  const double s_exact = (mx - mn) / L;
  return s / 2 + unit_roundoff<S>() * (std::abs(mn) + L * s_exact) +
         subnormal_error<S>() * (1 + L) + 8 * 0x1p-24 * (std::abs(mn) + std::abs(mx));
}

// fp64 softmax attention of g query rows against n rows given by key(i, c) / val(i, c).
template <class K, class V>
void ref_attention(int n, int D, K key, V val, const float* q, int g, double scale, double* out) {
  std::vector<double> z(static_cast<std::size_t>(n));
  for (int j = 0; j < g; ++j) {
    const float* qj = q + static_cast<std::size_t>(j) * D;
    double m = -INFINITY;
    for (int i = 0; i < n; ++i) {
      double d = 0;
      for (int c = 0; c < D; ++c) d += static_cast<double>(qj[c]) * key(i, c);
      z[i] = d * scale;
      m = std::max(m, z[i]);
    }
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += (z[i] = std::exp(z[i] - m));
    for (int c = 0; c < D; ++c) {
      double acc = 0;
      for (int i = 0; i < n; ++i) acc += z[i] * val(i, c);
      out[static_cast<std::size_t>(j) * D + c] = n > 0 ? acc / sum : 0.0;
    }
  }
}

// A batch of KIVI caches with its original (unquantised) tokens. Keys have per-channel offsets
// and scales (outlier channels, the reason KIVI quantises keys per channel); values are N(0, 1).
template <class L>
struct kivi_fixture {
  using T = typename L::element_type;
  using S = typename L::scale_type;
  static constexpr int D = L::head_dim;
  static constexpr int kbits = L::key_bits;
  static constexpr int vbits = L::value_bits;

  int num_seqs, H, cap;
  std::vector<int> target;  // final lengths
  std::vector<int32_t> lens;  // current lengths: the array the layout reads
  L l;
  kvscout::kivi_host_storage store;
  std::vector<T> k, v;  // originals [num_seqs, cap, H, D]

  kivi_fixture(std::vector<int> final_lens, int heads, kvscout::kivi_options opt,
               std::uint32_t seed, int spare = 3)
      : num_seqs(static_cast<int>(final_lens.size())),
        H(heads),
        cap(*std::max_element(final_lens.begin(), final_lens.end()) + spare),
        target(std::move(final_lens)),
        lens(static_cast<std::size_t>(num_seqs), 0),
        l(L::padded(H, cap, lens.data(), num_seqs, opt)),
        store(l) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> offset(static_cast<std::size_t>(H) * D), spread(offset.size());
    for (auto& x : offset) x = 2.f * nd(rng);
    for (auto& x : spread) x = std::exp(0.8f * nd(rng));
    const std::size_t n = static_cast<std::size_t>(num_seqs) * cap * H * D;
    k.resize(n), v.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t hc = i % (static_cast<std::size_t>(H) * D);
      k[i] = kvscout::from_float<T>(offset[hc] + spread[hc] * nd(rng));
      v[i] = kvscout::from_float<T>(nd(rng));
    }
  }

  std::size_t at(int s, int t, int h) const {
    return ((static_cast<std::size_t>(s) * cap + t) * H + h) * D;
  }
  double key(int s, int t, int h, int c) const { return kvscout::to_float(k[at(s, t, h) + c]); }
  double val(int s, int t, int h, int c) const { return kvscout::to_float(v[at(s, t, h) + c]); }

  kvscout::kivi_append_host<L> writer() { return {l, store.buffers(), lens.data()}; }

  // Appends every sequence up to its target: in one call per sequence, or one token at a time
  // round-robin over the sequences.
  void fill(bool one_at_a_time) {
    auto w = writer();
    const std::size_t tok = static_cast<std::size_t>(H) * D;
    if (!one_at_a_time) {
      for (int s = 0; s < num_seqs; ++s)
        w.append(s, target[s], {&k[at(s, 0, 0)], target[s] * tok}, {&v[at(s, 0, 0)], target[s] * tok});
      return;
    }
    for (bool more = true; more;) {
      more = false;
      for (int s = 0; s < num_seqs; ++s) {
        const int t = lens[s];
        if (t >= target[s]) continue;
        w.append(s, {&k[at(s, t, 0)], tok}, {&v[at(s, t, 0)], tok});
        more = true;
      }
    }
  }

  kvscout::kivi_view<L, kvscout::host_space> view() const { return store.buffers().view(l); }

  // Independent reading of the documented buffers: the dequantised key / value of (s, t, h, c)
  // in fp64 (q * scale + zero), or the stored window element. KIVI's rule, written out
  // (models/llama_kivi.py): keys quantised B = R (G if R = 0) at a time, values all but the R
  // most recent; a fetchable row has both.
  int block() const { return l.residual() > 0 ? l.residual() : l.group(); }
  int kqlen(int s) const { return lens[s] / block() * block(); }
  int vqlen(int s) const { return std::max(0, lens[s] - l.residual()); }
  int qlen(int s) const { return std::min(kqlen(s), vqlen(s)); }
  const std::byte* key_record(int s, int t, int h) const {
    const std::size_t Qc = static_cast<std::size_t>(l.quantized_capacity());
    return store.buffers().k_codes.data() + ((s * static_cast<std::size_t>(H) + h) * Qc + t) * l.k_row_bytes();
  }
  const std::byte* value_record(int s, int t, int h) const {
    const std::size_t Qc = static_cast<std::size_t>(l.quantized_capacity());
    return store.buffers().v_records.data() + ((s * static_cast<std::size_t>(H) + h) * Qc + t) * l.v_row_bytes();
  }
  const std::byte* key_params(int s, int j, int h) const {
    const std::size_t groups = static_cast<std::size_t>(l.quantized_capacity() / l.group());
    return store.buffers().k_params.data() +
           ((s * static_cast<std::size_t>(H) + h) * groups + j) * 2 * D * sizeof(S);
  }
  double residual(bool is_key, int s, int t, int h, int c) const {
    const std::size_t W = static_cast<std::size_t>(block());
    const std::byte* base = is_key ? store.buffers().k_residual.data() : store.buffers().v_residual.data();
    T x;
    std::memcpy(&x, base + (((s * static_cast<std::size_t>(H) + h) * W + t % W) * D + c) * sizeof(T), sizeof(T));
    return kvscout::to_float(x);
  }
  // From the records (t < kqlen / vqlen): what attention reads for a fetched row.
  double rec_key(int s, int t, int h, int c) const {
    const auto* rec = reinterpret_cast<const std::uint8_t*>(key_record(s, t, h));
    const std::byte* p = key_params(s, t / l.group(), h);
    return ref_code(rec, c, kbits) * read_param<S>(p + c * sizeof(S)) +
           read_param<S>(p + (D + c) * sizeof(S));
  }
  double rec_val(int s, int t, int h, int c) const {
    const std::byte* r = value_record(s, t, h);
    const int j = c / l.group(), groups = D / l.group();
    const std::size_t codes = static_cast<std::size_t>(D) * vbits / 8;
    return ref_code(reinterpret_cast<const std::uint8_t*>(r), c, vbits) *
               read_param<S>(r + codes + j * sizeof(S)) +
           read_param<S>(r + codes + (groups + j) * sizeof(S));
  }
  // What attention reads for token t: its records when fetchable, else its window rows.
  double deq_key(int s, int t, int h, int c) const {
    return t < qlen(s) ? rec_key(s, t, h, c) : residual(true, s, t, h, c);
  }
  double deq_val(int s, int t, int h, int c) const {
    return t < qlen(s) ? rec_val(s, t, h, c) : residual(false, s, t, h, c);
  }
};

}  // namespace

// ---- packing --------------------------------------------------------------------------------

TEST_CASE("kivi pack: bytes equal the hand-computed example and unpack returns the codes",
          "[kivi]") {
  using namespace kvscout::detail;
  {
    const std::uint8_t codes[8] = {0, 1, 2, 3, 3, 2, 1, 0};
    std::uint8_t packed[2] = {0xAA, 0xAA};
    kivi_pack<2>(codes, 8, packed);
    // byte 0 = 0 | 1 << 2 | 2 << 4 | 3 << 6 = 0xE4; byte 1 = 3 | 2 << 2 | 1 << 4 | 0 << 6 = 0x1B
    REQUIRE(packed[0] == 0xE4);
    REQUIRE(packed[1] == 0x1B);
  }
  {
    const std::uint8_t codes[4] = {0x1, 0xF, 0x7, 0x0};
    std::uint8_t packed[2] = {0xAA, 0xAA};
    kivi_pack<4>(codes, 4, packed);
    REQUIRE(packed[0] == 0xF1);  // element 0 in the low nibble
    REQUIRE(packed[1] == 0x07);
  }
  std::mt19937 rng(3);
  for (int bits : {2, 4}) {
    CAPTURE(bits);
    const int n = 256;
    std::vector<std::uint8_t> codes(n), packed(static_cast<std::size_t>(n) * bits / 8, 0x5A),
        back(n, 0xFF);
    for (auto& c : codes) c = static_cast<std::uint8_t>(rng() % (1u << bits));
    if (bits == 2) {
      kivi_pack<2>(codes.data(), n, packed.data());
      kivi_unpack<2>(packed.data(), n, back.data());
    } else {
      kivi_pack<4>(codes.data(), n, packed.data());
      kivi_unpack<4>(packed.data(), n, back.data());
    }
    REQUIRE(back == codes);
    for (int c = 0; c < n; ++c) {
      REQUIRE(ref_code(packed.data(), c, bits) == codes[c]);
      // Little-endian 32-bit words: element c at bit (c * bits) % 32 of word (c * bits) / 32.
      std::uint32_t word = 0;
      for (int b = 0; b < 4; ++b)
        word |= static_cast<std::uint32_t>(packed[(c * bits / 32) * 4 + b]) << (8 * b);
      REQUIRE(((word >> ((c * bits) % 32)) & ((1u << bits) - 1)) == codes[c]);
      const std::uint32_t code = bits == 2 ? kivi_code<2>(packed.data(), c) : kivi_code<4>(packed.data(), c);
      REQUIRE(code == codes[c]);
    }
  }
}

TEST_CASE("kivi records: a hand-computed cache, byte for byte", "[kivi]") {
  // D = 16, G = 2, R = 0, 2 bits, fp16: one key group of tokens 0 and 1.
  //   keys:   token 0 channel c = c % 4,     token 1 channel c = 3 - c % 4
  //           per channel the smaller value gets code 0, the larger code 3:
  //           token 0 codes (0, 0, 3, 3) per 4 channels -> byte 0b11110000 = 0xF0
  //           token 1 codes (3, 3, 0, 0)                -> byte 0b00001111 = 0x0F
  //   values: token 0 channel c = c % 4: groups (0, 1), (2, 3): codes (0, 3, 0, 3) -> 0xCC,
  //           scales fp16(1/3) = 0x3555, zeros 0 (0x0000) and 2 (0x4000) alternating.
  using L = kvscout::kivi_layout<half, 16, 2>;
  std::vector<int32_t> lens = {0};
  const L l = L::padded(1, 2, lens.data(), 1, {.group = 2, .residual = 0});
  REQUIRE(l.k_row_bytes() == 16);  // 4 code bytes + 12 padding
  REQUIRE(l.v_row_bytes() == 48);  // 4 code bytes + 8 scales + 8 zeros (fp16) = 36 -> 48
  kvscout::kivi_host_storage store(l);
  const auto b = store.buffers();
  // Poison every buffer: the writer must write every byte of a record, padding included.
  std::memset(b.k_codes.data(), 0xA5, b.k_codes.size());
  std::memset(b.v_records.data(), 0xA5, b.v_records.size());
  kvscout::kivi_append_host<L> w(l, b, lens.data());
  std::vector<half> k(32), v(32);
  for (int c = 0; c < 16; ++c) {
    k[c] = kvscout::from_float<half>(static_cast<float>(c % 4));
    k[16 + c] = kvscout::from_float<half>(static_cast<float>(3 - c % 4));
    v[c] = kvscout::from_float<half>(static_cast<float>(c % 4));
    v[16 + c] = kvscout::from_float<half>(static_cast<float>(c % 4));
  }
  w.append(0, {k.data(), 16}, {v.data(), 16});
  REQUIRE(lens[0] == 1);
  REQUIRE(l.seq_len(0) == 0);  // one token: the group is not complete
  w.append(0, {k.data() + 16, 16}, {v.data() + 16, 16});
  REQUIRE(lens[0] == 2);
  REQUIRE(l.seq_len(0) == 2);
  REQUIRE(l.residual_len(0) == 0);
  const auto* kc = reinterpret_cast<const std::uint8_t*>(b.k_codes.data());
  const std::vector<std::uint8_t> k0(kc, kc + 16), k1(kc + 16, kc + 32);
  REQUIRE(k0 == std::vector<std::uint8_t>{0xF0, 0xF0, 0xF0, 0xF0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  REQUIRE(k1 == std::vector<std::uint8_t>{0x0F, 0x0F, 0x0F, 0x0F, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  const auto* vr = reinterpret_cast<const std::uint8_t*>(b.v_records.data());
  std::vector<std::uint8_t> expect = {0xCC, 0xCC, 0xCC, 0xCC};
  for (int j = 0; j < 8; ++j) expect.insert(expect.end(), {0x55, 0x35});  // scales 1/3
  for (int j = 0; j < 8; ++j) expect.insert(expect.end(), {0x00, static_cast<std::uint8_t>(j % 2 ? 0x40 : 0x00)});
  expect.resize(48, 0);
  REQUIRE(std::vector<std::uint8_t>(vr, vr + 48) == expect);
  REQUIRE(std::vector<std::uint8_t>(vr + 48, vr + 96) == expect);  // token 1 has the same values
  // Key group parameters: channel c has {c % 4, 3 - c % 4}: scale 1 or 1/3, zero min(...).
  const auto* kp = reinterpret_cast<const half*>(b.k_params.data());
  for (int c = 0; c < 16; ++c) {
    const float lo = static_cast<float>(std::min(c % 4, 3 - c % 4));
    const float hi = static_cast<float>(std::max(c % 4, 3 - c % 4));
    CAPTURE(c);
    REQUIRE(kvscout::to_float(kp[c]) == kvscout::to_float(kvscout::from_float<half>((hi - lo) / 3.f)));
    REQUIRE(kvscout::to_float(kp[16 + c]) == lo);
  }
}

TEST_CASE("kivi half -> float conversion is exact for every bit pattern", "[kivi]") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    __half_raw r;
    r.x = static_cast<unsigned short>(h);
    const float ref = __half2float(half(r));
    const float got = kvscout::detail::kivi_half_bits_to_float(h);
    CAPTURE(h, ref, got);
    if (std::isnan(ref)) {
      REQUIRE(std::isnan(got));
    } else {
      REQUIRE(std::memcmp(&ref, &got, sizeof(float)) == 0);
    }
  }
}

// ---- quantisation error ----------------------------------------------------------------------

namespace {
template <int B, class S, class T>
struct quant_case {
  static constexpr int bits = B;
  using scale = S;
  using element = T;
};
}  // namespace

TEMPLATE_TEST_CASE("kivi quantise / dequantise: every element within its group's analytic bound",
                   "[kivi]", (quant_case<2, half, half>), (quant_case<4, half, half>),
                   (quant_case<2, float, half>), (quant_case<4, float, float>),
                   (quant_case<2, half, float>), (quant_case<4, half, bfloat16>)) {
  constexpr int B = TestType::bits;
  using S = typename TestType::scale;
  using T = typename TestType::element;
  using namespace kvscout::detail;
  constexpr int D = 128;
  std::mt19937 rng(11 + B);
  std::normal_distribution<float> nd(0.f, 1.f);
  // The worst error / bound over every element, and where it was.
  double worst_ratio = 0;
  std::string worst_at;
  auto check = [&](double got, double x, double mn, double mx, double s, const char* what, int G,
                   int trial, int c) {
    const double bound = group_bound<B, S>(mn, mx, s);
    const double err = std::abs(got - x);
    const double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0);
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst_at = std::string(what) + " G=" + std::to_string(G) + " trial=" + std::to_string(trial) +
                 " c=" + std::to_string(c) + " x=" + std::to_string(x) + " x'=" +
                 std::to_string(got) + " err=" + std::to_string(err) + " bound=" +
                 std::to_string(bound);
    }
  };
  int constant_groups = 0;
  for (int G : {1, 2, 16, 32, 128}) {
    for (int trial = 0; trial < 40; ++trial) {
      // Trials: plain, offset, wide, tiny ranges (down to fp16 subnormal scales), constant.
      const float off = trial % 5 == 1 ? 50.f * nd(rng) : 0.f;
      const float spread = trial % 5 == 2 ? 300.f : (trial % 5 == 3 ? 1e-4f : 1.f);
      std::vector<T> x(D);
      for (auto& e : x) e = kvscout::from_float<T>(off + spread * nd(rng));
      if (trial % 5 == 4) std::fill(x.begin(), x.begin() + G, x[0]);  // a constant group
      auto xf = [&](int c) { return static_cast<double>(kvscout::to_float(x[c])); };

      // Values: one row, groups of G channels.
      std::vector<std::uint8_t> codes(D * B / 8);
      std::vector<S> scales(D / G), zeros(D / G);
      kivi_quantize_value_row<B, S, T>(x.data(), D, G, codes.data(), scales.data(), zeros.data());
      std::vector<float> back(D, -7.f);
      kivi_dequantize_value_row<B, S>(codes.data(), scales.data(), zeros.data(), D, G, back.data());
      for (int j = 0; j < D / G; ++j) {
        double mn = INFINITY, mx = -INFINITY;
        for (int c = j * G; c < (j + 1) * G; ++c) mn = std::min(mn, xf(c)), mx = std::max(mx, xf(c));
        const double s = kvscout::to_float(scales[j]), z = kvscout::to_float(zeros[j]);
        CAPTURE(G, trial, j, mn, mx, s, z);
        // The stored parameters are the roundings of the exact ones.
        REQUIRE(std::abs(z - mn) <= unit_roundoff<S>() * std::abs(mn) + subnormal_error<S>());
        const double s_exact = (mx - mn) / ((1 << B) - 1);
        REQUIRE(std::abs(s - s_exact) <=
                (unit_roundoff<S>() + 0x1p-22) * s_exact + subnormal_error<S>());
        for (int c = j * G; c < (j + 1) * G; ++c) check(back[c], xf(c), mn, mx, s, "value", G, trial, c);
        if (mn == mx) {  // constant group: scale 0, codes 0, x' = zero exactly
          ++constant_groups;
          REQUIRE(s == 0.0);
          for (int c = j * G; c < (j + 1) * G; ++c) {
            REQUIRE(ref_code(codes.data(), c, B) == 0);
            REQUIRE(back[c] == static_cast<float>(z));
          }
        }
      }

      // Keys: G tokens of D channels, token i channel c = x[(i * 7 + c) % D]; per channel one
      // group over the G tokens.
      std::vector<std::vector<T>> rows(static_cast<std::size_t>(G), std::vector<T>(D));
      std::vector<const T*> ptrs(static_cast<std::size_t>(G));
      for (int i = 0; i < G; ++i) {
        for (int c = 0; c < D; ++c) rows[i][c] = x[(i * 7 + c) % D];
        ptrs[i] = rows[i].data();
      }
      const std::size_t stride = D * B / 8 + 16;  // records further apart than their codes
      std::vector<std::uint8_t> recs(stride * G, 0xEE);
      std::vector<S> ks(D), kz(D);
      kivi_quantize_key_group<B, S, T>(ptrs.data(), G, D, ks.data(), kz.data(), recs.data(), stride);
      std::vector<double> mn(D, INFINITY), mx(D, -INFINITY);
      for (int i = 0; i < G; ++i)
        for (int c = 0; c < D; ++c) {
          const double v = kvscout::to_float(rows[i][c]);
          mn[c] = std::min(mn[c], v), mx[c] = std::max(mx[c], v);
        }
      for (int i = 0; i < G; ++i) {
        for (std::size_t b = D * B / 8; b < stride; ++b) REQUIRE(recs[i * stride + b] == 0xEE);
        kivi_dequantize_key_row<B, S>(recs.data() + i * stride, ks.data(), kz.data(), D, back.data());
        for (int c = 0; c < D; ++c)
          check(back[c], kvscout::to_float(rows[i][c]), mn[c], mx[c], kvscout::to_float(ks[c]), "key",
                G, trial, c);
      }
    }
  }
  INFO("worst error / bound = " << worst_ratio << " at " << worst_at);
  REQUIRE(worst_ratio <= 1.0);
  REQUIRE(worst_ratio > 0.3);  // and the bound is not vacuous: errors come near it
  REQUIRE(constant_groups > 0);
}

// ---- layout ----------------------------------------------------------------------------------

TEST_CASE("kivi record sizes: bytes moved per row", "[kivi]") {
  std::vector<int32_t> lens = {0};
  auto sizes = [&](auto layout_tag) {
    using L = typename decltype(layout_tag)::type;
    const L l = L::padded(1, 256, lens.data(), 1);
    return std::pair<std::size_t, std::size_t>(l.k_row_bytes(), l.v_row_bytes());
  };
  using kvscout::kivi_layout;
  // head_dim 64 / 128, 2 / 4 bits, fp16 / fp32 scales, G = 32 (the defaults).
  REQUIRE(sizes(std::type_identity<kivi_layout<half, 64, 2>>{}) == std::pair<std::size_t, std::size_t>{16, 32});
  REQUIRE(sizes(std::type_identity<kivi_layout<half, 64, 4>>{}) == std::pair<std::size_t, std::size_t>{32, 48});
  REQUIRE(sizes(std::type_identity<kivi_layout<half, 128, 2>>{}) == std::pair<std::size_t, std::size_t>{32, 48});
  REQUIRE(sizes(std::type_identity<kivi_layout<half, 128, 4>>{}) == std::pair<std::size_t, std::size_t>{64, 80});
  REQUIRE(sizes(std::type_identity<kivi_layout<half, 64, 2, float>>{}) == std::pair<std::size_t, std::size_t>{16, 32});
  REQUIRE(sizes(std::type_identity<kivi_layout<half, 64, 4, float>>{}) == std::pair<std::size_t, std::size_t>{32, 48});
  REQUIRE(sizes(std::type_identity<kivi_layout<half, 128, 2, float>>{}) == std::pair<std::size_t, std::size_t>{32, 64});
  REQUIRE(sizes(std::type_identity<kivi_layout<half, 128, 4, float>>{}) == std::pair<std::size_t, std::size_t>{64, 96});
  // KIVI-2 at head_dim 128 moves 80 of fp16's 512 bytes per row: ratio 0.156 <= 0.25.
  REQUIRE(32 + 48 <= 512 / 4);
}

TEST_CASE("kivi layout: address math against the documented shapes", "[kivi]") {
  using L = kvscout::kivi_layout<half, 64, 4, float>;
  std::vector<int32_t> lens = {0, 300, 45, 97};
  const int H = 3, cap = 301, G = 16, R = 32;
  const L l = L::padded(H, cap, lens.data(), 4, {.group = G, .residual = R});
  l.validate(l.required_k_bytes(), l.required_v_bytes());
  const int Kq = cap / R * R;                 // 288 keys quantised at capacity
  const int Qc = std::max(Kq, cap - R);       // record slots: 288 (values: 269)
  REQUIRE(l.quantized_capacity() == Qc);
  REQUIRE(l.key_groups() == Kq / G);
  REQUIRE(l.residual_slots() == R);
  const std::size_t kr = 32, vr = 32 + 2 * (64 / G) * 4;  // 64: already a multiple of 16
  REQUIRE(l.k_row_bytes() == kr);
  REQUIRE(l.v_row_bytes() == vr);
  REQUIRE(l.v_scales_offset() == 32);
  REQUIRE(l.v_zeros_offset() == 32 + (64 / G) * 4);
  REQUIRE(l.required_k_bytes() == 4u * H * Qc * kr);
  REQUIRE(l.required_v_bytes() == 4u * H * Qc * vr);
  REQUIRE(l.required_k_params_bytes() == 4u * H * (Kq / G) * 2 * 64 * 4);
  REQUIRE(l.required_residual_bytes() == 4u * H * R * 64 * 2);
  for (int s = 0; s < 4; ++s) {
    const int q = std::min(lens[s] / R * R, std::max(0, lens[s] - R));
    CAPTURE(s);
    REQUIRE(l.total_len(s) == lens[s]);
    REQUIRE(l.seq_len(s) == q);
    REQUIRE(l.residual_len(s) == lens[s] - q);
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < q; ++t) {
        const std::size_t rec = (static_cast<std::size_t>(s) * H + h) * Qc + t;
        REQUIRE(l.k_offset(s, t, h) == rec * kr);
        REQUIRE(l.v_offset(s, t, h) == rec * vr);
        REQUIRE(l.contiguous_rows(s, t, h, 1000) == q - t);
        REQUIRE(l.contiguous_rows(s, t, h, 2) == std::min(2, q - t));
        const auto ro = kvscout::detail::checked_row_offsets(l, s, t, h);
        REQUIRE(ro.k == rec * kr);
      }
      for (int j = 0; j < Kq / G; ++j)
        REQUIRE(l.k_params_offset(s, j, h) == ((static_cast<std::size_t>(s) * H + h) * (Kq / G) + j) * 2 * 64 * 4);
      for (int t = q; t < lens[s]; ++t)
        REQUIRE(l.residual_offset(s, t, h) ==
                ((static_cast<std::size_t>(s) * H + h) * R + t % R) * 64 * 2);
    }
    // Executors see the quantised tokens only.
    if (q < lens[s])
      REQUIRE_THROWS_WITH(kvscout::detail::checked_row_offsets(l, s, q, 0),
                          Contains("out of range"));
  }
  std::vector<int32_t> ql(4, -1);
  l.fill_quantized_lens({ql.data(), ql.size()});
  REQUIRE(ql == std::vector<int32_t>{0, 268, 13, 65});  // min(32 floor(len / 32), len - 32)
}

TEST_CASE("kivi rule: KIVI's key and value windows at every boundary", "[kivi]") {
  using L = kvscout::kivi_layout<half, 128, 2>;
  std::vector<int32_t> lens = {0};
  for (int G : {1, 4, 32, 128}) {
    for (int mult : {0, 1, 2, 4}) {
      const int R = G * mult;
      CAPTURE(G, R);
      const L l = L::padded(1, 2000, lens.data(), 1, {.group = G, .residual = R});
      // KIVI's decode step, as its code does it (models/llama_kivi.py): the new key joins the
      // full-precision keys, which are quantised together when they reach R; the new value
      // joins the full-precision values, and the oldest is quantised when there are R + 1.
      // R = 0 (kvscout's extension): keys a group of G at a time, values at once.
      const int B = R > 0 ? R : G;
      int kq = 0, kfull = 0, vq = 0, vfull = 0;
      for (int len = 0; len <= 1000; ++len) {
        if (len > 0) {
          if (++kfull == B) kq += B, kfull = 0;
          if (++vfull > R) ++vq, --vfull;
        }
        CAPTURE(len);
        REQUIRE(l.key_quantized_len_for(len) == kq);
        REQUIRE(l.value_quantized_len_for(len) == vq);
        REQUIRE(l.quantized_len_for(len) == std::min(kq, vq));
        REQUIRE(len - vq == std::min(len, R));  // exactly the R most recent values stay
        REQUIRE(len - kq < B);                   // 0 to B - 1 keys stay
        REQUIRE(len - l.quantized_len_for(len) <= l.residual_slots());  // the window fits
      }
      // The named boundaries.
      for (int len : {R - 1, R, R + 1, 2 * R - 1, 2 * R, 2 * R + 1, G - 1, G, G + 1}) {
        if (len < 0) continue;
        REQUIRE(l.key_quantized_len_for(len) == len / B * B);
        REQUIRE(l.value_quantized_len_for(len) == std::max(0, len - R));
      }
    }
  }
  // Over lengths 2048-4095 with R = 128, G = 32: on average 63.5 keys and exactly 128 values
  // stay in full precision (the old shared window kept 143.5 of both).
  const L l = L::padded(1, 4096, lens.data(), 1, {.group = 32, .residual = 128});
  double keys = 0, values = 0;
  for (int len = 2048; len < 4096; ++len) {
    keys += len - l.key_quantized_len_for(len);
    values += len - l.value_quantized_len_for(len);
  }
  REQUIRE(keys / 2048 == 63.5);
  REQUIRE(values / 2048 == 128.0);
  // A capacity below the key block: the ring holds the capacity (no flush can come), not R slots.
  {
    using H = kvscout::kivi_layout<half, 64, 2>;
    std::vector<int32_t> one = {0};
    const H small = H::padded(2, 50, one.data(), 1, {.group = 32, .residual = 128});
    REQUIRE(small.residual_slots() == 50);
    REQUIRE(small.required_residual_bytes() == 2u * 50 * 64 * sizeof(half));
    REQUIRE(small.quantized_capacity() == 0);
    kvscout::kivi_host_storage st(small);
    kvscout::kivi_append_host<H> w(small, st.buffers(), one.data());
    std::vector<half> tok(2 * 64);
    for (int t = 0; t < 50; ++t) {
      for (std::size_t i = 0; i < tok.size(); ++i)
        tok[i] = kvscout::from_float<half>(static_cast<float>((t * 7 + static_cast<int>(i)) % 11) - 5.f);
      w.append(0, {tok.data(), tok.size()}, {tok.data(), tok.size()});
    }
    const kvscout::kivi_layout_rows_host rows(st.buffers().view(small));
    std::vector<float> got(64);
    rows.load_k(0, 1, 49, got.data());  // the last token, read back from its own slot, exactly
    for (int c = 0; c < 64; ++c) REQUIRE(got[c] == kvscout::to_float(tok[64 + c]));
    REQUIRE(small.seq_len(0) == 0);
  }
  // R must be a multiple of G (KIVI asserts it).
  REQUIRE_THROWS_WITH(L::padded(1, 64, lens.data(), 1, {.group = 32, .residual = 48}),
                      Contains("residual length R = 48") &&
                          Contains("multiple of the group size G = 32"));
}

TEMPLATE_TEST_CASE("kivi streaming append: bulk and one-token appends agree, every element within "
                   "its bound, the window as KIVI's rule says",
                   "[kivi]", (kvscout::kivi_layout<half, 64, 2>),
                   (kvscout::kivi_layout<half, 128, 4>), (kvscout::kivi_layout<float, 64, 4, float>),
                   (kvscout::kivi_layout<bfloat16, 64, 2, float>),
                   (kvscout::kivi_layout<half, 64, kvscout::kivi_bits{2, 4}>),
                   (kvscout::kivi_layout<half, 64, kvscout::kivi_bits{4, 2}>)) {
  using L = TestType;
  using S = typename L::scale_type;
  using T = typename L::element_type;
  constexpr int D = L::head_dim;
  const int G = 16;
  const int R = GENERATE(32, 16, 0);
  CAPTURE(R);
  // Lengths around every boundary (R - 1, R, R + 1, 2R +- 1, G +- 1, several blocks) and an
  // empty sequence.
  std::vector<int> lens = {G - 1, G, G + 1, 5 * G + 3, 0, 1};
  for (int x : {R - 1, R, R + 1, 2 * R - 1, 2 * R, 2 * R + 1})
    if (x >= 0) lens.push_back(x);
  kivi_fixture<L> bulk(lens, 2, {.group = G, .residual = R}, 21);
  kivi_fixture<L> stream(lens, 2, {.group = G, .residual = R}, 21);
  bulk.fill(false);
  stream.fill(true);
  REQUIRE(bulk.lens == std::vector<int32_t>(lens.begin(), lens.end()));
  REQUIRE(stream.lens == bulk.lens);
  auto same = [](kvscout::host_span<std::byte> a, kvscout::host_span<std::byte> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
  };
  const auto bb = bulk.store.buffers(), sb = stream.store.buffers();
  REQUIRE(same(bb.k_codes, sb.k_codes));
  REQUIRE(same(bb.v_records, sb.v_records));
  REQUIRE(same(bb.k_params, sb.k_params));
  REQUIRE(same(bb.k_residual, sb.k_residual));
  REQUIRE(same(bb.v_residual, sb.v_residual));

  auto& f = bulk;
  constexpr int KB = L::key_bits, VB = L::value_bits;
  const kvscout::kivi_layout_rows_host rows(f.view());
  std::vector<float> kbuf(D), vbuf(D);
  int window_keys = 0, window_values = 0;  // window rows held dequantised
  for (int s = 0; s < f.num_seqs; ++s) {
    const int q = f.qlen(s), kq = f.kqlen(s), vq = f.vqlen(s);
    REQUIRE(f.l.seq_len(s) == q);
    REQUIRE(f.l.residual_len(s) == lens[s] - q);
    for (int h = 0; h < f.H; ++h) {
      REQUIRE(rows.rows(s, h) == lens[s]);
      for (int t = 0; t < lens[s]; ++t) {
        CAPTURE(s, h, t, q, kq, vq);
        REQUIRE(rows.token(s, h, t) == t);
        rows.load_k(s, h, t, kbuf.data());
        rows.load_v(s, h, t, vbuf.data());
        for (int c = 0; c < D; ++c) {
          // The row source and the independent reading of the documented buffers agree.
          REQUIRE(std::abs(kbuf[c] - f.deq_key(s, t, h, c)) <= 1e-6 * (1 + std::abs(kbuf[c])));
          REQUIRE(std::abs(vbuf[c] - f.deq_val(s, t, h, c)) <= 1e-6 * (1 + std::abs(vbuf[c])));
          // In the window: a quantised key (value) is its record's dequantisation rounded once
          // to T; a key (value) not yet quantised is the original, exactly.
          if (t >= q) {
            const double kw = f.residual(true, s, t, h, c), vw = f.residual(false, s, t, h, c);
            if (t < kq) {
              REQUIRE(kw == kvscout::to_float(kvscout::from_float<T>(static_cast<float>(f.rec_key(s, t, h, c)))));
            } else {
              REQUIRE(kw == f.key(s, t, h, c));
            }
            if (t < vq) {
              REQUIRE(vw == kvscout::to_float(kvscout::from_float<T>(static_cast<float>(f.rec_val(s, t, h, c)))));
            } else {
              REQUIRE(vw == f.val(s, t, h, c));
            }
          }
        }
        if (t >= q && t < kq && h == 0) ++window_keys;
        if (t >= q && t < vq && h == 0) ++window_values;
        // Every quantised key within its group's bound (plus, in the window, one rounding to T).
        const double round_t = std::is_same_v<T, float> ? 0.0 : (std::is_same_v<T, half> ? 0x1p-11 : 0x1p-8);
        if (t < kq) {
          const int j = t / G;
          for (int c = 0; c < D; ++c) {
            double mn = INFINITY, mx = -INFINITY;
            for (int u = j * G; u < (j + 1) * G; ++u) {
              mn = std::min(mn, f.key(s, u, h, c));
              mx = std::max(mx, f.key(s, u, h, c));
            }
            const double sc = read_param<S>(f.key_params(s, j, h) + c * sizeof(S));
            REQUIRE(read_param<S>(f.key_params(s, j, h) + (D + c) * sizeof(S)) ==
                    kvscout::to_float(kvscout::from_float<S>(static_cast<float>(mn))));
            REQUIRE(std::abs(kbuf[c] - f.key(s, t, h, c)) <=
                    group_bound<KB, S>(mn, mx, sc) + round_t * std::abs(kbuf[c]));
          }
        }
        // Every quantised value: groups of G channels of this token.
        if (t < vq) {
          for (int g = 0; g < D / G; ++g) {
            double mn = INFINITY, mx = -INFINITY;
            for (int c = g * G; c < (g + 1) * G; ++c) {
              mn = std::min(mn, f.val(s, t, h, c));
              mx = std::max(mx, f.val(s, t, h, c));
            }
            const double sc = read_param<S>(f.value_record(s, t, h) + D * VB / 8 + g * sizeof(S));
            for (int c = g * G; c < (g + 1) * G; ++c)
              REQUIRE(std::abs(vbuf[c] - f.val(s, t, h, c)) <=
                      group_bound<VB, S>(mn, mx, sc) + round_t * std::abs(vbuf[c]));
          }
        }
      }
    }
  }
  // The window held quantised keys (R > 0) or quantised values (R = 0): the cases were reached.
  if (R > 0) {
    REQUIRE(window_keys > 0);
    REQUIRE(window_values == 0);
  } else {
    REQUIRE(window_values > 0);
    REQUIRE(window_keys == 0);
  }
}

// ---- gather ----------------------------------------------------------------------------------

TEST_CASE("kivi gather: gather_executor_host copies the selected records unchanged", "[kivi]") {
  using L = kvscout::kivi_layout<half, 128, 2>;
  kivi_fixture<L> f({700, 33, 260, 161}, 3, {.group = 32, .residual = 64}, 8);
  f.fill(false);
  const auto kv = f.view();
  const int cap = 200;
  std::mt19937 rng(4);
  std::vector<int32_t> idx(static_cast<std::size_t>(f.num_seqs) * f.H * cap, -1),
      counts(static_cast<std::size_t>(f.num_seqs) * f.H);
  for (int s = 0; s < f.num_seqs; ++s)
    for (int h = 0; h < f.H; ++h) {
      int n = 0;
      for (int t = 0; t < f.l.seq_len(s) && n < cap; ++t)
        if (rng() % 4 == 0 || (t % 40 < 6)) idx[(s * f.H + h) * cap + n++] = t;  // runs, scattered
      counts[s * f.H + h] = n;
    }
  const kvscout::selection_view<kvscout::host_space> sel{
      {idx.data(), idx.size()}, {counts.data(), counts.size()}, f.num_seqs, f.H, cap};
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    using ex_t = kvscout::gather_executor_host<L>;
    const kvscout::host_gather_config cfg{{.num_seqs = f.num_seqs, .num_kv_heads = f.H}, cap,
                                          threads};
    const auto ws = kvscout::make_workspace<ex_t>(cfg);
    ex_t ex(cfg, ws.span());
    const std::size_t slots = idx.size();
    std::vector<std::byte> dk_raw(slots * f.l.k_row_bytes() + 16), dv_raw(slots * f.l.v_row_bytes() + 16);
    auto align = [](std::vector<std::byte>& raw) {
      auto p = reinterpret_cast<std::uintptr_t>(raw.data());
      return raw.data() + ((16 - p % 16) % 16);
    };
    std::byte* dk = align(dk_raw);
    std::byte* dv = align(dv_raw);
    std::memset(dk, 0x7B, slots * f.l.k_row_bytes());  // poison
    std::memset(dv, 0x7B, slots * f.l.v_row_bytes());
    const kvscout::gather_destination<kvscout::host_space> dst{{dk, slots * f.l.k_row_bytes()},
                                                                {dv, slots * f.l.v_row_bytes()}};
    ex.submit(kv.quantized(), sel, dst).wait();
    for (int s = 0; s < f.num_seqs; ++s)
      for (int h = 0; h < f.H; ++h)
        for (int i = 0; i < counts[s * f.H + h]; ++i) {
          const int t = idx[(s * f.H + h) * cap + i];
          const std::size_t slot = (static_cast<std::size_t>(s) * f.H + h) * cap + i;
          CAPTURE(s, h, i, t);
          REQUIRE(std::memcmp(dk + slot * f.l.k_row_bytes(), f.key_record(s, t, h), f.l.k_row_bytes()) == 0);
          REQUIRE(std::memcmp(dv + slot * f.l.v_row_bytes(), f.value_record(s, t, h), f.l.v_row_bytes()) == 0);
        }
    // The gathered rows read back as the cache's rows.
    const kvscout::kivi_gathered_rows_host rows(f.l, sel, dst, kv.resident);
    const kvscout::kivi_layout_rows_host dense(kv);
    std::vector<float> a(128), b(128);
    for (int s = 0; s < f.num_seqs; ++s)
      for (int h = 0; h < f.H; ++h) {
        const int n = counts[s * f.H + h];
        REQUIRE(rows.rows(s, h) == n + f.l.residual_len(s));
        for (int i = 0; i < rows.rows(s, h); ++i) {
          const int t = rows.token(s, h, i);
          REQUIRE(t == (i < n ? idx[(s * f.H + h) * cap + i] : f.l.seq_len(s) + i - n));
          rows.load_k(s, h, i, a.data());
          dense.load_k(s, h, t, b.data());
          REQUIRE(a == b);
          rows.load_v(s, h, i, a.data());
          dense.load_v(s, h, t, b.data());
          REQUIRE(a == b);
        }
      }
    // A residual token selected (the lengths a selector got were the total, not the quantised
    // ones): refused, and the message says what a KIVI layout's seq_len counts.
    auto bad = idx;
    auto bad_counts = counts;
    bad_counts[0] = 1;
    bad[0] = f.l.seq_len(0);  // the first residual token of sequence 0
    const kvscout::selection_view<kvscout::host_space> total_lens{
        {bad.data(), bad.size()}, {bad_counts.data(), bad_counts.size()}, f.num_seqs, f.H, cap};
    REQUIRE_THROWS_WITH(ex.submit(kv.quantized(), total_lens, dst),
                        Contains("is out of range [0, seq_len = 636)") &&
                            Contains("a KIVI layout's seq_len is its quantised length"));
  }
}

// ---- attention -------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("kivi attention: dense and sparse over KIVI rows match fp64 attention on the "
                   "dequantised values",
                   "[kivi][attention]", (kvscout::kivi_layout<half, 64, 2>),
                   (kvscout::kivi_layout<half, 128, 4>), (kvscout::kivi_layout<half, 64, 4, float>)) {
  using L = TestType;
  using T = typename L::element_type;
  constexpr int D = L::head_dim;
  const int H = 2, g = 4, Hq = H * g;
  kivi_fixture<L> f({300, 17, 161, 95}, H, {.group = 32, .residual = 32}, 77);
  f.fill(true);
  const auto kv = f.view();
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(static_cast<std::size_t>(f.num_seqs) * Hq * D);
  for (auto& x : q) x = nd(rng);
  std::vector<T> kc(static_cast<std::size_t>(f.num_seqs) * H * D), vc(kc.size());
  for (auto& x : kc) x = kvscout::from_float<T>(nd(rng));
  for (auto& x : vc) x = kvscout::from_float<T>(nd(rng));
  const kvscout::current_token<T> cur{{kc.data(), kc.size()}, {vc.data(), vc.size()}};

  // fp64 reference over a token list per (s, h) + the current token, on the dequantised values.
  auto reference = [&](const std::vector<std::vector<int>>& tokens, std::vector<double>& out) {
    out.assign(q.size(), 0.0);
    for (int s = 0; s < f.num_seqs; ++s)
      for (int h = 0; h < H; ++h) {
        const auto& ts = tokens[s * H + h];
        const int n = static_cast<int>(ts.size());
        auto key = [&](int i, int c) {
          return i < n ? f.deq_key(s, ts[i], h, c) : kvscout::to_float(kc[(s * H + h) * D + c]);
        };
        auto val = [&](int i, int c) {
          return i < n ? f.deq_val(s, ts[i], h, c) : kvscout::to_float(vc[(s * H + h) * D + c]);
        };
        ref_attention(n + 1, D, key, val, &q[(static_cast<std::size_t>(s) * Hq + h * g) * D], g,
                      scale, &out[(static_cast<std::size_t>(s) * Hq + h * g) * D]);
      }
  };
  // Worst |a - b| / (atol + rtol * |b|): <= 1 passes. The dequantised values are exact in float
  // (one fma from exact codes and parameters), so only the accumulation differs: atol = rtol =
  // 2e-5 with float accumulation (as for fp16 rows), 1e-6 with fp64.
  auto worst = [](const std::vector<float>& a, const std::vector<double>& b, double tol) {
    double w = 0;
    for (std::size_t i = 0; i < a.size(); ++i) w = std::max(w, std::abs(a[i] - b[i]) / (tol + tol * std::abs(b[i])));
    return w;
  };

  SECTION("dense: every token, through kivi_layout_rows_host") {
    std::vector<std::vector<int>> all(static_cast<std::size_t>(f.num_seqs) * H);
    for (int s = 0; s < f.num_seqs; ++s)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < f.lens[s]; ++t) all[s * H + h].push_back(t);
    std::vector<double> ref;
    reference(all, ref);
    std::vector<float> out(q.size(), -7.f), out64(q.size(), -7.f);
    kvscout::decode_attention_host(kvscout::kivi_layout_rows_host(kv), cur, {q.data(), q.size()},
                                   {out.data(), out.size()}, {Hq, scale});
    kvscout::decode_attention_host<double>(kvscout::kivi_layout_rows_host(kv), cur, {q.data(), q.size()},
                                           {out64.data(), out64.size()}, {Hq, scale});
    CAPTURE(worst(out, ref, 2e-5), worst(out64, ref, 1e-6));
    REQUIRE(worst(out, ref, 2e-5) <= 1);
    REQUIRE(worst(out64, ref, 1e-6) <= 1);
  }

  SECTION("sparse: a gathered selection of quantised tokens + the residual window") {
    const int cap = 128;
    std::vector<int32_t> idx(static_cast<std::size_t>(f.num_seqs) * H * cap, -1),
        counts(static_cast<std::size_t>(f.num_seqs) * H);
    std::vector<std::vector<int>> subset(static_cast<std::size_t>(f.num_seqs) * H);
    for (int s = 0; s < f.num_seqs; ++s)
      for (int h = 0; h < H; ++h) {
        auto& ts = subset[s * H + h];
        for (int t = 0; t < f.l.seq_len(s) && static_cast<int>(ts.size()) < cap; ++t)
          if (rng() % 3 == 0) ts.push_back(t);
        counts[s * H + h] = static_cast<int32_t>(ts.size());
        std::copy(ts.begin(), ts.end(), idx.begin() + (s * H + h) * cap);
        for (int t = f.l.seq_len(s); t < f.lens[s]; ++t) ts.push_back(t);  // the residual
      }
    const kvscout::selection_view<kvscout::host_space> sel{
        {idx.data(), idx.size()}, {counts.data(), counts.size()}, f.num_seqs, H, cap};
    using ex_t = kvscout::gather_executor_host<L>;
    const kvscout::host_gather_config cfg{{.num_seqs = f.num_seqs, .num_kv_heads = H}, cap, 1};
    const auto ws = kvscout::make_workspace<ex_t>(cfg);
    ex_t ex(cfg, ws.span());
    // 16-byte aligned destination: std::vector of a 16-byte aligned type.
    struct alignas(16) granule { std::byte b[16]; };
    std::vector<granule> dk(idx.size() * f.l.k_row_bytes() / 16), dv(idx.size() * f.l.v_row_bytes() / 16);
    const kvscout::gather_destination<kvscout::host_space> dst{
        {reinterpret_cast<std::byte*>(dk.data()), dk.size() * 16},
        {reinterpret_cast<std::byte*>(dv.data()), dv.size() * 16}};
    ex.submit(kv.quantized(), sel, dst).wait();
    const kvscout::kivi_gathered_rows_host rows(f.l, sel, dst, kv.resident);
    std::vector<double> ref;
    reference(subset, ref);
    std::vector<float> out(q.size(), -7.f);
    const int stride = cap + 64;
    std::vector<float> probs(static_cast<std::size_t>(f.num_seqs) * H * stride, -7.f);
    kvscout::decode_attention_host(rows, cur, {q.data(), q.size()}, {out.data(), out.size()},
                                   {Hq, scale}, {probs.data(), probs.size()}, stride);
    CAPTURE(worst(out, ref, 2e-5));
    REQUIRE(worst(out, ref, 2e-5) <= 1);
    for (int s = 0; s < f.num_seqs; ++s)
      for (int h = 0; h < H; ++h) {
        double sum = 0;
        for (int i = 0; i <= rows.rows(s, h); ++i) sum += probs[(s * H + h) * stride + i];
        REQUIRE(std::abs(sum - g) <= 1e-4 * g);
      }

    // Every quantised token selected: sparse equals dense bit for bit (same rows, same order).
    for (int s = 0; s < f.num_seqs; ++s)
      for (int h = 0; h < H; ++h) counts[s * H + h] = f.l.seq_len(s);
    const int cap2 = f.l.quantized_capacity();
    std::vector<int32_t> idx2(static_cast<std::size_t>(f.num_seqs) * H * cap2);
    for (int s = 0; s < f.num_seqs; ++s)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < f.l.seq_len(s); ++t) idx2[(s * H + h) * cap2 + t] = t;
    const kvscout::selection_view<kvscout::host_space> all{
        {idx2.data(), idx2.size()}, {counts.data(), counts.size()}, f.num_seqs, H, cap2};
    const kvscout::host_gather_config cfg2{{.num_seqs = f.num_seqs, .num_kv_heads = H}, cap2, 1};
    const auto ws2 = kvscout::make_workspace<ex_t>(cfg2);
    ex_t ex2(cfg2, ws2.span());
    std::vector<granule> dk2(idx2.size() * f.l.k_row_bytes() / 16), dv2(idx2.size() * f.l.v_row_bytes() / 16);
    const kvscout::gather_destination<kvscout::host_space> dst2{
        {reinterpret_cast<std::byte*>(dk2.data()), dk2.size() * 16},
        {reinterpret_cast<std::byte*>(dv2.data()), dv2.size() * 16}};
    ex2.submit(kv.quantized(), all, dst2).wait();
    std::vector<float> sparse(q.size(), -7.f), dense(q.size(), 7.f);
    kvscout::decode_attention_host(kvscout::kivi_gathered_rows_host(f.l, all, dst2, kv.resident), cur,
                                   {q.data(), q.size()}, {sparse.data(), sparse.size()}, {Hq, scale});
    kvscout::decode_attention_host(kvscout::kivi_layout_rows_host(kv), cur, {q.data(), q.size()},
                                   {dense.data(), dense.size()}, {Hq, scale});
    REQUIRE(sparse == dense);
  }
}

TEMPLATE_TEST_CASE("kivi attention error against unquantised attention (reported)",
                   "[kivi][attention]", (kvscout::kivi_layout<half, 128, 2>),
                   (kvscout::kivi_layout<half, 128, 4>)) {
  using L = TestType;
  constexpr int D = L::head_dim;
  const int H = 2, g = 4, Hq = H * g, len = 2048;
  kivi_fixture<L> f({len}, H, {.group = 32, .residual = 128}, 2024);
  f.fill(false);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.f, 1.f);
  // Two query sets: diffuse (q ~ N(0, 1): thousands of rows share the mass) and peaked (each
  // query is a random cached key minus the mean key: a few rows dominate, as in real heads).
  for (const bool peaked : {false, true}) {
    std::vector<float> q(static_cast<std::size_t>(Hq) * D);
    for (int qh = 0; qh < Hq; ++qh) {
      const int h = qh / g, t = static_cast<int>(rng() % len);
      for (int c = 0; c < D; ++c) {
        double mean = 0;
        if (peaked) {
          for (int u = 0; u < len; u += 8) mean += f.key(0, u, h, c);
          mean /= len / 8;
        }
        q[static_cast<std::size_t>(qh) * D + c] =
            peaked ? static_cast<float>(0.5 * (f.key(0, t, h, c) - mean)) : nd(rng);
      }
    }
    std::vector<float> out(q.size());
    kvscout::decode_attention_host<double>(kvscout::kivi_layout_rows_host(f.view()),
                                           kvscout::current_token<half>{}, {q.data(), q.size()},
                                           {out.data(), out.size()}, {Hq, scale});
    // fp64 references: unquantised, and with only K / only V dequantised (where the error comes
    // from).
    std::vector<double> ref(q.size()), k_only(q.size()), v_only(q.size());
    for (int h = 0; h < H; ++h) {
      const float* qh = &q[static_cast<std::size_t>(h) * g * D];
      const std::size_t o = static_cast<std::size_t>(h) * g * D;
      auto k = [&](int i, int c) { return f.key(0, i, h, c); };
      auto v = [&](int i, int c) { return f.val(0, i, h, c); };
      auto kq = [&](int i, int c) { return f.deq_key(0, i, h, c); };
      auto vq = [&](int i, int c) { return f.deq_val(0, i, h, c); };
      ref_attention(len, D, k, v, qh, g, scale, &ref[o]);
      ref_attention(len, D, kq, v, qh, g, scale, &k_only[o]);
      ref_attention(len, D, k, vq, qh, g, scale, &v_only[o]);
    }
    auto rel_err = [&](auto&& a) {
      double num = 0, den = 0;
      for (std::size_t i = 0; i < q.size(); ++i) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
      }
      return std::sqrt(num / den);
    };
    double worst = 0;
    for (std::size_t i = 0; i < q.size(); ++i) worst = std::max(worst, std::abs(out[i] - ref[i]));
    const double rel = rel_err(out);
    WARN("KIVI-" << L::key_bits << " (G = 32, R = 128, fp16 scales), " << len << " tokens, "
                 << (peaked ? "peaked" : "diffuse")
                 << " queries: attention output relative L2 error vs unquantised = " << rel
                 << " (K only " << rel_err(k_only) << ", V only " << rel_err(v_only)
                 << "), worst element error = " << worst);
    // With diffuse queries on i.i.d. data the output is a near-zero average and any weight
    // change is large relative to it: reported only. Peaked queries get a loose sanity bound;
    // the numbers are what the WARN reports.
    REQUIRE(std::isfinite(rel));
    if (peaked) REQUIRE(rel < (L::key_bits == 2 ? 0.6 : 0.15));
  }
}

TEST_CASE("kivi composes with a top-k selector over the quantised tokens", "[kivi]") {
  // Scores for the quantised tokens only (score_view over quantized lens); the residual window is
  // attended in full without being selected.
  using L = kvscout::kivi_layout<half, 64, 4>;
  const int H = 2, g = 2, Hq = H * g, budget = 40;
  kivi_fixture<L> f({400, 90}, H, {.group = 16, .residual = 32}, 31);
  f.fill(false);
  const auto kv = f.view();
  std::vector<int32_t> qlens(2);
  f.l.fill_quantized_lens({qlens.data(), qlens.size()});
  const int stride = f.l.quantized_capacity();
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> ud(-1.f, 1.f);
  std::vector<float> scores(static_cast<std::size_t>(2) * H * stride);
  for (auto& x : scores) x = ud(rng);
  kvscout::topk_selector_host::config scfg{.shape = {.num_seqs = 2, .num_kv_heads = H,
                                           .max_tokens = stride}, .capacity = budget,
                                           .budget = budget, .keep = {.sinks = 2, .recent = 4}};
  std::vector<std::byte> sws(kvscout::topk_selector_host::workspace_bytes(scfg));
  kvscout::topk_selector_host topk(scfg, {sws.data(), sws.size()});
  std::vector<int32_t> idx(static_cast<std::size_t>(2) * H * budget), counts(2 * H);
  const kvscout::selection_buffers<kvscout::host_space> selb{
      {idx.data(), idx.size()}, {counts.data(), counts.size()}, 2, H, budget};
  topk.select({{scores.data(), scores.size()}, {qlens.data(), qlens.size()}, 2, H, stride}, selb);
  using ex_t = kvscout::gather_executor_host<L>;
  const kvscout::host_gather_config cfg{{.num_seqs = 2, .num_kv_heads = H}, budget, 1};
  const auto ws = kvscout::make_workspace<ex_t>(cfg);
  ex_t ex(cfg, ws.span());
  struct alignas(16) granule { std::byte b[16]; };
  std::vector<granule> dk(idx.size() * f.l.k_row_bytes() / 16), dv(idx.size() * f.l.v_row_bytes() / 16);
  const kvscout::gather_destination<kvscout::host_space> dst{
      {reinterpret_cast<std::byte*>(dk.data()), dk.size() * 16},
      {reinterpret_cast<std::byte*>(dv.data()), dv.size() * 16}};
  ex.submit(kv.quantized(), selb.view(), dst).wait();
  const kvscout::kivi_gathered_rows_host rows(f.l, selb.view(), dst, kv.resident);
  for (int s = 0; s < 2; ++s)
    for (int h = 0; h < H; ++h) {
      REQUIRE(counts[s * H + h] == std::min(budget, qlens[s]));
      REQUIRE(rows.rows(s, h) == counts[s * H + h] + f.l.residual_len(s));
      for (int i = 1; i < rows.rows(s, h); ++i) REQUIRE(rows.token(s, h, i) > rows.token(s, h, i - 1));
      REQUIRE(rows.token(s, h, rows.rows(s, h) - 1) == f.lens[s] - 1);  // the newest token
    }
  std::vector<float> q(static_cast<std::size_t>(2) * Hq * 64, 0.25f), out(q.size());
  kvscout::decode_attention_host(rows, kvscout::current_token<half>{}, {q.data(), q.size()},
                                 {out.data(), out.size()}, {Hq, 0.125f});
  for (float x : out) REQUIRE(std::isfinite(x));
}

TEMPLATE_TEST_CASE("kivi: the oracle policy scores a KIVI cache by its dequantised keys",
                   "[kivi][policy]", (kvscout::kivi_layout<half, 64, 2>),
                   (kvscout::kivi_layout<half, 128, 4, float>)) {
  // Every logit the oracle writes equals the fp64 logit of the query against the key attention
  // will read: dequantised for quantised tokens, full precision in the residual window.
  using L = TestType;
  constexpr int D = L::head_dim;
  const int H = 2, g = 3, Hq = H * g;
  kivi_fixture<L> f({300, 77}, H, {.group = 16, .residual = 32}, 41);
  f.fill(true);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::mt19937 rng(8);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(static_cast<std::size_t>(f.num_seqs) * Hq * D);
  for (auto& x : q) x = nd(rng);
  const int stride = f.cap;
  std::vector<int32_t> lens(f.lens.begin(), f.lens.end()), pos(lens);
  for (auto agg : {kvscout::gqa_aggregation::max_logit, kvscout::gqa_aggregation::mean_logit}) {
    CAPTURE(static_cast<int>(agg));
    kvscout::oracle_policy_host<L> oracle({{.num_q_heads = Hq, .scale = scale}, agg}, {f.view()});
    std::vector<float> scores(static_cast<std::size_t>(f.num_seqs) * H * stride, -7.f);
    oracle.score(0, {.x = {}, .q = {q.data(), q.size()}, .positions = {pos.data(), pos.size()},
                     .seq_lens = {lens.data(), lens.size()}},
                 {{scores.data(), scores.size()}, f.num_seqs, H, stride});
    double worst = 0;
    for (int s = 0; s < f.num_seqs; ++s)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < lens[s]; ++t) {
          double agg_ref = agg == kvscout::gqa_aggregation::max_logit ? -INFINITY : 0.0;
          double magnitude = 0;  // sum of |q_c k_c| * scale: what float rounding is relative to
          for (int j = 0; j < g; ++j) {
            const float* qj = &q[(static_cast<std::size_t>(s) * Hq + h * g + j) * D];
            double d = 0;
            for (int c = 0; c < D; ++c) {
              const double k = f.deq_key(s, t, h, c);
              d += static_cast<double>(qj[c]) * k;
              magnitude += std::abs(static_cast<double>(qj[c]) * k) * scale;
            }
            d *= scale;
            agg_ref = agg == kvscout::gqa_aggregation::max_logit ? std::max(agg_ref, d)
                                                                 : agg_ref + d / g;
          }
          const double got = scores[(static_cast<std::size_t>(s) * H + h) * stride + t];
          // float accumulation over D products: within D * 2^-24 of the magnitude, with margin
          worst = std::max(worst, std::abs(got - agg_ref) / (D * 0x1p-24 * magnitude + 1e-7));
        }
    CAPTURE(worst);
    REQUIRE(worst <= 1.0);  // in units of the rounding bound
  }
}

TEST_CASE("kivi: h2o accumulates the attention paid to a KIVI cache's rows", "[kivi][policy]") {
  // Dense attention over the quantised cache reports per-row probabilities; h2o adds them to the
  // tokens the rows stand for (residual-window rows included), so its scores sum to the group size.
  using L = kvscout::kivi_layout<half, 64, 2>;
  constexpr int D = 64;
  const int H = 2, g = 3, Hq = H * g;
  kivi_fixture<L> f({300, 77}, H, {.group = 16, .residual = 32}, 43);
  f.fill(false);
  const kvscout::kivi_layout_rows_host<L> rows(f.view());
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(static_cast<std::size_t>(f.num_seqs) * Hq * D), out(q.size());
  for (auto& x : q) x = nd(rng);
  const int stride = f.cap + 1;
  std::vector<float> probs(static_cast<std::size_t>(f.num_seqs) * H * stride, -1.f);
  kvscout::decode_attention_host(rows, kvscout::current_token<half>{}, {q.data(), q.size()},
                                 {out.data(), out.size()}, {Hq, 0.125f}, {probs.data(), probs.size()},
                                 stride);
  std::vector<int32_t> lens(f.lens.begin(), f.lens.end());
  kvscout::h2o_policy_host h2o({.shape = {.num_layers = 1, .num_seqs = 2, .num_kv_heads = H,
                                .max_tokens = stride}});
  const kvscout::score_context<kvscout::host_space> ctx{.x = {}, .q = {}, .positions = {}, .seq_lens = {lens.data(), lens.size()}};
  h2o.observe(0, ctx, rows, {probs.data(), probs.size()}, stride, /*has_current=*/false);
  std::vector<float> scores(probs.size(), -7.f);
  h2o.score(0, ctx, {{scores.data(), scores.size()}, 2, H, stride});
  for (int s = 0; s < 2; ++s)
    for (int h = 0; h < H; ++h) {
      CAPTURE(s, h);
      REQUIRE(rows.rows(s, h) == lens[s]);
      double sum = 0;
      for (int t = 0; t < lens[s]; ++t) {
        const std::size_t at = (static_cast<std::size_t>(s) * H + h) * stride + t;
        REQUIRE(scores[at] == probs[at]);
        REQUIRE(scores[at] >= 0.f);
        sum += scores[at];
      }
      REQUIRE(sum == Approx(g).epsilon(1e-4));
    }
}

// ---- the usage examples of the headers -------------------------------------------------------

TEST_CASE("kivi usage examples compile and run", "[kivi]") {
  {  // kv/detail/kivi_pack.hpp
    const float x[4] = {0.f, 1.f, 2.f, 3.f};
    auto a = kvscout::detail::kivi_make_affine<2, kvscout::half>(0.f, 3.f);
    std::uint8_t codes[4], packed[1];
    for (int c = 0; c < 4; ++c)
      codes[c] = static_cast<std::uint8_t>(kvscout::detail::kivi_quantize<2>(
          x[c], kvscout::detail::kivi_to_float(a.scale), kvscout::detail::kivi_to_float(a.zero)));
    kvscout::detail::kivi_pack<2>(codes, 4, packed);
    REQUIRE(packed[0] == 0xE4);
  }
  // kv/kivi.hpp and attention/kivi_rows.hpp
  using layout = kvscout::kivi_layout<kvscout::half, 128, /*Bits=*/2>;
  std::vector<int32_t> lens = {0, 0};
  auto l = layout::padded(/*num_kv_heads=*/8, /*capacity=*/4096, lens.data(), /*num_seqs=*/2,
                          {.group = 32, .residual = 128});
  kvscout::kivi_host_storage store(l);
  kvscout::kivi_append_host<layout> w(l, store.buffers(), lens.data());
  std::vector<half> tok(8 * 128);
  for (std::size_t i = 0; i < tok.size(); ++i) tok[i] = kvscout::from_float<half>(static_cast<float>(i % 13) - 6.f);
  const kvscout::host_span<const half> k_token(tok.data(), tok.size()), v_token = k_token;
  for (int t = 0; t < 200; ++t) w.append(/*s=*/0, k_token, v_token);
  REQUIRE(lens[0] == 200);
  REQUIRE(l.seq_len(0) == 72);  // values: all but the 128 most recent; keys: the first 128
  auto kv = store.buffers().view(l);
  const int capacity = 16;
  std::vector<int32_t> indices(2 * 8 * capacity), counts(2 * 8, 0);
  for (int h = 0; h < 8; ++h) {
    counts[h] = capacity;
    for (int i = 0; i < capacity; ++i) indices[h * capacity + i] = 4 * i;
  }
  const kvscout::selection_view<kvscout::host_space> selection{
      {indices.data(), indices.size()}, {counts.data(), counts.size()}, 2, 8, capacity};
  const kvscout::host_gather_config cfg{.shape = {.num_seqs = 2, .num_kv_heads = 8},
                                        .capacity = capacity};
  auto ws = kvscout::make_workspace<kvscout::gather_executor_host<layout>>(cfg);
  kvscout::gather_executor_host<layout> gather(cfg, ws.span());
  struct alignas(16) granule { std::byte b[16]; };  // 16-byte aligned destination rows
  std::vector<granule> dk(2u * 8 * capacity * l.k_row_bytes() / 16),
      dv(2u * 8 * capacity * l.v_row_bytes() / 16);
  const kvscout::gather_destination<kvscout::host_space> destination{
      {reinterpret_cast<std::byte*>(dk.data()), dk.size() * 16},
      {reinterpret_cast<std::byte*>(dv.data()), dv.size() * 16}};
  gather.submit(kv.quantized(), selection, destination).wait();
  kvscout::kivi_gathered_rows_host rows(l, selection, destination, kv.resident);
  std::vector<float> q(2 * 32 * 128, 0.1f), out(q.size());
  const kvscout::current_token<half> current{};
  kvscout::decode_attention_host(rows, current, {q.data(), q.size()}, {out.data(), out.size()},
                                 {.num_q_heads = 32, .scale = 0.088f});
  for (float x : out) REQUIRE(std::isfinite(x));
}

// ---- bad input -------------------------------------------------------------------------------

TEST_CASE("kivi bad input throws kvscout::error naming the value", "[kivi]") {
  using L = kvscout::kivi_layout<half, 128, 2>;
  std::vector<int32_t> lens = {10, 0};
  SECTION("group size") {
    REQUIRE_THROWS_AS(L::padded(2, 64, lens.data(), 2, {.group = 0, .residual = 4}),
                      kvscout::error);
    REQUIRE_THROWS_WITH(L::padded(2, 64, lens.data(), 2, {.group = 0, .residual = 4}),
                        Contains("G = 0"));
    REQUIRE_THROWS_WITH(L::padded(2, 64, lens.data(), 2, {.group = 48, .residual = 4}),
                        Contains("G = 48") && Contains("must divide head_dim = 128"));
    REQUIRE_THROWS_WITH(L::padded(2, 64, lens.data(), 2, {.group = -4, .residual = 4}),
                        Contains("G = -4"));
    REQUIRE_THROWS_WITH(L::padded(2, 64, lens.data(), 2, {.group = 32, .residual = -1}),
                        Contains("R = -1"));
    REQUIRE_THROWS_WITH(L::padded(0, 64, lens.data(), 2), Contains("num_kv_heads"));
    REQUIRE_THROWS_WITH(L::padded(2, -1, lens.data(), 2), Contains("capacity must be non-negative, got -1"));
  }
  const L l = L::padded(2, 64, lens.data(), 2, {.group = 16, .residual = 16});
  kvscout::kivi_host_storage store(l);
  const auto b = store.buffers();
  SECTION("lengths beyond the capacity") {
    std::vector<int32_t> bad = {65, 0};
    const L lb = L::padded(2, 64, bad.data(), 2, {.group = 16, .residual = 16});
    REQUIRE_THROWS_WITH(lb.validate(lb.required_k_bytes(), lb.required_v_bytes()),
                        Contains("seq_lens[0] = 65") && Contains("capacity = 64"));
  }
  SECTION("short buffers") {
    REQUIRE_THROWS_WITH(l.validate(l.required_k_bytes() - 1, l.required_v_bytes()),
                        Contains("K code buffer holds " + std::to_string(l.required_k_bytes() - 1)));
    REQUIRE_THROWS_WITH(l.validate(l.required_k_bytes(), 3), Contains("V record buffer holds 3"));
    auto v = b.view(l);
    v.resident.k_params = v.resident.k_params.subspan(0, 16);
    REQUIRE_THROWS_WITH(v.validate(), Contains("key parameter buffer") && Contains("holds 16"));
    auto r = b.view(l);
    r.resident.v_residual = r.resident.v_residual.subspan(0, 100);
    REQUIRE_THROWS_WITH(r.validate(), Contains("V residual buffer holds 100"));
    auto bs = b;
    bs.k_residual = bs.k_residual.subspan(0, 8);
    REQUIRE_THROWS_WITH(kvscout::kivi_append_host<L>(l, bs, lens.data()), Contains("K residual buffer holds 8"));
  }
  SECTION("misaligned buffers") {
    auto bm = b;
    // Still large enough (kivi_host_storage allocates one spare granule), but misaligned.
    bm.v_records = {b.v_records.data() + 4, b.v_records.size()};
    REQUIRE_THROWS_WITH(kvscout::kivi_append_host<L>(l, bm, lens.data()),
                        Contains("V record buffer") && Contains("not 16-byte aligned"));
    auto v = b.view(l);
    v.k_codes = {b.k_codes.data() + 8, b.k_codes.size()};
    REQUIRE_THROWS_WITH(v.validate(), Contains("K code buffer") && Contains("not 16-byte aligned"));
  }
  SECTION("appends") {
    std::vector<int32_t> other = lens;
    REQUIRE_THROWS_WITH(kvscout::kivi_append_host<L>(l, b, other.data()),
                        Contains("seq_lens must be the (writable) array the layout reads"));
    kvscout::kivi_append_host<L> w(l, b, lens.data());
    std::vector<half> tok(2 * 128, kvscout::from_float<half>(0.5f));
    const kvscout::host_span<const half> t1(tok.data(), tok.size());
    REQUIRE_THROWS_WITH(w.append(2, t1, t1), Contains("sequence 2 is out of range [0, 2)"));
    REQUIRE_THROWS_WITH(w.append(1, t1.subspan(0, 255), t1), Contains("expected [1, 2, 128] = 256"));
    while (lens[1] < 64) w.append(1, t1, t1);
    REQUIRE_THROWS_WITH(w.append(1, t1, t1), Contains("sequence 1 of length 64 exceeds capacity = 64"));
    REQUIRE(lens[1] == 64);
    std::vector<half> big = tok;
    big[37] = kvscout::from_float<half>(INFINITY);
    const int before = lens[0];
    REQUIRE_THROWS_WITH(w.append(0, t1, {big.data(), big.size()}), Contains("V element 37 = inf"));
    REQUIRE(lens[0] == before);
  }
  SECTION("values beyond the fp16 scale range") {
    using LF = kvscout::kivi_layout<float, 64, 4>;  // float cache, fp16 scales
    std::vector<int32_t> fl = {0};
    const LF lf = LF::padded(1, 8, fl.data(), 1, {.group = 16, .residual = 0});
    kvscout::kivi_host_storage sf(lf);
    kvscout::kivi_append_host<LF> w(lf, sf.buffers(), fl.data());
    std::vector<float> tok(64, 1.f);
    tok[3] = 70000.f;
    REQUIRE_THROWS_WITH(w.append(0, {tok.data(), 64}, {tok.data(), 64}),
                        Contains("K element 3 = 70000") && Contains("65504"));
  }
  SECTION("selections naming residual tokens") {
    std::vector<int32_t> full = {40, 0};  // fetchable: [0, 24); window: [24, 40)
    const L lq = L::padded(2, 64, full.data(), 2, {.group = 16, .residual = 16});
    kvscout::kivi_host_storage sq(lq);
    const auto kv = sq.buffers().view(lq);
    std::vector<int32_t> idx = {5, 33, 0, 0, 0, 0, 0, 0}, counts = {2, 0, 0, 0};
    const kvscout::selection_view<kvscout::host_space> sel{
        {idx.data(), idx.size()}, {counts.data(), counts.size()}, 2, 2, 2};
    using ex_t = kvscout::gather_executor_host<L>;
    const kvscout::host_gather_config cfg{{.num_seqs = 2, .num_kv_heads = 2}, 2, 1};
    const auto ws = kvscout::make_workspace<ex_t>(cfg);
    ex_t ex(cfg, ws.span());
    struct alignas(16) granule { std::byte b[16]; };
    std::vector<granule> dk(8 * lq.k_row_bytes() / 16), dv(8 * lq.v_row_bytes() / 16);
    const kvscout::gather_destination<kvscout::host_space> dst{
        {reinterpret_cast<std::byte*>(dk.data()), dk.size() * 16},
        {reinterpret_cast<std::byte*>(dv.data()), dv.size() * 16}};
    REQUIRE_THROWS_WITH(ex.submit(kv.quantized(), sel, dst),
                        Contains("token index 33") && Contains("seq_len = 24"));
    REQUIRE_THROWS_WITH(kvscout::kivi_gathered_rows_host(lq, sel, dst, kv.resident),
                        Contains("token index 33") && Contains("quantized_len = 24"));
    const kvscout::gather_destination<kvscout::host_space> odd{
        {reinterpret_cast<std::byte*>(dk.data()) + 1, dk.size() * 16 - 1}, dst.v};
    idx[1] = 7;
    REQUIRE_THROWS_WITH(kvscout::kivi_gathered_rows_host(lq, sel, odd, kv.resident),
                        Contains("gathered K records") && Contains("not 16-byte aligned"));
    const kvscout::gather_destination<kvscout::host_space> small{dst.k.subspan(0, 16), dst.v};
    REQUIRE_THROWS_WITH(kvscout::kivi_gathered_rows_host(lq, sel, small, kv.resident),
                        Contains("gathered K records holds 16"));
  }
}
