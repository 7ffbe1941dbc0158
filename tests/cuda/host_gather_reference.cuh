#pragma once
// The host gather as the reference of a device fetch: the rows a selection names, copied by
// gather_executor_host from the host view of a cache, as [num_seqs, num_kv_heads, capacity]
// rows of T (the destination layout every executor writes).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvscout/core/workspace.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"
#include "kvscout/fetch/host_gather.hpp"

namespace gpu_test {

template <class T>
struct gathered_host_rows {
  std::vector<T> k, v;
};

template <class Layout, class T>
gathered_host_rows<T> host_gather_rows(const Layout& layout, const T* k_cache, const T* v_cache,
                                       std::size_t cache_bytes,
                                       const kvscout::selection_view<kvscout::host_space>& sel) {
  const std::size_t slots = static_cast<std::size_t>(sel.num_seqs) * sel.num_kv_heads * sel.capacity;
  gathered_host_rows<T> out{std::vector<T>(slots * layout.k_row_bytes() / sizeof(T)),
                            std::vector<T>(slots * layout.v_row_bytes() / sizeof(T))};
  const kvscout::host_gather_config cfg{{.num_seqs = sel.num_seqs,
                                         .num_kv_heads = sel.num_kv_heads}, sel.capacity, 1};
  const auto ws = kvscout::make_workspace<kvscout::gather_executor_host<Layout>>(cfg);
  kvscout::gather_executor_host<Layout> gather(cfg, ws.span());
  gather
      .submit({layout, {reinterpret_cast<const std::byte*>(k_cache), cache_bytes},
               {reinterpret_cast<const std::byte*>(v_cache), cache_bytes}},
              sel,
              {{reinterpret_cast<std::byte*>(out.k.data()), out.k.size() * sizeof(T)},
               {reinterpret_cast<std::byte*>(out.v.data()), out.v.size() * sizeof(T)}})
      .wait();
  return out;
}

}  // namespace gpu_test
