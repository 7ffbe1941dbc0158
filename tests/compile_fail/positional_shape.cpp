// Must NOT compile: a config's shape given positionally (brace elision would read {1, 8, 4096}
// as num_layers, num_seqs, num_kv_heads); write .shape = {.num_seqs = 1, ...}.
#include "kvscout/select/topk.hpp"

int main() {
  const kvscout::topk_selector_host::config cfg{1, 8, 4096, 512, 512, {}};
  return cfg.capacity;
}
