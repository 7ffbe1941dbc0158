#pragma once
// Configuration macros shared by every kvscout header. KVSCOUT_HOST_DEVICE marks functions both
// backends call: __host__ __device__ __forceinline__ under nvcc, inline under a plain host
// compiler, so the same code is tested on the CPU.

#if defined(KVSCOUT_SIMT_HOST)
// The tests' host SIMT emulator: device code compiled by the host compiler, device paths taken.
#define KVSCOUT_HOST_DEVICE inline
#define KVSCOUT_DEVICE inline
#define KVSCOUT_CUDA_COMPILER 1
#elif defined(__CUDACC__) || defined(__HIPCC__)
#define KVSCOUT_HOST_DEVICE __host__ __device__ __forceinline__
#define KVSCOUT_DEVICE __device__ __forceinline__
#define KVSCOUT_CUDA_COMPILER 1
#else
#define KVSCOUT_HOST_DEVICE inline
#define KVSCOUT_DEVICE inline
#define KVSCOUT_CUDA_COMPILER 0
#endif

// True in nvcc's device pass. Under the SIMT emulator it is 0, so the host references a GPU test
// compares against keep their host form.
#if defined(__CUDA_ARCH__)
#define KVSCOUT_DEVICE_PASS 1
#else
#define KVSCOUT_DEVICE_PASS 0
#endif

// Where device-only code (device atomics) is compiled: nvcc's device pass and the SIMT emulator.
#if defined(__CUDA_ARCH__) || defined(KVSCOUT_SIMT_HOST)
#define KVSCOUT_DEVICE_CODE 1
#else
#define KVSCOUT_DEVICE_CODE 0
#endif

/// Complete unrolling of a host loop with a constant trip count (up to 16), for arrays of vector
/// accumulators that GCC otherwise leaves in memory. Empty under nvcc, whose front end does not
/// know the pragma, and for compilers that are not GCC-compatible.
#if defined(__GNUC__) && !defined(__CUDACC__)
#define KVSCOUT_HOST_UNROLL _Pragma("GCC unroll 16")
#else
#define KVSCOUT_HOST_UNROLL
#endif

#define KVSCOUT_VERSION_MAJOR 0
#define KVSCOUT_VERSION_MINOR 1
#define KVSCOUT_VERSION_PATCH 0

namespace kvscout {
inline constexpr int dynamic_extent = -1;
}  // namespace kvscout
