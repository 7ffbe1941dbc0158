// Must NOT compile: a layout over an element type kvscout does not support (double).
#include "kvscout/kv/contiguous.hpp"

int main() {
  kvscout::contiguous_layout<double, 64, kvscout::nhd> l;
  return l.num_seqs();
}
