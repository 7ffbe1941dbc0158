#pragma once
// The completion concept: what an executor's submit() returns. wait() blocks until the work is
// done; ready() polls.

#include <concepts>

namespace kvscout {

template <class C>
concept completion = requires(C& c, const C& cc) {
  c.wait();
  { cc.ready() } -> std::convertible_to<bool>;
};

struct ready_completion {
  void wait() const noexcept {}
  [[nodiscard]] bool ready() const noexcept { return true; }
};

static_assert(completion<ready_completion>);

}  // namespace kvscout
