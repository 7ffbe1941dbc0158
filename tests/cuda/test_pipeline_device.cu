// pipeline/cuda_pipeline.hpp on a device: the ordering it promises, checked by stages that stamp
// what they saw, eagerly and inside a captured CUDA graph.
//
// The fake step: for every layer, speculate(i, b) writes stamp(step, i) into selection slot b;
// fetch(i, b), deliberately slow, copies the slot into row buffer b (from mapped host memory, as
// a zero-copy fetch would); the compute stream's "attention" of layer i checks row buffer slot(i)
// holds stamp(step, i) and counts mismatches; the step ends by advancing the step counter on the
// compute stream (as the sequence lengths advance). Without the pipeline's waits the check fails
// (a control case shows the test can fail). On the host SIMT emulator (tests/simt) streams run
// at synchronisation points, honouring only event waits, in the order its setting gives: the
// same checks then show the pipeline's waits are the ones that order the stages.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu_harness.cuh"
#include "kvscout/core/configured.hpp"
#include "kvscout/core/detail/launch.cuh"
#include "kvscout/pipeline/cuda_pipeline.hpp"

namespace {

__device__ int stamp(int step, int layer) { return step * 1000 + layer + 1; }

__device__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void speculate_kernel(const int* step, int layer, int* selection) {
  spin(20000);
  *selection = stamp(*step, layer);
}

// Reads the selection through a host-mapped mirror of the host-side cache row (`host_row`),
// which stands for the offloaded cache the fetch reads.
__global__ void fetch_kernel(const int* selection, const int* host_row, int* rows, long long cycles) {
  spin(cycles);
  rows[0] = *selection;
  rows[1] = *host_row;
}

__global__ void attention_kernel(const int* step, int layer, const int* rows, int* errors,
                                 int* host_row, bool check_host) {
  if (rows[0] != stamp(*step, layer)) atomicAdd(errors, 1);
  // The host row the fetch read was written by the previous step's append (or the set-up).
  if (check_host && rows[1] != stamp(*step, layer)) atomicAdd(errors, 1);
  // The append of this layer's new token: rewrites the host row the next fetch of this layer
  // reads. The fetch in flight (layer + 1) reads another layer's row.
  if (host_row != nullptr) *host_row = stamp(*step + 1, layer);
  spin(5000);
}

__global__ void advance_kernel(int* step) { *step += 1; }

struct fake_stages {
  int* step;
  int* selection;       // [2]
  int* rows;            // [2][2]
  const int* host_rows; // [L] device alias of mapped host memory
  long long fetch_cycles;
  // The execution arguments the pipeline handed the last calls (host-side record).
  kvscout::cuda_exec speculated_on{}, fetched_on{};
  void speculate(int layer, int slot, const kvscout::cuda_exec& x) {
    speculated_on = x;
    kvscout::detail::launch(speculate_kernel, 1, 1, 0, x.stream, step, layer, selection + slot);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
  }
  void fetch(int layer, int slot, const kvscout::cuda_exec& x) {
    fetched_on = x;
    kvscout::detail::launch(fetch_kernel, 1, 1, 0, x.stream, selection + slot, host_rows + layer,
                            rows + 2 * slot, fetch_cycles);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
  }
};
static_assert(kvscout::pipeline_stages_cuda<fake_stages>);
static_assert(kvscout::configured<kvscout::decode_pipeline_cuda<fake_stages>>);

struct fixture {
  static constexpr int L = 8;
  gpu_test::device_vector<int> step{1}, selection{2}, rows{4}, errors{1};
  gpu_test::pinned_vector<int> host_rows{L};
  cudaStream_t compute{}, side{}, copy{};
  fixture() {
    KVSCOUT_CUDA_CHECK(cudaMemset(step.data(), 0, sizeof(int)));
    KVSCOUT_CUDA_CHECK(cudaMemset(errors.data(), 0, sizeof(int)));
    for (int i = 0; i < L; ++i) host_rows[i] = i + 1;  // stamp(0, i): as if appended before step 0
    KVSCOUT_CUDA_CHECK(cudaStreamCreate(&compute));
    KVSCOUT_CUDA_CHECK(cudaStreamCreate(&side));
    KVSCOUT_CUDA_CHECK(cudaStreamCreate(&copy));
    // The memsets ran on the legacy stream, which the non-blocking streams do not wait for.
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~fixture() {
    KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(compute));
    KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(side));
    KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(copy));
  }
  fake_stages stages(long long fetch_cycles) {
    return {step.data(), selection.data(), rows.data(), host_rows.device_data(), fetch_cycles};
  }
  int read_errors() {
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
    return errors.download()[0];
  }
};

// One step, enqueued. `wait` false skips wait_rows (the control case).
template <class Pipe>
void enqueue_step(Pipe& pipe, fixture& f, int skip, bool wait, bool check_host,
                  const kvscout::cuda_pipeline_exec& x) {
  for (int i = 0; i < fixture::L; ++i) {
    pipe.input_ready(i, x);
    if (wait) pipe.wait_rows(i, x);
    if (i >= skip) {
      // the host row of layer i was last written at the previous step's attention(i): stamp(step, i)
      kvscout::detail::launch(attention_kernel, 1, 1, 0, f.compute, f.step.data(), i,
                              f.rows.data() + 2 * Pipe::slot(i), f.errors.data(),
                              f.host_rows.device_data() + i, check_host);
      KVSCOUT_CUDA_CHECK(cudaGetLastError());
    }
  }
  kvscout::detail::launch(advance_kernel, 1, 1, 0, f.compute, f.step.data());
  KVSCOUT_CUDA_CHECK(cudaGetLastError());
}

void ordered_eagerly() {
  for (int skip : {0, 1, 2}) {
    fixture f;
    kvscout::decode_pipeline_cuda pipe({.shape = {.num_layers = fixture::L}, .skip_layers = skip},
                                       f.stages(200000));
    const kvscout::cuda_pipeline_exec x{f.compute, f.side, f.copy, f.errors.data()};
    for (int step = 0; step < 6; ++step) {
      if (skip == 0) pipe.speculate_first(x);
      enqueue_step(pipe, f, skip, true, false, x);
    }
    // Each stage ran on its role's stream with the status word input_ready was given (the fake
    // stages never write it).
    const fake_stages& st = pipe.stages();
    GPU_CHECK(st.speculated_on.stream == f.side && st.fetched_on.stream == f.copy);
    GPU_CHECK(st.speculated_on.status == f.errors.data() && st.fetched_on.status == f.errors.data());
    const int e = f.read_errors();
    if (e != 0) std::fprintf(stderr, "skip_layers %d: %d mismatches\n", skip, e);
    GPU_CHECK(e == 0);
  }
}

void serial_mode_is_ordered() {
  fixture f;
  kvscout::decode_pipeline_cuda pipe({.shape = {.num_layers = fixture::L}, .skip_layers = 2,
                                      .overlap = false},
                                     f.stages(20000));
  for (int step = 0; step < 4; ++step) enqueue_step(pipe, f, 2, true, false, {f.compute, f.compute, f.compute});
  GPU_CHECK(f.read_errors() == 0);
}

void control_without_waits_fails() {
  // The same step without wait_rows: attention reads row buffers the slow fetch has not written.
#if defined(KVSCOUT_SIMT_HOST)
  // On the host SIMT emulator streams run at the next synchronisation, one after another in the
  // thread-order setting's order. Forward runs the compute stream (created first) before the
  // side and copy streams, so without the waits attention overtakes the fetch, as on a device.
  kvscout_simt::detail::set_order("forward");
#endif
  fixture f;
  kvscout::decode_pipeline_cuda pipe({.shape = {.num_layers = fixture::L}, .skip_layers = 2},
                                     f.stages(2000000));
  for (int step = 0; step < 3; ++step) enqueue_step(pipe, f, 2, false, false, {f.compute, f.side, f.copy});
  const int e = f.read_errors();
#if defined(KVSCOUT_SIMT_HOST)
  const char* order = std::getenv("KVSCOUT_SIMT_ORDER");
  kvscout_simt::detail::set_order(order != nullptr ? order : "forward");
#endif
  std::printf("control: %d mismatches without the waits (expected > 0)\n", e);
  GPU_CHECK(e > 0);
}

void append_during_fetch_does_not_race() {
  // attention(i) rewrites layer i's host row (the append) while fetch(i + 1) is in flight; every
  // fetch must still see the row as the previous step left it.
  fixture f;
  kvscout::decode_pipeline_cuda pipe({.shape = {.num_layers = fixture::L}, .skip_layers = 1},
                                     f.stages(200000));
  for (int step = 0; step < 5; ++step) enqueue_step(pipe, f, 1, true, true, {f.compute, f.side, f.copy});
  GPU_CHECK(f.read_errors() == 0);
}

void captured_in_a_graph() {
  fixture f;
  kvscout::decode_pipeline_cuda pipe({.shape = {.num_layers = fixture::L}, .skip_layers = 2},
                                     f.stages(100000));
  cudaGraph_t graph{};
  KVSCOUT_CUDA_CHECK(cudaStreamBeginCapture(f.compute, cudaStreamCaptureModeThreadLocal));
  enqueue_step(pipe, f, 2, true, false, {f.compute, f.side, f.copy});
  KVSCOUT_CUDA_CHECK(cudaStreamEndCapture(f.compute, &graph));
  cudaGraphExec_t exec{};
  KVSCOUT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int step = 0; step < 10; ++step) KVSCOUT_CUDA_CHECK(cudaGraphLaunch(exec, f.compute));
  GPU_CHECK(f.read_errors() == 0);
  GPU_CHECK(f.step.download()[0] == 10);
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaGraphExecDestroy(exec));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaGraphDestroy(graph));
}

void bad_config_throws() {
  fixture f;
  bool thrown = false;
  try {
    kvscout::decode_pipeline_cuda pipe({.shape = {.num_layers = 4}, .skip_layers = 5}, f.stages(0));
  } catch (const kvscout::error& e) {
    thrown = std::string(e.what()).find("skip_layers = 5") != std::string::npos;
  }
  GPU_CHECK(thrown);
  thrown = false;
  try {
    kvscout::decode_pipeline_cuda pipe({.shape = {.num_layers = 4}}, f.stages(0));
    pipe.input_ready(0, {f.compute, f.compute, f.copy});  // refused before anything is enqueued
  } catch (const kvscout::error& e) {
    thrown = std::string(e.what()).find("three distinct streams") != std::string::npos;
  }
  GPU_CHECK(thrown);
  // wait_rows (here of a dense layer) and speculate_first refuse them as well.
  for (const bool first : {false, true}) {
    thrown = false;
    try {
      kvscout::decode_pipeline_cuda pipe({.shape = {.num_layers = 4}, .skip_layers = first ? 0 : 2},
                                         f.stages(0));
      if (first) pipe.speculate_first({f.compute, f.side, f.side});
      else pipe.wait_rows(0, {f.compute, f.copy, f.copy});
    } catch (const kvscout::error& e) {
      thrown = std::string(e.what()).find("three distinct streams") != std::string::npos;
    }
    GPU_CHECK(thrown);
  }
  // Waiting for a layer that was never launched is refused (it would wait on a stale event).
  thrown = false;
  try {
    kvscout::decode_pipeline_cuda pipe({.shape = {.num_layers = 4}, .skip_layers = 2}, f.stages(0));
    const kvscout::cuda_pipeline_exec x{f.compute, f.side, f.copy};
    pipe.input_ready(0, x);
    pipe.input_ready(1, x);  // launches layer 2
    pipe.wait_rows(2, x);
    pipe.wait_rows(3, x);    // layer 3 was not launched: input_ready(2) is missing
  } catch (const kvscout::error& e) {
    thrown = std::string(e.what()).find("call input_ready(2)") != std::string::npos;
  }
  GPU_CHECK(thrown);
}

}  // namespace

int main() {
  return gpu_test::run_all("pipeline_device",
                           {{"ordered_eagerly", ordered_eagerly},
                            {"serial_mode_is_ordered", serial_mode_is_ordered},
                            {"control_without_waits_fails", control_without_waits_fails},
                            {"append_during_fetch_does_not_race", append_during_fetch_does_not_race},
                            {"captured_in_a_graph", captured_in_a_graph},
                            {"bad_config_throws", bad_config_throws}});
}
