// Must NOT compile: device memory cannot be passed where host memory is expected.
#include "kvscout/core/span.hpp"

float first(kvscout::host_span<const float> s) { return s[0]; }

int main() {
  kvscout::device_span<float> d(nullptr, 0);
  return static_cast<int>(first(d));
}
