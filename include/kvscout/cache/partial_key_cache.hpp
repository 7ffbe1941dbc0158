#pragma once
// Partial key cache: for one layer, the partial keys (skew/) of every cached token, per sequence
// and KV head, preallocated to a maximum length. Appending writes one token's r values in place;
// nothing is ever reallocated.
//
// Layout: per (sequence, kv head), tiles of B = 64 / sizeof(T) tokens (one 64-byte line per
// channel), channel-major inside a tile:
//   [num_seqs, num_kv_heads, ceil(max_tokens / B), r, B]
//   element (s, h, c, t) at (((s * H + h) * tiles + t / B) * r + c) * B + t % B
// Scoring computes sum_c q~[c] * pk[c][t] for the B tokens of a tile at once, vectorised over
// tokens; a head's whole cache is one sequential stream (on the GPU: coalesced over tokens).
//
//   kvscout::partial_key_cache<float> pkc(/*num_seqs=*/1, /*num_kv_heads=*/3, /*r=*/16,
//                                         /*max_tokens=*/8192);
//   pkc.append(s, h, t, pk);                    // pk: float[r]

#include <cstddef>

#include "kvscout/cache/host_buffer.hpp"
#include "kvscout/core/detail/checked_size.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"

namespace kvscout {

template <compute_element T = float>
class partial_key_cache {
 public:
  partial_key_cache() = default;
  partial_key_cache(int num_seqs, int num_kv_heads, int r, int max_tokens,
                    host_pages pages = host_pages::normal)
      : num_seqs_(num_seqs), num_kv_heads_(num_kv_heads), r_(r), max_tokens_(max_tokens) {
    data_ = host_buffer<T>(elements(num_seqs, num_kv_heads, r, max_tokens), pages);
    tiles_ = tiles_for(max_tokens);
  }
  /// The same cache in the caller's memory: at least memory_bytes(...) bytes at memory_alignment,
  /// zeroed here, never freed here.
  partial_key_cache(int num_seqs, int num_kv_heads, int r, int max_tokens, host_span<std::byte> memory)
      : num_seqs_(num_seqs), num_kv_heads_(num_kv_heads), r_(r), max_tokens_(max_tokens) {
    data_ = detail::borrow_zeroed<T>("partial_key_cache", memory,
                                     memory_bytes(num_seqs, num_kv_heads, r, max_tokens), memory_alignment);
    tiles_ = tiles_for(max_tokens);
  }

  static constexpr std::size_t memory_alignment = 64;
  [[nodiscard]] static std::size_t memory_bytes(int num_seqs, int num_kv_heads, int r, int max_tokens) {
    return detail::checked_size("partial_key_cache bytes (elements x element size)",
                                elements(num_seqs, num_kv_heads, r, max_tokens), sizeof(T));
  }

  static constexpr int block_tokens = static_cast<int>(64 / sizeof(T));

  void append(int s, int h, int t, const float* pk) {
    KVSCOUT_EXPECTS(s >= 0 && s < num_seqs_, "sequence ", s, " is out of range [0, ", num_seqs_, ")");
    KVSCOUT_EXPECTS(h >= 0 && h < num_kv_heads_, "kv_head ", h, " is out of range [0, ",
                    num_kv_heads_, ")");
    KVSCOUT_EXPECTS(t >= 0 && t < max_tokens_, "token ", t, " is out of range [0, max_tokens = ",
                    max_tokens_, "): the partial key cache never grows");
    KVSCOUT_EXPECTS(pk != nullptr, "partial key of token ", t, " is null");
    T* base = data_.data() + tile_offset(s, h, t / block_tokens) + t % block_tokens;
    for (int c = 0; c < r_; ++c) base[static_cast<std::size_t>(c) * block_tokens] = from_float<T>(pk[c]);
  }

  /// [r, block_tokens], channel c of token b * block_tokens + i at c * block_tokens + i.
  [[nodiscard]] const T* tile(int s, int h, int b) const { return data_.data() + tile_offset(s, h, b); }
  [[nodiscard]] T at(int s, int h, int c, int t) const {
    return tile(s, h, t / block_tokens)[static_cast<std::size_t>(c) * block_tokens + t % block_tokens];
  }

  [[nodiscard]] int num_seqs() const { return num_seqs_; }
  [[nodiscard]] int num_kv_heads() const { return num_kv_heads_; }
  [[nodiscard]] int r() const { return r_; }
  [[nodiscard]] int max_tokens() const { return max_tokens_; }
  [[nodiscard]] int tiles() const { return tiles_; }
  [[nodiscard]] std::size_t bytes() const { return data_.size_bytes(); }
  /// What scoring reads for tokens [0, n) of every (sequence, kv head). n in [0, max_tokens].
  [[nodiscard]] std::size_t bytes_for(int n) const {
    KVSCOUT_EXPECTS(n >= 0 && n <= max_tokens_, "bytes_for(", n,
                    "): the token count must be in [0, max_tokens = ", max_tokens_, "]");
    const std::size_t t = static_cast<std::size_t>(n / block_tokens + (n % block_tokens != 0));
    return static_cast<std::size_t>(num_seqs_) * num_kv_heads_ * t * r_ * block_tokens * sizeof(T);
  }

 private:
  static int tiles_for(int max_tokens) { return max_tokens / block_tokens + (max_tokens % block_tokens != 0 ? 1 : 0); }
  static std::size_t elements(int num_seqs, int num_kv_heads, int r, int max_tokens) {
    KVSCOUT_EXPECTS(num_seqs > 0 && num_kv_heads > 0 && r > 0 && max_tokens > 0,
                    "partial_key_cache needs positive sizes, got num_seqs ", num_seqs,
                    ", num_kv_heads ", num_kv_heads, ", r ", r, ", max_tokens ", max_tokens);
    return detail::checked_size("partial_key_cache elements (num_seqs x num_kv_heads x tiles x r x "
                                "tile tokens)",
                                num_seqs, num_kv_heads, tiles_for(max_tokens), r, block_tokens);
  }
  std::size_t tile_offset(int s, int h, int b) const {
    return ((static_cast<std::size_t>(s) * num_kv_heads_ + h) * tiles_ + b) * r_ *
           static_cast<std::size_t>(block_tokens);
  }
  int num_seqs_ = 0, num_kv_heads_ = 0, r_ = 0, max_tokens_ = 0, tiles_ = 0;
  host_buffer<T> data_;
};

}  // namespace kvscout
