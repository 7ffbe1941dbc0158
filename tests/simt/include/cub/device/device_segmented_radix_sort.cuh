#pragma once
// The host SIMT emulator's stand-in for cub::DeviceSegmentedRadixSort::SortPairsDescending
// (tests/simt), the GPU benchmarks' anchor: the same two-phase interface (a size query with a
// null temp pointer, then the sort, enqueued on the stream) and the same order. Keys are ordered
// by CUB's radix key of a float (larger first; the bits of -0 sort below +0), stably, within each
// segment [begin_offsets[s], end_offsets[s]).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

namespace cub {

struct DeviceSegmentedRadixSort {
  template <class Value, class BeginIt, class EndIt>
  static cudaError_t SortPairsDescending(void* temp, std::size_t& temp_bytes, const float* keys_in,
                                         float* keys_out, const Value* values_in, Value* values_out,
                                         int num_items, int num_segments, BeginIt begin_offsets,
                                         EndIt end_offsets, int begin_bit = 0, int end_bit = 32,
                                         cudaStream_t stream = 0) {
    if (temp == nullptr) {
      temp_bytes = 16;
      return cudaSuccess;
    }
    if (num_items < 0 || num_segments < 0 || begin_bit != 0 || end_bit != 32) return cudaErrorInvalidValue;
    kvscout_simt::detail::enqueue(stream, [=] {
      for (int s = 0; s < num_segments; ++s) {
        const int a = begin_offsets[s], b = end_offsets[s];
        std::vector<int> order(static_cast<std::size_t>(b > a ? b - a : 0));
        std::iota(order.begin(), order.end(), a);
        auto radix_key = [&](int i) {
          std::uint32_t u;
          std::memcpy(&u, &keys_in[i], 4);
          return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
        };
        std::stable_sort(order.begin(), order.end(),
                         [&](int x, int y) { return radix_key(x) > radix_key(y); });
        for (std::size_t j = 0; j < order.size(); ++j) {
          keys_out[a + static_cast<int>(j)] = keys_in[order[j]];
          values_out[a + static_cast<int>(j)] = values_in[order[j]];
        }
      }
    });
    return cudaSuccess;
  }
};

}  // namespace cub
