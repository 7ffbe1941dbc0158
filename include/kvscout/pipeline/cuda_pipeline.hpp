#pragma once
// The CUDA decode pipeline: the order of one decode step on three streams, and nothing else.
//
// What runs is the caller's: the pipeline takes two stages, `speculate(layer, slot, exec)` (score
// and select the layer's rows into selection slot `slot`) and `fetch(layer, slot, exec)` (move the
// rows that slot names into row buffer `slot`), and orders them against the caller's compute
// stream with events. Every call takes the step's cuda_pipeline_exec last. Nothing blocks the
// host, allocates, or reads device memory, so a whole step can be captured in a CUDA graph.
//
// One step, slot(i) = i % 2 (layer i's rows are fetched while layer i - 1 reads its own):
//
//   compute  ... layer i-1: x_{i-1} ready -> [record input_ready] ... attention(i-1) ... layer i:
//            [wait fetched(slot i)] attention(i) over row buffer slot(i) ...
//   speculate          [wait input_ready] speculate(i, slot i) [record selected(slot i)]
//   copy                                   [wait selected(slot i)] fetch(i, slot i)
//                                                                  [record fetched(slot i)]
//
// The buffers of slot(i) are free when speculate(i) / fetch(i) start: their previous user, layer
// i - 2's attention, was enqueued before input_ready of layer i - 1, which both side streams wait
// on. Appending layer i's token on the compute stream after attention(i) cannot race a fetch: the
// one in flight reads layer i + 1's cache. The sequence lengths the fetches read must likewise
// advance on the compute stream, after the last layer's appends. x_i lives in an input buffer of
// slot(i + 1); the compute stream writes it again (x_{i+2}) only after wait_rows(i + 1).
//
//   kvscout::decode_pipeline_cuda pipe({.shape = shape, .skip_layers = 2}, stages);
//   const kvscout::cuda_pipeline_exec x{compute, side, copy, d_status};   // d_status optional
//   for (int i = 0; i < L; ++i) {
//     ... layer i's attention input x_i on `compute` ...
//     pipe.input_ready(i, x);   // speculation for layer i + 1 starts now, on `side`
//     pipe.wait_rows(i, x);     // layer i's rows are in row buffer pipe.slot(i) (sparse layers)
//     ... attention(i), append, MLP on `compute` ...
//   }
//
// Layer skip_layers is speculated at the previous layer, or by speculate_first() when
// skip_layers == 0.

#include <cuda_runtime_api.h>

#include <concepts>
#include <string>
#include <utility>

#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/error.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/shape.hpp"

namespace kvscout {

/// The two stages the pipeline orders. Both only enqueue work on exec.stream and report device
/// faults into exec.status.
template <class S>
concept pipeline_stages_cuda = requires(S& s, int layer, int slot, const cuda_exec& exec) {
  s.speculate(layer, slot, exec);
  s.fetch(layer, slot, exec);
};

struct cuda_pipeline_config {
  decode_shape shape{};  // num_layers
  int skip_layers = 2;  // layers [0, skip_layers) attend densely
  bool overlap = true;  // false: speculation and fetch run on the compute stream, in line
};

/// The caller's streams (compute, a side stream for speculation, a copy stream for fetches; three
/// distinct streams when overlap is on) and the device status word (null: none). The slots' reuse
/// is ordered on the compute stream: pass the same streams to every call of a step, and order a new
/// compute stream after the old one before a step that changes it.
struct cuda_pipeline_exec {
  cudaStream_t compute = nullptr;
  cudaStream_t speculate = nullptr;
  cudaStream_t copy = nullptr;
  int* status = nullptr;
};

template <pipeline_stages_cuda Stages>
class decode_pipeline_cuda {
 public:
  using config_type = cuda_pipeline_config;
  static constexpr int slots = 2;

  decode_pipeline_cuda(const cuda_pipeline_config& cfg, Stages stages) : cfg_(cfg), stages_(std::move(stages)) {
    KVSCOUT_EXPECTS(cfg.shape.num_layers > 0, "num_layers must be positive, got ",
                    cfg.shape.num_layers);
    KVSCOUT_EXPECTS(cfg.skip_layers >= 0 && cfg.skip_layers <= cfg.shape.num_layers,
                    "skip_layers = ", cfg.skip_layers,
                    " must be in [0, num_layers = ", cfg.shape.num_layers, "]");
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

  [[nodiscard]] static constexpr int slot(int layer) noexcept { return layer % slots; }
  [[nodiscard]] bool sparse(int layer) const noexcept {
    return layer >= cfg_.skip_layers && layer < cfg_.shape.num_layers;
  }

  /// With skip_layers == 0: speculates layer 0, once its input is ready on x.compute.
  void speculate_first(const cuda_pipeline_exec& x) {
    KVSCOUT_EXPECTS(cfg_.skip_layers == 0, "speculate_first() is for skip_layers == 0; layer ",
                    cfg_.skip_layers, " is speculated by input_ready(", cfg_.skip_layers - 1, ")");
    check_streams(x);
    launch(0, x);
  }

  /// Starts speculating and fetching layer i + 1 (when sparse) on x.speculate and x.copy.
  void input_ready(int layer, const cuda_pipeline_exec& x) {
    check_layer(layer);
    check_streams(x);
    if (sparse(layer + 1)) launch(layer + 1, x);
  }

  /// Makes x.compute wait until layer i's rows are in row buffer slot(i). A no-op for dense layers.
  /// Throws if layer i was not launched (input_ready(i - 1) not called this step).
  void wait_rows(int layer, const cuda_pipeline_exec& x) {
    check_layer(layer);
    check_streams(x);
    if (!sparse(layer)) return;
    const int b = slot(layer);
    KVSCOUT_EXPECTS(launched_[b] == layer, "wait_rows(", layer, "): slot ", b,
                    launched_[b] < 0 ? std::string(" holds no launched layer")
                                     : " was last launched for layer " + std::to_string(launched_[b]),
                    "; call input_ready(", layer - 1, ") (or speculate_first() for layer 0) first");
    launched_[b] = -1;  // consumed: the next wait on this slot needs a new launch
    if (cfg_.overlap) {
      // Waiting on selected too joins the speculate stream into compute directly: no captured fork
      // is joined only through copy (cudaErrorStreamCaptureUnjoined).
      KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(x.compute, selected_[slot(layer)], 0));
      KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(x.compute, fetched_[slot(layer)], 0));
    }
  }

 private:
  void check_streams(const cuda_pipeline_exec& x) const {
    KVSCOUT_EXPECTS(!cfg_.overlap || (x.speculate != x.compute && x.copy != x.compute && x.copy != x.speculate),
                    "overlap needs three distinct streams (compute, speculate, copy)");
  }
  void launch(int layer, const cuda_pipeline_exec& x) {
    const int b = slot(layer);
    launched_[b] = layer;
    if (!cfg_.overlap) {  // in line, on the compute stream: the serial baseline
      stages_.speculate(layer, b, cuda_exec{x.compute, x.status});
      stages_.fetch(layer, b, cuda_exec{x.compute, x.status});
      return;
    }
    KVSCOUT_CUDA_CHECK(cudaEventRecord(input_ready_, x.compute));
    KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(x.speculate, input_ready_, 0));
    stages_.speculate(layer, b, cuda_exec{x.speculate, x.status});
    KVSCOUT_CUDA_CHECK(cudaEventRecord(selected_[b], x.speculate));
    KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(x.copy, selected_[b], 0));
    stages_.fetch(layer, b, cuda_exec{x.copy, x.status});
    KVSCOUT_CUDA_CHECK(cudaEventRecord(fetched_[b], x.copy));
  }

  void check_layer(int layer) const {
    KVSCOUT_EXPECTS(layer >= 0 && layer < cfg_.shape.num_layers, "layer ", layer,
                    " is out of range [0, num_layers = ", cfg_.shape.num_layers, ")");
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
  Stages stages_;
  cudaEvent_t input_ready_ = nullptr;
  cudaEvent_t selected_[slots] = {nullptr, nullptr};
  cudaEvent_t fetched_[slots] = {nullptr, nullptr};
  int launched_[slots] = {-1, -1};  // host-side: the layer each slot was last launched for
};

}  // namespace kvscout
