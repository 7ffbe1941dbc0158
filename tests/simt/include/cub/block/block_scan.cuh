#pragma once
// The host SIMT emulator's stand-in for cub::BlockScan (tests/simt): exclusive prefix sums in
// thread order, with the block aggregate in every thread, as CUB gives them.
#include "kvscout_simt/block_common.hpp"

namespace cub {

template <class T, int BlockThreads>
class BlockScan {
 public:
  struct TempStorage {
    T values[BlockThreads];
  };
  explicit BlockScan(TempStorage& temp) : temp_(temp) {}

  void ExclusiveSum(T input, T& output) {
    T aggregate;
    ExclusiveSum(input, output, aggregate);
  }
  void ExclusiveSum(T input, T& output, T& aggregate) {
    const int t = kvscout_simt::block_linear_thread(BlockThreads);
    temp_.values[t] = input;
    KVSCOUT_SIMT_CUB_BARRIER();
    T before{};
    T total{};
    for (int i = 0; i < BlockThreads; ++i) {
      if (i == t) before = total;
      total = total + temp_.values[i];
    }
    output = before;
    aggregate = total;
  }
  void InclusiveSum(T input, T& output) {
    T aggregate;
    ExclusiveSum(input, output, aggregate);
    output = output + input;
  }

 private:
  TempStorage& temp_;
};

}  // namespace cub
