// Must NOT compile: rows gathered from a head_dim 128 cache read as rows of 64 (the mistake that,
// through the span constructor, would read every row at the wrong width). The layout form of
// gathered_rows_host refuses it by name.
#include "kvscout/attention/rows.hpp"
#include "kvscout/kv/contiguous.hpp"

int main() {
  const int lens[1] = {4};
  using layout = kvscout::contiguous_layout<kvscout::half, 128, kvscout::hnd>;
  const auto l = layout::padded(1, 4, lens, 1);
  const kvscout::selection_view<kvscout::host_space> sel{};
  const kvscout::gather_destination<kvscout::host_space> dst{};
  const kvscout::gathered_rows_host<kvscout::half, 64> rows(l, sel, dst);
  return rows.num_seqs();
}
