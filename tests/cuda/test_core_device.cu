// core/ and kv/ on the device: the math written once with KVSCOUT_HOST_DEVICE gives the same
// bits on the GPU as on the host; checked CUDA calls throw kvscout::error.

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gpu_harness.cuh"
#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/detail/launch.cuh"
#include "kvscout/kvscout.hpp"

namespace {

template <class T>
__global__ void round_trip_kernel(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = kvscout::to_float(kvscout::from_float<T>(in[i]));
}

template <class T>
void check_round_trip() {
  constexpr int n = 1 << 14;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1e4f, 1e4f);
  std::vector<float> in(n), out(n, -1.f);
  for (auto& x : in) x = dist(rng);
  float *d_in, *d_out;
  KVSCOUT_CUDA_CHECK(cudaMalloc(&d_in, n * sizeof(float)));
  KVSCOUT_CUDA_CHECK(cudaMalloc(&d_out, n * sizeof(float)));
  KVSCOUT_CUDA_CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  KVSCOUT_CUDA_CHECK(cudaMemset(d_out, 0xff, n * sizeof(float)));  // poison
  kvscout::detail::launch(round_trip_kernel<T>, (n + 255) / 256, 256, 0, nullptr, d_in, d_out, n);
  KVSCOUT_CUDA_CHECK(cudaGetLastError());
  KVSCOUT_CUDA_CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
  int mismatches = 0;
  for (int i = 0; i < n; ++i) {
    const float host = kvscout::to_float(kvscout::from_float<T>(in[i]));
    mismatches += std::memcmp(&host, &out[i], sizeof(float)) != 0;
  }
  GPU_CHECK(mismatches == 0);
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(d_in));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(d_out));
}

using paged = kvscout::paged_layout<kvscout::half, 128, kvscout::hnd, kvscout::block_table, 16>;

__global__ void offsets_kernel(paged l, std::size_t* out, int len, int heads) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < len * heads) out[i] = l.k_offset(0, i / heads, i % heads);
}

void check_layout_math_on_device() {
  const int len = 100, heads = 4, blocks = 7;
  std::vector<int32_t> table = {3, 0, 6, 1, 5, 2, 4}, lens = {len};
  int32_t *d_table, *d_lens;
  std::size_t* d_out;
  KVSCOUT_CUDA_CHECK(cudaMalloc(&d_table, table.size() * 4));
  KVSCOUT_CUDA_CHECK(cudaMalloc(&d_lens, 4));
  KVSCOUT_CUDA_CHECK(cudaMalloc(&d_out, len * heads * sizeof(std::size_t)));
  KVSCOUT_CUDA_CHECK(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  KVSCOUT_CUDA_CHECK(cudaMemcpy(d_lens, lens.data(), 4, cudaMemcpyHostToDevice));
  paged host_l({table.data(), lens.data(), blocks, 1}, heads);
  paged dev_l({d_table, d_lens, blocks, 1}, heads);  // same math, device-resident metadata
  kvscout::detail::launch(offsets_kernel, (len * heads + 127) / 128, 128, 0, nullptr, dev_l, d_out,
                          len, heads);
  KVSCOUT_CUDA_CHECK(cudaGetLastError());
  std::vector<std::size_t> out(len * heads);
  KVSCOUT_CUDA_CHECK(cudaMemcpy(out.data(), d_out, out.size() * sizeof(std::size_t),
                                cudaMemcpyDeviceToHost));
  int mismatches = 0;
  for (int i = 0; i < len * heads; ++i) mismatches += out[i] != host_l.k_offset(0, i / heads, i % heads);
  GPU_CHECK(mismatches == 0);
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(d_table));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(d_lens));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(d_out));
}

// make_device_workspace: the part's bytes in device memory, 256-byte aligned, usable by a kernel.
__global__ void write_bytes(std::byte* p, std::size_t n) {
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) p[i] = std::byte{0x5a};
}
struct seven_bytes_part {
  static std::size_t workspace_bytes(int n) { return static_cast<std::size_t>(n) * 7; }
  static constexpr std::size_t workspace_alignment = 256;
};
void check_device_workspace() {
  using part = seven_bytes_part;
  const kvscout::device_workspace ws = kvscout::make_device_workspace<part>(100);
  GPU_CHECK(ws.size() == 700 && ws.span().size() == 700);
  GPU_CHECK(reinterpret_cast<std::uintptr_t>(ws.data()) % 256 == 0);
  kvscout::detail::launch(write_bytes, 1, 128, 0, nullptr, ws.data(), ws.size());
  std::vector<std::byte> back(ws.size());
  KVSCOUT_CUDA_CHECK(cudaMemcpy(back.data(), ws.data(), back.size(), cudaMemcpyDeviceToHost));
  bool all = true;
  for (std::byte b : back) all = all && b == std::byte{0x5a};
  GPU_CHECK(all);
  GPU_CHECK(kvscout::make_device_workspace<part>(0).span().empty());
  GPU_CHECK(gpu_test::throws_with([] { kvscout::device_workspace(16, 512); },
                                  "alignment 512 must be a power of two up to 256"));
}

void check_cuda_errors_throw() {
  void* p = nullptr;
  bool thrown = false;
  try {
    KVSCOUT_CUDA_CHECK(cudaMalloc(&p, std::size_t{1} << 60));  // 1 EiB: must fail
  } catch (const kvscout::error& e) {
    thrown = std::string(e.what()).find("cudaErrorMemoryAllocation") != std::string::npos;
  }
  GPU_CHECK(thrown);
  // The error was cleared: the next call is not poisoned by it.
  GPU_CHECK(cudaGetLastError() == cudaSuccess);
}

}  // namespace

int main() {
  return gpu_test::run_all("core_device",
                           {{"round_trip_f16", check_round_trip<kvscout::half>},
                            {"round_trip_bf16", check_round_trip<kvscout::bfloat16>},
                            {"layout_math", check_layout_math_on_device},
                            {"device_workspace", check_device_workspace},
                            {"cuda_errors_throw", check_cuda_errors_throw}});
}
