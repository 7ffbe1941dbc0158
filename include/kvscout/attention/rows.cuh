#pragma once
// Row sources for the device decode attention (attention/decode.cuh), the device twins of
// attention/rows.hpp and attention/kivi_rows.hpp, and their concept attention_rows_cuda:
//   gathered_rows_cuda<T, D>      the fetched T rows (sparse attention)
//   kivi_gathered_rows_cuda<L>    the fetched KIVI records dequantised as read, then the
//                                 resident residual window
//   layout_rows_cuda<L>           every token of a device-resident cache (dense anchor)
//   joined_rows_cuda<A, B>        A's rows, then B's
// head_dim / E lanes read one row; a lane gets the E consecutive elements starting at c0
// (E = decode_lane_elems<element_type, head_dim>: up to 16 bytes a lane), as float:
//
//   rows(s, h, status)                    rows of (s, h) (counts clamped to [0, capacity],
//                                         device_status::bad_count raised)
//   load_k(s, h, i, c0, float (&)[E], status) -> bool   false: row skipped (bad index, raised)
//   load_v(s, h, i, c0, float (&)[E])     only after load_k returned true
//
// The per-element math is the host's, so a dequantised element has the same bits here as in
// kivi_gathered_rows_host.

#include <cuda_runtime.h>

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "kvscout/attention/detail/decode_device_checks.hpp"
#include "kvscout/core/device_status.hpp"
#include "kvscout/core/config.hpp"
#include "kvscout/core/detail/load_row_part.cuh"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/kv/detail/kivi_pack.hpp"
#include "kvscout/kv/kivi.hpp"

namespace kvscout {
namespace detail {

KVSCOUT_DEVICE int clamp_count(int n, int capacity) { return n < 0 ? 0 : (n > capacity ? capacity : n); }

}  // namespace detail

/// A row source decode_attention_cuda reads: copied by value into the kernel, shapes on the host,
/// and the three device calls above; rows() returns a count the source trusts or has clamped. An
/// engine's own row source models this to reuse the kernel.
template <class R>
concept attention_rows_cuda =
    std::copyable<R> &&
    requires {
      typename R::element_type;
      { R::head_dim } -> std::convertible_to<int>;
    } &&
    requires(const R& r, int s, int h, int i, int c0, int* status,
             float (&part)[detail::decode_lane_elems<typename R::element_type, R::head_dim>]) {
      { r.num_seqs() } -> std::same_as<int>;
      { r.num_kv_heads() } -> std::same_as<int>;
      { r.rows(s, h, status) } -> std::same_as<int>;
      {
        r.template load_k<detail::decode_lane_elems<typename R::element_type, R::head_dim>>(
            s, h, i, c0, part, status)
      } -> std::same_as<bool>;
      r.template load_v<detail::decode_lane_elems<typename R::element_type, R::head_dim>>(
          s, h, i, c0, part);
    };

template <kv_element T, int HeadDim>
class gathered_rows_cuda {
 public:
  using element_type = T;
  static constexpr int head_dim = HeadDim;

  gathered_rows_cuda() = default;
  /// k / v: [num_seqs, num_kv_heads, capacity, head_dim]. Host checks of shapes and sizes only;
  /// counts are clamped on the device.
  gathered_rows_cuda(const selection_view<device_space>& sel, device_span<const T> k,
                       device_span<const T> v)
      : indices_(sel.indices.data()),
        counts_(sel.counts.data()),
        k_(k.data()),
        v_(v.data()),
        num_seqs_(sel.num_seqs),
        num_kv_heads_(sel.num_kv_heads),
        capacity_(sel.capacity) {
    detail::check_gathered_cuda(sel, k.size_bytes(), k.data(), v.size_bytes(), v.data(),
                                  HeadDim * sizeof(T), HeadDim * sizeof(T));
  }
  /// The same over the byte buffers an executor wrote, read as T rows (sizes, 16-byte alignment
  /// checked).
  gathered_rows_cuda(const selection_view<device_space>& sel,
                       const gather_destination<device_space>& rows)
      : gathered_rows_cuda(sel, typed(rows.k), typed(rows.v)) {}

  KVSCOUT_HOST_DEVICE int num_seqs() const { return num_seqs_; }
  KVSCOUT_HOST_DEVICE int num_kv_heads() const { return num_kv_heads_; }

  KVSCOUT_DEVICE int rows(int s, int h, int* status) const {
    const int n = counts_[pair(s, h)];
    if (n < 0 || n > capacity_) detail::raise_device_status(status, device_status::bad_count);
    return detail::clamp_count(n, capacity_);
  }
  template <int E>
  KVSCOUT_DEVICE bool load_k(int s, int h, int i, int c0, float (&dst)[E], int* /*status*/) const {
    detail::load_row_part<T, E>(k_ + slot(s, h, i) * HeadDim + c0, dst);
    return true;
  }
  template <int E>
  KVSCOUT_DEVICE void load_v(int s, int h, int i, int c0, float (&dst)[E]) const {
    detail::load_row_part<T, E>(v_ + slot(s, h, i) * HeadDim + c0, dst);
  }

 private:
  KVSCOUT_DEVICE std::size_t pair(int s, int h) const {
    return static_cast<std::size_t>(s) * num_kv_heads_ + h;
  }
  KVSCOUT_DEVICE std::size_t slot(int s, int h, int i) const {
    return pair(s, h) * static_cast<std::size_t>(capacity_) + static_cast<std::size_t>(i);
  }
  const std::int32_t* indices_ = nullptr;
  const std::int32_t* counts_ = nullptr;
  const T* k_ = nullptr;
  const T* v_ = nullptr;
  int num_seqs_ = 0, num_kv_heads_ = 0, capacity_ = 0;

  static device_span<const T> typed(device_span<std::byte> b) {
    return {reinterpret_cast<const T*>(b.data()), b.size() / sizeof(T)};
  }
};

/// Every cached token of a device-resident (or mapped) cache: the dense anchor. Not for KIVI.
template <kv_layout L>
  requires(!kivi_quantized_layout<L>)
class layout_rows_cuda {
 public:
  static_assert(detail::layout_passes_to_kernels<L>());
  using element_type = typename L::element_type;
  static constexpr int head_dim = L::head_dim;

  layout_rows_cuda() = default;
  /// The layout's metadata must be device-readable; it is not validated here (validate it on a host
  /// copy). Rows whose bytes fall outside the buffers are skipped (out_of_bounds).
  explicit layout_rows_cuda(const kv_view<L, device_space>& kv)
      : l_(kv.layout), k_(kv.k.data()), v_(kv.v.data()), k_bytes_(kv.k.size()),
        v_bytes_(kv.v.size()) {
    KVSCOUT_EXPECTS(k_ != nullptr && v_ != nullptr, "K or V buffer is null");
    KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(k_) % 16 == 0 &&
                        reinterpret_cast<std::uintptr_t>(v_) % 16 == 0,
                    "K / V at ", static_cast<const void*>(k_), " / ",
                    static_cast<const void*>(v_), " must be 16-byte aligned");
  }

  KVSCOUT_HOST_DEVICE int num_seqs() const { return l_.num_seqs(); }
  KVSCOUT_HOST_DEVICE int num_kv_heads() const { return l_.num_kv_heads(); }

  KVSCOUT_DEVICE int rows(int s, int /*h*/, int* /*status*/) const { return l_.seq_len(s); }
  template <int E>
  KVSCOUT_DEVICE bool load_k(int s, int h, int i, int c0, float (&dst)[E], int* status) const {
    constexpr std::size_t row = sizeof(element_type) * head_dim;
    const std::size_t ko = l_.k_offset(s, i, h), vo = l_.v_offset(s, i, h);
    if (ko > k_bytes_ || row > k_bytes_ - ko || vo > v_bytes_ || row > v_bytes_ - vo) {
      detail::raise_device_status(status, device_status::out_of_bounds);
      return false;
    }
    // A row the layout places off the load's alignment is skipped with `misaligned` instead of
    // faulting on the load.
    constexpr std::size_t part = sizeof(element_type) * E;
    constexpr std::size_t align = part % 16 == 0 ? 16 : (part % 8 == 0 ? 8 : sizeof(element_type));
    if ((ko | vo) % align != 0) {
      detail::raise_device_status(status, device_status::misaligned);
      return false;
    }
    detail::load_row_part<element_type, E>(
        reinterpret_cast<const element_type*>(k_ + ko) + c0, dst);
    return true;
  }
  template <int E>
  KVSCOUT_DEVICE void load_v(int s, int h, int i, int c0, float (&dst)[E]) const {
    detail::load_row_part<element_type, E>(
        reinterpret_cast<const element_type*>(v_ + l_.v_offset(s, i, h)) + c0, dst);
  }

 private:
  L l_{};
  const std::byte* k_ = nullptr;
  const std::byte* v_ = nullptr;
  std::size_t k_bytes_ = 0, v_bytes_ = 0;
};

/// The gathered KIVI records, dequantised as read, then the resident window;
/// rows(s, h) = counts[s, h] + residual_len(s).
template <kivi_quantized_layout L>
class kivi_gathered_rows_cuda {
 public:
  using element_type = typename L::element_type;
  using scale_type = typename L::scale_type;
  static constexpr int head_dim = L::head_dim;

  kivi_gathered_rows_cuda() = default;
  /// The layout's lengths, the selection, the gathered records and the resident buffers must be
  /// device-readable. Indices are checked on the device (outside the quantised tokens: skipped,
  /// bad_index).
  kivi_gathered_rows_cuda(const L& layout, const selection_view<device_space>& sel,
                            const gather_destination<device_space>& gathered,
                            const kivi_resident_view<device_space>& resident)
      : l_(layout),
        indices_(sel.indices.data()),
        counts_(sel.counts.data()),
        k_(gathered.k.data()),
        v_(gathered.v.data()),
        k_params_(resident.k_params.data()),
        k_residual_(resident.k_residual.data()),
        v_residual_(resident.v_residual.data()),
        capacity_(sel.capacity) {
    KVSCOUT_EXPECTS(sel.num_seqs == layout.num_seqs() && sel.num_kv_heads == layout.num_kv_heads(),
                    "selection shape [", sel.num_seqs, ", ", sel.num_kv_heads,
                    "] differs from the layout's [", layout.num_seqs(), ", ",
                    layout.num_kv_heads(), "]");
    detail::check_gathered_cuda(sel, gathered.k.size(), gathered.k.data(), gathered.v.size(),
                                  gathered.v.data(), layout.k_row_bytes(), layout.v_row_bytes());
    resident.validate(layout);
  }

  KVSCOUT_HOST_DEVICE int num_seqs() const { return l_.num_seqs(); }
  KVSCOUT_HOST_DEVICE int num_kv_heads() const { return l_.num_kv_heads(); }

  KVSCOUT_DEVICE int rows(int s, int h, int* status) const {
    const int n = counts_[pair(s, h)];
    if (n < 0 || n > capacity_) detail::raise_device_status(status, device_status::bad_count);
    return detail::clamp_count(n, capacity_) + l_.residual_len(s);
  }

  template <int E>
  KVSCOUT_DEVICE bool load_k(int s, int h, int i, int c0, float (&dst)[E], int* status) const {
    using S = scale_type;
    const int n = detail::clamp_count(counts_[pair(s, h)], capacity_);
    if (i < n) {
      const std::size_t at = slot(s, h, i);
      const int t = indices_[at];
      if (t < 0 || t >= l_.seq_len(s)) {
        detail::raise_device_status(status, device_status::bad_index);
        return false;
      }
      const auto* codes = reinterpret_cast<const std::uint8_t*>(k_ + at * l_.k_row_bytes());
      const S* scale = reinterpret_cast<const S*>(k_params_ + l_.k_params_offset(s, t / l_.group(), h));
      const S* zero = scale + head_dim;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int c = c0 + e;
        dst[e] = detail::kivi_dequantize(detail::kivi_code<L::key_bits>(codes, c),
                                         detail::kivi_to_float(scale[c]),
                                         detail::kivi_to_float(zero[c]));
      }
    } else {
      const int t = l_.seq_len(s) + (i - n);
      detail::load_row_part<element_type, E>(
          reinterpret_cast<const element_type*>(k_residual_ + l_.residual_offset(s, t, h)) + c0,
          dst);
    }
    return true;
  }

  template <int E>
  KVSCOUT_DEVICE void load_v(int s, int h, int i, int c0, float (&dst)[E]) const {
    using S = scale_type;
    const int n = detail::clamp_count(counts_[pair(s, h)], capacity_);
    if (i < n) {
      const std::byte* rec = v_ + slot(s, h, i) * l_.v_row_bytes();
      const auto* codes = reinterpret_cast<const std::uint8_t*>(rec);
      const S* scales = reinterpret_cast<const S*>(rec + l_.v_scales_offset());
      const S* zeros = reinterpret_cast<const S*>(rec + l_.v_zeros_offset());
      const int G = l_.group();
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int c = c0 + e;
        dst[e] = detail::kivi_dequantize(detail::kivi_code<L::value_bits>(codes, c),
                                         detail::kivi_to_float(scales[c / G]),
                                         detail::kivi_to_float(zeros[c / G]));
      }
    } else {
      const int t = l_.seq_len(s) + (i - n);
      detail::load_row_part<element_type, E>(
          reinterpret_cast<const element_type*>(v_residual_ + l_.residual_offset(s, t, h)) + c0,
          dst);
    }
  }

 private:
  KVSCOUT_DEVICE std::size_t pair(int s, int h) const {
    return static_cast<std::size_t>(s) * l_.num_kv_heads() + h;
  }
  KVSCOUT_DEVICE std::size_t slot(int s, int h, int i) const {
    return pair(s, h) * static_cast<std::size_t>(capacity_) + static_cast<std::size_t>(i);
  }
  L l_{};
  const std::int32_t* indices_ = nullptr;
  const std::int32_t* counts_ = nullptr;
  const std::byte* k_ = nullptr;
  const std::byte* v_ = nullptr;
  const std::byte* k_params_ = nullptr;
  const std::byte* k_residual_ = nullptr;
  const std::byte* v_residual_ = nullptr;
  int capacity_ = 0;
};

/// Two device row sources of one element type, head_dim and shape read as one: (s, h) has a's rows,
/// then b's (the correction step's rows, so nothing is copied into one set). Holds both by value;
/// each load reads a's count once more (clamped as rows() clamps it; only rows() reports a bad
/// one).
template <attention_rows_cuda A, attention_rows_cuda B>
  requires std::same_as<typename A::element_type, typename B::element_type> &&
           (A::head_dim == B::head_dim)
class joined_rows_cuda {
 public:
  using element_type = typename A::element_type;
  static constexpr int head_dim = A::head_dim;

  joined_rows_cuda() = default;
  joined_rows_cuda(const A& a, const B& b) : a_(a), b_(b) {
    KVSCOUT_EXPECTS(a.num_seqs() == b.num_seqs() && a.num_kv_heads() == b.num_kv_heads(),
                    "joined rows of shapes [num_seqs, num_kv_heads] = [", a.num_seqs(), ", ",
                    a.num_kv_heads(), "] and [", b.num_seqs(), ", ", b.num_kv_heads(),
                    "], expected one shape");
  }

  KVSCOUT_HOST_DEVICE int num_seqs() const { return a_.num_seqs(); }
  KVSCOUT_HOST_DEVICE int num_kv_heads() const { return a_.num_kv_heads(); }

  KVSCOUT_DEVICE int rows(int s, int h, int* status) const {
    return a_.rows(s, h, status) + b_.rows(s, h, status);
  }
  template <int E>
  KVSCOUT_DEVICE bool load_k(int s, int h, int i, int c0, float (&dst)[E], int* status) const {
    const int n = a_.rows(s, h, nullptr);
    return i < n ? a_.template load_k<E>(s, h, i, c0, dst, status)
                 : b_.template load_k<E>(s, h, i - n, c0, dst, status);
  }
  template <int E>
  KVSCOUT_DEVICE void load_v(int s, int h, int i, int c0, float (&dst)[E]) const {
    const int n = a_.rows(s, h, nullptr);
    if (i < n) {
      a_.template load_v<E>(s, h, i, c0, dst);
    } else {
      b_.template load_v<E>(s, h, i - n, c0, dst);
    }
  }

 private:
  A a_{};
  B b_{};
};

}  // namespace kvscout
