#pragma once
// A configured component is built from a value of its `config_type`; `configuration()` hands that
// value back (const, no copy), so generic code reads any component's config the same way. Not part
// of the plug-in concepts: a third-party component need not model it.

#include <concepts>

namespace kvscout {

template <class T>
concept configured = requires(const T& t) {
  typename T::config_type;
  { t.configuration() } -> std::same_as<const typename T::config_type&>;
};

}  // namespace kvscout
