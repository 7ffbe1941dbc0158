#pragma once
// Exact selection of the k best keys of a row by radix select (no sort, no nth_element).
//
// Keys are score_key() values: 32 bits, larger is better, 0 = NaN = never chosen. Each pass counts
// one digit (at most 11 bits, most significant first) of the remaining candidates; only the bucket
// holding the k-th best key goes on to the next digit. A caller that knows bounds [key_lo, key_hi]
// of its keys passes them: digits of key - key_lo spread a narrow range over all the buckets.
//
// The result, a radix_cut, selects every key > cut.key and the first cut.ties keys equal to it in
// row order (ties go to the lowest positions), so emitting the selection in ascending order is one
// scan (radix_take). Fewer than k non-NaN keys: the cut takes every non-NaN key ({0, 0}).
//
//   auto cut = kvscout::detail::radix_select_host(
//       [&](int i) { return kvscout::score_key(row[i]); }, n, k, hist, pos.data());
//   int ties = cut.ties, count = 0;
//   for (int i = 0; i < n; ++i)
//     if (kvscout::detail::radix_take(kvscout::score_key(row[i]), cut, ties)) out[count++] = i;
//
// The digit plan, the take rule and the bucket walk are KVSCOUT_HOST_DEVICE so that the CUDA radix
// select computes the same cut.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvscout/core/config.hpp"
#include "kvscout/select/concepts.hpp"

namespace kvscout::detail {

inline constexpr int radix_bits = 11;
inline constexpr int radix_buckets = 1 << radix_bits;  // counters of one histogram

KVSCOUT_HOST_DEVICE int radix_significant_bits(std::uint32_t lo, std::uint32_t hi) {
  const std::uint32_t range = hi - lo;
#if KVSCOUT_DEVICE_PASS
  return 32 - __clz(static_cast<int>(range));
#else
  return 32 - std::countl_zero(range);
#endif
}

/// Digit `pass` (0 = most significant): bits [shift, shift + bits) of key - base.
struct radix_digit {
  int shift;
  int bits;
  std::uint32_t base;

  KVSCOUT_HOST_DEVICE std::uint32_t of(std::uint32_t key) const {
    return ((key - base) >> shift) & ((std::uint32_t{1} << bits) - 1u);
  }
};
/// The host takes narrower digits for short candidate lists: a pass costs a histogram of 1 << bits
/// counters whatever the list.
KVSCOUT_HOST_DEVICE radix_digit radix_plan(int top, int pass, std::uint32_t base,
                                           int bits = radix_bits) {
  const int hi = top - bits * pass;
  const int lo = hi > bits ? hi - bits : 0;
  return {lo, hi - lo, base};
}
KVSCOUT_HOST_DEVICE int radix_passes(int top, int bits = radix_bits) {
  return (top + bits - 1) / bits;
}

struct radix_cut {
  std::uint32_t key;
  int ties;
};

/// Takes nothing (UINT32_MAX is never a score key).
KVSCOUT_HOST_DEVICE radix_cut radix_cut_none() { return {0xffffffffu, 0}; }
KVSCOUT_HOST_DEVICE radix_cut radix_cut_all() { return {0u, 0}; }
/// Key 0 (NaN) is never taken.
KVSCOUT_HOST_DEVICE radix_cut radix_cut_at(std::uint32_t key, int ties) {
  return key == 0 ? radix_cut_all() : radix_cut{key, ties};
}

KVSCOUT_HOST_DEVICE bool radix_take(std::uint32_t key, radix_cut cut, int& ties_left) {
  if (key == cut.key) [[unlikely]] {
    const bool tie = ties_left > 0;
    ties_left -= static_cast<int>(tie);
    return tie;
  }
  return key > cut.key;
}

/// The bucket holding the k-th largest entry (1-based k), walking down from the top, and its rank
/// inside the bucket. k must be in [1, sum of hist].
struct radix_bucket {
  int bucket;
  int k;
};
KVSCOUT_HOST_DEVICE radix_bucket radix_find_bucket(const std::uint32_t* hist, int buckets, int k) {
  // Groups of 16 buckets first (their sums vectorise): most buckets of a short list are empty.
  constexpr int group = 16;
  int b = buckets - 1;
  while (b + 1 >= 2 * group) {
    int sum = 0;
    for (int j = 0; j < group; ++j) sum += static_cast<int>(hist[b - j]);
    if (k <= sum) break;
    k -= sum;
    b -= group;
  }
  for (; b > 0; --b) {
    const int c = static_cast<int>(hist[b]);
    if (k <= c) break;
    k -= c;
  }
  return {b, k};
}

/// The rest of radix_select_host, given the histogram of digit 0 of every key.
template <class KeyAt>
radix_cut radix_select_counted(KeyAt&& key_at, int n, int k, std::uint32_t* hist, std::int32_t* pos,
                               int top, std::uint32_t base, int bits = radix_bits) {
  const int passes = radix_passes(top, bits);
  radix_digit d = radix_plan(top, 0, base, bits);
  radix_bucket rb = radix_find_bucket(hist, 1 << d.bits, k);
  std::uint32_t prefix = static_cast<std::uint32_t>(rb.bucket) << d.shift;  // of key - base
  int m = static_cast<int>(hist[rb.bucket]);
  if (passes == 1) return radix_cut_at(base + prefix, rb.k);

  {
    const std::uint32_t want = static_cast<std::uint32_t>(rb.bucket);
    int c = 0;
    for (int i = 0; i < n; ++i) {
      pos[c] = i;
      c += static_cast<int>(d.of(key_at(i)) == want);
    }
  }

  for (int pass = 1; pass < passes; ++pass) {
    if (rb.k == m) {
      std::uint32_t lo = 0xffffffffu;
      for (int i = 0; i < m; ++i) {
        const std::uint32_t key = key_at(pos[i]);
        lo = key < lo ? key : lo;
      }
      int ties = 0;
      for (int i = 0; i < m; ++i) ties += static_cast<int>(key_at(pos[i]) == lo);
      return radix_cut_at(lo, ties);
    }
    d = radix_plan(top, pass, base, bits);
    std::memset(hist, 0, sizeof(std::uint32_t) << d.bits);
    for (int i = 0; i < m; ++i) ++hist[d.of(key_at(pos[i]))];
    rb = radix_find_bucket(hist, 1 << d.bits, rb.k);
    prefix |= static_cast<std::uint32_t>(rb.bucket) << d.shift;
    if (pass + 1 == passes) return radix_cut_at(base + prefix, rb.k);
    const int next = static_cast<int>(hist[rb.bucket]);
    if (next != m) {
      const std::uint32_t want = static_cast<std::uint32_t>(rb.bucket);
      int c = 0;
      for (int i = 0; i < m; ++i) {
        const std::int32_t p = pos[i];
        pos[c] = p;
        c += static_cast<int>(d.of(key_at(p)) == want);
      }
    }
    m = next;
  }
  return radix_cut_all();  // not reached: the last pass returns
}

/// The cut for the k best of the n keys key_at(0), ..., key_at(n - 1), all in [key_lo, key_hi].
/// Workspace: hist [radix_buckets], pos [n]. Cost: two scans of the keys, then of the survivors.
template <class KeyAt>
radix_cut radix_select_host(KeyAt&& key_at, int n, int k, std::uint32_t* hist, std::int32_t* pos,
                            std::uint32_t key_lo = 0u, std::uint32_t key_hi = 0xffffffffu,
                            int bits = radix_bits) {
  if (k <= 0 || n <= 0) return radix_cut_none();
  if (k >= n) return radix_cut_all();
  const int top = radix_significant_bits(key_lo, key_hi);
  if (top == 0) return radix_cut_at(key_lo, k);  // all keys are equal
  const radix_digit d = radix_plan(top, 0, key_lo, bits);
  std::memset(hist, 0, sizeof(std::uint32_t) << d.bits);
  for (int i = 0; i < n; ++i) ++hist[d.of(key_at(i))];
  return radix_select_counted(key_at, n, k, hist, pos, top, key_lo, bits);
}

}  // namespace kvscout::detail
