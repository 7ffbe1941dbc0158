#pragma once
// Host vector helpers written with GCC / Clang vector extensions: the compiler maps a vector
// value onto the widest registers the target has (SSE2, AVX2, AVX-512), so host kernels vectorise
// for whatever the user compiles for, without intrinsics and without a code path per ISA.
//
//   float d = kvscout::detail::dot(a, b, n);   // 16 independent partial sums, then a reduction
//   kvscout::detail::dot_rows(W, ld, x, n, rows, y);   // y[j] = dot(W + j * ld, x, n), same bits
//   kvscout::detail::dot_rows_multi(W, ld, X, ldx, count, n, rows, Y, ldy);   // count x's at once

#include <cstddef>
#include <cstring>

namespace kvscout::detail {

/// N floats as one vector value.
template <int N>
struct float_vec {
  typedef float type __attribute__((vector_size(N * sizeof(float))));
};

/// sum_i a[i] * b[i] with 16 independent partial sums: bound by reading a and b, not by the
/// latency of one chain of additions (the order of the additions differs from a plain loop).
inline float dot(const float* a, const float* b, int n) {
  using vec = float_vec<16>::type;
  vec lanes{};
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    vec x, y;
    std::memcpy(&x, a + i, sizeof x);
    std::memcpy(&y, b + i, sizeof y);
    lanes += x * y;
  }
  float s = 0.f;
  for (int k = 0; k < 16; ++k) s += lanes[k];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

/// out[v * ldo + j] = dot(a + j * lda, b + v * ldb, n) for j in [0, rows) and v in [0, B): the
/// same operations in the same order per (row, vector), so the same bits as dot(), but R rows and
/// B vectors at a time: each load of a row feeds B chains, each load of a vector R chains, and
/// the FMA units get R * B independent chains (one dot is a single chain, bound by the
/// multiply-add latency). Rows past the last whole group of R take dot() one by one.
template <int R, int B>
void dot_rows_block(const float* a, std::size_t lda, const float* b, std::size_t ldb, int n,
                    int rows, float* out, std::size_t ldo) {
  using vec = float_vec<16>::type;
  int j = 0;
  for (; j + R <= rows; j += R) {
    const float* aj = a + static_cast<std::size_t>(j) * lda;
    vec lanes[B][R] = {};
    int i = 0;
    for (; i + 16 <= n; i += 16) {
      vec y[B];
      for (int v = 0; v < B; ++v)
        std::memcpy(&y[v], b + static_cast<std::size_t>(v) * ldb + i, sizeof y[v]);
      for (int u = 0; u < R; ++u) {
        vec x;
        std::memcpy(&x, aj + static_cast<std::size_t>(u) * lda + i, sizeof x);
        for (int v = 0; v < B; ++v) lanes[v][u] += x * y[v];
      }
    }
    for (int v = 0; v < B; ++v) {
      const float* bv = b + static_cast<std::size_t>(v) * ldb;
      for (int u = 0; u < R; ++u) {
        const float* au = aj + static_cast<std::size_t>(u) * lda;
        float s = 0.f;
        for (int k = 0; k < 16; ++k) s += lanes[v][u][k];
        for (int t = i; t < n; ++t) s += au[t] * bv[t];
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
inline void dot_rows(const float* a, std::size_t lda, const float* b, int n, int rows, float* out) {
  dot_rows_block<8, 1>(a, lda, b, 0, n, rows, out, 0);
}

/// out[v * ldo + j] = dot(a + j * lda, b + v * ldb, n) for j in [0, rows), v in [0, count): a GEMV
/// of `count` vectors against the same rows, dot()'s bits for each. With AVX-512 it reads the rows
/// once per 4 vectors (a GEMM with a thin right-hand side: the rows are the bytes that cost); its
/// 16 accumulators, 4 vectors and a row fill 21 of the 32 vector registers. Narrower targets would
/// spill them (16 registers, two or four per 16-float value), so there each vector takes dot_rows.
inline void dot_rows_multi(const float* a, std::size_t lda, const float* b, std::size_t ldb,
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
