#pragma once
// The row_selector concept, keep-sets, and the order-preserving score keys every selector ranks by.
//
// A selector turns per-token scores into a selection (core/selection.hpp). Protocol, as for the
// executors:
//   1. S::workspace_bytes(config): bytes of caller-owned workspace, at an address that is a
//      multiple of S::workspace_alignment (the constructor checks it)
//   2. S sel(config, workspace): the only place a selector may allocate
//   3. per step, sel.select(scores, out, x): writes out.indices and out.counts
// Workspace, scores and buffers live in S::memory_space; x is S::exec_type (core/exec.hpp).

#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "kvscout/core/config.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

/// Tokens selected whatever their score (NaN included): the first `sinks` tokens of a row and the
/// last `recent`: [0, min(sinks, len)) u [max(0, len - recent), len); the two may overlap.
struct keep_set {
  int sinks = 0;
  int recent = 0;
};

namespace detail {
/// A selector's budget at a row of len cached tokens. budget_share 0: `budget` rows. Otherwise
/// ceil(budget_share * len) rows (a product within 1e-9 of an integer rounds down to it), at least
/// the keep-set's sinks + recent and at most `budget`: the budget follows the cached length.
KVSCOUT_HOST_DEVICE int row_budget(int budget, double budget_share, keep_set keep, int len) {
  if (!(budget_share > 0)) return budget;
  const double x = budget_share * static_cast<double>(len) - 1e-9;
  int b = x > 0 ? static_cast<int>(x) : 0;
  if (static_cast<double>(b) < x) ++b;  // ceil, without <cmath> on the device
  const int floor = keep.sinks + keep.recent;
  b = b > floor ? b : floor;
  return b < budget ? b : budget;
}

/// [0, head_end) and [tail_begin, len), with head_end <= tail_begin: the tokens chosen by score are
/// exactly [head_end, tail_begin).
struct keep_range {
  int head_end;
  int tail_begin;

  KVSCOUT_HOST_DEVICE int size(int len) const { return head_end + (len - tail_begin); }
};

KVSCOUT_HOST_DEVICE keep_range keep_bounds(keep_set keep, int len) {
  const int head_end = keep.sinks < len ? keep.sinks : len;
  const int tail = len - keep.recent;
  return {head_end, tail > head_end ? tail : head_end};
}

/// An unsigned key that orders as the scores do, so that selection can count bits (radix select):
///   score_key(x) < score_key(y)  iff  x < y        for non-NaN x, y (-inf and +inf included)
///   score_key(-0.f) == score_key(+0.f)
///   score_key(NaN) == 0, below every other key      (never chosen by score)
/// UINT32_MAX is never a key. Branch-free: a score's sign is as unpredictable as the score.
KVSCOUT_HOST_DEVICE std::uint32_t score_key(float x) {
#if KVSCOUT_DEVICE_PASS
  const std::uint32_t b = __float_as_uint(x);
#else
  const std::uint32_t b = std::bit_cast<std::uint32_t>(x);
#endif
  const std::uint32_t mag = b & 0x7fffffffu;
  const std::uint32_t neg = 0u - (b >> 31);                     // all ones for a negative score
  const std::uint32_t key = 0x80000000u + ((mag ^ neg) - neg);  // 2^31 + mag or 2^31 - mag
  return key & (0u - static_cast<std::uint32_t>(mag <= 0x7f800000u));  // NaN -> 0
}

/// +0 for the key of either zero; score_from_key(0) is a NaN.
KVSCOUT_HOST_DEVICE float score_from_key(std::uint32_t key) {
  const std::uint32_t b = key >= 0x80000000u ? key - 0x80000000u
                          : key == 0         ? 0x7fc00000u
                                             : 0x80000000u | (0x80000000u - key);
#if KVSCOUT_DEVICE_PASS
  return __uint_as_float(b);
#else
  return std::bit_cast<float>(b);
#endif
}

/// m - alpha (in float arithmetic); -inf for m = -inf, and for alpha = +inf (every non-NaN score,
/// also when m = +inf).
KVSCOUT_HOST_DEVICE float threshold_floor(float m, float alpha) {
  return alpha < INFINITY ? m - alpha : -INFINITY;
}

}  // namespace detail

template <class S>
concept row_selector =
    requires {
      typename S::config_type;
      typename S::memory_space;
      typename S::exec_type;
    } &&
    std::constructible_from<S, const typename S::config_type&,
                            span<std::byte, typename S::memory_space>> &&
    requires(S& s, const typename S::config_type& cfg,
             const score_view<typename S::memory_space>& scores,
             const selection_buffers<typename S::memory_space>& out,
             const typename S::exec_type& x) {
      { S::workspace_bytes(cfg) } -> std::same_as<std::size_t>;
      { S::workspace_alignment } -> std::convertible_to<std::size_t>;
      s.select(scores, out, x);
    };

}  // namespace kvscout
