// Must NOT compile: a layout type without k_row_bytes() is rejected by the kv_layout concept, and
// the diagnostic names the missing requirement.
#include <cstddef>

#include "kvscout/fetch/host_gather.hpp"

struct broken_layout {
  using element_type = float;
  static constexpr int head_dim = 64;
  int num_seqs() const { return 1; }
  int num_kv_heads() const { return 1; }
  int seq_len(int) const { return 1; }
  // std::size_t k_row_bytes() const;   <- missing
  std::size_t v_row_bytes() const { return 256; }
  std::size_t k_offset(int, int, int) const { return 0; }
  std::size_t v_offset(int, int, int) const { return 0; }
  int contiguous_rows(int, int, int, int n) const { return n; }
  void validate(std::size_t, std::size_t) const {}
};

int main() {
  kvscout::host_gather_config cfg{.shape = {.num_seqs = 1, .num_kv_heads = 1}, .capacity = 1};
  return static_cast<int>(kvscout::gather_executor_host<broken_layout>::workspace_bytes(cfg));
}
