#pragma once
// kvtest::counting_executor<Inner>: an engine's own prefetch executor, as the pipeline tests need
// one: Inner (the host gather, the zero-copy gather) behind a wrapper that counts its submits and,
// where the selection is in host memory, the rows it is asked to move. It has only what the
// prefetch_executor concept asks for (no pool(), no row cache), so a pipeline over it takes the
// plain path. Included by relative path from tests/host and tests/cuda (and the emulator build).

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kvscout/core/span.hpp"

namespace kvtest {

template <class Inner>
class counting_executor {
 public:
  using inner_type = Inner;
  using layout_type = typename Inner::layout_type;
  using config_type = typename Inner::config_type;
  using source_type = typename Inner::source_type;
  using selection_type = typename Inner::selection_type;
  using destination_type = typename Inner::destination_type;
  using completion_type = typename Inner::completion_type;
  using exec_type = typename Inner::exec_type;
  /// Where the selections (and the workspace) live: host_space or device_space.
  using memory_space = typename decltype(std::declval<const selection_type&>().counts)::memory_space;
  static constexpr std::size_t workspace_alignment = Inner::workspace_alignment;
  [[nodiscard]] static std::size_t workspace_bytes(const config_type& c) { return Inner::workspace_bytes(c); }

  explicit counting_executor(const config_type& c, kvscout::span<std::byte, memory_space> ws = {})
      : inner_(c, ws) {}

  [[nodiscard]] const config_type& configuration() const noexcept
    requires requires(const Inner& i) { i.configuration(); }
  {
    return inner_.configuration();
  }

  completion_type submit(const source_type& src, const selection_type& sel, const destination_type& dst,
                         const exec_type& x = {}) {
    ++submits;
    if constexpr (std::is_same_v<memory_space, kvscout::host_space>)
      for (std::size_t i = 0; i < sel.counts.size(); ++i) rows += sel.counts[i];
    return inner_.submit(src, sel, dst, x);
  }

  int submits = 0;
  std::int64_t rows = 0;  // host selections only

 private:
  Inner inner_;
};

}  // namespace kvtest
