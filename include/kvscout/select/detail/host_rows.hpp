#pragma once
// Row machinery shared by the host selectors: input checks, the per-row workspace, vectorised row
// scans, a sampled lower bound, and the exact "best k of a range" pipeline built on radix select.
//
// The best k of a long range, exactly: sample_lower_bound gives a score L that about
// k + 3.5 standard deviations of tokens reach; collect_candidates keeps the tokens >= L (and >= the
// running maximum - alpha); filter_and_count drops what a lower running maximum let in and counts
// the first radix digit; radix select on the survivors. If fewer than k tokens reach L, the range
// is redone without it: only the time depends on the sample, never the result.
//
// The tests compare the SSE2 / AVX2 / AVX-512 scans with the portable ones.

#include <cmath>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvscout/core/config.hpp"
#include "kvscout/core/detail/host_vec.hpp"
#include "kvscout/core/detail/x86_intrinsics.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/select/concepts.hpp"
#include "kvscout/select/detail/checks.hpp"
#include "kvscout/select/detail/host_scans.hpp"
#include "kvscout/select/detail/radix_select.hpp"

namespace kvscout::detail {

inline constexpr std::size_t row_workspace_alignment = alignof(std::uint32_t);

inline std::uint32_t* workspace_words(host_span<std::byte> workspace, std::size_t need) {
  KVSCOUT_EXPECTS(workspace.size() >= need, "workspace holds ", workspace.size(),
                  " bytes, expected at least workspace_bytes(config) = ", need);
  KVSCOUT_EXPECTS(workspace.data() != nullptr || need == 0, "workspace is null");
  KVSCOUT_EXPECTS(reinterpret_cast<std::uintptr_t>(workspace.data()) % row_workspace_alignment == 0,
                  "workspace must be ", row_workspace_alignment, "-byte aligned, got address ",
                  static_cast<const void*>(workspace.data()));
  return reinterpret_cast<std::uint32_t*>(workspace.data());
}

inline constexpr int sample_max = 2048;  // sampled scores per row at most
inline constexpr int sample_min = 128;   // fewer would not bound k well enough to pay off

struct row_workspace {
  std::uint32_t* hist;   // [radix_buckets + 1]
  std::uint32_t* keys;   // [sample_max]  the sampled scores' keys
  std::int32_t* pos;     // [stride]      radix candidates (a sample has at most stride / 16)
  std::int32_t* cand;    // [stride]      a row's candidate token indices
  std::uint32_t* ckeys;  // [stride]      their score keys

  static std::size_t words(int stride) {
    return static_cast<std::size_t>(radix_buckets) + 1 + sample_max +
           3 * static_cast<std::size_t>(stride);
  }
  static row_workspace carve(std::uint32_t* w, int stride) {
    row_workspace ws{};
    ws.hist = w;
    ws.keys = ws.hist + radix_buckets + 1;
    ws.pos = reinterpret_cast<std::int32_t*>(ws.keys + sample_max);
    ws.cand = ws.pos + stride;
    ws.ckeys = reinterpret_cast<std::uint32_t*>(ws.cand + stride);
    return ws;
  }
};

inline int emit_range(int begin, int end, std::int32_t* out) {
  for (int t = begin; t < end; ++t) out[t - begin] = t;
  return end > begin ? end - begin : 0;
}


/// max_of(q, qn, -inf) carried along another scan's loop: step() once per vector block, then
/// result().
template <bool Simd>
struct max_carry {
#if KVSCOUT_HOST_AVX512 || KVSCOUT_HOST_AVX2
#if KVSCOUT_HOST_AVX512
  max_carry512 c{-INFINITY};
#else
  max_carry256 c{-INFINITY};
#endif
  void step(const float* q, int qn) {
    if constexpr (Simd) c.step(q, qn);
  }
  float result(const float* q, int qn) {
    if constexpr (Simd) return c.result(q, qn);
    return max_of<false>(q, qn, -INFINITY);
  }
#else
  void step(const float*, int) {}
  float result(const float* q, int qn) const { return max_of<Simd>(q, qn, -INFINITY); }
#endif
};

/// Runs block(i, dense) for i = 0, B, 2B, ... while i + B <= n, collect_window positions at a time;
/// returns the position reached. Before each window: if c > limit, sets gave_up and stops;
/// dense = ByDensity && c * 16 > i. Per window, to keep both out of the block loop.
template <int B, bool ByDensity, class Block>
__attribute__((always_inline)) inline int by_windows(int n, const int& c, int limit,
                                                     bool& gave_up, Block&& block) {
  static_assert(collect_window % B == 0, "a window is whole blocks");
  int i = 0;
  while (i + B <= n) {
    if (c > limit) {
      gave_up = true;
      break;
    }
    const int stop = i + collect_window < n - (B - 1) ? i + collect_window : n - (B - 1);
    if (ByDensity && c * 16 > i) {
      for (; i < stop; i += B) block(i, std::true_type{});
    } else {
      for (; i < stop; i += B) block(i, std::false_type{});
    }
  }
  return i;
}

/// Writes first + i for every i in [0, n) with p[i] >= bound, ascending, to out[0, n); returns how
/// many, or -1 as soon as more than `limit` are written (checked every collect_window positions;
/// out is then unspecified). With Ahead, also sets *qmax = max_of(q, qn, -inf) of another row q,
/// read in the same loop so that the compaction and the next row's L2 read overlap.
template <bool Simd = select_simd, bool Ahead = false>
int compact_at_least_impl(const float* p, int n, int first, float bound, std::int32_t* out,
                          int limit, [[maybe_unused]] const float* q, [[maybe_unused]] int qn,
                          [[maybe_unused]] float* qmax) {
  int i = 0;
  int c = 0;
  bool gave_up = false;
  [[maybe_unused]] max_carry<Simd> ahead;
#if KVSCOUT_HOST_AVX512
  if constexpr (Simd) {
    const __m512 b = _mm512_set1_ps(bound);
    const auto group = [&](int j, auto) __attribute__((always_inline)) {
      if constexpr (Ahead) ahead.step(q, qn);
      const __m512 x[4] = {_mm512_loadu_ps(p + j), _mm512_loadu_ps(p + j + 16),
                           _mm512_loadu_ps(p + j + 32), _mm512_loadu_ps(p + j + 48)};
      const __mmask64 bits = at_least_mask64(x, b);
      if (bits != 0) c = emit_bits64(bits, first + j, out, c);
    };
    i = by_windows<64, false>(n, c, limit, gave_up, group);
  }
#elif KVSCOUT_HOST_AVX2
  if constexpr (Simd) {
    // Block i writes inside out[c, c + 32) with c <= i. Dense emission past two kept per block.
    const __m256 b = _mm256_set1_ps(bound);
    const auto block = [&](int j, auto dense) __attribute__((always_inline)) {
      if constexpr (Ahead) ahead.step(q, qn);
      const __m256 x[4] = {_mm256_loadu_ps(p + j), _mm256_loadu_ps(p + j + 8),
                           _mm256_loadu_ps(p + j + 16), _mm256_loadu_ps(p + j + 24)};
      const std::uint32_t bits = at_least_mask32(x, b);
      if (bits != 0) c = decltype(dense)::value ? emit_bits32(bits, first + j, out, c)
                                                : emit_bits32_sparse(bits, first + j, out, c);
    };
    i = by_windows<32, true>(n, c, limit, gave_up, block);
  }
#elif KVSCOUT_HOST_SSE2
  if constexpr (Simd) {
    const __m128 b = _mm_set1_ps(bound);
    const auto block = [&](int j, auto) __attribute__((always_inline)) {
      const __m128 x[4] = {_mm_loadu_ps(p + j), _mm_loadu_ps(p + j + 4), _mm_loadu_ps(p + j + 8),
                           _mm_loadu_ps(p + j + 12)};
      c = compress_block(x, first + j, b, out, c);
    };
    i = by_windows<16, false>(n, c, limit, gave_up, block);
  }
#endif
  for (; !gave_up && i < n; ++i) {
    if (i % collect_window == 0 && c > limit) {
      gave_up = true;
      break;
    }
    out[c] = first + i;
    c += static_cast<int>(p[i] >= bound);
  }
  if constexpr (Ahead) *qmax = ahead.result(q, qn);
  return gave_up ? -1 : c;
}

template <bool Simd = select_simd>
int compact_at_least(const float* p, int n, int first, float bound, std::int32_t* out,
                     int limit = INT_MAX) {
  return compact_at_least_impl<Simd, false>(p, n, first, bound, out, limit, nullptr, 0, nullptr);
}

template <bool Simd = select_simd>
int compact_at_least_and_max(const float* p, int n, int first, float bound, std::int32_t* out,
                             int limit, const float* q, int qn, float* qmax) {
  return compact_at_least_impl<Simd, true>(p, n, first, bound, out, limit, q, qn, qmax);
}

/// One pass over p[0, n) that finds the maximum and keeps every token that can still be a
/// candidate: p[i] >= max(lower, threshold_floor(M(i), alpha)), M(i) a maximum known at i, never
/// above the row's; the caller filters the extra (filter_at_least). `rm`: the running max in and
/// out (NaN ignored). Writes first + i ascending to out[0, n); returns how many. M(i) depends on
/// positions only, so every version keeps the same list:
///   m0   = max(rm, p[0, min(n, collect_prefix)))   (so that a row does not start at -inf)
///   M(i) = m0                          for i in window 0
///   M(i) = max(m0, p[0, 256 (w - 1)))  for i in window w = [256 w, 256 w + 256), w >= 1
inline constexpr int collect_prefix = 512;

/// `limit`: returns -1 as soon as more than `limit` positions are kept (out and rm unspecified).
template <bool Simd = select_simd>
int collect_candidates(const float* p, int n, int first, float lower, float alpha, float& rm,
                       std::int32_t* out, int limit = INT_MAX) {
  const int prefix = n < collect_prefix ? n : collect_prefix;
  const float m0 = max_of<Simd>(p, prefix, rm);
  const auto window_bound = [lower, alpha](float known) {
    const float f = detail::threshold_floor(known, alpha);
    return f > lower ? f : lower;
  };
  collect_state st{0, 0, m0, m0, lower};
  if constexpr (Simd) {
    if (!collect_vectors(p, n, first, window_bound, st, out, limit)) return -1;
  }
  int i = st.i, c = st.c;
  float m = st.m, pend = st.pend, bound = st.bound;
  for (; i < n; ++i) {
    if (i % collect_window == 0) {
      if (c > limit) return -1;
      bound = window_bound(pend);
      pend = m;
    }
    out[c] = first + i;
    c += static_cast<int>(p[i] >= bound);
    m = p[i] > m ? p[i] : m;
  }
  rm = m;
  return c;
}

/// Keeps the positions t of list[0, n) with row[t] >= floor (NaN never is), in order.
template <bool Simd = select_simd>
int filter_at_least(const float* row, std::int32_t* list, int n, float floor) {
  int i = 0;
  int c = 0;
#if KVSCOUT_HOST_AVX512
  if constexpr (Simd) {
    const __m512 f = _mm512_set1_ps(floor);
    // list[c, c + 16) with c <= i: the store never passes what has been read.
    for (; i + 16 <= n; i += 16) {
      const __m512i t = _mm512_loadu_si512(list + i);
      const __mmask16 k = _mm512_cmp_ps_mask(_mm512_i32gather_ps(t, row, 4), f, _CMP_GE_OQ);
      _mm512_storeu_si512(list + c, _mm512_maskz_compress_epi32(k, t));
      c += __builtin_popcount(static_cast<unsigned>(k));
    }
  }
#endif
  for (; i < n; ++i) {
    const std::int32_t t = list[i];
    list[c] = t;
    c += static_cast<int>(row[t] >= floor);
  }
  return c;
}

/// Keeps the positions t of list[0, n) whose score key is >= lo, in order, their keys to
/// keys[0, count), and counts their digit d into hist (pre-zeroed, plus one for the dropped).
inline int filter_and_count(const float* row, std::int32_t* list, int n, std::uint32_t lo,
                            radix_digit d, std::uint32_t* keys, std::uint32_t* hist) {
  const std::uint32_t dropped = std::uint32_t{1} << d.bits;
  int c = 0;
  for (int i = 0; i < n; ++i) {
    const std::int32_t t = list[i];
    const std::uint32_t key = detail::score_key(row[t]);
    const bool keep = key >= lo;
    list[c] = t;
    keys[c] = key;
    c += static_cast<int>(keep);
    ++hist[keep ? d.of(key) : dropped];
  }
  return c;
}

/// Lists up to this long use short_digit_bits-wide digits: a pass walks 1 << bits counters.
inline constexpr int short_digit_list = 1024;
inline constexpr int short_digit_bits = 8;

inline int digit_bits_for(int n) {
  return n <= short_digit_list ? short_digit_bits : radix_bits;
}

/// Past this many candidates the selectors bound the row by a sample instead.
inline constexpr int short_list_max = 2048;

/// A score L such that, very likely, at least k of p[0, n) are >= L and not many more than k: the
/// score of rank k * S / n + 3.5 standard deviations + 4 in a stratified sample of
/// S ~ (n / 2)^(2/3) scores. -inf where no such bound helps (short rows, k close to n, NaN-heavy
/// samples). Workspace: keys [sample_max], hist, pos [sample_max].
inline float sample_lower_bound(const float* p, int n, int k, std::uint32_t* keys,
                                std::uint32_t* hist, std::int32_t* pos) {
  constexpr float none = -INFINITY;
  const double balanced = std::cbrt(0.25 * static_cast<double>(n) * n);
  const int samples = static_cast<int>(balanced < sample_max ? balanced : sample_max);
  if (samples < sample_min || n / samples < 16) return none;
  const double share = static_cast<double>(k) / n;
  const double expect = share * samples;
  const double rank = std::ceil(expect + 3.5 * std::sqrt(expect * (1.0 - share)) + 4.0);
  if (rank >= 0.5 * samples) return none;  // would keep half the row: not worth a sample
  const int segment = n / samples;
  std::uint32_t key_lo = 0xffffffffu, key_hi = 0u;
  for (int j = 0; j < samples; ++j) {
    const std::uint64_t h = (static_cast<std::uint32_t>(j) * 2654435761u) >> 16;
    const int offset = static_cast<int>((h * static_cast<std::uint64_t>(segment)) >> 16);
    const std::uint32_t key = detail::score_key(p[j * segment + offset]);
    keys[j] = key;
    key_lo = key < key_lo ? key : key_lo;
    key_hi = key > key_hi ? key : key_hi;
  }
  const radix_cut cut = radix_select_host([keys](int i) { return keys[i]; }, samples,
                                          static_cast<int>(rank), hist, pos, key_lo, key_hi,
                                          digit_bits_for(samples));
  return cut.key == 0 ? none : detail::score_from_key(cut.key);
}

/// The best k of row[begin, end) (NaN ignored, ties to the lowest index), ascending, to out.
/// Workspace: hist [radix_buckets], pos [end - begin].
inline int take_best_host(const float* row, int begin, int end, int k, std::uint32_t* hist,
                          std::int32_t* pos, std::int32_t* out) {
  const int n = end - begin;
  if (n <= 0 || k <= 0) return 0;
  const float* p = row + begin;
  const radix_cut cut =
      radix_select_host([p](int i) { return detail::score_key(p[i]); }, n, k, hist, pos);
  // Emission into pos (entry c <= i is written at step i), so nothing past the count reaches out.
  int ties = cut.ties;
  int c = 0;
  for (int i = 0; i < n; ++i) {
    pos[c] = begin + i;
    c += static_cast<int>(radix_take(detail::score_key(p[i]), cut, ties));
  }
  std::memcpy(out, pos, sizeof(std::int32_t) * static_cast<std::size_t>(c));
  return c;
}

/// Among the tokens [a, a + n) of a row: the candidates (scores >= threshold_floor(m, alpha), m the
/// largest non-NaN score of the range and rm), or the best k of them where there are more,
/// ascending to out. `lower`: a hint that about k tokens reach it (-inf for none); the result is
/// exact whatever it is.
inline int best_above_floor(const float* row, int a, int n, int k, float alpha, float rm,
                            float lower, const row_workspace& ws, std::int32_t* out) {
  const float* p = row + a;
  std::int32_t* cand = ws.cand;
  std::uint32_t* keys = ws.ckeys;
  if (!(lower > -INFINITY)) lower = -INFINITY;  // a NaN hint is no hint
  float m = rm;
  int c = collect_candidates(p, n, a, lower, alpha, m, cand);
  const float floor = detail::threshold_floor(m, alpha);
  // Every candidate's key lies in [lo, hi]: plan the digits on it.
  std::uint32_t lo = detail::score_key(lower > floor ? lower : floor);
  const std::uint32_t hi = detail::score_key(m);
  int top = radix_significant_bits(lo, hi);
  int bits = digit_bits_for(c);
  std::memset(ws.hist, 0, sizeof(std::uint32_t) * ((std::size_t{1} << bits) + 1));
  c = filter_and_count(row, cand, c, lo, radix_plan(top, 0, lo, bits), keys, ws.hist);
  if (lower > floor && c < k) {
    // The hint was too high (fewer than k tokens reach it): redo the row with the exact floor.
    lo = detail::score_key(floor);
    top = radix_significant_bits(lo, hi);
    c = compact_at_least(p, n, a, floor, cand);
    bits = digit_bits_for(c);
    std::memset(ws.hist, 0, sizeof(std::uint32_t) * ((std::size_t{1} << bits) + 1));
    c = filter_and_count(row, cand, c, lo, radix_plan(top, 0, lo, bits), keys, ws.hist);
  }
  if (c > k) {
    // Every token equal to the k-th score is in the list, so ties still go to the lowest indices.
    const radix_cut cut = top == 0 ? radix_cut_at(lo, k)  // all candidates score the same
                                   : radix_select_counted([keys](int i) { return keys[i]; }, c, k,
                                                          ws.hist, ws.pos, top, lo, bits);
    int ties = cut.ties;
    int kept = 0;
    for (int i = 0; i < c; ++i) {
      cand[kept] = cand[i];
      kept += static_cast<int>(radix_take(keys[i], cut, ties));
    }
    c = kept;
  }
  std::memcpy(out, cand, sizeof(std::int32_t) * static_cast<std::size_t>(c));
  return c;
}

/// The best k non-NaN tokens of [a, a + n) of a row (ties to the lowest index), ascending, to out.
inline int best_of_range(const float* row, int a, int n, int k, const row_workspace& ws,
                         std::int32_t* out) {
  if (n <= 0 || k <= 0) return 0;
  if (k >= n) {
    const int c = compact_at_least(row + a, n, a, -INFINITY, ws.cand);  // every non-NaN
    std::memcpy(out, ws.cand, sizeof(std::int32_t) * static_cast<std::size_t>(c));
    return c;
  }
  const float lower = sample_lower_bound(row + a, n, k, ws.keys, ws.hist, ws.pos);
  if (lower > -INFINITY) return best_above_floor(row, a, n, k, INFINITY, -INFINITY, lower, ws, out);
  return take_best_host(row, a, a + n, k, ws.hist, ws.pos, out);
}

}  // namespace kvscout::detail
