#pragma once
// Quantised partial key cache: for one layer, the partial keys (skew/) of every cached token, per
// sequence and KV head, r channels each, quantised per channel over groups of G tokens to Bits
// bits (kvscout's own format; the key scheme is KIVI's). Preallocated to a maximum length;
// appending writes one token in place; nothing is ever reallocated.
//
// Quantisation of channel c of a complete group (tokens gG .. gG + G - 1), levels = 2^Bits - 1:
//   min_c  = min_t x[c][t]                     (float)
//   step_c = float((double(max_c) - min_c) / levels)   (0 for a constant channel)
//   code   = clamp(nearbyint((double(x) - min_c) / step_c), 0, levels)   (0 where step_c = 0;
//            nearbyint: to nearest, ties to even)
//   x^     = min_c + step_c * code             (float; a constant channel decodes exactly)
// The newest incomplete group of each (sequence, kv head) is a float staging tile, read exactly;
// when its last token is appended the group is quantised into place and the staging tile is
// cleared. Tokens not yet appended read 0, as in partial_key_cache.
//
// Layout, chosen for scoring (logit(t) = sum_c q_c min_c + sum_c (q_c step_c) code[c][t]):
//   [num_seqs, num_kv_heads, ceil(max_tokens / G)] tiles of tile_floats() floats (64-byte lines):
//     min [r] float, step [r] float, codes [r, line_bytes] bytes (channel-major), padding
//   line_bytes = G * Bits / 8: the codes of one channel. Token i of the group is in byte
//   i % line_bytes at bit Bits * (i / line_bytes): each bit plane holds line_bytes consecutive
//   tokens, one shift and one mask of a byte vector away from lanes (no shuffles).
//   staging [num_seqs, num_kv_heads, r, G] floats (channel c of token i at c * G + i).
//
//   kvscout::quantized_partial_key_cache<4> pkc(/*num_seqs=*/1, /*num_kv_heads=*/3, /*r=*/64,
//                                               /*max_tokens=*/8192);
//   pkc.append(s, h, t, pk);                      // pk: float[r], t = tokens appended so far

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvscout/cache/host_buffer.hpp"
#include "kvscout/core/detail/checked_size.hpp"
#include "kvscout/core/error.hpp"

namespace kvscout {

namespace detail {
constexpr bool supported_key_quantization(int bits, int group) noexcept {
  return (bits == 2 || bits == 4 || bits == 8) &&
         (group == 16 || group == 32 || group == 64 || group == 128);
}
}  // namespace detail

/// The format tag of quantised partial keys: Bits per channel code (2, 4 or 8), over groups of
/// Group tokens (16, 32, 64 or 128).
template <int Bits, int Group = 32>
struct quantized_keys {
  static constexpr int bits = Bits;
  static constexpr int group = Group;
};

template <int Bits, int Group = 32>
class quantized_partial_key_cache {
  static_assert(detail::supported_key_quantization(Bits, Group),
                "quantized partial keys support Bits of 2, 4 or 8 and groups of 16, 32, 64 or "
                "128 tokens");

 public:
  static constexpr int bits = Bits;
  static constexpr int group_tokens = Group;
  static constexpr int levels = (1 << Bits) - 1;
  static constexpr int line_bytes = Group * Bits / 8;

  quantized_partial_key_cache() = default;
  quantized_partial_key_cache(int num_seqs, int num_kv_heads, int r, int max_tokens,
                              host_pages pages = host_pages::normal)
      : num_seqs_(num_seqs), num_kv_heads_(num_kv_heads), r_(r), max_tokens_(max_tokens) {
    const sizes z = sizes_for(num_seqs, num_kv_heads, r, max_tokens);
    tiles_ = z.tiles;
    tile_floats_ = z.tile_floats;
    data_ = host_buffer<float>(z.tile_total, pages);
    staging_ = host_buffer<float>(z.staging_total, pages);
    count_ = host_buffer<int>(z.counts);
  }
  /// The same cache in the caller's memory (tiles, staging tiles, token counts, in that order): at
  /// least memory_bytes(...) bytes at memory_alignment, zeroed here, never freed here.
  quantized_partial_key_cache(int num_seqs, int num_kv_heads, int r, int max_tokens,
                              host_span<std::byte> memory)
      : num_seqs_(num_seqs), num_kv_heads_(num_kv_heads), r_(r), max_tokens_(max_tokens) {
    const sizes z = sizes_for(num_seqs, num_kv_heads, r, max_tokens);
    float* f = reinterpret_cast<float*>(
        detail::zeroed_cache_memory("quantized_partial_key_cache", memory, z.bytes(), memory_alignment));
    tiles_ = z.tiles;
    tile_floats_ = z.tile_floats;
    data_ = host_buffer<float>(host_span<float>{f, z.tile_total});
    staging_ = host_buffer<float>(host_span<float>{f + z.tile_total, z.staging_total});
    count_ = host_buffer<int>(
        host_span<int>{reinterpret_cast<int*>(f + z.tile_total + z.staging_total), z.counts});
  }

  static constexpr std::size_t memory_alignment = 64;
  [[nodiscard]] static std::size_t memory_bytes(int num_seqs, int num_kv_heads, int r, int max_tokens) {
    return sizes_for(num_seqs, num_kv_heads, r, max_tokens).bytes();
  }

  /// Checks that append(s, h, t, pk) would be accepted, writing nothing: s and h in range, t the
  /// next token of (s, h), and every value of pk[0..r) finite (a NaN or infinity would poison its
  /// group's min and step).
  void check_append(int s, int h, int t, const float* pk) const {
    KVSCOUT_EXPECTS(s >= 0 && s < num_seqs_, "sequence ", s, " is out of range [0, ", num_seqs_,
                    ")");
    KVSCOUT_EXPECTS(h >= 0 && h < num_kv_heads_, "kv_head ", h, " is out of range [0, ",
                    num_kv_heads_, ")");
    KVSCOUT_EXPECTS(t >= 0 && t < max_tokens_, "token ", t, " is out of range [0, max_tokens = ",
                    max_tokens_, "): the partial key cache never grows");
    const int expected = appended(s, h);
    KVSCOUT_EXPECTS(t == expected, "quantized partial keys are appended in order: sequence ", s,
                    ", kv_head ", h, " got token ", t, ", expected token ", expected);
    KVSCOUT_EXPECTS(pk != nullptr, "partial key of token ", t, " is null");
    for (int c = 0; c < r_; ++c)
      KVSCOUT_EXPECTS(std::isfinite(pk[c]), "partial key value ", pk[c], " of token ", t,
                      ", channel ", c, " (sequence ", s, ", kv_head ", h,
                      ") is not finite; it would poison its group's min and step");
  }

  /// t = appended(s, h); the group is quantised when t is its last token. Refused (nothing written)
  /// as check_append says.
  void append(int s, int h, int t, const float* pk) {
    check_append(s, h, t, pk);
    float* st = staging(s, h);
    const int i = t % Group;
    for (int c = 0; c < r_; ++c) st[static_cast<std::size_t>(c) * Group + i] = pk[c];
    ++count_[static_cast<std::size_t>(s) * num_kv_heads_ + h];
    if (i == Group - 1) flush(s, h, t / Group);
  }

  [[nodiscard]] int appended(int s, int h) const {
    return count_[static_cast<std::size_t>(s) * num_kv_heads_ + h];
  }
  [[nodiscard]] int complete_groups(int s, int h) const { return appended(s, h) / Group; }

  /// Complete group b < complete_groups(s, h): min [r], step [r].
  [[nodiscard]] const float* group_min(int s, int h, int b) const {
    return data_.data() + tile_offset(s, h, b);
  }
  [[nodiscard]] const float* group_step(int s, int h, int b) const {
    return group_min(s, h, b) + r_;
  }
  [[nodiscard]] const std::uint8_t* group_codes(int s, int h, int b) const {
    return reinterpret_cast<const std::uint8_t*>(group_min(s, h, b) +
                                                 2 * static_cast<std::size_t>(r_));
  }
  [[nodiscard]] int code(int s, int h, int c, int t) const {
    const int i = t % Group;
    const std::uint8_t byte =
        group_codes(s, h, t / Group)[static_cast<std::size_t>(c) * line_bytes + i % line_bytes];
    return (byte >> (Bits * (i / line_bytes))) & levels;
  }
  /// The newest incomplete group: [r, G] floats, channel c of token complete_groups(s, h) * G + i
  /// at c * G + i (0 past the appended tokens).
  [[nodiscard]] const float* staging(int s, int h) const {
    return staging_.data() + (static_cast<std::size_t>(s) * num_kv_heads_ + h) * r_ * Group;
  }
  /// As scoring sees it: min + step * code for a complete group, the exact value in the staging
  /// tile, 0 for a token not appended. Not range-checked (as partial_key_cache::at).
  [[nodiscard]] float dequantized(int s, int h, int c, int t) const {
    const int b = t / Group;
    if (b == complete_groups(s, h))
      return staging(s, h)[static_cast<std::size_t>(c) * Group + t % Group];
    if (b > complete_groups(s, h)) return 0.f;
    return group_min(s, h, b)[c] + group_step(s, h, b)[c] * static_cast<float>(code(s, h, c, t));
  }

  [[nodiscard]] int num_seqs() const { return num_seqs_; }
  [[nodiscard]] int num_kv_heads() const { return num_kv_heads_; }
  [[nodiscard]] int r() const { return r_; }
  [[nodiscard]] int max_tokens() const { return max_tokens_; }
  [[nodiscard]] int tiles() const { return tiles_; }
  [[nodiscard]] std::size_t tile_floats() const { return tile_floats_; }
  [[nodiscard]] std::size_t bytes() const {
    return data_.size_bytes() + staging_.size_bytes() + count_.size_bytes();
  }
  /// Bytes scoring reads for tokens [0, n) of every (sequence, kv head). n in [0, max_tokens].
  [[nodiscard]] std::size_t bytes_for(int n) const {
    KVSCOUT_EXPECTS(n >= 0 && n <= max_tokens_, "bytes_for(", n,
                    "): the token count must be in [0, max_tokens = ", max_tokens_, "]");
    const std::size_t per = static_cast<std::size_t>(n / Group) * tile_floats_ * sizeof(float) +
                            (n % Group != 0 ? static_cast<std::size_t>(r_) * Group * sizeof(float)
                                            : 0);
    return static_cast<std::size_t>(num_seqs_) * num_kv_heads_ * per;
  }

 private:
  struct sizes {
    int tiles;
    std::size_t tile_floats, tile_total, staging_total, counts, total_bytes;
    [[nodiscard]] std::size_t bytes() const { return total_bytes; }
  };
  static sizes sizes_for(int num_seqs, int num_kv_heads, int r, int max_tokens) {
    KVSCOUT_EXPECTS(num_seqs > 0 && num_kv_heads > 0 && r > 0 && max_tokens > 0,
                    "quantized_partial_key_cache needs positive sizes, got num_seqs ", num_seqs,
                    ", num_kv_heads ", num_kv_heads, ", r ", r, ", max_tokens ", max_tokens);
    sizes z{};
    z.tiles = max_tokens / Group + (max_tokens % Group != 0 ? 1 : 0);
    const std::size_t raw = detail::checked_size("quantized_partial_key_cache tile bytes (r x "
                                                 "(8 + line bytes))",
                                                 r, 8 + line_bytes);
    z.tile_floats = (raw + 63) / 64 * 16;
    z.tile_total = detail::checked_size("quantized_partial_key_cache floats (num_seqs x num_kv_heads "
                                        "x tiles x tile floats)",
                                        num_seqs, num_kv_heads, z.tiles, z.tile_floats);
    z.staging_total = detail::checked_size("quantized_partial_key_cache staging floats (num_seqs x "
                                           "num_kv_heads x r x group)",
                                           num_seqs, num_kv_heads, r, Group);
    z.counts = static_cast<std::size_t>(num_seqs) * num_kv_heads;
    const char* what = "quantized_partial_key_cache bytes (tiles + staging + counts)";
    z.total_bytes = detail::checked_sum(
        what,
        detail::checked_sum(what, detail::checked_size(what, z.tile_total, sizeof(float)),
                            detail::checked_size(what, z.staging_total, sizeof(float))),
        detail::checked_size(what, z.counts, sizeof(int)));
    return z;
  }
  std::size_t tile_offset(int s, int h, int b) const {
    return ((static_cast<std::size_t>(s) * num_kv_heads_ + h) * tiles_ + b) * tile_floats_;
  }
  float* staging(int s, int h) {
    return staging_.data() + (static_cast<std::size_t>(s) * num_kv_heads_ + h) * r_ * Group;
  }
  void flush(int s, int h, int b) {
    float* st = staging(s, h);
    float* mn = data_.data() + tile_offset(s, h, b);
    float* step = mn + r_;
    auto* codes = reinterpret_cast<std::uint8_t*>(step + r_);
    for (int c = 0; c < r_; ++c) {
      const float* x = st + static_cast<std::size_t>(c) * Group;
      float lo = x[0], hi = x[0];
      for (int i = 1; i < Group; ++i) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
      }
      const float sc = static_cast<float>((static_cast<double>(hi) - lo) / levels);
      mn[c] = lo;
      step[c] = sc;
      std::uint8_t* line = codes + static_cast<std::size_t>(c) * line_bytes;
      std::memset(line, 0, line_bytes);
      if (sc == 0.f) continue;  // constant channel: every code 0, decodes to lo exactly
      for (int i = 0; i < Group; ++i) {
        double q = std::nearbyint((static_cast<double>(x[i]) - lo) / sc);
        q = q < 0 ? 0 : q > levels ? levels : q;
        line[i % line_bytes] = static_cast<std::uint8_t>(
            line[i % line_bytes] | (static_cast<unsigned>(q) << (Bits * (i / line_bytes))));
      }
    }
    std::memset(st, 0, static_cast<std::size_t>(r_) * Group * sizeof(float));
  }

  int num_seqs_ = 0, num_kv_heads_ = 0, r_ = 0, max_tokens_ = 0, tiles_ = 0;
  std::size_t tile_floats_ = 0;
  host_buffer<float> data_;     // [num_seqs, num_kv_heads, tiles, tile_floats]
  host_buffer<float> staging_;  // [num_seqs, num_kv_heads, r, G]
  host_buffer<int> count_;      // [num_seqs, num_kv_heads] tokens appended
};

}  // namespace kvscout
