#pragma once
// The prefetch_executor concept: something that moves selected KV rows into a contiguous
// destination. The protocol, the same for every executor:
//   1. E::workspace_bytes(config): bytes of caller-owned workspace at E::workspace_alignment
//   2. E e(config, workspace): may start threads, create events; the only place it may allocate
//   3. per step, auto c = e.submit(source, selection, destination, exec); exec: E::exec_type.
//      No executor stores a stream or a status word.
//   4. c.wait() blocks until the rows are in place; c.ready() polls.

#include <concepts>
#include <cstddef>

#include "kvscout/core/completion.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/selection.hpp"
#include "kvscout/core/span.hpp"

namespace kvscout {

template <class E>
concept prefetch_executor =
    requires {
      typename E::config_type;
      typename E::source_type;
      typename E::selection_type;
      typename E::destination_type;
      typename E::completion_type;
      typename E::exec_type;
    } && completion<typename E::completion_type> &&
    requires(E& e, const typename E::config_type& cfg, const typename E::source_type& src,
             const typename E::selection_type& sel, const typename E::destination_type& dst,
             const typename E::exec_type& x) {
      { E::workspace_bytes(cfg) } -> std::same_as<std::size_t>;
      { E::workspace_alignment } -> std::convertible_to<std::size_t>;
      { e.submit(src, sel, dst, x) } -> std::same_as<typename E::completion_type>;
    };

/// Whether an executor fits a device decode step that never waits for the device and can be
/// captured in a CUDA graph: its selection is device-resident and its submit() does not block the
/// calling thread. An executor whose submit() may block declares `static constexpr bool
/// submit_blocks_host = true`. Pipelines static_assert it.
template <class E>
inline constexpr bool device_step_executor =
    prefetch_executor<E> &&
    std::same_as<typename E::selection_type, selection_view<device_space>> &&
    !requires { requires E::submit_blocks_host; };

}  // namespace kvscout
