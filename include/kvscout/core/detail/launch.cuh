#pragma once
// How kvscout launches a kernel and reaches its dynamic shared memory. Under nvcc these are exactly
// the launch and the `extern __shared__` array; under the tests' host SIMT emulator
// (KVSCOUT_SIMT_HOST) the same kernels run on the CPU, so CI executes every kernel without a GPU.

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "kvscout/core/config.hpp"

namespace kvscout::detail {

/// kernel<<<grid, block, smem, stream>>>(args...), the arguments converted to the kernel's
/// parameter types here.
template <class... Params, class... Args>
inline void launch(void (*kernel)(Params...), dim3 grid, dim3 block,
                   std::size_t smem, cudaStream_t stream, Args &&...args) {
  static_assert(sizeof...(Params) == sizeof...(Args),
                "a kernel launch with the wrong argument count");
#if defined(KVSCOUT_SIMT_HOST)
  ::kvscout_simt::launch(kernel, grid, block, smem, stream,
                         std::forward<Args>(args)...);
#else
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
#endif
}

/// Setup-time: plans and selectors ask it once, when built.
inline int current_sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return sms;
}

/// The launch's `smem` bytes, 16-byte aligned.
template <class T> KVSCOUT_DEVICE T *dynamic_shared() {
#if defined(KVSCOUT_SIMT_HOST)
  return static_cast<T *>(::kvscout_simt::detail::dynamic_shared());
#else
  extern __shared__ __align__(16) unsigned char kvscout_dynamic_shared[];
  return reinterpret_cast<T *>(kvscout_dynamic_shared);
#endif
}

} // namespace kvscout::detail
