#pragma once
// The host SIMT emulator's stand-in for cub::BlockLoad (tests/simt): every algorithm yields CUB's
// blocked arrangement (thread t holds items t * Items ... t * Items + Items - 1); guarded loads
// fill the items past `valid` with the default, or poison. Unlike CUB's transposing loads it
// does not use its TempStorage, so a missing barrier before reusing that storage is not seen here.
#include "kvscout_simt/block_common.hpp"

namespace cub {

enum BlockLoadAlgorithm {
  BLOCK_LOAD_DIRECT,
  BLOCK_LOAD_STRIPED,
  BLOCK_LOAD_VECTORIZE,
  BLOCK_LOAD_TRANSPOSE,
  BLOCK_LOAD_WARP_TRANSPOSE,
  BLOCK_LOAD_WARP_TRANSPOSE_TIMESLICED,
};

template <class T, int BlockThreads, int Items, BlockLoadAlgorithm Algorithm = BLOCK_LOAD_DIRECT>
class BlockLoad {
 public:
  struct TempStorage {
    T unused[1];
  };
  explicit BlockLoad(TempStorage&) {}

  template <class It>
  void Load(It in, T (&items)[Items]) {
    const int t = kvscout_simt::block_linear_thread(BlockThreads);
    for (int i = 0; i < Items; ++i) items[i] = in[t * Items + i];
  }
  // CUB leaves the items past `valid` unassigned: they are poisoned here.
  template <class It>
  void Load(It in, T (&items)[Items], int valid) {
    const int t = kvscout_simt::block_linear_thread(BlockThreads);
    for (int i = 0; i < Items; ++i)
      items[i] = t * Items + i < valid ? static_cast<T>(in[t * Items + i]) : kvscout_simt::poisoned<T>();
  }
  template <class It, class D>
  void Load(It in, T (&items)[Items], int valid, D oob_default) {
    const int t = kvscout_simt::block_linear_thread(BlockThreads);
    for (int i = 0; i < Items; ++i)
      items[i] = t * Items + i < valid ? static_cast<T>(in[t * Items + i]) : static_cast<T>(oob_default);
  }
};

}  // namespace cub
