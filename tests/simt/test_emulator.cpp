// The host SIMT emulator's own tests: the semantics the GPU tests rely on when they run on it, and
// the faults it must stop on (each in a child process that must abort with its message). Built
// with the prelude force-included, like the GPU tests.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "gpu_harness.cuh"
#include "kvscout/core/detail/launch.cuh"

namespace {

using kvscout::detail::launch;

// A tree reduction through shared memory: wrong without its barriers.
__global__ void block_sum(const int* in, int* out) {
  __shared__ int s[256];
  const int t = static_cast<int>(threadIdx.x);
  s[t] = in[blockIdx.x * 256 + t];
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (t < w) s[t] += s[t + w];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

void tree_reduction_per_block() {
  std::vector<int> in(4 * 256);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>((i * 7919) % 1000) - 500;
  gpu_test::device_vector<int> d_in(in), d_out(4);
  launch(block_sum, 4, 256, 0, nullptr, d_in.data(), d_out.data());
  GPU_CHECK(cudaGetLastError() == cudaSuccess);
  const auto out = d_out.download();
  for (int b = 0; b < 4; ++b)
    GPU_CHECK(out[b] == std::accumulate(in.begin() + b * 256, in.begin() + (b + 1) * 256, 0));
}

// Shuffles: a butterfly sum and a broadcast, in a block of 3 whole warps.
__global__ void warp_ops(const float* in, float* sums, int* lane0) {
  const int t = static_cast<int>(threadIdx.x);
  float v = in[t];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  sums[t] = v;
  lane0[t] = __shfl_sync(0xffffffffu, t * 10, 0);
}

void warp_shuffles() {
  std::vector<float> in(96);
  for (int i = 0; i < 96; ++i) in[i] = static_cast<float>(i % 13) - 6.f;
  gpu_test::device_vector<float> d_in(in), sums(96);
  gpu_test::device_vector<int> lane0(96);
  launch(warp_ops, 1, 96, 0, nullptr, d_in.data(), sums.data(), lane0.data());
  const auto s = sums.download();
  const auto l = lane0.download();
  for (int w = 0; w < 3; ++w) {
    float want = 0.f;
    for (int i = 0; i < 32; ++i) want += in[w * 32 + i];
    for (int i = 0; i < 32; ++i) {
      GPU_CHECK(s[w * 32 + i] == want);
      GPU_CHECK(l[w * 32 + i] == w * 320);
    }
  }
}

// __syncthreads_or / _count, a 2-D block, and dynamic shared memory (poisoned until written).
__global__ void votes(int* out, int flagged) {
  const int t = static_cast<int>(threadIdx.x + blockDim.x * threadIdx.y);
  float* dyn = kvscout::detail::dynamic_shared<float>();
  const bool unset_is_nan = dyn[t] != dyn[t];
  __syncthreads();
  dyn[t] = static_cast<float>(t);
  const int any = __syncthreads_or(t == flagged);
  const int count = __syncthreads_count(t % 3 == 0);
  if (t == 0) {
    out[0] = any;
    out[1] = count;
    out[2] = static_cast<int>(dyn[blockDim.x * blockDim.y - 1]);
  }
  if (!unset_is_nan) atomicAdd(out + 3, 1);
}

void votes_and_dynamic_shared() {
  gpu_test::device_vector<int> out(4);
  KVSCOUT_CUDA_CHECK(cudaMemset(out.data(), 0, 16));
  launch(votes, 1, dim3(16, 4), 64 * sizeof(float), nullptr, out.data(), 37);
  auto o = out.download();
  GPU_CHECK(o[0] == 1 && o[1] == 22 && o[2] == 63 && o[3] == 0);
  KVSCOUT_CUDA_CHECK(cudaMemset(out.data(), 0, 16));
  launch(votes, 1, dim3(16, 4), 64 * sizeof(float), nullptr, out.data(), -1);
  o = out.download();
  GPU_CHECK(o[0] == 0 && o[1] == 22);
}

// The CUB stand-ins against their definitions; Reduce is valid in thread 0 only.
__global__ void cub_parts(const int* in, int* reduced, int* scanned, int* aggregate, int* loaded) {
  using reduce = cub::BlockReduce<int, 64>;
  using scan = cub::BlockScan<int, 64>;
  using load = cub::BlockLoad<int, 64, 2, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  __shared__ typename reduce::TempStorage rt;
  __shared__ typename scan::TempStorage st;
  __shared__ typename load::TempStorage lt;
  const int t = static_cast<int>(threadIdx.x);
  reduced[t] = reduce(rt).Reduce(in[t], [](int a, int b) { return a > b ? a : b; });
  __syncthreads();
  scan(st).ExclusiveSum(in[t], scanned[t], aggregate[t]);
  int items[2];
  load(lt).Load(in, items, 101, -7);
  loaded[2 * t] = items[0];
  loaded[2 * t + 1] = items[1];
}

void cub_stand_ins() {
  std::vector<int> in(128);
  for (int i = 0; i < 128; ++i) in[i] = (i * 37) % 101 - 50;
  gpu_test::device_vector<int> d_in(in), red(64), scn(64), agg(64), ld(128);
  launch(cub_parts, 1, 64, 0, nullptr, d_in.data(), red.data(), scn.data(), agg.data(), ld.data());
  const auto r = red.download(), s = scn.download(), a = agg.download(), l = ld.download();
  GPU_CHECK(r[0] == *std::max_element(in.begin(), in.begin() + 64));
  GPU_CHECK(r[1] == -1);  // poisoned outside thread 0
  int run = 0;
  for (int t = 0; t < 64; ++t) {
    GPU_CHECK(s[t] == run);
    run += in[t];
  }
  for (int t = 0; t < 64; ++t) GPU_CHECK(a[t] == run);
  for (int i = 0; i < 128; ++i) GPU_CHECK(l[i] == (i < 101 ? in[i] : -7));
}

__global__ void add_one(int* p) { p[threadIdx.x] += 1; }

// Capture records, replay runs; a synchronous call during capture is refused and invalidates it.
void graph_capture_and_replay() {
  gpu_test::device_vector<int> d(32);
  KVSCOUT_CUDA_CHECK(cudaMemset(d.data(), 0, 128));
  cudaStream_t s{}, side{};
  cudaEvent_t fork{}, join{};
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&s));
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&side));
  KVSCOUT_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  KVSCOUT_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  KVSCOUT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  launch(add_one, 1, 32, 0, s, d.data());
  KVSCOUT_CUDA_CHECK(cudaEventRecord(fork, s));
  KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));  // side joins the capture
  launch(add_one, 1, 32, 0, side, d.data());
  KVSCOUT_CUDA_CHECK(cudaEventRecord(join, side));
  KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(s, join, 0));
  cudaGraph_t g{};
  KVSCOUT_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  GPU_CHECK(d.download()[5] == 0);  // nothing ran while capturing
  cudaGraphExec_t e{};
  KVSCOUT_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  for (int i = 0; i < 3; ++i) KVSCOUT_CUDA_CHECK(cudaGraphLaunch(e, s));
  GPU_CHECK(d.download()[5] == 6);

  KVSCOUT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  launch(add_one, 1, 32, 0, s, d.data());
  GPU_CHECK(cudaDeviceSynchronize() != cudaSuccess);
  cudaGraph_t bad{};
  GPU_CHECK(cudaStreamEndCapture(s, &bad) == cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();

  // A forked stream whose last work the origin never waits for: unjoined.
  KVSCOUT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  KVSCOUT_CUDA_CHECK(cudaEventRecord(fork, s));
  KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));
  launch(add_one, 1, 32, 0, side, d.data());
  KVSCOUT_CUDA_CHECK(cudaEventRecord(join, side));
  KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(s, join, 0));
  launch(add_one, 1, 32, 0, side, d.data());  // after the join
  GPU_CHECK(cudaStreamEndCapture(s, &bad) == cudaErrorStreamCaptureUnjoined);
  (void)cudaGetLastError();
  GPU_CHECK(d.download()[5] == 6);  // nothing of either failed capture ran
  KVSCOUT_CUDA_CHECK(cudaGraphExecDestroy(e));
  KVSCOUT_CUDA_CHECK(cudaGraphDestroy(g));
  KVSCOUT_CUDA_CHECK(cudaEventDestroy(fork));
  KVSCOUT_CUDA_CHECK(cudaEventDestroy(join));
  KVSCOUT_CUDA_CHECK(cudaStreamDestroy(s));
  KVSCOUT_CUDA_CHECK(cudaStreamDestroy(side));
}

void bad_launches_are_errors() {
  gpu_test::device_vector<int> d(32);
  launch(add_one, 1, 1025, 0, nullptr, d.data());
  GPU_CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  launch(add_one, 0, 32, 0, nullptr, d.data());
  GPU_CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  launch(add_one, 1, 32, 64 * 1024, nullptr, d.data());  // over 48 KiB without opting in
  GPU_CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  GPU_CHECK(cudaGetLastError() == cudaSuccess);
}

// Shuffle edge semantics (PTX shfl.bfly / shfl.idx): a butterfly past its segment keeps the
// lane's own value, one below reads the earlier segment; a source lane wraps within the segment;
// a mask that names half a warp is fine while the other half has left.
__global__ void shuffle_edges(int* out) {
  const int lane = static_cast<int>(threadIdx.x);
  out[lane] = __shfl_xor_sync(0xffffffffu, lane, 16, 16);
  out[32 + lane] = __shfl_sync(0xffffffffu, lane, -1, 8);
  if (lane >= 16) return;
  out[64 + lane] = __shfl_xor_sync(0x0000ffffu, lane, 1);
}

void shuffle_edge_semantics() {
  gpu_test::device_vector<int> out(80);
  launch(shuffle_edges, 1, 32, 0, nullptr, out.data());
  const auto o = out.download();
  for (int lane = 0; lane < 32; ++lane) {
    const int first = lane & ~15, src = lane ^ 16;
    GPU_CHECK(o[lane] == (src <= first + 15 ? src : lane));
    GPU_CHECK(o[32 + lane] == ((lane & ~7) | 7));
  }
  for (int lane = 0; lane < 16; ++lane) GPU_CHECK(o[64 + lane] == (lane ^ 1));
}

// Thread 0 publishes a value that the others read without a barrier: right in forward order
// (thread 0 runs first), stale in reverse, which is why ctest runs every emulated test both ways.
__global__ void missing_barrier(int* out, int round) {
  __shared__ int s;
  if (threadIdx.x == 0) s = round;
  __syncthreads();
  if (threadIdx.x == 0) s = round + 1000;  // a second publication, without a barrier after it
  out[threadIdx.x] = s;
}

void thread_order_exposes_missing_barriers() {
  gpu_test::device_vector<int> out(64);
  int stale[2] = {0, 0};
  const char* orders[2] = {"forward", "reverse"};
  for (int o = 0; o < 2; ++o) {
    kvscout_simt::detail::set_order(orders[o]);
    launch(missing_barrier, 1, 64, 0, nullptr, out.data(), 7);
    for (int v : out.download()) stale[o] += v != 1007 ? 1 : 0;
  }
  kvscout_simt::detail::set_order("forward");
  std::printf("  stale reads: %d forward, %d reverse (of 64)\n", stale[0], stale[1]);
  GPU_CHECK(stale[0] == 0);
  GPU_CHECK(stale[1] == 63);
}

__global__ void write_value(int* p, int v) { *p = v; }
__global__ void copy_value(const int* from, int* to) { *to = *from; }

// Streams run at synchronisation points, honouring event waits only: without a wait the consumer
// on the earlier-created stream overtakes the producer in forward order; with one it never does.
// A copy from pageable memory takes the source as it was at the call.
void streams_run_at_synchronisation() {
  gpu_test::device_vector<int> a(1), b(1);
  cudaStream_t consumer{}, producer{};
  cudaEvent_t made{};
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&consumer));
  KVSCOUT_CUDA_CHECK(cudaStreamCreate(&producer));
  KVSCOUT_CUDA_CHECK(cudaEventCreateWithFlags(&made, cudaEventDisableTiming));
  int got[2][2];
  const char* orders[2] = {"forward", "reverse"};
  for (int o = 0; o < 2; ++o) {
    kvscout_simt::detail::set_order(orders[o]);
    for (int waited = 0; waited < 2; ++waited) {
      KVSCOUT_CUDA_CHECK(cudaMemset(a.data(), 0, 4));
      launch(write_value, 1, 1, 0, producer, a.data(), 42);
      KVSCOUT_CUDA_CHECK(cudaEventRecord(made, producer));
      if (waited) KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(consumer, made, 0));
      launch(copy_value, 1, 1, 0, consumer, a.data(), b.data());
      got[o][waited] = b.download()[0];
    }
  }
  kvscout_simt::detail::set_order("forward");
  std::printf("  consumer read: forward %d without the wait, %d with; reverse %d, %d\n", got[0][0],
              got[0][1], got[1][0], got[1][1]);
  GPU_CHECK(got[0][0] == 0 && got[0][1] == 42 && got[1][0] == 42 && got[1][1] == 42);

  std::vector<int> pageable = {7};
  KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(a.data(), pageable.data(), 4, cudaMemcpyHostToDevice, consumer));
  pageable[0] = 8;  // allowed: the call has staged the source
  GPU_CHECK(a.download()[0] == 7);
  KVSCOUT_CUDA_CHECK(cudaEventDestroy(made));
  KVSCOUT_CUDA_CHECK(cudaStreamDestroy(consumer));
  KVSCOUT_CUDA_CHECK(cudaStreamDestroy(producer));
}

// ---- cases that must abort --------------------------------------------------------------------
__global__ void divergent_barrier(int* p) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  p[threadIdx.x] = 1;
}
// Half a warp waits at a shuffle, the other half at a block barrier: neither can complete.
__global__ void deadlock(float* p) {
  if (threadIdx.x < 16) {
    p[threadIdx.x] = __shfl_xor_sync(0xffffffffu, p[threadIdx.x], 1);
  } else {
    __syncthreads();
  }
}
// The mask names lanes that leave without taking part.
__global__ void partial_warp_shuffle(float* p) {
  if (threadIdx.x < 16) p[threadIdx.x] = __shfl_xor_sync(0xffffffffu, p[threadIdx.x], 1);
}

// Lanes of one warp at two different shuffle call sites.
__global__ void divergent_shuffle(float* p) {
  if (threadIdx.x < 16) {
    p[threadIdx.x] = __shfl_xor_sync(0xffffffffu, p[threadIdx.x], 1);
  } else {
    p[threadIdx.x] = __shfl_xor_sync(0xffffffffu, p[threadIdx.x], 2);
  }
}
// A CUB block primitive after some threads have returned: undefined with CUB.
__global__ void cub_after_return(int* p) {
  using reduce = cub::BlockReduce<int, 64>;
  __shared__ typename reduce::TempStorage temp;
  if (threadIdx.x >= 40) return;
  p[0] = reduce(temp).Sum(1);
}

void launch_fault(const std::string& name) {
  gpu_test::device_vector<float> f(64);
  gpu_test::device_vector<int> d(64);
  if (name == "divergent_barrier") launch(divergent_barrier, 1, 32, 0, nullptr, d.data());
  if (name == "deadlock") launch(deadlock, 1, 32, 0, nullptr, f.data());
  if (name == "partial_warp_shuffle") launch(partial_warp_shuffle, 1, 32, 0, nullptr, f.data());
  if (name == "divergent_shuffle") launch(divergent_shuffle, 1, 32, 0, nullptr, f.data());
  if (name == "cub_after_return") launch(cub_after_return, 1, 64, 0, nullptr, d.data());
}

// Runs the faulty kernel in a child process: it must abort with `message` on stderr.
void stops_on(const std::string& name, const char* message) {
  int err[2];
  GPU_CHECK(pipe(err) == 0);
  const pid_t child = fork();
  if (child == 0) {
    dup2(err[1], 2);
    close(err[0]);
    launch_fault(name);
    _exit(0);
  }
  close(err[1]);
  std::string text;
  char buf[512];
  for (ssize_t n; (n = read(err[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  close(err[0]);
  int status = 0;
  waitpid(child, &status, 0);
  GPU_CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  GPU_CHECK(text.find(message) != std::string::npos);
  std::printf("  %s: %s", name.c_str(), text.c_str());
}

void stops_on_faults() {
  stops_on("divergent_barrier", "wait at different barriers");
  stops_on("deadlock", "deadlock");
  stops_on("partial_warp_shuffle", "exited while other threads of its warp wait at a shuffle");
  stops_on("divergent_shuffle", "lanes of a warp wait at different shuffles");
  stops_on("cub_after_return", "CUB block primitive ran after threads of the block returned");
}

}  // namespace

int main() {
  return gpu_test::run_all("simt_emulator", {{"tree_reduction_per_block", tree_reduction_per_block},
                                             {"warp_shuffles", warp_shuffles},
                                             {"votes_and_dynamic_shared", votes_and_dynamic_shared},
                                             {"cub_stand_ins", cub_stand_ins},
                                             {"graph_capture_and_replay", graph_capture_and_replay},
                                             {"bad_launches_are_errors", bad_launches_are_errors},
                                             {"shuffle_edge_semantics", shuffle_edge_semantics},
                                             {"thread_order_exposes_missing_barriers",
                                              thread_order_exposes_missing_barriers},
                                             {"streams_run_at_synchronisation",
                                              streams_run_at_synchronisation},
                                             {"stops_on_faults", stops_on_faults}});
}
