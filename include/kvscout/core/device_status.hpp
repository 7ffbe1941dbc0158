#pragma once
// The device status word: what a kernel found wrong in data only the device reads.
//
// Kernels cannot throw, and the hot path must not read anything back, so a kernel that meets bad
// device-resident data does not read or write out of bounds: it skips the row (or clamps the
// count) and ORs a bit into a caller-provided int in device memory, which the caller reads when it
// likes (kvscout never does). A null status pointer turns the reporting off, not the checks. It is
// passed as cuda_exec::status; nothing stores it.
//
//   fetch.submit(src, sel, dst, {stream, status});   // status: cudaMalloc'd, zeroed by the caller
//   int bits = 0; cudaMemcpy(&bits, status, sizeof bits, cudaMemcpyDeviceToHost);
//   if (bits) std::puts(kvscout::device_status::describe(bits).c_str());

#include <string>

#include "kvscout/core/config.hpp"

namespace kvscout {

/// The bits of the device status word, and describe() to turn a word into words.
struct device_status {
  /// A token index outside its range (a selected index, an append's (sequence, position)): row or
  /// append skipped.
  static constexpr int bad_index = 1 << 0;
  static constexpr int bad_count = 1 << 1;
  /// A row whose byte range falls outside the source / destination buffer: skipped.
  static constexpr int out_of_bounds = 1 << 2;
  static constexpr int misaligned = 1 << 3;
  /// Append input that is not finite or exceeds the KIVI scale type's range: the sequence skipped.
  static constexpr int bad_value = 1 << 4;
  /// A sequence length read on the device outside [0, bound]: clamped.
  static constexpr int bad_length = 1 << 5;
  /// A batch row's sequence id outside the sequences the policy holds: the row scored -inf
  /// (reported for rows of length 0 too). Or a row_cache_view::row_map entry outside [-1,
  /// num_seqs): that row's cache was not used.
  static constexpr int bad_seq_id = 1 << 6;
  /// An append out of order (quantised partial keys): skipped.
  static constexpr int bad_order = 1 << 7;

  static std::string describe(int bits) {
    if (bits == 0) return "ok";
    std::string s;
    auto add = [&](int bit, const char* what) {
      if ((bits & bit) == 0) return;
      if (!s.empty()) s += ", ";
      s += what;
    };
    add(bad_index, "token index out of range (row skipped)");
    add(bad_count, "count outside [0, capacity] (clamped)");
    add(out_of_bounds, "row outside its buffer (skipped)");
    add(misaligned, "row not 16-byte aligned (skipped)");
    add(bad_value, "non-finite or out-of-range append input (append skipped)");
    add(bad_length, "sequence length outside [0, bound] (clamped)");
    add(bad_seq_id,
        "sequence id or row-cache map entry out of range (row scored -inf / not "
        "served from the cache)");
    add(bad_order, "append out of order (token skipped)");
    const int known = bad_index | bad_count | out_of_bounds | misaligned | bad_value | bad_length |
                      bad_seq_id | bad_order;
    if ((bits & ~known) != 0) {
      if (!s.empty()) s += ", ";
      s += "unknown bits " + std::to_string(bits & ~known);
    }
    return s;
  }
};

namespace detail {
/// ORs `bits` into *status (null: no report); a no-op where compiled for the host.
KVSCOUT_DEVICE void raise_device_status(int* status, int bits) {
#if KVSCOUT_DEVICE_CODE
  if (status != nullptr) atomicOr(status, bits);
#else
  (void)status, (void)bits;
#endif
}
}  // namespace detail

}  // namespace kvscout
