#pragma once
// Test fixture: a seeded random orthogonal matrix, a skew plan's A (test_skew.cpp, and the device
// speculation's tests test_spec_device.cu, test_correction_device.cu). Host code only.

#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

namespace kvtest {

/// A random orthogonal D x D matrix (modified Gram-Schmidt in fp64 on the columns of a normal
/// matrix), row-major.
inline std::vector<double> random_orthogonal_fp64(int D, std::mt19937& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> a(static_cast<std::size_t>(D) * D);
  for (auto& v : a) v = nd(rng);
  for (int j = 0; j < D; ++j) {
    for (int k = 0; k < j; ++k) {
      double dot = 0;
      for (int i = 0; i < D; ++i) dot += a[i * D + j] * a[i * D + k];
      for (int i = 0; i < D; ++i) a[i * D + j] -= dot * a[i * D + k];
    }
    double n = 0;
    for (int i = 0; i < D; ++i) n += a[i * D + j] * a[i * D + j];
    n = std::sqrt(n);
    for (int i = 0; i < D; ++i) a[i * D + j] /= n;
  }
  return a;
}

/// The same matrix rounded to float (a skew_plan's A).
inline std::vector<float> random_orthogonal(int D, std::mt19937& rng) {
  const std::vector<double> a = random_orthogonal_fp64(D, rng);
  return {a.begin(), a.end()};
}

}  // namespace kvtest
