#pragma once
// Completion of stream-ordered GPU work: one CUDA event, recorded on the caller's stream after
// the work. wait() blocks the host thread; ready() polls. A pipeline does neither: it makes its
// compute stream wait on event(), so the whole step stays capturable in a CUDA graph.
//
// Under capture: a completion made while its stream is being captured belongs to that capture.
// Wait on it only from another captured stream of the same capture. wait(), ready() or a wait
// from an uncaptured stream are capture errors (thrown as kvscout::error), and the event does not
// follow later replays of the graph: after a replay, order on the replay's stream instead.
//
//   kvscout::event_completion c{ev.get()};
//   cudaStreamWaitEvent(compute_stream, c.event(), 0);        // or c.wait() / c.ready()

#include <cuda_runtime_api.h>

#include "kvscout/core/completion.hpp"
#include "kvscout/core/cuda_check.hpp"

namespace kvscout {

class cuda_event {
 public:
  cuda_event() { KVSCOUT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  cuda_event(cuda_event&& o) noexcept : event_(o.event_) { o.event_ = nullptr; }
  cuda_event& operator=(cuda_event&& o) noexcept {
    if (this != &o) {
      reset();
      event_ = o.event_;
      o.event_ = nullptr;
    }
    return *this;
  }
  ~cuda_event() { reset(); }

  void record(cudaStream_t stream) { KVSCOUT_CUDA_CHECK(cudaEventRecord(event_, stream)); }
  [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }

 private:
  void reset() noexcept {
    if (event_ != nullptr) KVSCOUT_CUDA_CHECK_NO_THROW(cudaEventDestroy(event_));
    event_ = nullptr;
  }
  cudaEvent_t event_ = nullptr;
};

/// Valid until the event is recorded again (an executor re-records its event on the next submit).
class event_completion {
 public:
  event_completion() = default;
  explicit event_completion(cudaEvent_t e) noexcept : event_(e) {}

  /// No-op for a default-constructed completion.
  void wait() const {
    if (event_ != nullptr) KVSCOUT_CUDA_CHECK(cudaEventSynchronize(event_));
  }
  /// Throws kvscout::error if the work failed.
  [[nodiscard]] bool ready() const {
    if (event_ == nullptr) return true;
    const cudaError_t st = cudaEventQuery(event_);
    if (st == cudaErrorNotReady) return false;
    KVSCOUT_CUDA_CHECK(st);
    return true;
  }
  [[nodiscard]] cudaEvent_t event() const noexcept { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

static_assert(completion<event_completion>);

}  // namespace kvscout
