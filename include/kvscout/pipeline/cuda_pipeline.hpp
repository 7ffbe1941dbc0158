#pragma once
// The CUDA decode pipeline: the order of one decode step on three streams, and nothing else.
//
// What runs is the caller's (or kvscout's kernels bound by the caller): the pipeline takes two
// stages, `speculate(layer, slot, exec)` (score + select layer's rows into selection slot `slot`)
// and `fetch(layer, slot, exec)` (move the rows that slot names into row buffer `slot`), and
// orders them against the caller's compute stream with events. exec is a cuda_exec
// (core/exec.hpp): the stream of the stage's role and the device status word the caller passed
// to the call that launched it (input_ready / speculate_first; null: not reported). Everything is enqueued; nothing
// blocks the host, allocates, or reads device memory, so a whole step can be captured in a CUDA
// graph (tests/cuda/test_pipeline_device.cu does).
//
// One step over L layers, slot(i) = i % 2 (double buffers: layer i's rows are fetched while layer
// i - 1 reads its own):
//
//   compute  ... layer i-1: x_{i-1} ready -> [record input_ready] ... attention(i-1) ... layer i:
//            [wait fetched(slot i)] attention(i) over row buffer slot(i) ...
//   speculate          [wait input_ready] speculate(i, slot i) [record selected(slot i)]
//   copy                                   [wait selected(slot i)] fetch(i, slot i)
//                                                                  [record fetched(slot i)]
//
// Why the buffers of slot(i) are free when speculate(i) / fetch(i) start: their previous user is
// layer i - 2, whose attention the compute stream enqueued before x_{i-1} was ready, so it is
// complete when input_ready fires, and both side streams wait (transitively) on input_ready.
// Why appending the new token cannot race a fetch: the caller appends layer i's token on the
// compute stream after attention(i). The fetch in flight at that time is layer i + 1's, which
// reads layer i + 1's cache only; the next fetch of layer i is at the next step, ordered after
// the append through input_ready of layer i - 1. The sequence lengths the fetches read must
// likewise advance on the compute stream, after the last layer's appends.
// What the caller keeps per slot: speculate(i + 1) reads x_i on the side stream while the compute
// stream moves on, so x_i lives in an input buffer of slot(i + 1), as the selection and the rows
// do; the compute stream writes that buffer again (x_{i+2}) only after wait_rows(i + 1), which
// orders it after speculate(i + 1).
//
//   kvscout::decode_pipeline_cuda pipe({.num_layers = L, .skip_layers = 2},
//                                      {compute, side, copy}, stages);
//   for (int i = 0; i < L; ++i) {
//     ... layer i's attention input x_i on `compute` ...
//     pipe.input_ready(i, d_status);   // speculation for layer i + 1 starts now, on `side`
//     pipe.wait_rows(i);         // layer i's rows are in row buffer pipe.slot(i) (sparse layers)
//     ... attention(i), append, MLP on `compute` ...
//   }
//
// Layers below skip_layers attend densely and are never speculated; layer skip_layers is
// speculated at the previous layer like every other (when skip_layers > 0), or at the start of
// the step by speculate_first() when skip_layers == 0. The last layer speculates for nobody.

#include <cuda_runtime_api.h>

#include <concepts>
#include <string>
#include <utility>

#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/exec.hpp"

namespace kvscout {

/// The two stages the pipeline orders. Both only enqueue work on exec.stream and report device
/// faults into exec.status (core/device_status.hpp).
template <class S>
concept pipeline_stages_cuda = requires(S& s, int layer, int slot, const cuda_exec& exec) {
  s.speculate(layer, slot, exec);
  s.fetch(layer, slot, exec);
};

struct cuda_pipeline_config {
  int num_layers = 0;
  int skip_layers = 2;  // layers [0, skip_layers) attend densely
  bool overlap = true;  // false: speculation and fetch run on the compute stream, in line
};

/// Streams owned by the caller: the model's compute stream, a side stream for speculation and a
/// copy stream for fetches (three distinct streams when overlap is on).
struct cuda_pipeline_streams {
  cudaStream_t compute = nullptr;
  cudaStream_t speculate = nullptr;
  cudaStream_t copy = nullptr;
};

template <pipeline_stages_cuda Stages>
class decode_pipeline_cuda {
 public:
  using config_type = cuda_pipeline_config;
  static constexpr int slots = 2;

  /// Validates the configuration and creates the events (the only allocation).
  decode_pipeline_cuda(const cuda_pipeline_config& cfg, const cuda_pipeline_streams& streams,
                       Stages stages)
      : cfg_(cfg), streams_(streams), stages_(std::move(stages)) {
    KVSCOUT_EXPECTS(cfg.num_layers > 0, "num_layers must be positive, got ", cfg.num_layers);
    KVSCOUT_EXPECTS(cfg.skip_layers >= 0 && cfg.skip_layers <= cfg.num_layers, "skip_layers = ",
                    cfg.skip_layers, " must be in [0, num_layers = ", cfg.num_layers, "]");
    if (cfg.overlap) {
      KVSCOUT_EXPECTS(streams.speculate != streams.compute && streams.copy != streams.compute &&
                          streams.copy != streams.speculate,
                      "overlap needs three distinct streams (compute, speculate, copy)");
    }
    try {
      KVSCOUT_CUDA_CHECK(cudaEventCreateWithFlags(&input_ready_, cudaEventDisableTiming));
      for (int b = 0; b < slots; ++b) {
        KVSCOUT_CUDA_CHECK(cudaEventCreateWithFlags(&selected_[b], cudaEventDisableTiming));
        KVSCOUT_CUDA_CHECK(cudaEventCreateWithFlags(&fetched_[b], cudaEventDisableTiming));
      }
    } catch (...) {
      destroy();
      throw;
    }
  }
  decode_pipeline_cuda(const decode_pipeline_cuda&) = delete;
  decode_pipeline_cuda& operator=(const decode_pipeline_cuda&) = delete;
  ~decode_pipeline_cuda() { destroy(); }

  [[nodiscard]] const cuda_pipeline_config& configuration() const noexcept { return cfg_; }
  [[nodiscard]] Stages& stages() noexcept { return stages_; }

  /// The selection slot and row buffer layer i uses.
  [[nodiscard]] static constexpr int slot(int layer) noexcept { return layer % slots; }
  /// Whether layer i attends over fetched rows (true) or densely (false).
  [[nodiscard]] bool sparse(int layer) const noexcept {
    return layer >= cfg_.skip_layers && layer < cfg_.num_layers;
  }

  /// With skip_layers == 0, layer 0 has no previous layer to hide behind: call this at the start
  /// of the step, once its input is ready on the compute stream. device_status: the word the
  /// stages report into (core/device_status.hpp), or null.
  void speculate_first(int* device_status = nullptr) {
    KVSCOUT_EXPECTS(cfg_.skip_layers == 0, "speculate_first() is for skip_layers == 0; layer ",
                    cfg_.skip_layers, " is speculated by input_ready(", cfg_.skip_layers - 1, ")");
    launch(0, device_status);
  }

  /// Layer i's attention input is ready on the compute stream: start speculating and fetching
  /// layer i + 1 (when it is sparse). device_status: the word the stages report into
  /// (core/device_status.hpp), or null.
  void input_ready(int layer, int* device_status = nullptr) {
    check_layer(layer);
    if (sparse(layer + 1)) launch(layer + 1, device_status);
  }

  /// Makes the compute stream wait until layer i's rows are in row buffer slot(i). A no-op for
  /// dense layers. Throws if layer i was not launched (input_ready(i - 1) not called this step).
  void wait_rows(int layer) {
    check_layer(layer);
    if (!sparse(layer)) return;
    const int b = slot(layer);
    KVSCOUT_EXPECTS(launched_[b] == layer, "wait_rows(", layer, "): slot ", b,
                    launched_[b] < 0 ? std::string(" holds no launched layer")
                                     : " was last launched for layer " + std::to_string(launched_[b]),
                    "; call input_ready(", layer - 1, ") (or speculate_first() for layer 0) first");
    launched_[b] = -1;  // consumed: the next wait on this slot needs a new launch
    if (cfg_.overlap) {
      // fetched implies selected; the wait on selected is redundant for ordering but joins the
      // speculate stream into the compute stream directly, so a captured step never leaves a fork
      // joined only through the copy stream (cudaErrorStreamCaptureUnjoined is not risked).
      KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(streams_.compute, selected_[slot(layer)], 0));
      KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(streams_.compute, fetched_[slot(layer)], 0));
    }
  }

 private:
  void launch(int layer, int* status) {
    const int b = slot(layer);
    launched_[b] = layer;
    if (!cfg_.overlap) {  // in line, on the compute stream: the serial baseline
      stages_.speculate(layer, b, cuda_exec{streams_.compute, status});
      stages_.fetch(layer, b, cuda_exec{streams_.compute, status});
      return;
    }
    KVSCOUT_CUDA_CHECK(cudaEventRecord(input_ready_, streams_.compute));
    KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(streams_.speculate, input_ready_, 0));
    stages_.speculate(layer, b, cuda_exec{streams_.speculate, status});
    KVSCOUT_CUDA_CHECK(cudaEventRecord(selected_[b], streams_.speculate));
    KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(streams_.copy, selected_[b], 0));
    stages_.fetch(layer, b, cuda_exec{streams_.copy, status});
    KVSCOUT_CUDA_CHECK(cudaEventRecord(fetched_[b], streams_.copy));
  }

  void check_layer(int layer) const {
    KVSCOUT_EXPECTS(layer >= 0 && layer < cfg_.num_layers, "layer ", layer,
                    " is out of range [0, num_layers = ", cfg_.num_layers, ")");
  }

  void destroy() noexcept {
    if (input_ready_) KVSCOUT_CUDA_CHECK_NO_THROW(cudaEventDestroy(input_ready_));
    for (int b = 0; b < slots; ++b) {
      if (selected_[b]) KVSCOUT_CUDA_CHECK_NO_THROW(cudaEventDestroy(selected_[b]));
      if (fetched_[b]) KVSCOUT_CUDA_CHECK_NO_THROW(cudaEventDestroy(fetched_[b]));
    }
    input_ready_ = nullptr;
    selected_[0] = selected_[1] = fetched_[0] = fetched_[1] = nullptr;
  }

  cuda_pipeline_config cfg_;
  cuda_pipeline_streams streams_;
  Stages stages_;
  cudaEvent_t input_ready_ = nullptr;
  cudaEvent_t selected_[slots] = {nullptr, nullptr};
  cudaEvent_t fetched_[slots] = {nullptr, nullptr};
  int launched_[slots] = {-1, -1};  // host-side: the layer each slot was last launched for
};

// Deprecated (issue 33): the old names, kept for one release. (A concept cannot be deprecated:
// pipeline_stages_cuda is a plain alias, to be removed in the next release.)
template <pipeline_stages_cuda Stages>
using cuda_decode_pipeline [[deprecated("use decode_pipeline_cuda")]] =
    decode_pipeline_cuda<Stages>;
template <class S>
concept cuda_pipeline_stages = pipeline_stages_cuda<S>;

}  // namespace kvscout
