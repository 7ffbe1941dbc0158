#pragma once
// The whole-cache row source of a layout: what a consumer that reads every cached token of a host
// cache (the dense reference, the oracle policy) constructs from one layer's view.
//
//   cache_view_t<L>  the view of one layer's host cache: kv_view<L, host_space>, or
//                    kivi_view<L, host_space> for a KIVI layout (codes, records, resident params
//                    and residual window)
//   cache_rows_t<L>  its row source: layout_rows_host<L>, or kivi_layout_rows_host<L> (dequantised rows,
//                    then the resident window, kv/kivi.hpp)
//
//   kvscout::cache_rows_t<L> rows(view);   // rows.load_k(s, h, t, dst) for t < rows.rows(s, h)

#include "kvscout/attention/kivi_rows.hpp"
#include "kvscout/attention/rows.hpp"
#include "kvscout/kv/kivi.hpp"

namespace kvscout {

template <kv_layout L>
struct cache_rows_traits {
  using view_type = kv_view<L, host_space>;
  using rows_type = layout_rows_host<L>;
};

template <kv_layout L>
  requires kivi_quantized_layout<L>
struct cache_rows_traits<L> {
  using view_type = kivi_view<L, host_space>;
  using rows_type = kivi_layout_rows_host<L>;
};

template <kv_layout L>
using cache_view_t = typename cache_rows_traits<L>::view_type;
template <kv_layout L>
using cache_rows_t = typename cache_rows_traits<L>::rows_type;

static_assert(attention_rows<cache_rows_t<kivi_layout<half, 64, 2>>>);

}  // namespace kvscout
