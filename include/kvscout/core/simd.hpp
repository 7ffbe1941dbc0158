#pragma once
// Host vector helpers written with GCC / Clang vector extensions: the compiler maps a vector
// value onto the widest registers the target has (SSE2, AVX2, AVX-512), so host kernels vectorise
// for whatever the user compiles for, without intrinsics and without a code path per ISA.
//
//   float d = kvscout::detail::dot(a, b, n);   // 16 independent partial sums, then a reduction
//   kvscout::detail::dot_rows(W, ld, x, n, rows, y);   // y[j] = dot(W + j * ld, x, n), same bits

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

/// out[j] = dot(a + j * lda, b, n) for j in [0, rows): the same operations in the same order per
/// row, so the same bits as dot(), but R rows at a time share each load of b and give the FMA
/// units R independent chains (one dot is a single chain, bound by the multiply-add latency).
template <int R = 8>
void dot_rows(const float* a, std::size_t lda, const float* b, int n, int rows, float* out) {
  using vec = float_vec<16>::type;
  int j = 0;
  for (; j + R <= rows; j += R) {
    const float* aj = a + static_cast<std::size_t>(j) * lda;
    vec lanes[R] = {};
    int i = 0;
    for (; i + 16 <= n; i += 16) {
      vec y;
      std::memcpy(&y, b + i, sizeof y);
      for (int u = 0; u < R; ++u) {
        vec x;
        std::memcpy(&x, aj + static_cast<std::size_t>(u) * lda + i, sizeof x);
        lanes[u] += x * y;
      }
    }
    for (int u = 0; u < R; ++u) {
      const float* au = aj + static_cast<std::size_t>(u) * lda;
      float s = 0.f;
      for (int k = 0; k < 16; ++k) s += lanes[u][k];
      for (int t = i; t < n; ++t) s += au[t] * b[t];
      out[j + u] = s;
    }
  }
  for (; j < rows; ++j) out[j] = dot(a + static_cast<std::size_t>(j) * lda, b, n);
}

}  // namespace kvscout::detail
