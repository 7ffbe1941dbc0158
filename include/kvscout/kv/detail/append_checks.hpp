#pragma once
// Host-side half of the device append: validation of what the host knows, tested without a GPU.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kvscout/core/dtype.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/kv/concepts.hpp"
#include "kvscout/kv/kivi.hpp"

namespace kvscout::detail {

inline void check_kv_scales(const kv_scales& s) {
  KVSCOUT_EXPECTS(std::isfinite(s.k) && s.k > 0.f && std::isfinite(s.v) && s.v > 0.f,
                  "kv_scales must be positive and finite, got k = ", s.k, ", v = ", s.v);
}

template <class In, class T>
inline constexpr bool append_input_ok = std::is_same_v<In, float> || std::is_same_v<In, T>;

/// As kivi_append_host.
template <class S>
constexpr float kivi_append_limit() {
  return std::is_same_v<S, half> ? 65504.f : 0.5f * std::numeric_limits<float>::max();
}

inline void check_append_inputs(int num_seqs, int num_kv_heads, int head_dim, std::size_t k_size,
                                const void* k, std::size_t v_size, const void* v) {
  const std::size_t elems = static_cast<std::size_t>(num_seqs) * num_kv_heads * head_dim;
  KVSCOUT_EXPECTS(k_size >= elems && v_size >= elems, "new K / V hold ", k_size, " / ", v_size,
                  " elements, expected [", num_seqs, ", ", num_kv_heads, ", ", head_dim, "] = ",
                  elems);
  KVSCOUT_EXPECTS(elems == 0 || (k != nullptr && v != nullptr), "new K or V is null");
}

/// Destination buffers non-null and 16-byte aligned; row sizes a multiple of 16.
template <kv_layout L>
void check_append_layout(const L& l, const std::byte* k, const std::byte* v) {
  KVSCOUT_EXPECTS(k != nullptr && v != nullptr, "K or V cache buffer is null");
  KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(k) % 16 == 0 &&
                      reinterpret_cast<std::uintptr_t>(v) % 16 == 0,
                  "K / V cache buffers at ", static_cast<const void*>(k), " / ",
                  static_cast<const void*>(v), " must be 16-byte aligned");
  KVSCOUT_EXPECTS(l.k_row_bytes() % 16 == 0 && l.v_row_bytes() % 16 == 0, "row sizes K ",
                  l.k_row_bytes(), " / V ", l.v_row_bytes(), " must be multiples of 16 bytes");
}

/// seq_lens must be the array the layout reads; the five buffers non-null, 16-byte aligned and
/// large enough. No metadata is read on the host.
template <kivi_quantized_layout L, class Space>
void check_kivi_append(const L& l, const kivi_buffers<Space>& b, const std::int32_t* seq_lens) {
  KVSCOUT_EXPECTS(seq_lens != nullptr && seq_lens == l.seq_lens(),
                  "seq_lens must be the (writable) array the layout reads: got ",
                  static_cast<const void*>(seq_lens), ", the layout reads ",
                  static_cast<const void*>(l.seq_lens()));
  kivi_check_buffer(b.k_codes.data(), b.k_codes.size(), l.required_k_bytes(), "K code buffer");
  kivi_check_buffer(b.v_records.data(), b.v_records.size(), l.required_v_bytes(),
                    "V record buffer");
  kivi_check_buffer(b.k_params.data(), b.k_params.size(), l.required_k_params_bytes(),
                    "key parameter buffer (k_params)");
  kivi_check_buffer(b.k_residual.data(), b.k_residual.size(), l.required_residual_bytes(),
                    "K residual buffer");
  kivi_check_buffer(b.v_residual.data(), b.v_residual.size(), l.required_residual_bytes(),
                    "V residual buffer");
  b.check_distinct(l);
}

}  // namespace kvscout::detail
