// Must NOT compile: a static head_dim outside the supported list is a compile-time error.
#include <type_traits>

#include "kvscout/core/dispatch.hpp"

int main() {
  return kvscout::dispatch_head_dim(std::integral_constant<int, 96>{},
                                    [](auto d) { return decltype(d)::value; });
}
