#pragma once
// The device status word: what a kernel found wrong in data only the device reads.
//
// Kernels cannot throw, and the hot path must not read anything back, so a kernel that meets bad
// device-resident data (a token index >= seq_len, a count > capacity, a row outside the source
// buffer) does not read or write out of bounds: it skips the row (or clamps the count) and ORs a
// bit into a caller-provided int in device memory, which the caller reads when it likes (kvscout
// never does). A null status pointer turns the reporting off, not the checks.
//
// It is passed as cuda_exec::status (core/exec.hpp), in the last argument of every device call;
// the CUDA pipeline hands its cuda_pipeline_exec's status word to every stage call.
// Nothing stores it: each call reports into the word it was given.
//
//   int* status;                          // cudaMalloc'd, zeroed by the caller
//   fetch.submit(src, sel, dst, {stream, status});   // e.g. an executor
//   ...
//   int bits = 0; cudaMemcpy(&bits, status, sizeof bits, cudaMemcpyDeviceToHost);  // off the hot path
//   if (bits) std::puts(kvscout::describe_device_status(bits).c_str());

#include <string>

#include "kvscout/core/config.hpp"

namespace kvscout::device_status {

/// A token index outside its range (a selected index outside [0, seq_len(s)), for KIVI rows the
/// quantised tokens; an append's (sequence, position) outside the cache): row or append skipped.
inline constexpr int bad_index = 1 << 0;
/// A count outside [0, capacity]: clamped into it.
inline constexpr int bad_count = 1 << 1;
/// A row whose byte range falls outside the source / destination buffer (bad page id, bad
/// position, bad length metadata): skipped.
inline constexpr int out_of_bounds = 1 << 2;
/// A row address that is not 16-byte aligned (a page stride that breaks the vector width): skipped.
inline constexpr int misaligned = 1 << 3;
/// Append input that is not finite or exceeds the range of the KIVI scale type: the sequence's
/// append was skipped (the host writer would have thrown).
inline constexpr int bad_value = 1 << 4;
/// A sequence length read on the device outside [0, bound] (the selector's stride; the policy's
/// max_seq_len, stride or cache length): clamped, so the row was scored or selected over fewer tokens.
inline constexpr int bad_length = 1 << 5;
/// A batch row's sequence id (score_context<device_space>::seq_ids) outside the sequences the policy
/// holds: the row was scored -inf for every token, so no key of another sequence was read for it
/// (reported for rows of length 0 too). Or a row cache's map entry (row_cache_view::row_map)
/// outside [-1, num_seqs): that row's cache was not used, its rows crossed the link.
inline constexpr int bad_seq_id = 1 << 6;
/// An append out of order (quantised partial keys take each sequence's tokens in order, one run of
/// consecutive positions per call from where it stopped, or from 0 for a new sequence): skipped.
inline constexpr int bad_order = 1 << 7;

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
  add(bad_length, "sequence length outside [0, bound] (clamped)");
  add(bad_seq_id, "sequence id or row-cache map entry out of range (row scored -inf / not "
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

}  // namespace kvscout::device_status

namespace kvscout {
namespace detail {
/// ORs `bits` into *status from device code (every kernel reports through it); null: no report.
/// A no-op where the code is compiled for the host.
KVSCOUT_DEVICE void raise_device_status(int* status, int bits) {
#if KVSCOUT_DEVICE_CODE
  if (status != nullptr) atomicOr(status, bits);
#else
  (void)status, (void)bits;
#endif
}
}  // namespace detail

/// See kvscout::device_status.
inline std::string describe_device_status(int bits) { return device_status::describe(bits); }
}  // namespace kvscout
