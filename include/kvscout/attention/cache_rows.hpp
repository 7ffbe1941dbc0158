#pragma once
// The whole-cache row source of a layout, for consumers that read every cached token of a host
// cache (the dense reference, the oracle policy):
//   detail::cache_view_t<L>  kv_view<L, host_space>, or kivi_view<L, host_space> for a KIVI layout
//   detail::cache_rows_t<L> layout_rows_host<L>, or kivi_layout_rows_host<L>

#include "kvscout/attention/kivi_rows.hpp"
#include "kvscout/attention/rows.hpp"
#include "kvscout/kv/kivi.hpp"

namespace kvscout::detail {

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
using cache_view_t = typename detail::cache_rows_traits<L>::view_type;
template <kv_layout L>
using cache_rows_t = typename detail::cache_rows_traits<L>::rows_type;

static_assert(attention_rows<detail::cache_rows_t<kivi_layout<half, 64, 2>>>);

}  // namespace kvscout::detail
