#pragma once
// KIVI-quantised KV layout (Liu et al., ICML'24): 2- or 4-bit asymmetric quantisation (key and
// value widths separate: kivi_bits), keys per channel over groups of G tokens, values per token
// over groups of G channels, recent tokens in full precision. Its buffers and the host writer
// that quantises tokens as they leave the full-precision window: kv/kivi.hpp.
//
// Which tokens are quantised (KIVI's rule; docs/layouts.md): len = seq_lens[s], R the residual
// length (a multiple of G; R = 0 is kvscout's extension), B = key_block() = R (G when R = 0):
//   key_quantized_len   = B * floor(len / B)   keys are quantised B at a time
//   value_quantized_len = max(0, len - R)      the R most recent values stay in full precision
// seq_len(s) = the smaller: the tokens executors fetch and selectors choose among. The window
// [seq_len, len) is never fetched: it is resident where attention runs (rows already quantised
// are kept dequantised, rounded once to T), and attention reads all of it after the selected rows.
// Not binary-compatible with KIVI's cache: each token's key and value records are fetched alone.
//
// Buffers (per (sequence, kv head) slices of `capacity` tokens; every buffer 16-byte aligned)
// Qc = quantized_capacity(), Kq = key_quantized_len(capacity), W = residual_slots():
//   k_codes     [num_seqs, H, Qc, k_row_bytes]         key record of token t: packed codes of its D
//                                                      channels, zero-padded to 16 bytes
//   v_records   [num_seqs, H, Qc, v_row_bytes]         value record: packed codes [0, D*VBits/8),
//                                                      scales[D / G], zeros[D / G] (Scale), padding
//   k_params    [num_seqs, H, Kq / G, 2, D]  Scale     key group j: scale[D] then zero[D]
//   k_residual  [num_seqs, H, W, D]          T         token t of the window in slot t % W (a ring:
//   v_residual  [num_seqs, H, W, D]          T         nothing moves on quantising)
// Executors fetch only k_codes and v_records; k_params and the residual stay resident.
//
// Error bound: for a group with minimum mn, exact scale s* = (mx - mn) / L, stored scale s and zero
// z, |x - x'| <= s / 2 + u * (|mn| + L * s*) + round-off, u the unit round-off of Scale.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>

#include "kvscout/core/config.hpp"
#include "kvscout/core/detail/checked_size.hpp"
#include "kvscout/core/detail/overlap.hpp"
#include "kvscout/core/dispatch.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/kv/detail/kivi_pack.hpp"

namespace kvscout {

namespace detail {
inline constexpr value_list<2, 4> supported_kivi_bits{};
}  // namespace detail

/// Key and value bit widths of a kivi_layout: `2` (K2 / V2, KIVI-2), `4`, or `kivi_bits{2, 4}`
/// (K2 / V4). An int converts, so kivi_layout<half, 128, 2> is kivi_layout<half, 128, {2, 2}>.
struct kivi_bits {
  int key;
  int value;
  constexpr kivi_bits(int both) : key(both), value(both) {}  // NOLINT: implicit by design
  constexpr kivi_bits(int k, int v) : key(k), value(v) {}
};

namespace detail {
inline constexpr std::size_t kivi_alignment = 16;
}  // namespace detail

struct kivi_options {
  int group = 32;      // G: tokens per key group, channels per value group (must divide head_dim)
  int residual = 128;  // R: KIVI's residual length, a multiple of G (see the rule above)
};

template <kv_element T, int HeadDim, kivi_bits Bits, class Scale = half>
class kivi_layout {
  static_assert((Bits.key == 2 || Bits.key == 4) && (Bits.value == 2 || Bits.value == 4),
                "kvscout::kivi_layout: key and value bit widths must be 2 or 4 (KIVI-2, KIVI-4, "
                "or kivi_bits{2, 4} and the like)");
  static_assert(compute_element<T>,
                "kvscout::kivi_layout: T (the residual window's rows) must be float, half or "
                "bfloat16");
  static_assert(detail::kivi_scale_type<Scale>,
                "kvscout::kivi_layout: Scale (the type of scales and zeros) must be kvscout::half "
                "or float");
  static_assert(HeadDim > 0 && HeadDim % 16 == 0,
                "kvscout::kivi_layout: HeadDim must be a positive multiple of 16, so that the "
                "packed codes of a row fill whole 32-bit words");

  static constexpr std::size_t align_up(std::size_t n) {
    return (n + detail::kivi_alignment - 1) / detail::kivi_alignment * detail::kivi_alignment;
  }

 public:
  using element_type = T;  // residual rows, the current token, and what attention computes in
  using scale_type = Scale;
  static constexpr int head_dim = HeadDim;
  static constexpr int key_bits = Bits.key;
  static constexpr int value_bits = Bits.value;
  static constexpr std::size_t k_code_bytes = detail::kivi_code_bytes<key_bits>(HeadDim);
  static constexpr std::size_t v_code_bytes = detail::kivi_code_bytes<value_bits>(HeadDim);
  static constexpr std::size_t k_record_bytes = align_up(k_code_bytes);

  kivi_layout() = default;

  /// Padded batch: each (sequence, kv head) owns `capacity` token slots. seq_lens[num_seqs] holds
  /// each sequence's total tokens and must stay readable where the layout is used.
  static kivi_layout padded(int num_kv_heads, int capacity, const int32_t* seq_lens, int num_seqs,
                            kivi_options opt = {}) {
    KVSCOUT_EXPECTS(num_kv_heads > 0, "num_kv_heads must be positive, got ", num_kv_heads);
    KVSCOUT_EXPECTS(capacity >= 0, "capacity must be non-negative, got ", capacity);
    KVSCOUT_EXPECTS(num_seqs >= 0, "num_seqs must be non-negative, got ", num_seqs);
    KVSCOUT_EXPECTS(seq_lens != nullptr || num_seqs == 0, "seq_lens is null for ", num_seqs,
                    " sequences");
    KVSCOUT_EXPECTS(opt.group > 0, "group size G must be positive, got G = ", opt.group);
    KVSCOUT_EXPECTS(HeadDim % opt.group == 0, "group size G = ", opt.group,
                    " must divide head_dim = ", HeadDim,
                    " (values are quantised over groups of G "
                    "channels)");
    KVSCOUT_EXPECTS(opt.residual >= 0,
                    "residual window R must be non-negative, got R = ", opt.residual);
    KVSCOUT_EXPECTS(opt.residual % opt.group == 0, "residual length R = ", opt.residual,
                    " must be a multiple of the group size G = ", opt.group,
                    " (KIVI quantises keys R at a time, in groups of G)");
    kivi_layout l;
    l.num_seqs_ = num_seqs;
    l.num_kv_heads_ = num_kv_heads;
    l.capacity_ = capacity;
    l.group_ = opt.group;
    l.residual_ = opt.residual;
    l.lens_ = seq_lens;
    l.quantized_capacity_ =
        std::max(l.key_quantized_len_for(capacity), l.value_quantized_len_for(capacity));
    l.key_groups_ = l.key_quantized_len_for(capacity) / opt.group;
    l.v_record_bytes_ =
        align_up(v_code_bytes + 2 * static_cast<std::size_t>(HeadDim / opt.group) * sizeof(Scale));
    const std::size_t record_max =
        std::max({k_record_bytes, l.v_record_bytes_, k_params_group_bytes});
    detail::checked_size(
        "a KIVI record buffer's bytes (num_seqs x num_kv_heads x quantised "
        "capacity x record bytes)",
        num_seqs, num_kv_heads, l.quantized_capacity_, record_max);
    detail::checked_size(
        "a KIVI residual buffer's bytes (num_seqs x num_kv_heads x residual "
        "slots x row bytes)",
        num_seqs, num_kv_heads, l.residual_slots(), HeadDim * sizeof(T));
    return l;
  }

  KVSCOUT_HOST_DEVICE int num_seqs() const { return num_seqs_; }
  KVSCOUT_HOST_DEVICE int num_kv_heads() const { return num_kv_heads_; }
  KVSCOUT_HOST_DEVICE int group() const { return group_; }
  KVSCOUT_HOST_DEVICE int residual() const { return residual_; }
  KVSCOUT_HOST_DEVICE int capacity() const { return capacity_; }
  KVSCOUT_HOST_DEVICE int quantized_capacity() const { return quantized_capacity_; }
  KVSCOUT_HOST_DEVICE int key_groups() const { return key_groups_; }
  KVSCOUT_HOST_DEVICE int key_block() const { return residual_ > 0 ? residual_ : group_; }
  /// key_block(), or the capacity where that is smaller (at least 1: a flush then never comes).
  KVSCOUT_HOST_DEVICE int residual_slots() const {
    const int b = key_block();
    return b <= capacity_ ? b : (capacity_ > 0 ? capacity_ : 1);
  }
  KVSCOUT_HOST_DEVICE const int32_t* seq_lens() const { return lens_; }

  KVSCOUT_HOST_DEVICE int key_quantized_len_for(int len) const {
    const int b = key_block();
    return len / b * b;
  }
  KVSCOUT_HOST_DEVICE int value_quantized_len_for(int len) const {
    return len > residual_ ? len - residual_ : 0;
  }
  /// Tokens executors fetch and selectors see: len - R once len >= R > 0.
  KVSCOUT_HOST_DEVICE int quantized_len_for(int len) const {
    const int k = key_quantized_len_for(len), v = value_quantized_len_for(len);
    return k < v ? k : v;
  }
  KVSCOUT_HOST_DEVICE int total_len(int s) const { return lens_[s]; }
  KVSCOUT_HOST_DEVICE int seq_len(int s) const { return quantized_len_for(lens_[s]); }
  KVSCOUT_HOST_DEVICE int residual_len(int s) const {
    return lens_[s] - quantized_len_for(lens_[s]);
  }

  KVSCOUT_HOST_DEVICE std::size_t k_row_bytes() const { return k_record_bytes; }
  KVSCOUT_HOST_DEVICE std::size_t v_row_bytes() const { return v_record_bytes_; }

  KVSCOUT_HOST_DEVICE std::size_t k_offset(int s, int t, int h) const {
    return record_index(s, t, h) * k_record_bytes;
  }
  KVSCOUT_HOST_DEVICE std::size_t v_offset(int s, int t, int h) const {
    return record_index(s, t, h) * v_record_bytes_;
  }

  KVSCOUT_HOST_DEVICE int contiguous_rows(int s, int t, int /*h*/, int n) const {
    const int left = seq_len(s) - t;
    return n < left ? n : left;
  }

  KVSCOUT_HOST_DEVICE std::size_t v_scales_offset() const { return v_code_bytes; }
  KVSCOUT_HOST_DEVICE std::size_t v_zeros_offset() const {
    return v_code_bytes + static_cast<std::size_t>(HeadDim / group_) * sizeof(Scale);
  }

  static constexpr std::size_t k_params_group_bytes = 2 * sizeof(Scale) * HeadDim;
  KVSCOUT_HOST_DEVICE std::size_t k_params_offset(int s, int j, int h) const {
    return ((static_cast<std::size_t>(s) * num_kv_heads_ + h) * key_groups() + j) *
           k_params_group_bytes;
  }

  KVSCOUT_HOST_DEVICE std::size_t residual_offset(int s, int t, int h) const {
    const int w = residual_slots();
    return ((static_cast<std::size_t>(s) * num_kv_heads_ + h) * w + t % w) * HeadDim * sizeof(T);
  }

  std::size_t required_k_bytes() const { return slots() * quantized_capacity_ * k_record_bytes; }
  std::size_t required_v_bytes() const { return slots() * quantized_capacity_ * v_record_bytes_; }
  std::size_t required_k_params_bytes() const {
    return slots() * key_groups() * k_params_group_bytes;
  }
  std::size_t required_residual_bytes() const {
    return slots() * residual_slots() * HeadDim * sizeof(T);
  }

  void validate_lengths() const {
    for (int s = 0; s < num_seqs_; ++s) {
      KVSCOUT_EXPECTS(lens_[s] >= 0 && lens_[s] <= capacity_, "seq_lens[", s, "] = ", lens_[s],
                      " is outside [0, capacity = ", capacity_, "]");
    }
  }

  void validate(std::size_t k_bytes, std::size_t v_bytes) const {
    validate_lengths();
    KVSCOUT_EXPECTS(k_bytes >= required_k_bytes(), "K code buffer holds ", k_bytes,
                    " bytes but the layout needs ", required_k_bytes(), " (", num_seqs_,
                    " sequences, ", num_kv_heads_, " kv heads, ", quantized_capacity_,
                    " quantised slots of ", k_record_bytes, " bytes)");
    KVSCOUT_EXPECTS(v_bytes >= required_v_bytes(), "V record buffer holds ", v_bytes,
                    " bytes but the layout needs ", required_v_bytes(), " (", num_seqs_,
                    " sequences, ", num_kv_heads_, " kv heads, ", quantized_capacity_,
                    " quantised slots of ", v_record_bytes_, " bytes)");
  }

  void validate_resident(std::size_t k_params_bytes, std::size_t k_residual_bytes,
                         std::size_t v_residual_bytes) const {
    KVSCOUT_EXPECTS(k_params_bytes >= required_k_params_bytes(), "key parameter buffer holds ",
                    k_params_bytes, " bytes but the layout needs ", required_k_params_bytes(), " (",
                    key_groups(), " groups of ", k_params_group_bytes, " bytes per head)");
    KVSCOUT_EXPECTS(k_residual_bytes >= required_residual_bytes(), "K residual buffer holds ",
                    k_residual_bytes, " bytes but the layout needs ", required_residual_bytes(),
                    " (", residual_slots(), " slots of ", HeadDim, " x ", dtype_traits<T>::name,
                    " per head)");
    KVSCOUT_EXPECTS(v_residual_bytes >= required_residual_bytes(), "V residual buffer holds ",
                    v_residual_bytes, " bytes but the layout needs ", required_residual_bytes());
  }

  void fill_quantized_lens(host_span<int32_t> out) const {
    KVSCOUT_EXPECTS(out.size() >= static_cast<std::size_t>(num_seqs_), "output holds ", out.size(),
                    " entries, expected num_seqs = ", num_seqs_);
    for (int s = 0; s < num_seqs_; ++s) out[s] = seq_len(s);
  }

 private:
  std::size_t slots() const {
    return static_cast<std::size_t>(num_seqs_) * static_cast<std::size_t>(num_kv_heads_);
  }
  KVSCOUT_HOST_DEVICE std::size_t record_index(int s, int t, int h) const {
    return (static_cast<std::size_t>(s) * num_kv_heads_ + h) * quantized_capacity_ + t;
  }

  int num_seqs_ = 0;
  int num_kv_heads_ = 0;
  int capacity_ = 0;
  int quantized_capacity_ = 0;
  int key_groups_ = 0;
  int group_ = 32;  // never 0, so a default-constructed layout's length math is defined
  int residual_ = 128;
  const int32_t* lens_ = nullptr;
  std::size_t v_record_bytes_ = 0;
};

static_assert(kv_layout<kivi_layout<half, 128, 2>>);
static_assert(kv_layout<kivi_layout<half, 64, 4, float>>);
static_assert(kv_layout<kivi_layout<bfloat16, 128, 4, half>>);
static_assert(kv_layout<kivi_layout<float, 256, 2, float>>);
static_assert(kv_layout<kivi_layout<half, 128, kivi_bits{2, 4}>>);
static_assert(std::is_same_v<kivi_layout<half, 64, 2>, kivi_layout<half, 64, kivi_bits{2, 2}>>);

namespace detail {
template <class L>
struct is_kivi_layout : std::false_type {};
template <kv_element T, int D, kivi_bits B, class S>
struct is_kivi_layout<kivi_layout<T, D, B, S>> : std::true_type {};
}  // namespace detail

template <class L>
concept kivi_quantized_layout = detail::is_kivi_layout<L>::value && kv_layout<L>;

}  // namespace kvscout
