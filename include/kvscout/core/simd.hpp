#pragma once
// Host vector helpers written with GCC / Clang vector extensions, in vectors of the target's
// register width (host_float_lanes: 4 with SSE2, 8 with AVX / AVX2, 16 with AVX-512). The sums
// keep 16 lanes whatever the width, so their bits do not depend on it.
//
//   float d = kvscout::detail::dot(a, b, n);   // 16 independent partial sums, then a reduction
//   kvscout::detail::dot_rows(W, ld, x, n, rows, y);   // y[j] = dot(W + j * ld, x, n), same bits
//
// The rows (W, `a`) may be float, half or bfloat16: each element is widened exactly to float, so
// they give the bits of float rows holding the same values.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kvscout/core/detail/host_vec.hpp"
#include "kvscout/core/detail/x86_intrinsics.hpp"
#include "kvscout/core/dtype.hpp"

namespace kvscout::detail {

#if KVSCOUT_HOST_AVX512 || KVSCOUT_HOST_FMA || defined(__FP_FAST_FMAF)
inline constexpr bool host_madd_fused = true;
#else
inline constexpr bool host_madd_fused = false;
#endif

/// acc + x * y, one rounding where the target has FMA, two where it has not, always the same. Left
/// to the compiler, fusing depends on the code around it, and with it the bits that dot, dot_rows
/// and scoring promise to agree on.
inline host_vec madd(host_vec acc, host_vec x, host_vec y) {
#if KVSCOUT_HOST_AVX512
  return _mm512_fmadd_ps(x, y, acc);
#elif KVSCOUT_HOST_FMA
  static_assert(host_float_lanes == 8, "FMA targets have AVX");
  return _mm256_fmadd_ps(x, y, acc);
#elif defined(__FP_FAST_FMAF)
  host_vec r = acc;
  for (int t = 0; t < host_float_lanes; ++t) r[t] = __builtin_fmaf(x[t], y[t], acc[t]);
  return r;
#else
  return acc + x * y;
#endif
}
inline host_vec madd(host_vec acc, host_vec x, float y) {
  return madd(acc, x, y - host_vec{});  // y - 0 is y in every lane, -0 and NaN included
}
inline float madd(float acc, float x, float y) {
#if defined(__FP_FAST_FMAF)
  return __builtin_fmaf(x, y, acc);
#else
  return acc + x * y;
#endif
}

/// host_float_lanes consecutive elements as floats, exactly (a NaN's payload may differ).
template <compute_element W>
inline host_vec load_lanes(const W* p) {
  [[maybe_unused]] constexpr int N = host_float_lanes;
  host_vec x;
  if constexpr (std::is_same_v<W, float>) {
    std::memcpy(&x, p, sizeof x);
  } else if constexpr (std::is_same_v<W, bfloat16>) {
#if KVSCOUT_HOST_AVX512
    // One 16-lane zero extension; GCC splits the generic form below on Intel cores.
    const __m512i w = _mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
    std::memcpy(&x, &w, sizeof x);
#else
    typedef std::uint16_t u16xN __attribute__((vector_size(N * 2)));
    typedef std::uint32_t u32xN __attribute__((vector_size(N * 4)));
    u16xN h;
    std::memcpy(&h, p, sizeof h);
    const u32xN w = __builtin_convertvector(h, u32xN) << 16;
    std::memcpy(&x, &w, sizeof x);
#endif
  } else {
#if KVSCOUT_HOST_AVX512
    const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    std::memcpy(&x, &v, sizeof x);
#elif KVSCOUT_HOST_F16C
    if constexpr (N == 8) {
      const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      std::memcpy(&x, &v, sizeof x);
    } else {
      for (int t = 0; t < N; ++t) x[t] = to_float(p[t]);
    }
#elif !defined(__CUDACC__)
    // IEEE half to float in integer arithmetic, branch-free, for targets without F16C; subnormals
    // exact and independent of the FPU's denormal modes. Four lanes at a time (GCC scalarises
    // comparisons of wider generic vectors without AVX), signed (SSE2 compares signed 32-bit only).
    typedef std::int32_t i32x4 __attribute__((vector_size(16)));
    typedef float f32x4 __attribute__((vector_size(16)));
    typedef std::uint16_t u16x4 __attribute__((vector_size(8)));
    for (int q = 0; q < N / 4; ++q) {
      u16x4 h;
      std::memcpy(&h, p + 4 * q, sizeof h);
      const i32x4 w = __builtin_convertvector(h, i32x4);
      const i32x4 em = w & 0x7fff;
      const i32x4 sign = (w & 0x8000) << 16;
      const i32x4 normal = (em << 13) + (112 << 23);
      const i32x4 special = (em << 13) | 0x7f800000;
      const f32x4 sub_f = __builtin_convertvector(em, f32x4) * 0x1p-24f;
      i32x4 sub;
      std::memcpy(&sub, &sub_f, sizeof sub);
      const i32x4 is_sub = em < 0x400;        // -1 where subnormal or zero
      const i32x4 is_special = em >= 0x7c00;  // -1 where infinity or NaN
      const i32x4 bits = (sub & is_sub) | (special & is_special) |
                         (normal & ~(is_sub | is_special)) | sign;
      std::memcpy(reinterpret_cast<char*>(&x) + 16 * q, &bits, sizeof bits);
    }
#else
    for (int t = 0; t < N; ++t) x[t] = to_float(p[t]);
#endif
  }
  return x;
}

/// The sum of 16 logical lanes held in 16 / host_float_lanes vectors, as a tree: the same additions
/// on every target.
inline float sum16(const host_vec* v) {
  float_vec<4>::type p[4];  // lanes 0-3, 4-7, 8-11, 12-15
  std::memcpy(p, v, sizeof p);
  const float_vec<4>::type u = (p[0] + p[2]) + (p[1] + p[3]);
  return (u[0] + u[2]) + (u[1] + u[3]);
}

/// sum_i a[i] * b[i] with 16 independent partial sums, so bound by reading a and b, not by one
/// chain's latency.
template <compute_element W>
inline float dot(const W* a, const float* b, int n) {
  constexpr int N = host_float_lanes, L = 16 / N;
  host_vec lanes[L] = {};
  int i = 0;
  for (; i + 16 <= n; i += 16)
    KVSCOUT_HOST_UNROLL for (int l = 0; l < L; ++l) {
      host_vec y;
      std::memcpy(&y, b + i + l * N, sizeof y);
      lanes[l] = madd(lanes[l], load_lanes(a + i + l * N), y);
    }
  float s = sum16(lanes);
  for (; i < n; ++i) s = madd(s, to_float(a[i]), b[i]);
  return s;
}

/// out[v * ldo + j] = dot(a + j * lda, b + v * ldb, n) for j in [0, rows) and v in [0, B), with
/// dot()'s bits, R rows and B vectors at a time. Rows past the last whole group of R take dot().
template <int R, int B, compute_element W>
void dot_rows_block(const W* a, std::size_t lda, const float* b, std::size_t ldb, int n,
                    int rows, float* out, std::size_t ldo) {
  constexpr int N = host_float_lanes, L = 16 / N;
  int j = 0;
  for (; j + R <= rows; j += R) {
    const W* aj = a + static_cast<std::size_t>(j) * lda;
    host_vec lanes[B][R][L] = {};
    int i = 0;
    // The multiply-add loops are unrolled: rolled, they keep `lanes` in memory. The reduction's
    // loops stay rolled: unrolled, GCC 12 at -O3 warns falsely of undefined behaviour.
    for (; i + 16 <= n; i += 16)
      KVSCOUT_HOST_UNROLL for (int l = 0; l < L; ++l) {
        host_vec y[B];
        KVSCOUT_HOST_UNROLL for (int v = 0; v < B; ++v)
          std::memcpy(&y[v], b + static_cast<std::size_t>(v) * ldb + i + l * N, sizeof y[v]);
        KVSCOUT_HOST_UNROLL for (int u = 0; u < R; ++u) {
          const host_vec x = load_lanes(aj + static_cast<std::size_t>(u) * lda + i + l * N);
          KVSCOUT_HOST_UNROLL for (int v = 0; v < B; ++v)
            lanes[v][u][l] = madd(lanes[v][u][l], x, y[v]);
        }
      }
    for (int v = 0; v < B; ++v) {
      const float* bv = b + static_cast<std::size_t>(v) * ldb;
      for (int u = 0; u < R; ++u) {
        const W* au = aj + static_cast<std::size_t>(u) * lda;
        float s = sum16(lanes[v][u]);
        for (int t = i; t < n; ++t) s = madd(s, to_float(au[t]), bv[t]);
        out[static_cast<std::size_t>(v) * ldo + j + u] = s;
      }
    }
  }
  for (; j < rows; ++j)
    for (int v = 0; v < B; ++v)
      out[static_cast<std::size_t>(v) * ldo + j] =
          dot(a + static_cast<std::size_t>(j) * lda, b + static_cast<std::size_t>(v) * ldb, n);
}

/// Its accumulators, the vector's pieces and a row's fill 16 registers at most on narrower targets.
inline constexpr int dot_rows_per_block =
    host_float_lanes == 16 ? 8 : (host_float_lanes == 8 ? 4 : 2);

/// out[j] = dot(a + j * lda, b, n) for j in [0, rows), with dot()'s bits.
template <compute_element W>
inline void dot_rows(const W* a, std::size_t lda, const float* b, int n, int rows, float* out) {
  dot_rows_block<dot_rows_per_block, 1>(a, lda, b, 0, n, rows, out, 0);
}

/// dot_rows for `count` vectors, dot()'s bits for each. With AVX-512 it reads the rows once per 4
/// vectors; narrower targets would spill, so each vector takes dot_rows.
template <compute_element W>
inline void dot_rows_multi(const W* a, std::size_t lda, const float* b, std::size_t ldb,
                           int count, int n, int rows, float* out, std::size_t ldo) {
#if defined(__AVX512F__)
  int v = 0;
  for (; v + 4 <= count; v += 4)
    dot_rows_block<4, 4>(a, lda, b + static_cast<std::size_t>(v) * ldb, ldb, n, rows,
                         out + static_cast<std::size_t>(v) * ldo, ldo);
  const float* bv = b + static_cast<std::size_t>(v) * ldb;
  float* ov = out + static_cast<std::size_t>(v) * ldo;
  switch (count - v) {
    case 3: dot_rows_block<4, 3>(a, lda, bv, ldb, n, rows, ov, ldo); break;
    case 2: dot_rows_block<4, 2>(a, lda, bv, ldb, n, rows, ov, ldo); break;
    case 1: dot_rows_block<8, 1>(a, lda, bv, ldb, n, rows, ov, ldo); break;
    default: break;
  }
#else
  for (int v = 0; v < count; ++v)
    dot_rows(a, lda, b + static_cast<std::size_t>(v) * ldb, n, rows,
             out + static_cast<std::size_t>(v) * ldo);
#endif
}


}  // namespace kvscout::detail
