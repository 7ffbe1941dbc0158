#pragma once
// Vector loads of a few consecutive elements, widened to float.

#include <cuda_runtime.h>

#include "kvscout/core/config.hpp"
#include "kvscout/core/dtype.hpp"

namespace kvscout::detail {

/// E consecutive elements at p as float, with the widest loads their size allows (16, 8 bytes, else
/// element loads). p must be aligned to that width.
template <kv_element T, int E>
KVSCOUT_DEVICE void load_row_part(const T* p, float (&dst)[E]) {
  constexpr int bytes = E * static_cast<int>(sizeof(T));
  alignas(16) T tmp[E];
  if constexpr (bytes % 16 == 0) {
#pragma unroll
    for (int u = 0; u < bytes / 16; ++u)
      reinterpret_cast<uint4*>(tmp)[u] = reinterpret_cast<const uint4*>(p)[u];
  } else if constexpr (bytes % 8 == 0) {
#pragma unroll
    for (int u = 0; u < bytes / 8; ++u)
      reinterpret_cast<uint2*>(tmp)[u] = reinterpret_cast<const uint2*>(p)[u];
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) tmp[e] = p[e];
  }
#pragma unroll
  for (int e = 0; e < E; ++e) dst[e] = to_float(tmp[e]);
}

}  // namespace kvscout::detail
