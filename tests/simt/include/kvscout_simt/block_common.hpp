#pragma once
// Shared by the emulator's CUB stand-ins (tests/simt/include/cub).
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvscout_simt {

/// The calling thread's linear index in its block, checked against the block size a CUB
/// primitive was instantiated for.
inline int block_linear_thread(int block_threads) {
  const auto& s = detail::current();
  const unsigned n = s.block_dim.x * s.block_dim.y * s.block_dim.z;
  if (n != static_cast<unsigned>(block_threads)) {
    std::fprintf(stderr, "simt: a CUB block primitive for %d threads ran in a block of %u\n",
                 block_threads, n);
    std::abort();
  }
  return static_cast<int>(s.thread_idx.x + s.block_dim.x * (s.thread_idx.y + s.block_dim.y * s.thread_idx.z));
}

template <class T>
T poisoned() {
  T v;
  std::memset(static_cast<void*>(&v), 0xff, sizeof(T));
  return v;
}

}  // namespace kvscout_simt
