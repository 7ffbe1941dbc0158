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
/// __syncthreads_or (count = false) and __syncthreads_count (count = true).
int syncthreads_vote(int predicate, bool count, const char* site);
/// A warp shuffle of 8 bytes: shfl.bfly (butterfly, `arg` the lane mask) or shfl.idx (`arg` the
/// source lane).
std::uint64_t shuffle_bits(bool butterfly, unsigned mask, std::uint64_t bits, int arg, int width,
                           const char* site);
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
#define __syncthreads_or(p) ::kvscout_simt::detail::syncthreads_vote((p), false, KVSCOUT_SIMT_SITE)
#define __syncthreads_count(p) ::kvscout_simt::detail::syncthreads_vote((p), true, KVSCOUT_SIMT_SITE)
inline long long clock64() { return ::kvscout_simt::detail::clock(); }

namespace kvscout_simt::detail {
template <class T>
inline T shuffle(bool butterfly, unsigned mask, T v, int arg, int width, const char* site) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = shuffle_bits(butterfly, mask, bits, arg, width, site);
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
namespace kvscout_simt::detail {
template <class T, class F>
inline T read_modify_write(T* p, F f) {
  const T old = *p;
  *p = f(old);
  return old;
}
}  // namespace kvscout_simt::detail
// Blocks run one after another and share one memory: every store is visible to later blocks.
inline void __threadfence() {}
template <class T>
inline T atomicAdd(T* p, T v) {
  return ::kvscout_simt::detail::read_modify_write(p, [v](T old) { return old + v; });
}
template <class T>
inline T atomicOr(T* p, T v) {
  return ::kvscout_simt::detail::read_modify_write(p, [v](T old) { return old | v; });
}

// Only the intrinsics that kvscout's kernels and tests call outside KVSCOUT_DEVICE_PASS branches
// (which are 0 here): a kernel that needs another fails to compile, naming it.
#include <bit>
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }

#include <math.h>  // device code calls isfinite, expf, fmaxf ... unqualified
