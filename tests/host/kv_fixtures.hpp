#pragma once
// Test fixtures: every KV layout kvscout ships, built from a list of sequence lengths, with an
// independent reference for the byte offset of every row (written from the documented shapes,
// not from the layouts' code).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/paged.hpp"

namespace kvtest {

enum class kind { padded, ragged, flashinfer, vllm };

// One test case: layout kind x order x element type x head_dim.
template <kind Kind, class Order, class T, int D>
struct layout_case {
  static constexpr kind layout_kind = Kind;
  using order = Order;
  using element = T;
  static constexpr int head_dim = D;
  static constexpr int fi_page = 16;  // static page size of the FlashInfer-form cases
  static constexpr int vllm_page = 7;  // runtime page size of the vLLM-form cases
  using layout = std::conditional_t<
      Kind == kind::padded || Kind == kind::ragged, kvscout::contiguous_layout<T, D, Order>,
      std::conditional_t<Kind == kind::flashinfer,
                         kvscout::paged_layout<T, D, Order, kvscout::flashinfer_page_table, fi_page>,
                         kvscout::paged_layout<T, D, Order, kvscout::block_table>>>;

  static std::string name() {
    const char* k[] = {"padded", "ragged", "paged-flashinfer", "paged-vllm"};
    return std::string(k[static_cast<int>(Kind)]) + "/" + Order::name + "/" +
           std::string(kvscout::dtype_traits<T>::name) + "/d" + std::to_string(D);
  }
};

// Owns the metadata a layout points at, the layout, and the reference offsets.
template <class Case>
struct layout_fixture {
  using layout_type = typename Case::layout;
  static constexpr int D = Case::head_dim;
  static constexpr std::size_t row = sizeof(typename Case::element) * D;

  std::vector<int32_t> lens, a, b, c;  // metadata arrays (meaning depends on the kind)
  int heads = 0, capacity = 0, page = 1, num_pages = 0;
  layout_type layout;
  std::size_t bytes = 0;  // bytes each of the K / V buffers needs

  layout_fixture(std::vector<int32_t> seq_lens, int num_kv_heads, std::mt19937& rng)
      : lens(std::move(seq_lens)), heads(num_kv_heads) {
    const int n = static_cast<int>(lens.size());
    const int longest = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
    if constexpr (Case::layout_kind == kind::padded) {
      capacity = longest + 3;  // spare slots that must never be touched
      layout = layout_type::padded(heads, capacity, lens.data(), n);
      bytes = static_cast<std::size_t>(n) * capacity * heads * row;
    } else if constexpr (Case::layout_kind == kind::ragged) {
      a.assign(n + 1, 0);
      for (int s = 0; s < n; ++s) a[s + 1] = a[s] + lens[s];
      capacity = a[n] + 2;
      layout = layout_type::ragged(heads, capacity, a.data(), n);
      bytes = static_cast<std::size_t>(capacity) * heads * row;
    } else {
      page = Case::layout_kind == kind::flashinfer ? Case::fi_page : Case::vllm_page;
      std::vector<int> per_seq(n);
      for (int s = 0; s < n; ++s) per_seq[s] = (lens[s] + page - 1) / page;
      num_pages = std::accumulate(per_seq.begin(), per_seq.end(), 0) + 2;
      std::vector<int32_t> ids(num_pages);
      std::iota(ids.begin(), ids.end(), 0);
      // Mostly shuffled, but keep a few physically consecutive runs so that runs across pages
      // are exercised.
      std::shuffle(ids.begin(), ids.end(), rng);
      if (num_pages > 4) std::sort(ids.begin(), ids.begin() + num_pages / 3);
      bytes = static_cast<std::size_t>(num_pages) * page * heads * row;
      if constexpr (Case::layout_kind == kind::flashinfer) {
        a.assign(n + 1, 0);  // indptr
        c.assign(n, 0);      // last_page_len
        int next = 0;
        for (int s = 0; s < n; ++s) {
          a[s + 1] = a[s] + per_seq[s];
          for (int i = 0; i < per_seq[s]; ++i) b.push_back(ids[next++]);
          c[s] = per_seq[s] == 0 ? 0 : lens[s] - (per_seq[s] - 1) * page;
        }
        kvscout::flashinfer_page_table pt{a.data(), b.data(), c.data(), n};
        layout = layout_type(pt, heads);
      } else {
        const int max_blocks =
            (n == 0 ? 0 : *std::max_element(per_seq.begin(), per_seq.end())) + 1;
        a.assign(static_cast<std::size_t>(n) * max_blocks, -1);  // unused entries hold -1
        int next = 0;
        for (int s = 0; s < n; ++s)
          for (int i = 0; i < per_seq[s]; ++i) a[static_cast<std::size_t>(s) * max_blocks + i] = ids[next++];
        kvscout::block_table bt{a.data(), lens.data(), max_blocks, n};
        layout = layout_type(bt, heads, page);
      }
    }
  }

  layout_fixture(const layout_fixture&) = delete;
  layout_fixture& operator=(const layout_fixture&) = delete;

  // Reference byte offset of the K (= V) row of (s, t, h).
  std::size_t ref_offset(int s, int t, int h) const {
    const std::size_t H = heads, Dz = D;
    const bool is_nhd = std::is_same_v<typename Case::order, kvscout::nhd>;
    std::size_t elems = 0;
    if constexpr (Case::layout_kind == kind::padded) {
      const std::size_t cap = capacity;
      elems = is_nhd ? ((s * cap + t) * H + h) * Dz : ((s * H + h) * cap + t) * Dz;
    } else if constexpr (Case::layout_kind == kind::ragged) {
      const std::size_t tok = static_cast<std::size_t>(a[s]) + t, total = capacity;
      elems = is_nhd ? (tok * H + h) * Dz : (h * total + tok) * Dz;
    } else {
      std::size_t pg;
      if constexpr (Case::layout_kind == kind::flashinfer) {
        pg = static_cast<std::size_t>(b[a[s] + t / page]);
      } else {
        pg = static_cast<std::size_t>(a[static_cast<std::size_t>(s) * (a.size() / lens.size()) + t / page]);
      }
      const std::size_t P = page, slot = t % page;
      elems = pg * P * H * Dz + (is_nhd ? (slot * H + h) * Dz : (h * P + slot) * Dz);
    }
    return elems * sizeof(typename Case::element);
  }
};

#define KVTEST_CASES_FOR(K, O)                                                                    \
  layout_case<K, O, float, 64>, layout_case<K, O, float, 128>, layout_case<K, O, float, 256>,     \
      layout_case<K, O, kvscout::half, 64>, layout_case<K, O, kvscout::half, 128>,                \
      layout_case<K, O, kvscout::half, 256>, layout_case<K, O, kvscout::bfloat16, 64>,            \
      layout_case<K, O, kvscout::bfloat16, 128>, layout_case<K, O, kvscout::bfloat16, 256>,       \
      layout_case<K, O, kvscout::fp8_e4m3, 64>, layout_case<K, O, kvscout::fp8_e5m2, 128>

// Every layout x dtype x head_dim (fp8: e4m3 at 64, e5m2 at 128).
using all_layout_cases = std::tuple<
    KVTEST_CASES_FOR(kind::padded, kvscout::nhd), KVTEST_CASES_FOR(kind::padded, kvscout::hnd),
    KVTEST_CASES_FOR(kind::ragged, kvscout::nhd), KVTEST_CASES_FOR(kind::ragged, kvscout::hnd),
    KVTEST_CASES_FOR(kind::flashinfer, kvscout::nhd),
    KVTEST_CASES_FOR(kind::flashinfer, kvscout::hnd), KVTEST_CASES_FOR(kind::vllm, kvscout::nhd),
    KVTEST_CASES_FOR(kind::vllm, kvscout::hnd)>;

// Fills a buffer with seeded random bytes (never zeros).
inline void fill_random(std::vector<std::byte>& buf, std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (auto& x : buf) x = static_cast<std::byte>(1 + rng() % 255);
}

}  // namespace kvtest
