#pragma once
// Test helper of the speculation's GPU tests: one append call of the same seeded keys to a host
// policy (layer 0) and to device speculators, so that both hold the same partial keys.

#include <cstdint>
#include <utility>
#include <vector>

#include "gpu_harness.cuh"

namespace gpu_test {

/// Every (s, t) of `entries`, in order: gen(k) fills token (s, t)'s keys k [H * D] (after RoPE,
/// the same to both sides), then host.append(0, s, t, k, k); then each device speculator gets
/// the whole batch in one append() call, its status word `status` (may be null). Synchronises.
template <class Host, class Gen, class... Dev>
void append_same_keys(Host& host, const std::vector<std::pair<int, int>>& entries, int H, int D, Gen&& gen,
                      int* status, Dev&... devs) {
  std::vector<float> keys, k(static_cast<std::size_t>(H) * D);
  std::vector<std::int32_t> sids, tids;
  for (const auto& [s, t] : entries) {
    gen(k);
    host.append(0, s, t, k.data(), k.data());
    keys.insert(keys.end(), k.begin(), k.end());
    sids.push_back(s);
    tids.push_back(t);
  }
  device_vector<float> dk(keys);
  device_vector<std::int32_t> ds(sids), dt(tids);
  (devs.append({dk.data(), dk.size()}, {ds.data(), ds.size()}, {dt.data(), dt.size()},
               static_cast<int>(sids.size()), {nullptr, status}),
   ...);
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
}

/// The entries of sequences 0, 1, ... holding lens[s] tokens each, sequence by sequence.
inline std::vector<std::pair<int, int>> prefill_entries(const std::vector<std::int32_t>& lens) {
  std::vector<std::pair<int, int>> e;
  for (std::size_t s = 0; s < lens.size(); ++s)
    for (int t = 0; t < lens[s]; ++t) e.push_back({static_cast<int>(s), t});
  return e;
}

}  // namespace gpu_test
