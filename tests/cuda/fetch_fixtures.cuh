#pragma once
// Fixtures shared by the CUDA fetch / attention / append tests: the host layout fixtures of
// tests/host/kv_fixtures.hpp, their metadata copied to the device (so that kernels can read a
// layout), seeded random selections of a given density, and KIVI caches filled by the host
// writer.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "../host/kv_fixtures.hpp"
#include "gpu_harness.cuh"
#include "kvscout/core/selection.hpp"
#include "kvscout/kv/kivi.hpp"

namespace fetch_test {

using gpu_test::device_vector;
using gpu_test::pinned_vector;

/// A layout fixture's metadata on the device, and the same layout pointing at it.
template <class Case>
struct device_layout {
  using layout_type = typename Case::layout;
  device_vector<int32_t> lens, a, b, c;
  layout_type layout;

  static std::vector<int32_t> or_one(const std::vector<int32_t>& v) {
    return v.empty() ? std::vector<int32_t>{0} : v;
  }
  explicit device_layout(const kvtest::layout_fixture<Case>& f)
      : lens(or_one(f.lens)), a(or_one(f.a)), b(or_one(f.b)), c(or_one(f.c)) {
    const int n = static_cast<int>(f.lens.size());
    using kvtest::kind;
    if constexpr (Case::layout_kind == kind::padded) {
      layout = layout_type::padded(f.heads, f.capacity, lens.data(), n);
    } else if constexpr (Case::layout_kind == kind::ragged) {
      layout = layout_type::ragged(f.heads, f.capacity, a.data(), n);
    } else if constexpr (Case::layout_kind == kind::flashinfer) {
      layout = layout_type(kvscout::flashinfer_page_table{a.data(), b.data(), c.data(), n}, f.heads);
    } else {
      const int max_blocks = static_cast<int>(f.a.size() / std::max<std::size_t>(f.lens.size(), 1));
      layout = layout_type(kvscout::block_table{a.data(), lens.data(), max_blocks, n}, f.heads,
                           f.page);
    }
  }
};

/// A seeded selection: each token with probability `density`, capped at the capacity, ascending.
struct host_selection {
  std::vector<int32_t> indices, counts;
  int num_seqs = 0, heads = 0, capacity = 0;

  host_selection(const std::vector<int>& lens, int h, int cap, double density, std::mt19937& rng)
      : num_seqs(static_cast<int>(lens.size())), heads(h), capacity(cap) {
    indices.assign(static_cast<std::size_t>(num_seqs) * heads * std::max(cap, 1), -7);
    counts.assign(static_cast<std::size_t>(num_seqs) * heads, 0);
    std::bernoulli_distribution take(density);
    for (int s = 0; s < num_seqs; ++s)
      for (int hh = 0; hh < heads; ++hh) {
        std::vector<int32_t> chosen;
        for (int t = 0; t < lens[s]; ++t)
          if (take(rng)) chosen.push_back(t);
        if (static_cast<int>(chosen.size()) > cap) {
          std::shuffle(chosen.begin(), chosen.end(), rng);
          chosen.resize(static_cast<std::size_t>(cap));
          std::sort(chosen.begin(), chosen.end());
        }
        const std::size_t r = static_cast<std::size_t>(s) * heads + hh;
        counts[r] = static_cast<int32_t>(chosen.size());
        std::copy(chosen.begin(), chosen.end(), indices.begin() + static_cast<std::ptrdiff_t>(r * cap));
      }
  }
  kvscout::selection_view<kvscout::host_space> view() const {
    return {{indices.data(), indices.size()}, {counts.data(), counts.size()}, num_seqs, heads,
            capacity};
  }
  std::int64_t total() const {
    std::int64_t t = 0;
    for (int c : counts) t += c;
    return t;
  }
};

/// The same selection on the device.
struct device_selection {
  device_vector<int32_t> indices, counts;
  int num_seqs, heads, capacity;
  explicit device_selection(const host_selection& h)
      : indices(h.indices), counts(h.counts), num_seqs(h.num_seqs), heads(h.heads),
        capacity(h.capacity) {}
  kvscout::selection_view<kvscout::device_space> view() const {
    return {{indices.data(), indices.size()}, {counts.data(), counts.size()}, num_seqs, heads,
            capacity};
  }
};

inline void fill_random_bytes(std::byte* p, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(1 + rng() % 255);
}

/// Seeded values in [-2, 2) as T.
template <class T>
std::vector<T> random_values(std::size_t n, std::uint32_t seed, float lo = -2.f, float hi = 2.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = kvscout::from_float<T>(d(rng));
  return v;
}

/// Index of the first differing byte, or -1.
inline long long first_mismatch(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<long long>(i);
  return -1;
}

inline int read_status(const device_vector<int>& st) { return st.download()[0]; }
inline void clear_status(device_vector<int>& st) {
  KVSCOUT_CUDA_CHECK(cudaMemset(st.data(), 0, sizeof(int)));
  KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
}

/// A KIVI cache filled by kivi_append_host with random tokens.
template <class L>
struct kivi_cache {
  std::vector<int32_t> lens;
  L layout;
  kvscout::kivi_host_storage store;

  kivi_cache(const std::vector<int32_t>& target, int heads, int capacity, kvscout::kivi_options opt,
             std::uint32_t seed)
      : lens(target.size(), 0),
        layout(L::padded(heads, capacity, lens.data(), static_cast<int>(target.size()), opt)),
        store(layout) {
    using T = typename L::element_type;
    kvscout::kivi_append_host<L> w(layout, store.buffers(), lens.data());
    for (std::size_t s = 0; s < target.size(); ++s) {
      const std::size_t n = static_cast<std::size_t>(target[s]) * heads * L::head_dim;
      auto k = random_values<T>(n, seed + 17 * static_cast<std::uint32_t>(s));
      auto v = random_values<T>(n, seed + 17 * static_cast<std::uint32_t>(s) + 5);
      w.append(static_cast<int>(s), target[s], {k.data(), n}, {v.data(), n});
    }
  }
  kivi_cache(const kivi_cache&) = delete;
};

}  // namespace fetch_test
