// Must NOT compile: kivi_layout supports 2- and 4-bit codes only (KIVI-2, KIVI-4, kivi_bits{2, 4}); any other
// width is a static_assert whose message names the supported set.
#include "kvscout/kv/kivi.hpp"

int main() {
  const kvscout::kivi_layout<kvscout::half, 128, /*Bits=*/3> l{};
  return l.num_seqs();
}
