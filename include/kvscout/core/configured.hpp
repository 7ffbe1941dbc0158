#pragma once
// The one convention every configured kvscout component follows: it is built from a value of
// its `config_type`, and `configuration()` hands that value back (const, no copy). Selectors,
// speculation policies (host and device), prefetch executors and both decode pipelines model it,
// so generic code can read, say, a selector's capacity or a pipeline's skip_layers the same way.
//
//   template <kvscout::configured C>
//   int capacity_of(const C& c) { return c.configuration().capacity; }
//
// It is not part of the row_selector / speculation_policy / prefetch_executor concepts: a
// third-party component need not model it to plug in.

#include <concepts>

namespace kvscout {

template <class T>
concept configured = requires(const T& t) {
  typename T::config_type;
  { t.configuration() } -> std::same_as<const typename T::config_type&>;
};

}  // namespace kvscout
