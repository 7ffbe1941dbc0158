// Must NOT compile: a KIVI cache keeps its residual window in full precision, so its element type
// is float, half or bfloat16; fp8 (a scaled storage type) is refused by name.
#include "kvscout/kv/kivi.hpp"

int main() {
  const kvscout::kivi_layout<kvscout::fp8_e4m3, 128, 2> l{};
  return l.num_seqs();
}
