#pragma once
// The device status word: what a kernel found wrong in data only the device reads.
//
// Kernels cannot throw, and the hot path must not read anything back to decide, so a kernel that
// meets bad device-resident data (a token index >= seq_len, a count > capacity, a row whose
// address falls outside the source buffer) does not read or write out of bounds: it skips the row
// (or clamps the count) and ORs a bit into a caller-provided int in device memory. The caller
// reads it whenever it likes (e.g. once per step, after the step's event, or only in debug
// builds); kvscout never does. A null status pointer turns the reporting off, not the checks.
//
//   int* status;                          // cudaMalloc'd, zeroed by the caller
//   cfg.device_status = status;           // executors, attention and append take it
//   ...
//   int bits = 0; cudaMemcpy(&bits, status, sizeof bits, cudaMemcpyDeviceToHost);  // off the hot path
//   if (bits) std::puts(kvscout::describe_device_status(bits).c_str());

#include <string>

namespace kvscout::device_status {

/// A selected token index outside [0, seq_len(s)) (or, for KIVI rows, outside the quantised
/// tokens): the row was skipped.
inline constexpr int bad_index = 1 << 0;
/// A count outside [0, capacity]: clamped into it.
inline constexpr int bad_count = 1 << 1;
/// A row whose byte range falls outside the source / destination buffer (bad page id, bad
/// position, bad length metadata): skipped.
inline constexpr int out_of_bounds = 1 << 2;
/// A row address that is not 16-byte aligned (a page stride that breaks the vector width):
/// skipped.
inline constexpr int misaligned = 1 << 3;
/// Append input that is not finite or exceeds the range of the KIVI scale type: the sequence's
/// append was skipped (the host writer would have thrown).
inline constexpr int bad_value = 1 << 4;

/// Human-readable list of the bits set in `bits`.
inline std::string describe(int bits) {
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
  const int known = bad_index | bad_count | out_of_bounds | misaligned | bad_value;
  if ((bits & ~known) != 0) {
    if (!s.empty()) s += ", ";
    s += "unknown bits " + std::to_string(bits & ~known);
  }
  return s;
}

}  // namespace kvscout::device_status

namespace kvscout {
/// See kvscout::device_status.
inline std::string describe_device_status(int bits) { return device_status::describe(bits); }
}  // namespace kvscout
