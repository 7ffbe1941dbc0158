#pragma once
// KIVI-quantised KV layout (Liu et al., ICML'24): 2- or 4-bit asymmetric quantisation (key and
// value widths separate: kivi_bits), keys per channel over groups of G tokens, values per token
// over groups of G channels, recent tokens in full precision; and the host writer that quantises
// tokens as they leave the full-precision window.
//
//   using layout = kvscout::kivi_layout<kvscout::half, 128, /*Bits=*/2>;   // fp16 scales / zeros
//   auto l = layout::padded(/*num_kv_heads=*/8, /*capacity=*/4096, lens.data(), /*num_seqs=*/2,
//                           {.group = 32, .residual = 128});
//   kvscout::kivi_host_storage store(l);                     // or any 16-byte aligned buffers
//   kvscout::kivi_append_host<layout> w(l, store.buffers(), lens.data());
//   w.append(/*s=*/0, k_token, v_token);                     // [8, 128] each; lens[0] becomes 1
//   executor.submit(store.buffers().view(l).quantized(), selection, destination);
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
#include "kvscout/core/dispatch.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/detail/checked_size.hpp"
#include "kvscout/core/detail/overlap.hpp"
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
                    " must divide head_dim = ", HeadDim, " (values are quantised over groups of G "
                    "channels)");
    KVSCOUT_EXPECTS(opt.residual >= 0, "residual window R must be non-negative, got R = ",
                    opt.residual);
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
    l.quantized_capacity_ = std::max(l.key_quantized_len_for(capacity),
                                     l.value_quantized_len_for(capacity));
    l.key_groups_ = l.key_quantized_len_for(capacity) / opt.group;
    l.v_record_bytes_ = align_up(v_code_bytes + 2 * static_cast<std::size_t>(HeadDim / opt.group) *
                                                    sizeof(Scale));
    const std::size_t record_max = std::max({k_record_bytes, l.v_record_bytes_,
                                             k_params_group_bytes});
    detail::checked_size("a KIVI record buffer's bytes (num_seqs x num_kv_heads x quantised "
                         "capacity x record bytes)", num_seqs, num_kv_heads,
                         l.quantized_capacity_, record_max);
    detail::checked_size("a KIVI residual buffer's bytes (num_seqs x num_kv_heads x residual "
                         "slots x row bytes)", num_seqs, num_kv_heads, l.residual_slots(),
                         HeadDim * sizeof(T));
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
                    k_params_bytes, " bytes but the layout needs ", required_k_params_bytes(),
                    " (", key_groups(), " groups of ", k_params_group_bytes, " bytes per head)");
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

namespace detail {
inline void kivi_check_buffer(const std::byte* p, std::size_t size, std::size_t need, const char* what) {
  KVSCOUT_EXPECTS(p != nullptr || need == 0, what, " is null but ", need, " bytes are needed");
  KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(p) % detail::kivi_alignment == 0, what,
                  " at address ", static_cast<const void*>(p), " is not ", detail::kivi_alignment,
                  "-byte aligned");
  KVSCOUT_EXPECTS(size >= need, what, " holds ", size, " bytes, expected at least ", need);
}
}  // namespace detail

template <class Space>
struct kivi_resident_view {
  span<const std::byte, Space> k_params;    // [num_seqs, H, Kq / G, 2, D] Scale
  span<const std::byte, Space> k_residual;  // [num_seqs, H, W, D] T
  span<const std::byte, Space> v_residual;  // [num_seqs, H, W, D] T

  template <kivi_quantized_layout L>
  void validate(const L& l) const {
    detail::kivi_check_buffer(k_params.data(), k_params.size(), l.required_k_params_bytes(),
                                     "key parameter buffer (k_params)");
    detail::kivi_check_buffer(k_residual.data(), k_residual.size(),
                                     l.required_residual_bytes(), "K residual buffer");
    detail::kivi_check_buffer(v_residual.data(), v_residual.size(),
                                     l.required_residual_bytes(), "V residual buffer");
  }
};

template <class Layout, class Space>
struct kivi_view {
  Layout layout;
  span<const std::byte, Space> k_codes;     // [num_seqs, H, Qc, k_row_bytes]   fetched
  span<const std::byte, Space> v_records;   // [num_seqs, H, Qc, v_row_bytes]   fetched
  kivi_resident_view<Space> resident;       // key parameters, residual windows: not fetched

  KVSCOUT_HOST_DEVICE kv_view<Layout, Space> quantized() const { return {layout, k_codes, v_records}; }

  void validate() const {
    layout.validate(k_codes.size(), v_records.size());
    detail::kivi_check_buffer(k_codes.data(), k_codes.size(), layout.required_k_bytes(),
                                     "K code buffer");
    detail::kivi_check_buffer(v_records.data(), v_records.size(),
                                     layout.required_v_bytes(), "V record buffer");
    resident.validate(layout);
  }
};

template <class Space>
struct kivi_buffers {
  span<std::byte, Space> k_codes;
  span<std::byte, Space> v_records;
  span<std::byte, Space> k_params;
  span<std::byte, Space> k_residual;
  span<std::byte, Space> v_residual;

  template <kivi_quantized_layout L>
  kivi_view<L, Space> view(const L& l) const {
    return {l, k_codes, v_records, {k_params, k_residual, v_residual}};
  }

  template <kivi_quantized_layout L>
  void check_distinct(const L& l) const {
    const std::byte* p[5] = {k_codes.data(), v_records.data(), k_params.data(), k_residual.data(),
                             v_residual.data()};
    const std::size_t n[5] = {l.required_k_bytes(), l.required_v_bytes(),
                              l.required_k_params_bytes(), l.required_residual_bytes(),
                              l.required_residual_bytes()};
    constexpr const char* name[5] = {"K code buffer", "V record buffer", "key parameter buffer",
                                     "K residual buffer", "V residual buffer"};
    for (int i = 0; i < 5; ++i)
      for (int j = i + 1; j < 5; ++j) {
        KVSCOUT_EXPECTS(!detail::bytes_overlap(p[i], n[i], p[j], n[j]), "the ",
                        name[i], " (", n[i], " bytes at ", static_cast<const void*>(p[i]),
                        ") and the ", name[j], " (", n[j], " bytes at ",
                        static_cast<const void*>(p[j]), ") overlap");
      }
  }
};

/// Owning host storage, 16-byte aligned, zero-filled: for tests, benchmarks and examples.
class kivi_host_storage {
 public:
  template <kivi_quantized_layout L>
  explicit kivi_host_storage(const L& l)
      : k_codes_(alloc(l.required_k_bytes())),
        v_records_(alloc(l.required_v_bytes())),
        k_params_(alloc(l.required_k_params_bytes())),
        k_residual_(alloc(l.required_residual_bytes())),
        v_residual_(alloc(l.required_residual_bytes())),
        sizes_{l.required_k_bytes(), l.required_v_bytes(), l.required_k_params_bytes(),
               l.required_residual_bytes(), l.required_residual_bytes()} {}

  kivi_buffers<host_space> buffers() const {
    return {{k_codes_.get(), sizes_[0]},
            {v_records_.get(), sizes_[1]},
            {k_params_.get(), sizes_[2]},
            {k_residual_.get(), sizes_[3]},
            {v_residual_.get(), sizes_[4]}};
  }

 private:
  struct aligned_delete {
    void operator()(std::byte* p) const {
      ::operator delete[](p, std::align_val_t{detail::kivi_alignment});
    }
  };
  using owned = std::unique_ptr<std::byte[], aligned_delete>;
  static owned alloc(std::size_t bytes) {
    const std::size_t n = bytes + detail::kivi_alignment;
    owned p(static_cast<std::byte*>(::operator new[](n, std::align_val_t{detail::kivi_alignment})));
    std::memset(p.get(), 0, n);
    return p;
  }
  owned k_codes_, v_records_, k_params_, k_residual_, v_residual_;
  std::size_t sizes_[5];
};

/// Appends tokens by KIVI's rule and increments seq_lens[s], the array the layout reads. Validates
/// before writing anything: sequence index, capacity, input sizes, finite inputs, and (fp16 scales)
/// |x| <= 65504. Different sequences may be appended from different threads. An append rewrites
/// window rows that readers of the current lengths see: a concurrent reader needs the caller's
/// synchronisation.
template <kivi_quantized_layout Layout>
class kivi_append_host {
 public:
  using element_type = typename Layout::element_type;
  using scale_type = typename Layout::scale_type;
  static constexpr int head_dim = Layout::head_dim;

  kivi_append_host(const Layout& l, const kivi_buffers<host_space>& b, int32_t* seq_lens)
      : l_(l), b_(b), lens_(seq_lens) {
    KVSCOUT_EXPECTS(seq_lens != nullptr && seq_lens == l.seq_lens(),
                    "seq_lens must be the (writable) array the layout reads: got ",
                    static_cast<const void*>(seq_lens), ", the layout reads ",
                    static_cast<const void*>(l.seq_lens()));
    b.view(l).validate();
    b.check_distinct(l);
  }

  void append(int s, host_span<const element_type> k, host_span<const element_type> v) {
    append(s, 1, k, v);
  }

  /// k, v [n, num_kv_heads, head_dim].
  void append(int s, int n, host_span<const element_type> k, host_span<const element_type> v) {
    KVSCOUT_EXPECTS(s >= 0 && s < l_.num_seqs(), "sequence ", s, " is out of range [0, ",
                    l_.num_seqs(), ")");
    KVSCOUT_EXPECTS(n >= 0, "token count must be non-negative, got ", n);
    const int len = lens_[s];
    KVSCOUT_EXPECTS(len >= 0 && len <= l_.capacity() - n, "appending ", n,
                    " token(s) to sequence ", s, " of length ", len, " exceeds capacity = ",
                    l_.capacity());
    const int H = l_.num_kv_heads();
    const std::size_t elems = static_cast<std::size_t>(n) * H * head_dim;
    KVSCOUT_EXPECTS(k.size() >= elems && v.size() >= elems, "token K / V hold ", k.size(), " / ",
                    v.size(), " elements, expected [", n, ", ", H, ", ", head_dim, "] = ", elems);
    KVSCOUT_EXPECTS(elems == 0 || (k.data() != nullptr && v.data() != nullptr),
                    "token K or V is null");
    check_values(k.data(), elems, "K");
    check_values(v.data(), elems, "V");
    for (int i = 0; i < n; ++i) {
      const std::size_t tok = static_cast<std::size_t>(i) * H * head_dim;
      append_one(s, k.data() + tok, v.data() + tok);
    }
  }

 private:
  using T = element_type;
  using S = scale_type;
  static constexpr int KBits = Layout::key_bits;
  static constexpr int VBits = Layout::value_bits;

  static void check_values(const T* x, std::size_t n, const char* what) {
    // fp16 scales: zero = min and scale = (max - min) / L stay finite when |x| <= 65504; fp32: half
    // the float range, so that max - min cannot overflow either.
    const float limit =
        std::is_same_v<S, half> ? 65504.f : 0.5f * std::numeric_limits<float>::max();
    for (std::size_t i = 0; i < n; ++i) {
      const float f = to_float(x[i]);
      KVSCOUT_EXPECTS(std::isfinite(f) && std::abs(f) <= limit, what, " element ", i, " = ", f,
                      " is not finite or exceeds the range of the scale type (|x| <= ", limit,
                      ")");
    }
  }

  T* k_ring(int s, int t, int h) const {
    return reinterpret_cast<T*>(b_.k_residual.data() + l_.residual_offset(s, t, h));
  }
  T* v_ring(int s, int t, int h) const {
    return reinterpret_cast<T*>(b_.v_residual.data() + l_.residual_offset(s, t, h));
  }

  void append_one(int s, const T* k, const T* v) {
    const int len = lens_[s], next = len + 1;
    const int H = l_.num_kv_heads();
    constexpr std::size_t row = head_dim * sizeof(T);
    const int v0 = l_.value_quantized_len_for(len), v1 = l_.value_quantized_len_for(next);
    if (v1 > v0 && v0 < len) quantise_value(s, v0, false);
    for (int h = 0; h < H; ++h) {
      std::memcpy(k_ring(s, len, h), k + static_cast<std::size_t>(h) * head_dim, row);
      std::memcpy(v_ring(s, len, h), v + static_cast<std::size_t>(h) * head_dim, row);
    }
    if (v1 > v0 && v0 == len) quantise_value(s, len, true);
    const int k0 = l_.key_quantized_len_for(len), k1 = l_.key_quantized_len_for(next);
    if (k1 > k0) quantise_keys(s, k0, k1, l_.quantized_len_for(next));
    lens_[s] = next;
  }

  // `keep`: the ring slot then holds the dequantised row (the token stays in the window).
  void quantise_value(int s, int t, bool keep) {
    const int G = l_.group();
    for (int h = 0; h < l_.num_kv_heads(); ++h) {
      auto* rec = reinterpret_cast<std::uint8_t*>(b_.v_records.data() + l_.v_offset(s, t, h));
      std::memset(rec, 0, l_.v_row_bytes());  // padding bytes are zero, records deterministic
      S* scales = reinterpret_cast<S*>(rec + l_.v_scales_offset());
      S* zeros = reinterpret_cast<S*>(rec + l_.v_zeros_offset());
      T* x = v_ring(s, t, h);
      detail::kivi_quantize_value_row<VBits, S, T>(x, head_dim, G, rec, scales, zeros);
      if (keep)
        for (int c = 0; c < head_dim; ++c)
          x[c] = from_float<T>(detail::kivi_dequantize(detail::kivi_code<VBits>(rec, c),
                                                       detail::kivi_to_float(scales[c / G]),
                                                       detail::kivi_to_float(zeros[c / G])));
    }
  }

  // Tokens [k0, k1) (whole groups of G); ring slots from token `window` on then hold them
  // dequantised.
  void quantise_keys(int s, int k0, int k1, int window) {
    const int G = l_.group();
    const T* rows[head_dim];  // G <= head_dim (G divides it)
    for (int h = 0; h < l_.num_kv_heads(); ++h) {
      for (int q0 = k0; q0 < k1; q0 += G) {
        std::memset(b_.k_codes.data() + l_.k_offset(s, q0, h), 0,
                    static_cast<std::size_t>(G) * l_.k_row_bytes());
        for (int i = 0; i < G; ++i) rows[i] = k_ring(s, q0 + i, h);
        S* scale = reinterpret_cast<S*>(b_.k_params.data() + l_.k_params_offset(s, q0 / G, h));
        S* zero = scale + head_dim;
        auto* records = reinterpret_cast<std::uint8_t*>(b_.k_codes.data() + l_.k_offset(s, q0, h));
        detail::kivi_quantize_key_group<KBits, S, T>(rows, G, head_dim, scale, zero, records,
                                                     l_.k_row_bytes());
        for (int i = 0; i < G; ++i) {
          if (q0 + i < window) continue;
          T* x = k_ring(s, q0 + i, h);
          const std::uint8_t* rec = records + static_cast<std::size_t>(i) * l_.k_row_bytes();
          for (int c = 0; c < head_dim; ++c)
            x[c] = from_float<T>(detail::kivi_dequantize(detail::kivi_code<KBits>(rec, c),
                                                         detail::kivi_to_float(scale[c]),
                                                         detail::kivi_to_float(zero[c])));
        }
      }
    }
  }

  Layout l_;
  kivi_buffers<host_space> b_;
  int32_t* lens_;
};

}  // namespace kvscout
