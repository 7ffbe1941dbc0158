#pragma once
// Host vector helpers written with GCC / Clang vector extensions: the compiler maps a vector
// value onto the widest registers the target has (SSE2, AVX2, AVX-512), so host kernels vectorise
// for whatever the user compiles for, without intrinsics and without a code path per ISA.
//
//   float d = kvscout::detail::dot(a, b, n);   // 16 independent partial sums, then a reduction

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

}  // namespace kvscout::detail
