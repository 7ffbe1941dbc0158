#pragma once
// The host SIMT emulator's stand-in for cub::BlockReduce (tests/simt): the same interface and
// contract as CUB's for the calls kvscout makes. The result is valid in thread 0 only, as in CUB;
// every other thread gets poisoned bits (all ones), so a kernel that reads it elsewhere fails.
#include <cstring>

#include "kvscout_simt/block_common.hpp"

namespace cub {

template <class T, int BlockThreads>
class BlockReduce {
 public:
  struct TempStorage {
    T values[BlockThreads];
  };
  explicit BlockReduce(TempStorage& temp) : temp_(temp) {}

  template <class Op>
  T Reduce(T input, Op op) {
    return Reduce(input, op, BlockThreads);
  }
  template <class Op>
  T Reduce(T input, Op op, int num_valid) {
    const int t = kvscout_simt::block_linear_thread(BlockThreads);
    temp_.values[t] = input;
    KVSCOUT_SIMT_CUB_BARRIER();
    if (t != 0) return kvscout_simt::poisoned<T>();
    T acc = temp_.values[0];
    for (int i = 1; i < num_valid; ++i) acc = op(acc, temp_.values[i]);
    return acc;
  }
  T Sum(T input) {
    return Reduce(input, [](const T& a, const T& b) { return a + b; });
  }

 private:
  TempStorage& temp_;
};

}  // namespace cub
