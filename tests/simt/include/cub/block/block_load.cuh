#pragma once
// The host SIMT emulator's stand-in for cub::BlockLoad (tests/simt): every algorithm yields CUB's
// blocked arrangement (thread t holds items t * Items ... t * Items + Items - 1); guarded loads
// fill the items past `valid` with the default.
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
  template <class It>
  void Load(It in, T (&items)[Items], int valid) {
    const int t = kvscout_simt::block_linear_thread(BlockThreads);
    for (int i = 0; i < Items; ++i) {
      if (t * Items + i < valid) items[i] = in[t * Items + i];
    }
  }
  template <class It, class D>
  void Load(It in, T (&items)[Items], int valid, D oob_default) {
    const int t = kvscout_simt::block_linear_thread(BlockThreads);
    for (int i = 0; i < Items; ++i)
      items[i] = t * Items + i < valid ? static_cast<T>(in[t * Items + i]) : static_cast<T>(oob_default);
  }
};

}  // namespace cub
