#pragma once
// Shared by the emulator's CUB stand-ins (tests/simt/include/cub).
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvscout_simt {

/// The calling thread's linear index in its block, checked against the block size a CUB
/// primitive was instantiated for.
/// The calling thread's index for a CUB block primitive of `block_threads` threads (1-D, as
/// CUB's default BLOCK_DIM_Y = BLOCK_DIM_Z = 1 assumes), checked: the block must have exactly
/// that many threads in x.
inline int block_linear_thread(int block_threads) {
  const auto& s = detail::current();
  if (s.block_dim.x != static_cast<unsigned>(block_threads) || s.block_dim.y != 1 || s.block_dim.z != 1) {
    std::fprintf(stderr, "simt: a CUB block primitive for %d threads ran in a block of (%u, %u, %u)\n",
                 block_threads, s.block_dim.x, s.block_dim.y, s.block_dim.z);
    std::abort();
  }
  return static_cast<int>(s.thread_idx.x);
}

/// The barrier inside a CUB collective: every thread of the block must take part, so a thread
/// that has returned before it is an error (the plain barrier counts it as arrived).
#define KVSCOUT_SIMT_CUB_BARRIER() ::kvscout_simt::detail::collective_syncthreads(KVSCOUT_SIMT_SITE)

template <class T>
T poisoned() {
  T v;
  std::memset(static_cast<void*>(&v), 0xff, sizeof(T));
  return v;
}

}  // namespace kvscout_simt
