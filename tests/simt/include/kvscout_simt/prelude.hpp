#pragma once
// The host SIMT emulator's prelude: force-included (-include) before anything else in a
// translation unit that compiles kvscout's CUDA sources (.cuh headers, the GPU tests) with the
// host C++ compiler. The kernels' source is unchanged: every CUDA thread of a block runs as a
// fiber on the calling thread (in the order KVSCOUT_SIMT_ORDER names: forward, reverse or
// shuffle[:SEED]), __syncthreads and warp shuffles are cooperative barriers, blocks run one
// after another, __shared__ variables are function statics (so one block's threads share them),
// streams queue their operations and run them at synchronisation points (honouring event waits
// only, streams in the same order setting), and graph capture records operations to replay. The subset of the CUDA runtime that kvscout and its GPU tests call is implemented in
// simt.cpp; link it instead of libcudart.
//
// docs/testing.md lists what this shows (indexing, arithmetic, block algorithms, missing
// barriers of the write-then-read kind, CUB misuse, divergent barriers and shuffles, deadlocks,
// missing event waits, capture structure) and what it cannot (races inside a kernel,
// interleavings, uninitialised static shared memory, host / device address confusion, resources,
// timing, the device's rounding). Those need a GPU (scripts/gpu_check.sh).

#define KVSCOUT_SIMT_HOST 1

// CUDA's keywords, defined before cuda_runtime.h so that crt/host_defines.h keeps them.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __constant__ static
#define __grid_constant__
#define __restrict__ __restrict
#define __launch_bounds__(...)

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>

namespace kvscout_simt {

namespace detail {
struct thread_state {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
const thread_state& current();
void* dynamic_shared();
// `site` names the __syncthreads call: every thread of a block must wait at the same one.
void syncthreads(const char* site);
int syncthreads_or(int predicate, const char* site);
int syncthreads_count(int predicate, const char* site);
std::uint64_t shfl_xor(unsigned mask, std::uint64_t bits, int lane_mask, int width, const char* site);
std::uint64_t shfl(unsigned mask, std::uint64_t bits, int src_lane, int width, const char* site);
/// The order in which a block's threads run between barriers: "forward", "reverse" or
/// "shuffle[:SEED]" (the default comes from KVSCOUT_SIMT_ORDER, else forward).
void set_order(const char* setting);
/// No thread of the running block has returned.
bool block_intact();
/// The barrier inside a CUB block collective: like __syncthreads, but every thread of the block
/// must arrive (one that has returned is an error, not an arrival).
void collective_syncthreads(const char* site);
long long clock();
/// Queues (on the legacy stream: runs; while a capture is active: records) an operation.
void enqueue(cudaStream_t stream, std::function<void()> op);
/// Checks a launch configuration; records the error as the last error and returns false if bad.
bool check_launch(dim3 grid, dim3 block, std::size_t smem);
void run_grid(dim3 grid, dim3 block, std::size_t smem, const std::function<void()>& body);
}  // namespace detail

/// kvscout::detail::launch's emulated path: the arguments are already converted to the kernel's
/// parameter types and are copied into the operation, as a launch copies them.
template <class... Params>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
            std::remove_cv_t<std::remove_reference_t<Params>>... args) {
  if (!detail::check_launch(grid, block, smem)) return;
  detail::enqueue(stream, [=]() {
    detail::run_grid(grid, block, smem, [&]() { kernel(args...); });
  });
}

}  // namespace kvscout_simt

// ---- the built-in variables and functions of device code ----------------------------------------
#define threadIdx (::kvscout_simt::detail::current().thread_idx)
#define blockIdx (::kvscout_simt::detail::current().block_idx)
#define blockDim (::kvscout_simt::detail::current().block_dim)
#define gridDim (::kvscout_simt::detail::current().grid_dim)
#ifndef warpSize
#define warpSize 32
#endif

#define KVSCOUT_SIMT_STR2(x) #x
#define KVSCOUT_SIMT_STR(x) KVSCOUT_SIMT_STR2(x)
#define KVSCOUT_SIMT_SITE __FILE__ ":" KVSCOUT_SIMT_STR(__LINE__)
#define __syncthreads() ::kvscout_simt::detail::syncthreads(KVSCOUT_SIMT_SITE)
#define __syncthreads_or(p) ::kvscout_simt::detail::syncthreads_or((p), KVSCOUT_SIMT_SITE)
#define __syncthreads_count(p) ::kvscout_simt::detail::syncthreads_count((p), KVSCOUT_SIMT_SITE)
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}
inline long long clock64() { return ::kvscout_simt::detail::clock(); }
inline void __nanosleep(unsigned) {}

namespace kvscout_simt::detail {
template <class T>
inline T shuffle(bool butterfly, unsigned mask, T v, int arg, int width, const char* site) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = butterfly ? shfl_xor(mask, bits, arg, width, site) : shfl(mask, bits, arg, width, site);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
inline int shuffle_width(int width = 32) { return width; }
}  // namespace kvscout_simt::detail
// Every lane of a shuffle must call the same one (the call site is part of the check).
#define __shfl_xor_sync(mask, v, lane_mask, ...)                                              \
  ::kvscout_simt::detail::shuffle(true, (mask), (v), (lane_mask),                             \
                                  ::kvscout_simt::detail::shuffle_width(__VA_ARGS__), KVSCOUT_SIMT_SITE)
#define __shfl_sync(mask, v, src_lane, ...)                                                   \
  ::kvscout_simt::detail::shuffle(false, (mask), (v), (src_lane),                             \
                                  ::kvscout_simt::detail::shuffle_width(__VA_ARGS__), KVSCOUT_SIMT_SITE)

// Fibers of one grid run on one host thread and switch only at barriers: a read-modify-write is
// atomic as written.
template <class T>
inline T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <class T>
inline T atomicOr(T* p, T v) {
  const T old = *p;
  *p = old | v;
  return old;
}
template <class T>
inline T atomicMax(T* p, T v) {
  const T old = *p;
  *p = old < v ? v : old;
  return old;
}
template <class T>
inline T atomicMin(T* p, T v) {
  const T old = *p;
  *p = v < old ? v : old;
  return old;
}
template <class T>
inline T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}

inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline unsigned __float_as_uint(float x) { unsigned u; std::memcpy(&u, &x, 4); return u; }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
template <class T>
inline T __ldg(const T* p) { return *p; }

// Correctly rounded arithmetic with a named rounding: round to nearest is the host's default.
#include <cmath>
#include <math.h>  // device code calls isfinite, expf, fmaxf ... unqualified
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline float __frcp_rn(float a) { volatile float r = 1.f / a; return r; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __expf(float a) { return std::exp(a); }
inline float __logf(float a) { return std::log(a); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float a) { return a < 0.f ? 0.f : (a > 1.f ? 1.f : a); }
inline float rsqrtf(float a) { return 1.f / std::sqrt(a); }
