#pragma once
// Host vector helpers written with GCC / Clang vector extensions: the compiler maps a vector
// value onto the widest registers the target has (SSE2, AVX2, AVX-512), so host kernels vectorise
// for whatever the user compiles for, without intrinsics and without a code path per ISA.
//
//   float d = kvscout::detail::dot(a, b, n);   // 16 independent partial sums, then a reduction
//   kvscout::detail::dot_rows(W, ld, x, n, rows, y);   // y[j] = dot(W + j * ld, x, n), same bits
//   kvscout::detail::dot_rows_multi(W, ld, X, ldx, count, n, rows, Y, ldy);   // count x's at once
//
// The rows (W, `a`) may be float, half or bfloat16 (W_Q kept in the model's own type): each 2-byte
// element is widened exactly to float as it is loaded, and the arithmetic is the float one, so
// rows of W give the bits of float rows holding the same values (finite values; NaN stays NaN).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvscout/core/detail/x86_intrinsics.hpp"
#include "kvscout/core/dtype.hpp"

namespace kvscout::detail {

/// N floats as one vector value.
template <int N>
struct float_vec {
  typedef float type __attribute__((vector_size(N * sizeof(float))));
};

/// 16 consecutive elements of a float, half or bfloat16 row as 16 floats: the exact value of
/// every element (NaN stays NaN; its payload may differ between the paths below). An output
/// argument, not a return value: a 64-byte vector returned by value changes the ABI with the
/// target's vector width (GCC warns), a reference does not.
template <compute_element W>
inline void load16(const W* p, float_vec<16>::type& x) {
  if constexpr (std::is_same_v<W, float>) {
    std::memcpy(&x, p, sizeof x);
  } else if constexpr (std::is_same_v<W, bfloat16>) {
    // A bfloat16 is the high half of the float it widens to.
#if KVSCOUT_HOST_AVX512
    // One 16-lane zero extension (GCC splits the generic form below into two 8-lane ones and a
    // merge when it prefers 256-bit vectors, as on Intel cores: 20 % slower GEMV, measured).
    const __m512i w = _mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
    std::memcpy(&x, &w, sizeof x);
#else
    typedef std::uint16_t u16x16 __attribute__((vector_size(32)));
    typedef std::uint32_t u32x16 __attribute__((vector_size(64)));
    u16x16 h;
    std::memcpy(&h, p, sizeof h);
    u32x16 w;
    for (int t = 0; t < 16; ++t) w[t] = static_cast<std::uint32_t>(h[t]) << 16;
    std::memcpy(&x, &w, sizeof x);
#endif
  } else {
#if KVSCOUT_HOST_AVX512
    const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    std::memcpy(&x, &v, sizeof x);
#elif KVSCOUT_HOST_F16C
    const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
    std::memcpy(&x, &lo, sizeof lo);
    std::memcpy(reinterpret_cast<char*>(&x) + sizeof lo, &hi, sizeof hi);
#elif !defined(__CUDACC__)
    // IEEE half to float in integer arithmetic, branch-free, for targets without F16C (CUDA's
    // host conversion works one element at a time: 3x slower than this, which is itself 3 to 5x
    // slower than float rows; bfloat16 rows or an F16C target avoid the cost). Normal: the exponent
    // rebiased by 127 - 15; infinity / NaN: the exponent all ones, the mantissa kept;
    // subnormal (and zero): mantissa x 2^-24, exact in float and independent of the FPU's
    // denormal modes (the result is a normal float).
    // Four lanes at a time (one SSE2 register: GCC scalarises comparisons of wider generic
    // vectors on targets without them), signed (SSE2 compares and converts signed 32-bit
    // integers only; every value here is below 2^16), selects by masks.
    typedef std::int32_t i32x4 __attribute__((vector_size(16)));
    typedef float f32x4 __attribute__((vector_size(16)));
    typedef std::uint16_t u16x4 __attribute__((vector_size(8)));
    for (int q = 0; q < 4; ++q) {
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
    for (int t = 0; t < 16; ++t) x[t] = to_float(p[t]);
#endif
  }
}

/// sum_i a[i] * b[i] with 16 independent partial sums: bound by reading a and b, not by the
/// latency of one chain of additions (the order of the additions differs from a plain loop).
template <compute_element W>
inline float dot(const W* a, const float* b, int n) {
  using vec = float_vec<16>::type;
  vec lanes{};
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    vec x, y;
    load16(a + i, x);
    std::memcpy(&y, b + i, sizeof y);
    lanes += x * y;
  }
  float s = 0.f;
  for (int k = 0; k < 16; ++k) s += lanes[k];
  for (; i < n; ++i) s += to_float(a[i]) * b[i];
  return s;
}

/// out[v * ldo + j] = dot(a + j * lda, b + v * ldb, n) for j in [0, rows) and v in [0, B): the
/// same operations in the same order per (row, vector), so the same bits as dot(), but R rows and
/// B vectors at a time: each load of a row feeds B chains, each load of a vector R chains, and
/// the FMA units get R * B independent chains (one dot is a single chain, bound by the
/// multiply-add latency). Rows past the last whole group of R take dot() one by one.
template <int R, int B, compute_element W>
void dot_rows_block(const W* a, std::size_t lda, const float* b, std::size_t ldb, int n,
                    int rows, float* out, std::size_t ldo) {
  using vec = float_vec<16>::type;
  int j = 0;
  for (; j + R <= rows; j += R) {
    const W* aj = a + static_cast<std::size_t>(j) * lda;
    vec lanes[B][R] = {};
    int i = 0;
    for (; i + 16 <= n; i += 16) {
      vec y[B];
      for (int v = 0; v < B; ++v)
        std::memcpy(&y[v], b + static_cast<std::size_t>(v) * ldb + i, sizeof y[v]);
      for (int u = 0; u < R; ++u) {
        vec x;
        load16(aj + static_cast<std::size_t>(u) * lda + i, x);
        for (int v = 0; v < B; ++v) lanes[v][u] += x * y[v];
      }
    }
    for (int v = 0; v < B; ++v) {
      const float* bv = b + static_cast<std::size_t>(v) * ldb;
      for (int u = 0; u < R; ++u) {
        const W* au = aj + static_cast<std::size_t>(u) * lda;
        float s = 0.f;
        for (int k = 0; k < 16; ++k) s += lanes[v][u][k];
        for (int t = i; t < n; ++t) s += to_float(au[t]) * bv[t];
        out[static_cast<std::size_t>(v) * ldo + j + u] = s;
      }
    }
  }
  for (; j < rows; ++j)
    for (int v = 0; v < B; ++v)
      out[static_cast<std::size_t>(v) * ldo + j] =
          dot(a + static_cast<std::size_t>(j) * lda, b + static_cast<std::size_t>(v) * ldb, n);
}

/// out[j] = dot(a + j * lda, b, n) for j in [0, rows): dot()'s bits, 8 rows at a time.
template <compute_element W>
inline void dot_rows(const W* a, std::size_t lda, const float* b, int n, int rows, float* out) {
  dot_rows_block<8, 1>(a, lda, b, 0, n, rows, out, 0);
}

/// out[v * ldo + j] = dot(a + j * lda, b + v * ldb, n) for j in [0, rows), v in [0, count): a GEMV
/// of `count` vectors against the same rows, dot()'s bits for each. With AVX-512 it reads the rows
/// once per 4 vectors (a GEMM with a thin right-hand side: the rows are the bytes that cost); its
/// 16 accumulators, 4 vectors and a row fill 21 of the 32 vector registers. Narrower targets would
/// spill them (16 registers, two or four per 16-float value), so there each vector takes dot_rows.
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
