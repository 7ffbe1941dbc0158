#pragma once
// The KIVI layout's buffers (kv/kivi_layout.hpp: what each holds) and the host writer that
// quantises tokens as they leave the full-precision window, by KIVI's rule.
//
//   using layout = kvscout::kivi_layout<kvscout::half, 128, /*Bits=*/2>;   // fp16 scales / zeros
//   auto l = layout::padded(/*num_kv_heads=*/8, /*capacity=*/4096, lens.data(), /*num_seqs=*/2,
//                           {.group = 32, .residual = 128});
//   kvscout::kivi_host_storage store(l);                     // or any 16-byte aligned buffers
//   kvscout::kivi_append_host<layout> w(l, store.buffers(), lens.data());
//   w.append(/*s=*/0, k_token, v_token);                     // [8, 128] each; lens[0] becomes 1
//   executor.submit(store.buffers().view(l).quantized(), selection, destination);
//

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>

#include "kvscout/core/config.hpp"
#include "kvscout/core/detail/overlap.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/kv/detail/kivi_pack.hpp"
#include "kvscout/kv/kivi_layout.hpp"

namespace kvscout {

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
