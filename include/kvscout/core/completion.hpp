#pragma once
// The completion concept: what an executor's submit() returns (fetch/concepts.hpp). wait() blocks
// until the work is done; ready() polls. ready_completion is the completion of work that is done
// when submit() returns (the host gather); core/event_completion.hpp is the device one.

#include <concepts>

namespace kvscout {

template <class C>
concept completion = requires(C& c, const C& cc) {
  c.wait();
  { cc.ready() } -> std::convertible_to<bool>;
};

/// The completion of work that is finished when submit() returns.
struct ready_completion {
  void wait() const noexcept {}
  [[nodiscard]] bool ready() const noexcept { return true; }
};

static_assert(completion<ready_completion>);

}  // namespace kvscout
