#pragma once
// The host's native float vector (GCC / Clang vector extensions) and the one row maximum every host
// part uses.

#include <cstring>
#include <limits>

namespace kvscout::detail {

template <int N>
struct float_vec {
  typedef float type __attribute__((vector_size(N * sizeof(float))));
};

/// The floats one vector register of the target holds: GCC passes wider vectors kept in arrays
/// through the stack.
#if defined(__AVX512F__)
inline constexpr int host_float_lanes = 16;
#elif defined(__AVX__)
inline constexpr int host_float_lanes = 8;
#else
inline constexpr int host_float_lanes = 4;
#endif

using host_vec = float_vec<host_float_lanes>::type;

/// The largest non-NaN of p[0, n), -inf if none. x > m is false for a NaN x, so no lane ever holds
/// a NaN. Four separate locals, not an array: GCC keeps an array of vectors in memory.
inline float max_non_nan(const float* p, int n) {
  constexpr int W = host_float_lanes;
  const auto up = [](host_vec m, const float* q) __attribute__((always_inline)) {
    host_vec x;
    std::memcpy(&x, q, sizeof x);
    return x > m ? x : m;
  };
  const host_vec lowest = host_vec{} - std::numeric_limits<float>::infinity();
  host_vec m0 = lowest, m1 = lowest, m2 = lowest, m3 = lowest;
  int i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    m0 = up(m0, p + i);
    m1 = up(m1, p + i + W);
    m2 = up(m2, p + i + 2 * W);
    m3 = up(m3, p + i + 3 * W);
  }
  for (; i + W <= n; i += W) m0 = up(m0, p + i);
  m0 = m1 > m0 ? m1 : m0;
  m2 = m3 > m2 ? m3 : m2;
  m0 = m2 > m0 ? m2 : m0;
  float r = -std::numeric_limits<float>::infinity();
  for (int l = 0; l < W; ++l) r = m0[l] > r ? m0[l] : r;
  for (; i < n; ++i) r = p[i] > r ? p[i] : r;
  return r;
}

}  // namespace kvscout::detail
