#pragma once
// Configuration macros shared by every kvscout header.
//
// KVSCOUT_HOST_DEVICE marks functions that both backends call: index math, quantisation math,
// score math. Under nvcc they are __host__ __device__ __forceinline__; under a plain host
// compiler they are ordinary inline functions, so the same code is tested on the CPU.

#if defined(KVSCOUT_SIMT_HOST)
// The host SIMT emulator of the tests (tests/simt): device code compiled by the host compiler and
// run on the CPU, with the device paths (intrinsics, atomics) taken.
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

// True while compiling device code (the device pass of nvcc). KVSCOUT_HOST_DEVICE functions
// choose their host or device form with it; under the SIMT emulator it is 0, so the host
// references a GPU test compares against keep their host form.
#if defined(__CUDA_ARCH__)
#define KVSCOUT_DEVICE_PASS 1
#else
#define KVSCOUT_DEVICE_PASS 0
#endif

// True where device-only code (KVSCOUT_DEVICE functions: device atomics) is compiled: the device
// pass of nvcc and the SIMT emulator.
#if defined(__CUDA_ARCH__) || defined(KVSCOUT_SIMT_HOST)
#define KVSCOUT_DEVICE_CODE 1
#else
#define KVSCOUT_DEVICE_CODE 0
#endif

/// Complete unrolling of a host loop with a constant trip count (up to 16), for loops over
/// arrays of vector accumulators that GCC otherwise leaves in memory, stored and reloaded on
/// every step (score/infinigen.hpp's scoring). Empty under nvcc, whose front end does not know
/// the pragma (so host code in .cu files keeps GCC's own choice), and for compilers that are
/// not GCC-compatible.
#if defined(__GNUC__) && !defined(__CUDACC__)
#define KVSCOUT_HOST_UNROLL _Pragma("GCC unroll 16")
#else
#define KVSCOUT_HOST_UNROLL
#endif

#define KVSCOUT_VERSION_MAJOR 0
#define KVSCOUT_VERSION_MINOR 1
#define KVSCOUT_VERSION_PATCH 0

namespace kvscout {
/// Marker for a template extent that is known only at run time (e.g. a runtime page size).
inline constexpr int dynamic_extent = -1;
}  // namespace kvscout
