#pragma once
// The host InfiniGen policy's scoring loops (score/infinigen.hpp): one (sequence, kv head) row of
// partial keys against a group's partial queries, from float / half / bfloat16 tiles
// (host_score_tiles) or from 2 / 4 / 8-bit codes (host_score_quantized). Each returns the row's
// largest non-NaN score (-inf if none) and writes the row's scores, aggregated over the group
// (max_logit's maximum, or the mean).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kvscout/cache/partial_key_store.hpp"
#include "kvscout/core/config.hpp"
#include "kvscout/core/detail/host_vec.hpp"
#include "kvscout/core/dispatch.hpp"
#include "kvscout/core/simd.hpp"
#include "kvscout/score/concepts.hpp"
#include "kvscout/score/detail/aggregate.hpp"

namespace kvscout::detail {

template <int N>
struct code_vec {
  typedef std::uint8_t bytes __attribute__((vector_size(N)));
  typedef std::int32_t ints __attribute__((vector_size(N * sizeof(std::int32_t))));
};

/// N bytes widened to 32-bit lanes: lane i holds p[i % LB] (LB >= 4 bytes at p, repeated where
/// LB < N). One zero extension: GCC 12 turns __builtin_convertvector from bytes to ints into a
/// byte-by-byte scalar sequence.
template <int N, int LB>
inline typename code_vec<N>::ints widen_codes(const std::uint8_t* p) {
  static_assert(LB >= 4 && (LB >= N || N % LB == 0), "a piece is whole repeats of the bytes");
  typename code_vec<N>::ints r;
#if KVSCOUT_HOST_SSE2
  __m128i x;
  if constexpr (LB >= 16 || LB >= N) {
    if constexpr (N >= 16) {
      x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    } else if constexpr (N == 8) {
      x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    } else {
      std::int32_t w;
      std::memcpy(&w, p, sizeof w);
      x = _mm_cvtsi32_si128(w);
    }
  } else if constexpr (LB == 8) {
    long long w;
    std::memcpy(&w, p, sizeof w);
    x = _mm_set1_epi64x(w);
  } else {
    std::int32_t w;
    std::memcpy(&w, p, sizeof w);
    x = _mm_set1_epi32(w);
  }
#if KVSCOUT_HOST_AVX512
  if constexpr (N == 16) {
    const __m512i v = _mm512_cvtepu8_epi32(x);
    std::memcpy(&r, &v, sizeof r);
    return r;
  }
#endif
#if KVSCOUT_HOST_AVX512 || KVSCOUT_HOST_AVX2
  if constexpr (N == 8) {
    const __m256i v = _mm256_cvtepu8_epi32(x);
    std::memcpy(&r, &v, sizeof r);
    return r;
  }
#endif
  if constexpr (N == 4) {
    const __m128i z = _mm_setzero_si128();
    const __m128i v = _mm_unpacklo_epi16(_mm_unpacklo_epi8(x, z), z);
    std::memcpy(&r, &v, sizeof r);
    return r;
  }
#endif
  for (int i = 0; i < N; ++i) r[i] = p[i % LB];
  return r;
}

// Returns sum_c q_c min_c and writes w[c] = q_c step_c: logit(t) = that + sum_c w[c] code[c][t].
inline float host_affine_terms(const float* q, const float* mn, const float* step, int r,
                               float* w) {
  constexpr int W = detail::host_float_lanes;
  using vec = detail::host_vec;
  vec acc = {};
  int c = 0;
  for (; c + W <= r; c += W) {
    vec qv, mv, sv;
    std::memcpy(&qv, q + c, sizeof qv);
    std::memcpy(&mv, mn + c, sizeof mv);
    std::memcpy(&sv, step + c, sizeof sv);
    acc = detail::madd(acc, qv, mv);
    const vec wv = qv * sv;
    std::memcpy(w + c, &wv, sizeof wv);
  }
  float b = 0.f;
  for (int l = 0; l < W; ++l) b += acc[l];
  for (; c < r; ++c) {
    b = detail::madd(b, q[c], mn[c]);
    w[c] = q[c] * step[c];
  }
  return b;
}

// host_score_tiles for quantised keys; the newest incomplete group is scored exactly from the
// staging tile. qw: [g, r] scratch for a tile's products q_c step_c. G == 0: runtime `g_dyn`. Out
// of line: inlined, the row is slower.
template <int G, class Store>
__attribute__((noinline)) float host_score_quantized(const float* qg, int r, const Store& cache,
                                                     int s, int h, int n, bool use_max, float inv_g,
                                                     float* row, float* qw, int g_dyn = 0) {
  constexpr int Gt = Store::group_tokens, LB = Store::line_bytes;
  constexpr int bits = Store::bits, levels = Store::levels;
  // A piece: PW consecutive tokens; a bit plane holds LB tokens, so a piece is part of one plane
  // (LB >= PW: one shift) or spans PW / LB of them (a shift per lane).
  constexpr int PW = detail::host_float_lanes;
  constexpr int NP = Gt / PW;
  static_assert(Gt % PW == 0, "a group is whole pieces");
  using fv = typename detail::float_vec<PW>::type;
  using i32v = typename detail::code_vec<PW>::ints;
  const int g = G > 0 ? G : g_dyn;
  constexpr int gcap = G > 0 ? G : detail::max_group;
  const int nq = std::min(n, cache.complete_groups(s, h) * Gt);
  fv top = fv{} - std::numeric_limits<float>::infinity();
  float tail_top = -std::numeric_limits<float>::infinity();
  float base[gcap];
  float* w = qw;  // [g, r]
  int t0 = 0;
  for (int b = 0; t0 < nq; ++b, t0 += Gt) {
    const float* mn = cache.group_min(s, h, b);
    const float* step = cache.group_step(s, h, b);
    const std::uint8_t* codes = cache.group_codes(s, h, b);
    for (int j = 0; j < g; ++j) base[j] = host_affine_terms(qg + j * r, mn, step, r, w + j * r);
    fv acc[gcap][NP] = {};
    for (int c = 0; c < r; ++c) {
      const std::uint8_t* line = codes + static_cast<std::size_t>(c) * LB;
      fv x[NP];
      KVSCOUT_HOST_UNROLL
      for (int m = 0; m < NP; ++m) {
        const i32v raw = detail::widen_codes<PW, LB>(line + (LB >= PW ? (m * PW) % LB : 0));
        i32v iv;
        if constexpr (LB >= PW) {
          iv = (raw >> (bits * (m * PW / LB))) & levels;
        } else {
          i32v shift;
          for (int l = 0; l < PW; ++l) shift[l] = bits * ((m * PW + l) / LB);
          iv = (raw >> shift) & levels;
        }
        x[m] = __builtin_convertvector(iv, fv);
      }
      KVSCOUT_HOST_UNROLL
      for (int j = 0; j < g; ++j) {
        const float wc = w[j * r + c];
        KVSCOUT_HOST_UNROLL
        for (int m = 0; m < NP; ++m) acc[j][m] += x[m] * wc;
      }
    }
    const int nb = std::min(Gt, nq - t0);
    for (int m = 0; m < NP && m * PW < nb; ++m) {
      fv a = acc[0][m] + base[0];
      for (int j = 1; j < g; ++j) {
        const fv z = acc[j][m] + base[j];
        a = use_max ? (a > z ? a : z) : a + z;
      }
      if (!use_max) a *= inv_g;
      if ((m + 1) * PW <= nb) {
        top = a > top ? a : top;
        std::memcpy(row + t0 + m * PW, &a, sizeof a);
      } else {
        for (int l = 0; l < nb - m * PW; ++l) {
          row[t0 + m * PW + l] = a[l];
          tail_top = a[l] > tail_top ? a[l] : tail_top;
        }
      }
    }
  }
  for (int t = nq; t < n; ++t) {
    float a = 0.f;
    for (int j = 0; j < g; ++j) {
      float d = 0.f;
      for (int c = 0; c < r; ++c) d = detail::madd(d, qg[j * r + c], cache.dequantized(s, h, c, t));
      a = j == 0 ? d : use_max ? (a > d ? a : d) : a + d;
    }
    if (!use_max) a *= inv_g;
    row[t] = a;
    tail_top = a > tail_top ? a : tail_top;
  }
  for (int l = 0; l < PW; ++l) tail_top = top[l] > tail_top ? top[l] : tail_top;
  return tail_top;
}

// Scoring pins its key lines up to this row size: faster from the caches, slower from memory.
inline constexpr std::size_t host_score_pin_row_bytes = std::size_t{4} << 20;

// About latency x bandwidth of one core's memory stream.
#if defined(__AVX512F__)
inline constexpr std::size_t host_score_prefetch_bytes = 12288;
#else
inline constexpr std::size_t host_score_prefetch_bytes = 4096;
#endif

// The G group members' sums of one vector of tokens folded into one: their maximum (use_max) or
// mean. Inlined whatever the compiler's budget: out of line, the accumulators would live in memory.
__attribute__((always_inline)) inline detail::host_vec fold_group(const detail::host_vec* acc,
                                                                  int g, int stride, bool use_max,
                                                                  float inv_g) {
  detail::host_vec a = acc[0];
  if (use_max) {
    for (int j = 1; j < g; ++j) a = a > acc[j * stride] ? a : acc[j * stride];
  } else {
    for (int j = 1; j < g; ++j) a += acc[j * stride];
    a *= inv_g;
  }
  return a;
}

// From token t0 (tile b) to n, one register-wide piece of a tile line at a time, for every group
// size: the tiles past the last whole block of T, and every tile where T is 0. Keeps the lane-wise
// maximum of whole pieces in top and of the last partial piece in tail_top.
template <class PkT, int G, class Store>
__attribute__((always_inline)) inline void host_score_tile_tail(
    const float* qg, int r, const Store& cache, int s, int h, int n, bool use_max, float inv_g,
    float* row, int g, int t0, int b, detail::host_vec& top, float& tail_top) {
  constexpr int tb = Store::block_tokens;
  constexpr int W = detail::host_float_lanes;
  constexpr int gcap = G > 0 ? G : detail::max_group;
  using vec = detail::host_vec;
  for (; t0 < n; t0 += tb, ++b) {
    const int nb = n - t0 < tb ? n - t0 : tb;
    const PkT* tile = cache.tile(s, h, b);
    for (int l = 0; l * W < nb; ++l) {  // a whole tile line is read; lanes past n are ignored
      vec acc[gcap] = {};
      for (int c = 0; c < r; ++c) {
        const vec pv = detail::load_lanes(tile + static_cast<std::size_t>(c) * tb + l * W);
        for (int j = 0; j < g; ++j) acc[j] = detail::madd(acc[j], pv, qg[j * r + c]);
      }
      const vec a = fold_group(acc, g, 1, use_max, inv_g);
      if (nb - l * W >= W) {
        top = a > top ? a : top;
        std::memcpy(row + t0 + l * W, &a, sizeof a);
      } else {
        for (int t = 0; t < nb - l * W; ++t) {
          row[t0 + l * W + t] = a[t];
          tail_top = a[t] > tail_top ? a[t] : tail_top;
        }
      }
    }
  }
}

// Scores one (s, h) row from float / half / bfloat16 tiles. G == 0: runtime `g` (slower). Pin: hold
// each key line in a register for the G multiply-adds that use it. Every lane's sum is formed in
// the same order whatever the vector width, so the scores' bits do not depend on the target.
// Returns the largest non-NaN score (-inf if none).
template <class PkT, int G, bool Pin = false, class Store>
float host_score_tiles(const float* qg, int r, const Store& cache, int s, int h, int n,
                       bool use_max, float inv_g, float* row, int g_dyn = 0) {
  constexpr int tb = Store::block_tokens;
  constexpr int W = detail::host_float_lanes;
  constexpr int L = tb / W;
  static_assert(tb % W == 0, "a tile line is whole vectors");
  using vec = detail::host_vec;
  const int g = G > 0 ? G : g_dyn;
  // Running lane-wise maximum (x > top is false for a NaN x, so top never holds one).
  vec top = vec{} - std::numeric_limits<float>::infinity();  // 0 - inf: -inf in every lane
  float tail_top = -std::numeric_limits<float>::infinity();
  int t0 = 0, b = 0;
  if constexpr (G > 0) {
    // T whole tiles at a time: T * G * L independent multiply-add chains. Where no tile fits the
    // registers (2-byte keys with g >= 4 on AVX2), T is 0 and host_score_tile_tail scores one
    // register-wide piece at a time.
    constexpr int T_wide = G == 1 ? 8 : G == 2 ? 4 : G <= 4 ? 3 : 2;
    constexpr int T =
        W == 16 ? (L == 1 ? T_wide : (T_wide / 2 > 0 ? T_wide / 2 : 1)) : 16 / (L * (G + 1));
    static_assert(tb * sizeof(PkT) == 64, "a tile line is 64 bytes");
    if constexpr (T > 0) {
      // T streams defeat the hardware prefetchers, so every line host_score_prefetch_bytes ahead
      // is prefetched in address order.
      for (; t0 + T * tb <= n; t0 += T * tb, b += T) {
        const PkT* tiles[T];
        for (int u = 0; u < T; ++u) tiles[u] = cache.tile(s, h, b + u);
        const char* ahead = reinterpret_cast<const char*>(tiles[0]) + host_score_prefetch_bytes;
        // Unrolled completely so that acc and pv are registers.
        vec acc[T][G][L] = {};
        for (int c = 0; c < r; ++c) {
          vec pv[T][L];
          KVSCOUT_HOST_UNROLL
          for (int u = 0; u < T; ++u) {
            __builtin_prefetch(ahead + static_cast<std::size_t>(c * T + u) * 64);
            const PkT* p = tiles[u] + static_cast<std::size_t>(c) * tb;
            KVSCOUT_HOST_UNROLL
            for (int l = 0; l < L; ++l) {
              // By value: a vector written through a reference into an array is kept in memory.
              vec x = detail::load_lanes(p + l * W);
#if defined(__AVX512F__)
              // GCC folds the load into each of the G multiply-adds; from the caches the loads set
              // the pace, so the empty asm pins the value in a 64-byte register. Rows read from
              // memory are faster without.
              if constexpr (Pin && G > 1 && sizeof(vec) == 64) asm("" : "+v"(x));
#endif
              pv[u][l] = x;
            }
          }
          KVSCOUT_HOST_UNROLL
          for (int j = 0; j < G; ++j) {
            const float qc = qg[j * r + c];
            KVSCOUT_HOST_UNROLL
            for (int u = 0; u < T; ++u) KVSCOUT_HOST_UNROLL
            for (int l = 0; l < L; ++l) acc[u][j][l] = detail::madd(acc[u][j][l], pv[u][l], qc);
          }
        }
        KVSCOUT_HOST_UNROLL
        for (int u = 0; u < T; ++u) KVSCOUT_HOST_UNROLL
        for (int l = 0; l < L; ++l) {
          const vec a = fold_group(&acc[u][0][l], G, L, use_max, inv_g);
          top = a > top ? a : top;
          std::memcpy(row + t0 + u * tb + l * W, &a, sizeof a);
        }
      }
    }
  }
  host_score_tile_tail<PkT, G>(qg, r, cache, s, h, n, use_max, inv_g, row, g, t0, b, top,
                                tail_top);
  for (int i = 0; i < W; ++i) tail_top = top[i] > tail_top ? top[i] : tail_top;
  return tail_top;
}

// A row's scratch for host_score_row: the group's logit rows (sum_prob), its mean query
// (mean_logit) and the quantised scorer's per-query terms.
struct host_score_scratch {
  float* lg;       // [g, max_tokens], or null where no aggregation is sum_prob
  float* qm;       // [r]
  float* qw;       // the quantised keys' scratch, or null
  int max_tokens;  // the stride of lg's rows
};

// One (s, h) row of n scores for the group's g partial queries qg [g, r], aggregated by agg:
// sum_prob (the group's softmax mass, in double), mean_logit (one dot product with the mean
// query) or max_logit. Returns the row's largest non-NaN score.
template <class PkT, class Store>
float host_score_row(const Store& cache, const float* qg, int r, int s, int h, int g, int n,
                     float* row, gqa_aggregation agg, const host_score_scratch& x) {
  constexpr bool quantized = is_quantized_keys_v<PkT>;
  if (agg == gqa_aggregation::sum_prob) {
    // sum over the heads of exp(logit - the head's max) / its normaliser, in double.
    if (n == 0) return -std::numeric_limits<float>::infinity();
    double inv_z[max_group];
    float top[max_group];
    for (int j = 0; j < g; ++j) {
      float* lj = x.lg + static_cast<std::size_t>(j) * x.max_tokens;
      const float* qj = qg + static_cast<std::size_t>(j) * r;
      if constexpr (quantized)
        top[j] = host_score_quantized<1>(qj, r, cache, s, h, n, true, 1.f, lj, x.qw);
      else
        top[j] = host_score_tiles<PkT, 1>(qj, r, cache, s, h, n, true, 1.f, lj);
      double z = 0;
      for (int t = 0; t < n; ++t) {
        const double e = std::exp(static_cast<double>(lj[t]) - top[j]);
        z += e;
        lj[t] = static_cast<float>(e);
      }
      inv_z[j] = 1.0 / z;
    }
    for (int t = 0; t < n; ++t) {
      double a = 0;
      for (int j = 0; j < g; ++j)
        a += static_cast<double>(x.lg[static_cast<std::size_t>(j) * x.max_tokens + t]) * inv_z[j];
      row[t] = static_cast<float>(a);
    }
    return max_non_nan(row, n);
  }
  const bool use_max = agg == gqa_aggregation::max_logit;
  const float inv_g = 1.f / static_cast<float>(g);
  if (!use_max && g > 1) {
    // mean_logit: the mean of the group's dot products is the dot product with the group's mean
    // query, so one multiply-add chain per tile instead of g (rounding differs only in order).
    float* qm = x.qm;
    for (int c = 0; c < r; ++c) {
      float sum = 0.f;
      for (int j = 0; j < g; ++j) sum += qg[j * r + c];
      qm[c] = sum * inv_g;
    }
    if constexpr (quantized)
      return host_score_quantized<1>(qm, r, cache, s, h, n, true, 1.f, row, x.qw);
    else
      return host_score_tiles<PkT, 1>(qm, r, cache, s, h, n, true, 1.f, row);
  }
  if constexpr (quantized) {
    if (g <= 8) {
      float top = 0.f;
      dispatch(value_list<1, 2, 3, 4, 5, 6, 7, 8>{}, g, "GQA group", [&](auto G) {
        top = host_score_quantized<decltype(G)::value>(qg, r, cache, s, h, n, use_max, inv_g, row,
                                                       x.qw);
      });
      return top;
    }
    return host_score_quantized<0>(qg, r, cache, s, h, n, use_max, inv_g, row, x.qw, g);
  } else {
    const bool pin = static_cast<std::size_t>(n) * static_cast<std::size_t>(r) * sizeof(PkT) <=
                     host_score_pin_row_bytes;
    if (g <= 8) {
      float top = 0.f;
      dispatch(value_list<1, 2, 3, 4, 5, 6, 7, 8>{}, g, "GQA group", [&](auto G) {
        constexpr int gv = decltype(G)::value;
        top = pin ? host_score_tiles<PkT, gv, true>(qg, r, cache, s, h, n, use_max, inv_g, row)
                  : host_score_tiles<PkT, gv, false>(qg, r, cache, s, h, n, use_max, inv_g, row);
      });
      return top;
    }
    return host_score_tiles<PkT, 0>(qg, r, cache, s, h, n, use_max, inv_g, row, g);
  }
}

}  // namespace kvscout::detail
