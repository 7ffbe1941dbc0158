#pragma once
// Contiguous KV layouts, NHD or HND, for batches of sequences of different lengths; K and V use
// separate buffers of the same shape.
//   padded  every sequence owns `capacity` token slots, lengths from seq_lens[num_seqs]:
//             NHD  [num_seqs, capacity, kv_heads, head_dim]
//             HND  [num_seqs, kv_heads, capacity, head_dim]   (the Hugging Face cache shape)
//   ragged  sequence s owns tokens [indptr[s], indptr[s+1]) of one shared buffer:
//             NHD  [total_tokens, kv_heads, head_dim]
//             HND  [kv_heads, total_tokens, head_dim]

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kvscout/core/config.hpp"
#include "kvscout/core/dtype.hpp"
#include "kvscout/core/detail/checked_size.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/kv/concepts.hpp"

namespace kvscout {

template <kv_element T, int HeadDim, detail::kv_order Order>
class contiguous_layout {
  static_assert(HeadDim > 0 && HeadDim % detail::vec_width<T> == 0,
                "kvscout::contiguous_layout: HeadDim must be a positive multiple of the 16-byte "
                "vector width of T");

 public:
  using element_type = T;
  using order = Order;
  static constexpr int head_dim = HeadDim;

  contiguous_layout() = default;

  /// seq_lens[num_seqs] must stay readable where the layout is used.
  static contiguous_layout padded(int num_kv_heads, int capacity, const int32_t* seq_lens,
                                  int num_seqs) {
    KVSCOUT_EXPECTS(num_kv_heads > 0, "num_kv_heads must be positive, got ", num_kv_heads);
    KVSCOUT_EXPECTS(capacity >= 0, "capacity must be non-negative, got ", capacity);
    KVSCOUT_EXPECTS(num_seqs >= 0, "num_seqs must be non-negative, got ", num_seqs);
    KVSCOUT_EXPECTS(seq_lens != nullptr || num_seqs == 0, "seq_lens is null for ", num_seqs,
                    " sequences");
    detail::checked_size("the padded K / V buffer's bytes (num_seqs x capacity x num_kv_heads x "
                         "row bytes)", num_seqs, capacity, num_kv_heads, row_bytes);
    contiguous_layout l;
    l.num_seqs_ = num_seqs;
    l.num_kv_heads_ = num_kv_heads;
    l.capacity_ = capacity;
    l.lens_ = seq_lens;
    const auto h = static_cast<std::int64_t>(num_kv_heads);
    l.seq_stride_ = capacity * h * HeadDim;
    l.set_order_strides(capacity);
    return l;
  }

  /// indptr[num_seqs + 1] must stay readable where the layout is used.
  static contiguous_layout ragged(int num_kv_heads, int total_tokens, const int32_t* indptr,
                                  int num_seqs) {
    KVSCOUT_EXPECTS(num_kv_heads > 0, "num_kv_heads must be positive, got ", num_kv_heads);
    KVSCOUT_EXPECTS(total_tokens >= 0, "total_tokens must be non-negative, got ", total_tokens);
    KVSCOUT_EXPECTS(num_seqs >= 0, "num_seqs must be non-negative, got ", num_seqs);
    KVSCOUT_EXPECTS(indptr != nullptr, "indptr is null");
    detail::checked_size("the ragged K / V buffer's bytes (total_tokens x num_kv_heads x row "
                         "bytes)", total_tokens, num_kv_heads, row_bytes);
    contiguous_layout l;
    l.num_seqs_ = num_seqs;
    l.num_kv_heads_ = num_kv_heads;
    l.capacity_ = total_tokens;
    l.indptr_ = indptr;
    l.seq_stride_ = 0;
    l.set_order_strides(total_tokens);
    return l;
  }

  KVSCOUT_HOST_DEVICE int num_seqs() const { return num_seqs_; }
  KVSCOUT_HOST_DEVICE int num_kv_heads() const { return num_kv_heads_; }
  KVSCOUT_HOST_DEVICE bool is_ragged() const { return indptr_ != nullptr; }

  KVSCOUT_HOST_DEVICE int seq_len(int s) const {
    return indptr_ != nullptr ? indptr_[s + 1] - indptr_[s] : lens_[s];
  }

  KVSCOUT_HOST_DEVICE std::size_t k_row_bytes() const { return row_bytes; }
  KVSCOUT_HOST_DEVICE std::size_t v_row_bytes() const { return row_bytes; }

  KVSCOUT_HOST_DEVICE std::size_t k_offset(int s, int t, int h) const {
    return static_cast<std::size_t>(element_offset(s, t, h)) * sizeof(T);
  }
  KVSCOUT_HOST_DEVICE std::size_t v_offset(int s, int t, int h) const { return k_offset(s, t, h); }

  /// Rows of one head are adjacent when the token stride is one row (HND, or NHD with a single KV
  /// head); then a run extends to the end of the sequence.
  KVSCOUT_HOST_DEVICE int contiguous_rows(int s, int t, int /*h*/, int n) const {
    if (token_stride_ != HeadDim) return n > 0 ? 1 : 0;
    const int left = seq_len(s) - t;
    return n < left ? n : left;
  }

  void validate(std::size_t k_bytes, std::size_t v_bytes) const {
    const std::size_t need = required_bytes();
    KVSCOUT_EXPECTS(k_bytes >= need, "K buffer holds ", k_bytes, " bytes but the layout needs ",
                    need, " (", num_seqs_, " sequences, ", num_kv_heads_, " kv heads, capacity ",
                    capacity_, ", head_dim ", HeadDim, ", ", dtype_traits<T>::name, ")");
    KVSCOUT_EXPECTS(v_bytes >= need, "V buffer holds ", v_bytes, " bytes but the layout needs ",
                    need);
    if (indptr_ != nullptr) {
      KVSCOUT_EXPECTS(indptr_[0] >= 0, "indptr[0] = ", indptr_[0], " is negative");
      for (int s = 0; s < num_seqs_; ++s) {
        KVSCOUT_EXPECTS(indptr_[s + 1] >= indptr_[s], "indptr is not non-decreasing: indptr[",
                        s, "] = ", indptr_[s], " > indptr[", s + 1, "] = ", indptr_[s + 1]);
      }
      KVSCOUT_EXPECTS(indptr_[num_seqs_] <= capacity_, "indptr[", num_seqs_,
                      "] = ", indptr_[num_seqs_], " exceeds total_tokens = ", capacity_);
    } else {
      for (int s = 0; s < num_seqs_; ++s) {
        KVSCOUT_EXPECTS(lens_[s] >= 0 && lens_[s] <= capacity_, "seq_lens[", s, "] = ", lens_[s],
                        " is outside [0, capacity = ", capacity_, "]");
      }
    }
  }

  std::size_t required_bytes() const {
    const std::size_t seqs = indptr_ != nullptr ? 1 : static_cast<std::size_t>(num_seqs_);
    return seqs * static_cast<std::size_t>(capacity_) * static_cast<std::size_t>(num_kv_heads_) *
           row_bytes;
  }

 private:
  static constexpr std::size_t row_bytes = sizeof(T) * HeadDim;

  void set_order_strides(int capacity) {
    if constexpr (std::is_same_v<Order, nhd>) {
      token_stride_ = static_cast<std::int64_t>(num_kv_heads_) * HeadDim;
      head_stride_ = HeadDim;
    } else {
      token_stride_ = HeadDim;
      head_stride_ = static_cast<std::int64_t>(capacity) * HeadDim;
    }
  }

  KVSCOUT_HOST_DEVICE std::int64_t element_offset(int s, int t, int h) const {
    const std::int64_t first = indptr_ != nullptr ? indptr_[s] : 0;
    return s * seq_stride_ + (first + t) * token_stride_ + h * head_stride_;
  }

  int num_seqs_ = 0;
  int num_kv_heads_ = 0;
  int capacity_ = 0;
  const int32_t* lens_ = nullptr;
  const int32_t* indptr_ = nullptr;
  std::int64_t seq_stride_ = 0;    // elements between sequences (padded form)
  std::int64_t token_stride_ = 0;  // elements between consecutive tokens of one head
  std::int64_t head_stride_ = 0;   // elements between heads of one token
};

static_assert(kv_layout<contiguous_layout<half, 128, nhd>>);
static_assert(kv_layout<contiguous_layout<float, 64, hnd>>);
static_assert(kv_layout<contiguous_layout<bfloat16, 256, hnd>>);

}  // namespace kvscout
