// Must NOT compile: quantised partial keys support 2-, 4- and 8-bit codes over groups of 16, 32,
// 64 or 128 tokens; any other width is a static_assert whose message names the supported set.
#include "kvscout/cache/quantized_partial_key_cache.hpp"

int main() {
  const kvscout::quantized_partial_key_cache</*Bits=*/3> c(1, 1, 16, 64);
  return c.r();
}
