// Must NOT compile: the value width of kivi_bits{K, V} must be 2 or 4 as well (here V = 3).
#include "kvscout/kv/kivi.hpp"

int main() {
  const kvscout::kivi_layout<kvscout::half, 128, kvscout::kivi_bits{2, 3}> l{};
  return l.num_seqs();
}
