#pragma once
// A stack of Llama-shaped decoder layers whose KV cache lives in host memory, decoded one token
// per step four ways: what bench_decode_step.cu times and tests/cuda/test_decode_step_model_device.cu
// checks (on a device, or on the host SIMT emulator at a small shape).
//
// One layer (fp16 weights on the device, cuBLAS GEMMs with fp32 accumulation, batch B):
//   xn = RMSNorm(x)                      -> half for the GEMM, float for the next layer's speculation
//   qkv = xn W_qkv^T                     (B x (Hq + 2H) D, float)
//   q, k, v = RoPE(qkv) at position len  (split-half RoPE, theta from the config)
//   o = attention(q, cache rows, k, v)   (half)          <- the part the four ways differ in
//   append k, v to the layer's cache at slot len (the lengths are not advanced: every step is the
//   same step, so the benchmark has a steady state; the slot lies past every length)
//   x += o W_o^T                         (beta = 1 into the float residual)
//   g, u = RMSNorm(x) W_gu^T; x += (silu(g) * u) W_down^T
//
// The ways (decode_way):
//   kvscout         speculation for layer i + 1 (infinigen_policy_cuda on layer i's normalised
//                   input, r = head_dim / 2 RoPE planes, max-logit over the query group) and top-k
//                   on a side stream, the zero-copy fetch of the selected rows on a copy stream,
//                   ordered by decode_pipeline_cuda (events, no host synchronisation); sparse
//                   attention over the fetched rows plus the new token. Layer 0 is speculated at
//                   the start of the step (skip_layers = 0: every layer sparse, nothing resident).
//   kvscout_cache   the same with the device row cache (cuda_stage_buffering::row_cache): rows
//                   fetched for the layer at the previous step are copied on the device.
//   kvscout_corrected  kvscout's step plus the correction step (cuda_stages.cuh correct()): once
//                   layer i's query exists, score_query, correction_selector_cuda and a zero-copy
//                   fetch of up to correction_share x budget more rows per (sequence, kv head),
//                   on the compute stream (the critical path); attention over both sets joined
//                   (joined_rows_cuda). Not for KIVI caches.
//   compute_only    kvscout's step with the fetch left out: speculation, selection, attention over
//                   rows already on the device, and the model. The step's floor when the link is free.
//   flexgen         every layer's whole K and V copied by the copy engine into a device buffer
//                   (double-buffered, layer i + 1's copy behind layer i's compute), dense attention.
//   infinigen       InfiniGen's own fetch path: the same speculation and selection on the device, the
//                   selection copied to the host and waited for, the rows gathered by host threads
//                   into pinned staging and copied (staged_executor_cuda), behind the previous layer's
//                   compute as far as the host's waits allow.
//   resident        the whole cache on the device, dense attention: the upper bound.
//
// Memory: the config's distinct_caches bounds how many layers' caches are allocated; layer l uses
// cache l % distinct_caches (speed does not depend on the values; the benchmark keeps every cache
// set larger than twice the L2 or distinct per layer). Values are a hash of (cache, sequence,
// token, head, channel), so the device-resident copy, the host cache and the speculator's partial
// keys hold the same keys.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvscout/attention/decode.cuh"
#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/detail/launch.cuh"
#include "kvscout/core/error.hpp"
#include "kvscout/fetch/staged.cuh"
#include "kvscout/fetch/zero_copy.cuh"
#include "kvscout/kv/append.cuh"
#include "kvscout/kv/contiguous.hpp"
#include "kvscout/kv/kivi.hpp"
#include "kvscout/kv/paged.hpp"
#include "kvscout/pipeline/cuda_pipeline.hpp"
#include "kvscout/pipeline/cuda_stages.cuh"
#include "kvscout/select/correction.cuh"
#include "kvscout/select/topk.cuh"
#include "kvscout/skew/plan.hpp"
#include "kvscout/score/infinigen.cuh"

namespace decode_step {

using kvscout::half;

#define DECODE_STEP_CUBLAS(call)                                                          \
  do {                                                                                    \
    const cublasStatus_t st_ = (call);                                                    \
    KVSCOUT_EXPECTS(st_ == CUBLAS_STATUS_SUCCESS, #call, " failed: ", cublasGetStatusString(st_)); \
  } while (0)

enum class decode_way { kvscout, kvscout_cache, compute_only, flexgen, infinigen, resident,
                        kvscout_corrected };

inline const char* way_name(decode_way w) {
  switch (w) {
    case decode_way::kvscout: return "kvscout";
    case decode_way::kvscout_cache: return "kvscout_row_cache";
    case decode_way::compute_only: return "compute_only";
    case decode_way::flexgen: return "flexgen";
    case decode_way::infinigen: return "infinigen";
    case decode_way::resident: return "resident";
    case decode_way::kvscout_corrected: return "kvscout_corrected";
  }
  return "?";
}

struct model_shape {
  int d_model = 4096;
  int q_heads = 32;
  int kv_heads = 8;
  int mlp = 14336;
  int layers = 8;
  float rope_theta = 500000.f;
  float eps = 1e-5f;
};

struct stack_config {
  model_shape model;
  std::vector<std::int32_t> lens;  // cached tokens per sequence (the batch)
  double budget = 0.10;            // rows per (sequence, kv head): this share of the longest
  double correction_share = 0.25;  // kvscout_corrected: rows it may add, this share of budget's
  int distinct_caches = 0;         // caches allocated (0: one per layer)
  int gather_blocks = 0;           // zero_copy_config::max_blocks (0: kvscout's default)
  int staged_threads = 4;          // host threads of InfiniGen's gather
  std::uint32_t seed = 1;
  bool record = false;             // keep every layer's q, new K / V, output and selection (tests)
  // Each step starts from the next of this many random inputs (a device counter picks it, so a
  // captured step moves on too): the residual never drifts, and consecutive steps differ as
  // independent tokens would, so the row cache's hit rate is a floor (docs/decode_step.md).
  int input_ring = 16;
};

// ---- values ------------------------------------------------------------------------------------

KVSCOUT_HOST_DEVICE float hash_unit(std::uint64_t x) {  // in [-1, 1)
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<float>(x >> 40) * (2.f / 16777216.f) - 1.f;
}
KVSCOUT_HOST_DEVICE std::uint64_t key_of(int cache, int kv, int s, int t, int h, int c) {
  return ((((static_cast<std::uint64_t>(cache) * 2 + kv) * 64 + s) * 4194304ULL + t) * 64 + h) *
             512 + c;
}
/// The cached K (kv = 0) or V (kv = 1) element: keys have a few large channels (RoPE planes
/// 0-3 of split-half RoPE: channels c with c mod (D/2) < 4), as real keys do.
KVSCOUT_HOST_DEVICE float cache_value(int cache, int kv, int s, int t, int h, int c, int D) {
  const float big = (kv == 0 && c % (D / 2) < 4) ? 4.f : 1.f;
  return big * hash_unit(key_of(cache, kv, s, t, h, c));
}

namespace detail {

template <class L>
__global__ void fill_cache(L layout, std::byte* k, std::byte* v, int cache, int tokens_bound) {
  constexpr int D = L::head_dim;
  const int s = static_cast<int>(blockIdx.y), h = static_cast<int>(blockIdx.z);
  const int len = layout.seq_len(s);
  for (int t = static_cast<int>(blockIdx.x); t < len && t < tokens_bound; t += static_cast<int>(gridDim.x)) {
    half* kr = reinterpret_cast<half*>(k + layout.k_offset(s, t, h));
    half* vr = reinterpret_cast<half*>(v + layout.v_offset(s, t, h));
    for (int c = static_cast<int>(threadIdx.x); c < D; c += static_cast<int>(blockDim.x)) {
      kr[c] = __float2half(cache_value(cache, 0, s, t, h, c, D));
      vr[c] = __float2half(cache_value(cache, 1, s, t, h, c, D));
    }
  }
}

// Keys of tokens [t0, t0 + n) of sequence s in the speculator's append form [n, H, D].
__global__ void key_chunk(half* out, int cache, int s, int t0, int n, int H, int D) {
  const std::size_t total = static_cast<std::size_t>(n) * H * D;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % D), h = static_cast<int>((i / D) % H),
              t = t0 + static_cast<int>(i / (static_cast<std::size_t>(D) * H));
    out[i] = __float2half(cache_value(cache, 0, s, t, h, c, D));
  }
}

__global__ void fill_half(half* p, std::size_t n, std::uint64_t seed, float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = __float2half(scale * hash_unit(seed * 0x9E3779B97F4A7C15ULL + i));
}

// x: [B, dm] float. out_h = x / rms(x) * w (half); out_f (optional, two): the same in float.
__global__ void rmsnorm(const float* x, const half* w, half* out_h, float* out_f0, float* out_f1,
                        int dm, float eps) {
  __shared__ float part[32];
  const int b = static_cast<int>(blockIdx.x);
  const float* xr = x + static_cast<std::size_t>(b) * dm;
  float ss = 0.f;
  for (int c = static_cast<int>(threadIdx.x); c < dm; c += static_cast<int>(blockDim.x)) ss += xr[c] * xr[c];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < static_cast<int>(blockDim.x / 32); ++i) total += part[i];
  const float inv = 1.f / sqrtf(total / static_cast<float>(dm) + eps);
  for (int c = static_cast<int>(threadIdx.x); c < dm; c += static_cast<int>(blockDim.x)) {
    const float y = xr[c] * inv * __half2float(w[c]);
    out_h[static_cast<std::size_t>(b) * dm + c] = __float2half(y);
    if (out_f0 != nullptr) out_f0[static_cast<std::size_t>(b) * dm + c] = y;
    if (out_f1 != nullptr) out_f1[static_cast<std::size_t>(b) * dm + c] = y;
  }
}

// qkv: [B, (Hq + 2H) D] float -> q [B, Hq, D] float, k / v [B, H, D] half; split-half RoPE at
// positions[b] on q and k.
__global__ void rope_split(const float* qkv, const std::int32_t* positions, float* q, half* k,
                           half* v, int Hq, int H, int D, float theta) {
  const int b = static_cast<int>(blockIdx.x);
  const int heads = Hq + 2 * H, half_d = D / 2;
  const float pos = static_cast<float>(positions[b]);
  const float* row = qkv + static_cast<std::size_t>(b) * heads * D;
  for (int i = static_cast<int>(threadIdx.x); i < heads * half_d; i += static_cast<int>(blockDim.x)) {
    const int hh = i / half_d, j = i % half_d;
    const float a = row[hh * D + j], c = row[hh * D + j + half_d];
    if (hh >= Hq + H) {  // value: no rotation
      half* vr = v + (static_cast<std::size_t>(b) * H + (hh - Hq - H)) * D;
      vr[j] = __float2half(a);
      vr[j + half_d] = __float2half(c);
      continue;
    }
    const float ang = pos * powf(theta, -2.f * static_cast<float>(j) / static_cast<float>(D));
    const float cs = cosf(ang), sn = sinf(ang);
    const float r0 = a * cs - c * sn, r1 = c * cs + a * sn;
    if (hh < Hq) {
      float* qr = q + (static_cast<std::size_t>(b) * Hq + hh) * D;
      qr[j] = r0;
      qr[j + half_d] = r1;
    } else {
      half* kr = k + (static_cast<std::size_t>(b) * H + (hh - Hq)) * D;
      kr[j] = __float2half(r0);
      kr[j + half_d] = __float2half(r1);
    }
  }
}

// The step's input: x = ring[*counter % K] ([B, dm] each), then the counter advances. One block,
// so the counter is read by every thread before thread 0 moves it on.
__global__ void next_input(const float* ring, int K, int n, int* counter, float* x) {
  const int c = *counter;
  const float* src = ring + static_cast<std::size_t>(c % K) * n;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) x[i] = src[i];
  __syncthreads();
  if (threadIdx.x == 0) *counter = c + 1 == 2147483647 ? 0 : c + 1;
}

// gu: [B, 2 mlp] (gate, then up) -> h [B, mlp] = silu(gate) * up.
__global__ void silu_mul(const half* gu, half* h, int mlp, int B) {
  const std::size_t n = static_cast<std::size_t>(B) * mlp;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t b = i / mlp, c = i % mlp;
    const float g = __half2float(gu[b * 2 * mlp + c]), u = __half2float(gu[b * 2 * mlp + mlp + c]);
    h[i] = __float2half(g / (1.f + expf(-g)) * u);
  }
}

inline unsigned grid_for(std::size_t n, unsigned threads, unsigned cap = 4096) {
  const std::size_t g = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min<std::size_t>(g, cap)));
}

}  // namespace detail

/// y[b, o] = sum_i x[b, i] W[o, i] + beta y[b, o] for b < B: row-major x [B, in] and W [out, in]
/// (half), y [B, out] (float or half, yt). cuBLAS is column-major: this is y^T = W x^T, with W
/// read as its transpose.
inline void gemm_rows(cublasHandle_t h, const half* w, int out, int in, const half* x, int B,
                      void* y, cudaDataType yt, float beta) {
  const float alpha = 1.f;
  DECODE_STEP_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, B, in, &alpha, w, CUDA_R_16F,
                                  in, x, CUDA_R_16F, in, &beta, y, yt, out, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
}

// ---- memory --------------------------------------------------------------------------------------

/// Device and pinned host blocks owned for the stack's lifetime (all allocation is at set-up).
class arena {
 public:
  arena() = default;
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;
  ~arena() {
    for (void* p : dev_) KVSCOUT_CUDA_CHECK_NO_THROW(cudaFree(p));
    for (void* p : host_) KVSCOUT_CUDA_CHECK_NO_THROW(cudaFreeHost(p));
  }
  template <class T>
  T* device(std::size_t n) {
    void* p = nullptr;
    KVSCOUT_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)));
    dev_.push_back(p);
    return static_cast<T*>(p);
  }
  template <class T>
  T* upload(const std::vector<T>& v) {
    T* d = device<T>(v.size());
    KVSCOUT_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
  }
  /// Pinned, mapped host memory: {host pointer, device alias}.
  std::pair<std::byte*, std::byte*> mapped(std::size_t bytes) {
    void* h = nullptr;
    void* d = nullptr;
    KVSCOUT_CUDA_CHECK(cudaHostAlloc(&h, std::max<std::size_t>(bytes, 16), cudaHostAllocMapped));
    host_.push_back(h);
    KVSCOUT_CUDA_CHECK(cudaHostGetDevicePointer(&d, h, 0));
    return {static_cast<std::byte*>(h), static_cast<std::byte*>(d)};
  }
  template <class T>
  T* pinned(std::size_t n) {
    void* h = nullptr;
    KVSCOUT_CUDA_CHECK(cudaHostAlloc(&h, std::max<std::size_t>(n, 1) * sizeof(T), 0));
    host_.push_back(h);
    return static_cast<T*>(h);
  }

 private:
  std::vector<void*> dev_, host_;
};

/// Contiguous pinned host-to-device rate of 64 MiB on `stream`, in GB/s, the median of 5: the
/// anchor the decode-step benchmark forms its ratios against.
inline double h2d_anchor_gbps(cudaStream_t stream) {
  const std::size_t bytes = std::size_t{64} << 20;
  arena a;
  std::byte* src = a.pinned<std::byte>(bytes);
  std::byte* dst = a.device<std::byte>(bytes);
  std::memset(src, 1, bytes);
  cudaEvent_t e0{}, e1{};
  KVSCOUT_CUDA_CHECK(cudaEventCreate(&e0));
  KVSCOUT_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> r;
  for (int i = 0; i < 5; ++i) {
    KVSCOUT_CUDA_CHECK(cudaEventRecord(e0, stream));
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    KVSCOUT_CUDA_CHECK(cudaEventRecord(e1, stream));
    KVSCOUT_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    KVSCOUT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    r.push_back(static_cast<double>(bytes) / (ms * 1e-3) * 1e-9);
  }
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaEventDestroy(e0));
  KVSCOUT_CUDA_CHECK_NO_THROW(cudaEventDestroy(e1));
  std::sort(r.begin(), r.end());
  return r[2];
}

// ---- the layouts the stack runs: how to build one over a batch, and its whole-cache copy ----------

template <class L>
struct cache_traits;

/// The metadata of a padded layout (contiguous, KIVI): capacity, the longest sequence plus room
/// for the appended token, and the lengths on the device.
struct padded_meta {
  int capacity = 0;
  const std::int32_t* d_lens = nullptr;
};
inline padded_meta make_padded_meta(arena& a, const std::vector<std::int32_t>& lens) {
  return {*std::max_element(lens.begin(), lens.end()) + 1, a.upload(lens)};
}

template <int D>
struct cache_traits<kvscout::contiguous_layout<half, D, kvscout::hnd>> {
  using layout = kvscout::contiguous_layout<half, D, kvscout::hnd>;
  static constexpr const char* name = "contiguous";
  using meta = padded_meta;
  static meta make_meta(arena& a, const std::vector<std::int32_t>& lens, int) {
    return make_padded_meta(a, lens);
  }
  static layout host_layout(const meta& m, const std::vector<std::int32_t>& lens, int H) {
    return layout::padded(H, m.capacity, lens.data(), static_cast<int>(lens.size()));
  }
  static layout device_layout(const meta& m, const std::vector<std::int32_t>& lens, int H) {
    return layout::padded(H, m.capacity, m.d_lens, static_cast<int>(lens.size()));
  }
  static std::size_t bytes(const layout& host) { return host.required_bytes(); }
  /// The byte ranges a full fetch copies: each (sequence, head)'s tokens.
  static std::vector<std::pair<std::size_t, std::size_t>> full_ranges(
      const layout& host, const std::vector<std::int32_t>& lens, int H) {
    std::vector<std::pair<std::size_t, std::size_t>> r;
    for (int s = 0; s < static_cast<int>(lens.size()); ++s)
      for (int h = 0; h < H; ++h)
        r.emplace_back(host.k_offset(s, 0, h), static_cast<std::size_t>(lens[s]) * host.k_row_bytes());
    return r;
  }
};

template <int D>
struct cache_traits<kvscout::paged_layout<half, D, kvscout::hnd, kvscout::block_table, 16>> {
  using layout = kvscout::paged_layout<half, D, kvscout::hnd, kvscout::block_table, 16>;
  static constexpr const char* name = "paged16";
  struct meta {
    std::vector<std::int32_t> table;  // host copy
    std::int32_t* d_table = nullptr;
    const std::int32_t* d_lens = nullptr;
    int max_blocks = 0, pages = 0;
  };
  // Pages in a shuffled order (as an allocator that has run a while hands them out), one more
  // slot than the longest sequence for the appended token.
  static meta make_meta(arena& a, const std::vector<std::int32_t>& lens, int /*heads*/) {
    meta m;
    const int S = static_cast<int>(lens.size());
    for (int n : lens) m.max_blocks = std::max(m.max_blocks, n / 16 + 1);
    std::vector<int> need(S);
    for (int s = 0; s < S; ++s) m.pages += need[s] = lens[s] / 16 + 1;
    std::vector<std::int32_t> ids(m.pages);
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937 rng(11);
    std::shuffle(ids.begin(), ids.end(), rng);
    m.table.assign(static_cast<std::size_t>(S) * m.max_blocks, -1);
    int next = 0;
    for (int s = 0; s < S; ++s)
      for (int p = 0; p < need[s]; ++p) m.table[static_cast<std::size_t>(s) * m.max_blocks + p] = ids[next++];
    m.d_table = a.upload(m.table);
    m.d_lens = a.upload(lens);
    return m;
  }
  static layout host_layout(const meta& m, const std::vector<std::int32_t>& lens, int H) {
    return layout({m.table.data(), lens.data(), m.max_blocks, static_cast<int>(lens.size())}, H);
  }
  static layout device_layout(const meta& m, const std::vector<std::int32_t>& lens, int H) {
    return layout({m.d_table, m.d_lens, m.max_blocks, static_cast<int>(lens.size())}, H);
  }
  static std::size_t bytes_for(const meta& m, int H) {
    return static_cast<std::size_t>(m.pages) * 16 * H * D * sizeof(half);
  }
  /// A full fetch copies the page pool whole (every page is in use).
  static std::vector<std::pair<std::size_t, std::size_t>> full_ranges(const meta& m, int H) {
    return {{0, bytes_for(m, H)}};
  }
};

/// KIVI (kv/kivi.hpp, G = 32, R = 128): the K codes and V records (what a fetch moves) in host
/// memory, the key parameters and the residual windows resident on the device. Values: halves of
/// a hash in every byte pair (any bits are valid codes; scales and zeros stay small and finite).
template <int D, kvscout::kivi_bits Bits>
struct cache_traits<kvscout::kivi_layout<half, D, Bits>> {
  using layout = kvscout::kivi_layout<half, D, Bits>;
  static constexpr const char* name = "kivi";
  static constexpr kvscout::kivi_options options{.group = 32, .residual = 128};
  using meta = padded_meta;
  static meta make_meta(arena& a, const std::vector<std::int32_t>& lens, int) {
    return make_padded_meta(a, lens);
  }
  static layout host_layout(const meta& m, const std::vector<std::int32_t>& lens, int H) {
    return layout::padded(H, m.capacity, lens.data(), static_cast<int>(lens.size()), options);
  }
  static layout device_layout(const meta& m, const std::vector<std::int32_t>& lens, int H) {
    return layout::padded(H, m.capacity, m.d_lens, static_cast<int>(lens.size()), options);
  }
};

// ---- the stack -----------------------------------------------------------------------------------

template <class L>
class decode_stack {
 public:
  using layout = L;
  using traits = cache_traits<L>;
  static constexpr int D = L::head_dim;
  /// KIVI caches run the sparse ways only (no dense KIVI attention on the device: flexgen and
  /// resident refuse), and append nothing (the lengths of a KIVI cache advance with its appends).
  static constexpr bool kivi = kvscout::kivi_quantized_layout<L>;
  using speculator_t = kvscout::infinigen_policy_cuda<half, half>;
  using stages_t = kvscout::infinigen_stages_cuda<L, kvscout::topk_selector_cuda, half, half>;

  /// kvscout's stages with the fetch switchable (compute_only leaves it out).
  struct switch_stages {
    stages_t* s = nullptr;
    bool fetch_on = true;
    const cudaEvent_t* t0 = nullptr;  // optional, per layer: recorded around each fetch
    const cudaEvent_t* t1 = nullptr;
    void speculate(int l, int b, const kvscout::cuda_exec& x) { s->speculate(l, b, x); }
    void fetch(int l, int b, const kvscout::cuda_exec& x) {
      if (!fetch_on) return;
      if (t0 != nullptr) KVSCOUT_CUDA_CHECK(cudaEventRecord(t0[l], x.stream));
      s->fetch(l, b, x);
      if (t1 != nullptr) KVSCOUT_CUDA_CHECK(cudaEventRecord(t1[l], x.stream));
    }
  };
  using pipeline_t = kvscout::decode_pipeline_cuda<switch_stages>;

  explicit decode_stack(const stack_config& cfg) : cfg_(cfg), m_(cfg.model) {
    const int S = batch();
    KVSCOUT_EXPECTS(S >= 1 && S <= 64, "batch of ", S, " sequences: expected 1 to 64");
    KVSCOUT_EXPECTS(m_.q_heads % m_.kv_heads == 0, "q_heads = ", m_.q_heads,
                    " is not a multiple of kv_heads = ", m_.kv_heads);
    for (std::int32_t n : cfg.lens) KVSCOUT_EXPECTS(n >= 1, "sequence length ", n, ": expected >= 1");
    KVSCOUT_EXPECTS(cfg.budget > 0 && cfg.budget <= 1, "budget ", cfg.budget, ": expected (0, 1]");
    KVSCOUT_EXPECTS(m_.layers >= 2, "layers = ", m_.layers, ": expected at least 2");
    caches_ = cfg.distinct_caches > 0 ? std::min(cfg.distinct_caches, m_.layers) : m_.layers;
    max_len_ = *std::max_element(cfg.lens.begin(), cfg.lens.end());
    budget_rows_ = std::max(1, static_cast<int>(std::lround(cfg.budget * max_len_)));
    KVSCOUT_EXPECTS(cfg.correction_share > 0 && cfg.correction_share <= 1, "correction_share ",
                    cfg.correction_share, ": expected (0, 1]");
    extra_rows_ = std::max(1, static_cast<int>(std::lround(cfg.correction_share * budget_rows_)));
    KVSCOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    KVSCOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    KVSCOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    DECODE_STEP_CUBLAS(cublasCreate(&blas_));
    DECODE_STEP_CUBLAS(cublasSetStream(blas_, compute_));
    // A workspace of our own, so that a captured step allocates nothing (32 MiB: what cuBLAS
    // asks for on Hopper).
    DECODE_STEP_CUBLAS(cublasSetWorkspace(blas_, a_.device<std::byte>(kCublasWorkspace), kCublasWorkspace));
    for (auto* e : {&ev_sel_host_[0], &ev_sel_host_[1], &ev_fetched_[0], &ev_fetched_[1],
                    &ev_free_[0], &ev_free_[1], &ev_x_[0], &ev_x_[1]})
      KVSCOUT_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    build_model();
    build_caches();
    build_kvscout();
    build_others();
    KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  decode_stack(const decode_stack&) = delete;
  decode_stack& operator=(const decode_stack&) = delete;
  ~decode_stack() {
    pipe_.reset();
    cache_pipe_.reset();
    corr_pipe_.reset();
    for (auto* e : {ev_sel_host_[0], ev_sel_host_[1], ev_fetched_[0], ev_fetched_[1], ev_free_[0],
                    ev_free_[1], ev_x_[0], ev_x_[1]})
      if (e) KVSCOUT_CUDA_CHECK_NO_THROW(cudaEventDestroy(e));
    if (blas_) cublasDestroy(blas_);
    for (auto s : {compute_, side_, copy_})
      if (s) KVSCOUT_CUDA_CHECK_NO_THROW(cudaStreamDestroy(s));
  }

  // ---- shape and accounting ----
  [[nodiscard]] int batch() const { return static_cast<int>(cfg_.lens.size()); }
  [[nodiscard]] int layers() const { return m_.layers; }
  [[nodiscard]] int budget_rows() const { return budget_rows_; }
  /// kvscout_corrected: rows the correction may add per (sequence, kv head).
  [[nodiscard]] int extra_rows() const { return extra_rows_; }
  [[nodiscard]] cudaStream_t compute_stream() const { return compute_; }
  [[nodiscard]] const stack_config& config() const { return cfg_; }
  /// K + V bytes of one token's row pair (one kv head): 512 for fp16 rows of 128, the K code
  /// record and the V record for KIVI.
  [[nodiscard]] std::size_t row_pair_bytes() const {
    return host_layout_.k_row_bytes() + host_layout_.v_row_bytes();
  }
  /// K + V bytes of every fetchable row of one layer (what a full fetch moves).
  [[nodiscard]] std::size_t layer_bytes() const { return full_bytes_; }
  /// Row-cache hits so far (device counter).
  [[nodiscard]] unsigned long long cache_hits() const {
    unsigned long long h = 0;
    KVSCOUT_CUDA_CHECK(cudaMemcpy(&h, d_hits_, sizeof h, cudaMemcpyDeviceToHost));
    return h;
  }
  /// Rows selected per step, summed over layers, as counted on the device by the last step(s).
  [[nodiscard]] long long rows_per_step() const {
    std::vector<long long> v(1);
    KVSCOUT_CUDA_CHECK(cudaMemcpy(v.data(), d_rows_, sizeof(long long), cudaMemcpyDeviceToHost));
    return v[0];
  }
  void reset_counters() {
    KVSCOUT_CUDA_CHECK(cudaMemsetAsync(d_rows_, 0, sizeof(long long), compute_));
    KVSCOUT_CUDA_CHECK(cudaMemsetAsync(d_hits_, 0, sizeof(unsigned long long), compute_));
    KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }
  [[nodiscard]] int device_status() const {
    int s = 0;
    KVSCOUT_CUDA_CHECK(cudaMemcpy(&s, d_status_, sizeof s, cudaMemcpyDeviceToHost));
    return s;
  }

  // ---- the step ----
  /// Enqueues one decode step on the compute stream (the infinigen way also waits on the host,
  /// by its design). count_rows: add the selected rows to the device counter (a small kernel per
  /// layer; off in timed runs).
  void step(decode_way w, bool count_rows = false) {
    if constexpr (kivi) {
      KVSCOUT_EXPECTS(w != decode_way::flexgen && w != decode_way::resident, "way ", way_name(w),
                      " needs dense attention over a device-resident cache, which KIVI layouts do "
                      "not have here; KIVI runs kvscout, kvscout_row_cache, compute_only, infinigen");
      KVSCOUT_EXPECTS(w != decode_way::kvscout_corrected, "way ", way_name(w),
                      " is not built for KIVI caches (its attention would join two KIVI row sets, "
                      "each with the resident window); KIVI runs kvscout, kvscout_row_cache, "
                      "compute_only, infinigen");
    }
    kvscout::detail::launch(detail::next_input, 1, 256, 0, compute_, static_cast<const float*>(inputs_),
                            cfg_.input_ring, batch() * m_.d_model, d_step_, x_);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
    switch (w) {
      case decode_way::kvscout:
      case decode_way::kvscout_cache:
      case decode_way::kvscout_corrected:
      case decode_way::compute_only: step_kvscout(w, count_rows); break;
      case decode_way::flexgen: step_flexgen(); break;
      case decode_way::infinigen: step_infinigen(count_rows); break;
      case decode_way::resident: step_resident(); break;
    }
  }

  /// Captures one step of a kvscout way into a graph (the row cache's step parity alternates:
  /// capture two and replay them in turn). The caller destroys the exec.
  cudaGraphExec_t capture(decode_way w) {
    KVSCOUT_EXPECTS(w == decode_way::kvscout || w == decode_way::kvscout_cache ||
                        w == decode_way::kvscout_corrected || w == decode_way::compute_only ||
                        w == decode_way::resident || w == decode_way::flexgen,
                    "way ", way_name(w), " cannot be captured (it waits on the host)");
    cudaGraph_t g{};
    KVSCOUT_CUDA_CHECK(cudaStreamBeginCapture(compute_, cudaStreamCaptureModeThreadLocal));
    try {
      step(w);
    } catch (...) {
      (void)cudaStreamEndCapture(compute_, &g);
      if (g) (void)cudaGraphDestroy(g);
      throw;
    }
    KVSCOUT_CUDA_CHECK(cudaStreamEndCapture(compute_, &g));
    cudaGraphExec_t exec{};
    KVSCOUT_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    KVSCOUT_CUDA_CHECK(cudaGraphDestroy(g));
    return exec;
  }

  /// Seconds the fetches of one eager step of way w took on their stream, summed over layers
  /// (events around each fetch: the zero-copy gather, the full copies, or the staged path from
  /// the start of its host gather, which holds the copy back, to the end of its scatter).
  /// kvscout_corrected: the speculative fetches only (the correction's is part of the step, on
  /// the compute stream). Synchronises: not for timed loops.
  double fetch_seconds(decode_way w) {
    std::vector<cudaEvent_t> t0(m_.layers), t1(m_.layers);
    for (int l = 0; l < m_.layers; ++l) {
      KVSCOUT_CUDA_CHECK(cudaEventCreate(&t0[l]));
      KVSCOUT_CUDA_CHECK(cudaEventCreate(&t1[l]));
    }
    ft0_ = t0.data();
    ft1_ = t1.data();
    for (auto* p : {pipe_.get(), cache_pipe_.get(), corr_pipe_.get()}) {
      if (p == nullptr) continue;  // KIVI: no corrected pipeline
      p->stages().t0 = ft0_;
      p->stages().t1 = ft1_;
    }
    double sum = 0;
    try {
      step(w);
      KVSCOUT_CUDA_CHECK(cudaDeviceSynchronize());
      for (int l = 0; l < m_.layers; ++l) {
        float ms = 0;
        KVSCOUT_CUDA_CHECK(cudaEventElapsedTime(&ms, t0[l], t1[l]));
        sum += ms * 1e-3;
      }
    } catch (...) {
      untime(t0, t1);
      throw;
    }
    untime(t0, t1);
    return sum;
  }

  // ---- records (config.record): per layer, downloaded by the tests ----
  struct layer_record {
    std::vector<float> q;                // [B, Hq, D]
    std::vector<half> k_new, v_new;      // [B, H, D]
    std::vector<half> out;               // [B, Hq, D]
    std::vector<std::int32_t> idx, cnt;  // the selection attention read (sparse ways)
    std::vector<std::int32_t> add_idx, add_cnt;  // kvscout_corrected: the rows it added
  };
  [[nodiscard]] layer_record record(int l) const {
    KVSCOUT_EXPECTS(cfg_.record, "record(): the stack was built without config.record");
    const int S = batch(), H = m_.kv_heads, Hq = m_.q_heads;
    layer_record r;
    r.q = download(rec_q_ + static_cast<std::size_t>(l) * S * Hq * D, static_cast<std::size_t>(S) * Hq * D);
    r.k_new = download(rec_k_ + static_cast<std::size_t>(l) * S * H * D, static_cast<std::size_t>(S) * H * D);
    r.v_new = download(rec_v_ + static_cast<std::size_t>(l) * S * H * D, static_cast<std::size_t>(S) * H * D);
    r.out = download(rec_o_ + static_cast<std::size_t>(l) * S * Hq * D, static_cast<std::size_t>(S) * Hq * D);
    r.idx = download(rec_idx_ + static_cast<std::size_t>(l) * S * H * budget_rows_,
                     static_cast<std::size_t>(S) * H * budget_rows_);
    r.cnt = download(rec_cnt_ + static_cast<std::size_t>(l) * S * H, static_cast<std::size_t>(S) * H);
    r.add_idx = download(rec_add_idx_ + static_cast<std::size_t>(l) * S * H * extra_rows_,
                         static_cast<std::size_t>(S) * H * extra_rows_);
    r.add_cnt = download(rec_add_cnt_ + static_cast<std::size_t>(l) * S * H, static_cast<std::size_t>(S) * H);
    return r;
  }
  /// The host's view of layer l's cache (mapped pinned memory) and its layout.
  [[nodiscard]] kvscout::kv_view<L, kvscout::host_space> host_cache(int l) const {
    const int c = l % caches_;
    return {host_layout_, {host_k_[c], k_bytes_}, {host_v_[c], v_bytes_}};
  }
  /// KIVI: the resident buffers (device) of cache c, and of layer l's cache.
  [[nodiscard]] kvscout::kivi_resident_view<kvscout::device_space> resident_of_cache(int c) const
    requires kivi
  {
    KVSCOUT_EXPECTS(c >= 0 && c < caches_, "cache ", c, " is out of range [0, ", caches_, ")");
    const auto i = static_cast<std::size_t>(c);
    return {{kp_[i], kp_bytes_}, {kr_[i], kr_bytes_}, {vr_[i], kr_bytes_}};
  }
  [[nodiscard]] kvscout::kivi_resident_view<kvscout::device_space> resident(int l) const
    requires kivi
  {
    return resident_of_cache(cache_of(l));
  }
  /// Fetchable rows of sequence s (the cached tokens; KIVI: those with K and V quantised).
  [[nodiscard]] int fetchable(int s) const { return host_layout_.seq_len(s); }
  [[nodiscard]] int cache_of(int l) const { return l % caches_; }

 private:
  void untime(std::vector<cudaEvent_t>& t0, std::vector<cudaEvent_t>& t1) {
    ft0_ = ft1_ = nullptr;
    for (auto* p : {pipe_.get(), cache_pipe_.get(), corr_pipe_.get()})
      if (p != nullptr) p->stages().t0 = p->stages().t1 = nullptr;
    for (auto e : t0) KVSCOUT_CUDA_CHECK_NO_THROW(cudaEventDestroy(e));
    for (auto e : t1) KVSCOUT_CUDA_CHECK_NO_THROW(cudaEventDestroy(e));
  }
  void time_begin(int l, cudaStream_t s) {
    if (ft0_ != nullptr) KVSCOUT_CUDA_CHECK(cudaEventRecord(ft0_[l], s));
  }
  void time_end(int l, cudaStream_t s) {
    if (ft1_ != nullptr) KVSCOUT_CUDA_CHECK(cudaEventRecord(ft1_[l], s));
  }

  template <class T>
  static std::vector<T> download(const T* p, std::size_t n) {
    std::vector<T> v(n);
    KVSCOUT_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }

  void gemm(const half* w, int out, int in, const half* x, void* y, cudaDataType yt, float beta) {
    gemm_rows(blas_, w, out, in, x, batch(), y, yt, beta);
  }

  // ---- set-up ----
  void build_model() {
    const int S = batch(), dm = m_.d_model, Hq = m_.q_heads, H = m_.kv_heads;
    const std::size_t qkv_rows = static_cast<std::size_t>(Hq + 2 * H) * D;
    std::mt19937 rng(cfg_.seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    const float wscale = 1.f / std::sqrt(static_cast<float>(dm));
    for (int l = 0; l < m_.layers; ++l) {
      layer_weights w;
      w.qkv = a_.device<half>(qkv_rows * dm);
      w.o = a_.device<half>(static_cast<std::size_t>(dm) * Hq * D);
      w.gu = a_.device<half>(static_cast<std::size_t>(2) * m_.mlp * dm);
      w.down = a_.device<half>(static_cast<std::size_t>(dm) * m_.mlp);
      w.norm1 = a_.device<half>(dm);
      w.norm2 = a_.device<half>(dm);
      // W_Q on the host, so that the speculator's partial rows are the model's own.
      std::vector<half> wq(static_cast<std::size_t>(Hq) * D * dm);
      const std::uint64_t base = (cfg_.seed + 1000ULL * l) * 0x2545F4914F6CDD1DULL;
      for (std::size_t i = 0; i < wq.size(); ++i)
        wq[i] = kvscout::from_float<half>(wscale * 1.7f * hash_unit(base + i));
      KVSCOUT_CUDA_CHECK(cudaMemcpy(w.qkv, wq.data(), wq.size() * sizeof(half), cudaMemcpyHostToDevice));
      w.wq_host = std::move(wq);
      fill(w.qkv + static_cast<std::size_t>(Hq) * D * dm, static_cast<std::size_t>(2 * H) * D * dm, 10 * l + 1, 1.7f * wscale);
      fill(w.o, static_cast<std::size_t>(dm) * Hq * D, 10 * l + 2, 1.7f / std::sqrt(static_cast<float>(Hq * D)));
      fill(w.gu, static_cast<std::size_t>(2) * m_.mlp * dm, 10 * l + 3, 1.7f * wscale);
      fill(w.down, static_cast<std::size_t>(dm) * m_.mlp, 10 * l + 4, 1.7f / std::sqrt(static_cast<float>(m_.mlp)));
      std::vector<half> ones(dm, kvscout::from_float<half>(1.f));
      KVSCOUT_CUDA_CHECK(cudaMemcpy(w.norm1, ones.data(), dm * sizeof(half), cudaMemcpyHostToDevice));
      KVSCOUT_CUDA_CHECK(cudaMemcpy(w.norm2, ones.data(), dm * sizeof(half), cudaMemcpyHostToDevice));
      weights_.push_back(std::move(w));
    }
    KVSCOUT_EXPECTS(cfg_.input_ring >= 1, "input_ring = ", cfg_.input_ring, ": expected >= 1");
    std::vector<float> x(static_cast<std::size_t>(cfg_.input_ring) * S * dm);
    for (auto& e : x) e = nd(rng);
    inputs_ = a_.upload(x);
    x_ = a_.device<float>(static_cast<std::size_t>(S) * dm);
    d_step_ = a_.device<int>(1);
    KVSCOUT_CUDA_CHECK(cudaMemset(d_step_, 0, sizeof(int)));
    xn_ = a_.device<half>(static_cast<std::size_t>(S) * dm);
    xspec_[0] = a_.device<float>(static_cast<std::size_t>(S) * dm);
    xspec_[1] = a_.device<float>(static_cast<std::size_t>(S) * dm);
    qkv_ = a_.device<float>(static_cast<std::size_t>(S) * qkv_rows);
    q_ = a_.device<float>(static_cast<std::size_t>(S) * Hq * D);
    k_new_ = a_.device<half>(static_cast<std::size_t>(S) * H * D);
    v_new_ = a_.device<half>(static_cast<std::size_t>(S) * H * D);
    attn_ = a_.device<half>(static_cast<std::size_t>(S) * Hq * D);
    gu_ = a_.device<half>(static_cast<std::size_t>(S) * 2 * m_.mlp);
    h_ = a_.device<half>(static_cast<std::size_t>(S) * m_.mlp);
    d_lens_ = a_.upload(cfg_.lens);  // positions = lengths: the new token's position
    d_status_ = a_.device<int>(1);
    d_rows_ = a_.device<long long>(1);
    d_hits_ = a_.device<unsigned long long>(1);
    KVSCOUT_CUDA_CHECK(cudaMemset(d_status_, 0, sizeof(int)));
    KVSCOUT_CUDA_CHECK(cudaMemset(d_rows_, 0, sizeof(long long)));
    KVSCOUT_CUDA_CHECK(cudaMemset(d_hits_, 0, sizeof(unsigned long long)));
    if (cfg_.record) {
      const std::size_t NL = m_.layers;
      rec_q_ = a_.device<float>(NL * S * Hq * D);
      rec_k_ = a_.device<half>(NL * S * H * D);
      rec_v_ = a_.device<half>(NL * S * H * D);
      rec_o_ = a_.device<half>(NL * S * Hq * D);
      rec_idx_ = a_.device<std::int32_t>(NL * S * H * budget_rows_);
      rec_cnt_ = a_.device<std::int32_t>(NL * S * H);
      rec_add_idx_ = a_.device<std::int32_t>(NL * S * H * extra_rows_);
      rec_add_cnt_ = a_.device<std::int32_t>(NL * S * H);
      // Zero added rows unless the corrected way records some.
      KVSCOUT_CUDA_CHECK(cudaMemset(rec_add_cnt_, 0, NL * S * H * 4));
      KVSCOUT_CUDA_CHECK(cudaMemset(rec_idx_, 0, NL * S * H * budget_rows_ * 4));
      KVSCOUT_CUDA_CHECK(cudaMemset(rec_cnt_, 0, NL * S * H * 4));
    }
  }

  void fill(half* p, std::size_t n, std::uint64_t seed, float scale) {
    kvscout::detail::launch(detail::fill_half, detail::grid_for(n, 256), 256, 0, compute_, p, n,
                            seed + cfg_.seed * 7919ULL, scale);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
  }

  void build_caches() {
    const int H = m_.kv_heads, S = batch();
    meta_ = traits::make_meta(a_, cfg_.lens, H);
    host_layout_ = traits::host_layout(meta_, cfg_.lens, H);
    dev_layout_ = traits::device_layout(meta_, cfg_.lens, H);
    std::vector<std::int32_t> fetch_lens(S);
    for (int s = 0; s < S; ++s) fetch_lens[s] = host_layout_.seq_len(s);
    d_fetch_lens_ = a_.upload(fetch_lens);
    if constexpr (kivi) {
      k_bytes_ = host_layout_.required_k_bytes();
      v_bytes_ = host_layout_.required_v_bytes();
      kp_bytes_ = host_layout_.required_k_params_bytes();
      kr_bytes_ = host_layout_.required_residual_bytes();
      full_bytes_ = 0;
      for (int n : fetch_lens) full_bytes_ += static_cast<std::size_t>(n) * H * row_pair_bytes();
    } else if constexpr (requires { traits::bytes(host_layout_); }) {
      k_bytes_ = v_bytes_ = traits::bytes(host_layout_);
      full_ranges_ = traits::full_ranges(host_layout_, cfg_.lens, H);
    } else {
      k_bytes_ = v_bytes_ = traits::bytes_for(meta_, H);
      full_ranges_ = traits::full_ranges(meta_, H);
    }
    if constexpr (!kivi) {
      full_bytes_ = 0;
      for (const auto& r : full_ranges_) full_bytes_ += 2 * r.second;
    }
    for (int c = 0; c < caches_; ++c) {
      auto [hk, dk] = a_.mapped(k_bytes_);
      auto [hv, dv] = a_.mapped(v_bytes_);
      host_k_.push_back(hk);
      host_v_.push_back(hv);
      alias_k_.push_back(dk);
      alias_v_.push_back(dv);
      if constexpr (kivi) {
        fill(reinterpret_cast<half*>(dk), k_bytes_ / 2, 100 + 4 * c, 0.1f);
        fill(reinterpret_cast<half*>(dv), v_bytes_ / 2, 101 + 4 * c, 0.1f);
        kp_.push_back(a_.device<std::byte>(kp_bytes_));
        kr_.push_back(a_.device<std::byte>(kr_bytes_));
        vr_.push_back(a_.device<std::byte>(kr_bytes_));
        fill(reinterpret_cast<half*>(kp_.back()), kp_bytes_ / 2, 102 + 4 * c, 0.1f);
        fill(reinterpret_cast<half*>(kr_.back()), kr_bytes_ / 2, 103 + 4 * c, 1.f);
        fill(reinterpret_cast<half*>(vr_.back()), kr_bytes_ / 2, 104 + 4 * c, 1.f);
      } else {
        const dim3 grid(static_cast<unsigned>(std::min(max_len_, 4096)), static_cast<unsigned>(S),
                        static_cast<unsigned>(H));
        kvscout::detail::launch(detail::fill_cache<L>, grid, 128, 0, compute_, dev_layout_, dk, dv, c, max_len_);
        KVSCOUT_CUDA_CHECK(cudaGetLastError());
      }
    }
    KVSCOUT_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }

  void build_kvscout() {
    const int S = batch(), H = m_.kv_heads, Hq = m_.q_heads, dm = m_.d_model, NL = m_.layers;
    const int r = D / 2;
    const kvscout::rope_config rope{D, m_.rope_theta, kvscout::rope_style::split_half};
    std::vector<int> planes(r / 2);
    std::iota(planes.begin(), planes.end(), 0);
    const std::vector<kvscout::skew_plan> plans(H, kvscout::rope_planes_plan(rope, planes));
    const kvscout::infinigen_config sc{{.num_seqs = S, .num_kv_heads = H,
                                             .num_q_heads = Hq, .head_dim = D, .d_model = dm,
                                             .max_tokens = max_len_ + 1,
                                             .scale = 1.f / std::sqrt(static_cast<float>(D))}, r,
                                            kvscout::rope_mode::rope_planes,
                                            kvscout::gqa_aggregation::max_logit};
    // Prefill each cache's partial keys once; layers sharing a cache share its speculator state
    // only in content: each layer has its own speculator (own W_Q rows, own partial key cache).
    const int chunk = 2048;
    half* keys = a_.device<half>(static_cast<std::size_t>(chunk) * H * D);
    std::vector<std::int32_t> iota(static_cast<std::size_t>(max_len_) + chunk);
    std::iota(iota.begin(), iota.end(), 0);
    const std::int32_t* d_iota = a_.upload(iota);
    std::vector<const std::int32_t*> seq_const;
    for (int s = 0; s < S; ++s) seq_const.push_back(a_.upload(std::vector<std::int32_t>(chunk, s)));
    for (int l = 0; l < NL; ++l) {
      const std::size_t bytes = speculator_t::workspace_bytes(sc);
      std::byte* ws = a_.device<std::byte>(bytes);
      const auto& wq = weights_[l].wq_host;
      specs_.push_back(std::make_unique<speculator_t>(
          sc, plans, kvscout::host_span<const half>(wq.data(), wq.size()), kvscout::host_span<const half>{},
          kvscout::device_span<std::byte>(ws, bytes)));
      for (int s = 0; s < S; ++s)
        for (int t0 = 0; t0 < cfg_.lens[s]; t0 += chunk) {
          const int n = std::min(chunk, cfg_.lens[s] - t0);
          kvscout::detail::launch(detail::key_chunk, detail::grid_for(static_cast<std::size_t>(n) * H * D, 256),
                                  256, 0, compute_, keys, cache_of(l), s, t0, n, H, D);
          specs_.back()->append(kvscout::device_span<const half>(keys, static_cast<std::size_t>(n) * H * D),
                                kvscout::device_span<const std::int32_t>(seq_const[s], n),
                                kvscout::device_span<const std::int32_t>(d_iota + t0, n), n, {compute_});
        }
    }
    seq_ids_ = a_.upload([&] {
      std::vector<std::int32_t> v(S);
      std::iota(v.begin(), v.end(), 0);
      return v;
    }());
    // Selector: budget_rows per (sequence, kv head), 4 sinks and 16 recent tokens kept.
    const kvscout::topk_selector_cuda::config tc{{.num_seqs = S, .num_kv_heads = H,
                                                  .max_tokens = max_len_ + 1}, budget_rows_,
                                                 budget_rows_, {4, 16}};
    const std::size_t tb = kvscout::topk_selector_cuda::workspace_bytes(tc);
    selector_ = std::make_unique<kvscout::topk_selector_cuda>(tc, kvscout::device_span<std::byte>(a_.device<std::byte>(tb), tb));
    zc_ = std::make_unique<kvscout::zero_copy_executor_cuda<L>>(
        kvscout::zero_copy_config{.shape = {.num_seqs = S, .num_kv_heads = H},
                                  .capacity = budget_rows_,
                                  .max_blocks = cfg_.gather_blocks});
    std::vector<kvscout::kv_view<L, kvscout::device_space>> sources;
    for (int l = 0; l < NL; ++l)
      sources.push_back({dev_layout_, {alias_k_[cache_of(l)], k_bytes_}, {alias_v_[cache_of(l)], v_bytes_}});
    scores_ = a_.device<float>(static_cast<std::size_t>(S) * H * (max_len_ + 1));
    const kvscout::score_buffer<kvscout::device_space> sb{{scores_, static_cast<std::size_t>(S) * H * (max_len_ + 1)}, S, H, max_len_ + 1};
    // Positions: the new token's (the cached tokens); scored lengths: the fetchable rows.
    const kvscout::cuda_stage_lengths lengths{{d_lens_, static_cast<std::size_t>(S)},
                                              {d_fetch_lens_, static_cast<std::size_t>(S)}, max_len_};
    const std::array<kvscout::device_span<const float>, 2> xin{
        kvscout::device_span<const float>(xspec_[0], static_cast<std::size_t>(S) * dm),
        kvscout::device_span<const float>(xspec_[1], static_cast<std::size_t>(S) * dm)};
    std::vector<speculator_t*> sp;
    for (auto& p : specs_) sp.push_back(p.get());
    auto make_set = [&]() {
      const std::size_t slots = static_cast<std::size_t>(S) * H * budget_rows_;
      std::int32_t* idx = a_.device<std::int32_t>(slots);
      std::int32_t* cnt = a_.device<std::int32_t>(static_cast<std::size_t>(S) * H);
      KVSCOUT_CUDA_CHECK(cudaMemset(idx, 0, slots * 4));
      KVSCOUT_CUDA_CHECK(cudaMemset(cnt, 0, static_cast<std::size_t>(S) * H * 4));
      const std::size_t kb = slots * host_layout_.k_row_bytes(), vb = slots * host_layout_.v_row_bytes();
      std::byte* rk = a_.device<std::byte>(kb);
      std::byte* rv = a_.device<std::byte>(vb);
      return kvscout::cuda_stage_buffers{
          {{idx, slots}, {cnt, static_cast<std::size_t>(S) * H}, S, H, budget_rows_}, {{rk, kb}, {rv, vb}}};
    };
    std::vector<kvscout::cuda_stage_buffers> slot_sets, layer_sets;
    for (int i = 0; i < 2; ++i) slot_sets.push_back(make_set());
    for (int i = 0; i < 2 * NL; ++i) layer_sets.push_back(make_set());
    slot_stages_ = std::make_unique<stages_t>(sp, *selector_, *zc_, sources, sb, lengths, xin, slot_sets);
    if constexpr (!kivi) {
      // kvscout_corrected: the same speculation and slots, plus the correction's parts.
      const kvscout::correction_selector_cuda::config cc{{.num_seqs = S,
                                                          .num_kv_heads = H,
                                                          .max_tokens = max_len_ + 1}, extra_rows_,
                                                         extra_rows_};
      const std::size_t cb = kvscout::correction_selector_cuda::workspace_bytes(cc);
      corr_selector_ = std::make_unique<kvscout::correction_selector_cuda>(
          cc, kvscout::device_span<std::byte>(a_.device<std::byte>(cb), cb));
      corr_zc_ = std::make_unique<kvscout::zero_copy_executor_cuda<L>>(
          kvscout::zero_copy_config{.shape = {.num_seqs = S, .num_kv_heads = H},
                                    .capacity = extra_rows_,
                                    .max_blocks = cfg_.gather_blocks});
      const std::size_t ln = static_cast<std::size_t>(S) * H * (max_len_ + 1);
      const auto make_added = [&]() {
        const std::size_t slots = static_cast<std::size_t>(S) * H * extra_rows_;
        const std::size_t kb = slots * host_layout_.k_row_bytes(), vb = slots * host_layout_.v_row_bytes();
        return kvscout::cuda_stage_buffers{
            {{a_.device<std::int32_t>(slots), slots},
             {a_.device<std::int32_t>(static_cast<std::size_t>(S) * H), static_cast<std::size_t>(S) * H},
             S, H, extra_rows_},
            {{a_.device<std::byte>(kb), kb}, {a_.device<std::byte>(vb), vb}}};
      };
      const kvscout::cuda_stage_correction<typename stages_t::executor_type> corr{
          corr_selector_.get(), corr_zc_.get(),
          {{a_.device<float>(ln), ln}, S, H, max_len_ + 1}, {make_added(), make_added()}};
      corr_stages_ = std::make_unique<stages_t>(sp, *selector_, *zc_, sources, sb, lengths, xin, slot_sets,
                                                kvscout::cuda_stage_buffering::slots, nullptr, corr);
    }
    cache_stages_ = std::make_unique<stages_t>(sp, *selector_, *zc_, sources, sb, lengths, xin, layer_sets,
                                               kvscout::cuda_stage_buffering::row_cache, d_hits_);
    // KIVI's rows are the fetched records, then the resident window (R + G at most).
    int window = 0;
    if constexpr (kivi) window = traits::options.residual + traits::options.group;
    sparse_plan_ = kvscout::plan_decode_attention_cuda(
        {.shape = {.num_seqs = S, .num_kv_heads = H, .num_q_heads = Hq, .head_dim = D},
         .max_rows = budget_rows_ + window + 1});
    dense_plan_ = kvscout::plan_decode_attention_cuda(
        {.shape = {.num_seqs = S, .num_kv_heads = H, .num_q_heads = Hq, .head_dim = D},
         .max_rows = max_len_ + 1});
    corr_plan_ = kvscout::plan_decode_attention_cuda(
        {.shape = {.num_seqs = S, .num_kv_heads = H, .num_q_heads = Hq, .head_dim = D},
         .max_rows = budget_rows_ + extra_rows_ + 1});
    const std::size_t wsb = std::max({sparse_plan_.workspace_bytes(), dense_plan_.workspace_bytes(),
                                      corr_plan_.workspace_bytes()});
    attn_ws_ = {a_.device<std::byte>(wsb), wsb};
  }

  void build_others() {
    const int S = batch(), H = m_.kv_heads;
    if constexpr (!kivi) {
      // FlexGen: two device buffers of a whole layer, the layout bound to them.
      for (int b = 0; b < 2; ++b) {
        full_k_[b] = a_.device<std::byte>(k_bytes_);
        full_v_[b] = a_.device<std::byte>(v_bytes_);
      }
      // Resident: every cache on the device, filled with the same values as the host caches.
      for (int c = 0; c < caches_; ++c) {
        res_k_.push_back(a_.device<std::byte>(k_bytes_));
        res_v_.push_back(a_.device<std::byte>(v_bytes_));
        KVSCOUT_CUDA_CHECK(cudaMemcpy(res_k_.back(), host_k_[c], k_bytes_, cudaMemcpyHostToDevice));
        KVSCOUT_CUDA_CHECK(cudaMemcpy(res_v_.back(), host_v_[c], v_bytes_, cudaMemcpyHostToDevice));
      }
    }
    // InfiniGen: the staged executor on the copy stream, the selection's host copies.
    const kvscout::staged_config stc{.shape = {.num_seqs = S, .num_kv_heads = H},
                                     .capacity = budget_rows_,
                                     .k_row_bytes = host_layout_.k_row_bytes(),
                                     .v_row_bytes = host_layout_.v_row_bytes(),
                                     .threads = std::max(1, cfg_.staged_threads)};
    using staged_t = kvscout::staged_executor_cuda<L>;
    const std::size_t hb = staged_t::workspace_bytes(stc), db = staged_t::device_workspace_bytes(stc);
    std::byte* hws = a_.pinned<std::byte>(hb);
    staged_ = std::make_unique<staged_t>(stc, kvscout::host_span<std::byte>(hws, hb),
                                         kvscout::device_span<std::byte>(a_.device<std::byte>(db), db));
    const std::size_t slots = static_cast<std::size_t>(S) * H * budget_rows_;
    for (int b = 0; b < 2; ++b) {
      host_idx_[b] = a_.pinned<std::int32_t>(slots);
      host_cnt_[b] = a_.pinned<std::int32_t>(static_cast<std::size_t>(S) * H);
    }
    pipe_ = std::make_unique<pipeline_t>(
        kvscout::cuda_pipeline_config{.shape = {.num_layers = m_.layers}, .skip_layers = 0},
        switch_stages{slot_stages_.get(), true});
    cache_pipe_ = std::make_unique<pipeline_t>(
        kvscout::cuda_pipeline_config{.shape = {.num_layers = m_.layers}, .skip_layers = 0},
        switch_stages{cache_stages_.get(), true});
    if constexpr (!kivi)
      corr_pipe_ = std::make_unique<pipeline_t>(
          kvscout::cuda_pipeline_config{.shape = {.num_layers = m_.layers}, .skip_layers = 0},
          switch_stages{corr_stages_.get(), true});
  }

  // ---- pieces of a layer on the compute stream ----
  // RMSNorm into xn (half) and the speculation input of slot `spec_slot` (and of the other slot
  // too when both_slots: layer 0 feeds its own speculation and layer 1's).
  void norm_in(int l, int spec_slot, bool both_slots) {
    const int S = batch();
    kvscout::detail::launch(detail::rmsnorm, static_cast<unsigned>(S), 256, 0, compute_, x_,
                            weights_[l].norm1, xn_, spec_slot >= 0 ? xspec_[spec_slot] : nullptr,
                            both_slots ? xspec_[spec_slot ^ 1] : nullptr, m_.d_model, m_.eps);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
  }
  void qkv_rope(int l) {
    const int S = batch();
    gemm(weights_[l].qkv, (m_.q_heads + 2 * m_.kv_heads) * D, m_.d_model, xn_, qkv_, CUDA_R_32F, 0.f);
    kvscout::detail::launch(detail::rope_split, static_cast<unsigned>(S), 256, 0, compute_, qkv_,
                            d_lens_, q_, k_new_, v_new_, m_.q_heads, m_.kv_heads, D, m_.rope_theta);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
  }
  kvscout::current_token<half, kvscout::device_space> current() const {
    const std::size_t n = static_cast<std::size_t>(batch()) * m_.kv_heads * D;
    return {{k_new_, n}, {v_new_, n}};
  }
  kvscout::device_span<const float> qspan() const {
    return {q_, static_cast<std::size_t>(batch()) * m_.q_heads * D};
  }
  kvscout::device_span<half> ospan() const {
    return {attn_, static_cast<std::size_t>(batch()) * m_.q_heads * D};
  }
  kvscout::attention_params aparams() const {
    return {.num_q_heads = m_.q_heads, .scale = 1.f / std::sqrt(static_cast<float>(D))};
  }
  void attend_sparse(int l, const kvscout::cuda_stage_buffers& buf) {
    if constexpr (kivi) {
      const kvscout::kivi_gathered_rows_cuda<L> rows(dev_layout_, buf.selection.view(), buf.rows, resident(l));
      kvscout::decode_attention_cuda(rows, current(), qspan(), ospan(), aparams(), sparse_plan_,
                                     attn_ws_, {compute_, d_status_});
    } else {
      const kvscout::gathered_rows_cuda<half, D> rows(buf.selection.view(), buf.rows);
      kvscout::decode_attention_cuda(rows, current(), qspan(), ospan(), aparams(), sparse_plan_,
                                     attn_ws_, {compute_, d_status_});
    }
  }
  // kvscout_corrected: the speculated rows and the rows the correction added, read in place.
  void attend_joined(const kvscout::cuda_stage_buffers& buf, const kvscout::cuda_stage_buffers& add) {
    if constexpr (!kivi) {
      const kvscout::joined_rows_cuda rows(
          kvscout::gathered_rows_cuda<half, D>(buf.selection.view(), buf.rows),
          kvscout::gathered_rows_cuda<half, D>(add.selection.view(), add.rows));
      kvscout::decode_attention_cuda(rows, current(), qspan(), ospan(), aparams(), corr_plan_,
                                     attn_ws_, {compute_, d_status_});
    }
  }
  void attend_dense(std::byte* k, std::byte* v) {
    if constexpr (!kivi) {
      const kvscout::layout_rows_cuda<L> rows(kvscout::kv_view<L, kvscout::device_space>{
          dev_layout_, {k, k_bytes_}, {v, v_bytes_}});
      kvscout::decode_attention_cuda(rows, current(), qspan(), ospan(), aparams(), dense_plan_,
                                     attn_ws_, {compute_, d_status_});
    }
  }
  // Append the new token into layer l's cache (host-mapped or device) and partial keys; then the
  // rest of the layer.
  void finish_layer(int l, std::byte* k_cache, std::byte* v_cache, bool partial_keys) {
    const int S = batch();
    const std::size_t n = static_cast<std::size_t>(S) * m_.kv_heads * D;
    if (cfg_.record) record_layer(l);
    if constexpr (!kivi) {
      kvscout::append_token_cuda(dev_layout_, kvscout::device_span<std::byte>(k_cache, k_bytes_),
                                 kvscout::device_span<std::byte>(v_cache, v_bytes_),
                                 kvscout::device_span<const half>(k_new_, n),
                                 kvscout::device_span<const half>(v_new_, n), d_lens_,
                                 {compute_, d_status_});
    }
    if (partial_keys)
      specs_[l]->append(kvscout::device_span<const half>(k_new_, n),
                        kvscout::device_span<const std::int32_t>(seq_ids_, S),
                        kvscout::device_span<const std::int32_t>(d_lens_, S), S, {compute_, d_status_});
    const auto& w = weights_[l];
    gemm(w.o, m_.d_model, m_.q_heads * D, attn_, x_, CUDA_R_32F, 1.f);
    kvscout::detail::launch(detail::rmsnorm, static_cast<unsigned>(S), 256, 0, compute_, x_, w.norm2,
                            xn_, static_cast<float*>(nullptr), static_cast<float*>(nullptr), m_.d_model, m_.eps);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
    gemm(w.gu, 2 * m_.mlp, m_.d_model, xn_, gu_, CUDA_R_16F, 0.f);
    const std::size_t hn = static_cast<std::size_t>(S) * m_.mlp;
    kvscout::detail::launch(detail::silu_mul, detail::grid_for(hn, 256), 256, 0, compute_, gu_, h_, m_.mlp, S);
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
    gemm(w.down, m_.d_model, m_.mlp, h_, x_, CUDA_R_32F, 1.f);
  }
  void record_layer(int l) {
    const int S = batch(), H = m_.kv_heads, Hq = m_.q_heads;
    const std::size_t qn = static_cast<std::size_t>(S) * Hq * D, kn = static_cast<std::size_t>(S) * H * D;
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(rec_q_ + l * qn, q_, qn * 4, cudaMemcpyDeviceToDevice, compute_));
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(rec_k_ + l * kn, k_new_, kn * 2, cudaMemcpyDeviceToDevice, compute_));
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(rec_v_ + l * kn, v_new_, kn * 2, cudaMemcpyDeviceToDevice, compute_));
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(rec_o_ + l * qn, attn_, qn * 2, cudaMemcpyDeviceToDevice, compute_));
    const std::size_t cn = static_cast<std::size_t>(S) * H;
    if (rec_sel_ != nullptr) {
      const std::size_t sn = cn * budget_rows_;
      KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(rec_idx_ + l * sn, rec_sel_->indices.data(), sn * 4, cudaMemcpyDeviceToDevice, compute_));
      KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(rec_cnt_ + l * cn, rec_sel_->counts.data(), cn * 4, cudaMemcpyDeviceToDevice, compute_));
    }
    if (rec_add_ != nullptr) {
      const std::size_t an = cn * extra_rows_;
      KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(rec_add_idx_ + l * an, rec_add_->indices.data(), an * 4, cudaMemcpyDeviceToDevice, compute_));
      KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(rec_add_cnt_ + l * cn, rec_add_->counts.data(), cn * 4, cudaMemcpyDeviceToDevice, compute_));
    } else if (cfg_.record) {
      KVSCOUT_CUDA_CHECK(cudaMemsetAsync(rec_add_cnt_ + l * cn, 0, cn * 4, compute_));
    }
  }
  void count_rows(const kvscout::selection_buffers<kvscout::device_space>& sel);

  // ---- the ways ----
  void step_kvscout(decode_way w, bool count) {
    const bool cache = w == decode_way::kvscout_cache;
    const bool corrected = w == decode_way::kvscout_corrected;
    pipeline_t& pipe = cache ? *cache_pipe_ : (corrected ? *corr_pipe_ : *pipe_);
    stages_t& st = cache ? *cache_stages_ : (corrected ? *corr_stages_ : *slot_stages_);
    pipe.stages().fetch_on = w != decode_way::compute_only;
    for (int i = 0; i < m_.layers; ++i) {
      norm_in(i, pipeline_t::slot(i + 1), i == 0);
      const kvscout::cuda_pipeline_exec x{compute_, side_, copy_, d_status_};
      if (i == 0) pipe.speculate_first(x);
      pipe.input_ready(i, x);
      qkv_rope(i);
      pipe.wait_rows(i, x);
      const kvscout::cuda_stage_buffers& buf = st.buffers(i, pipeline_t::slot(i));
      if (count) count_rows(buf.selection);
      if (corrected) {
        // Layer i's query exists: the correction step, on the critical path.
        st.correct(i, pipeline_t::slot(i), qspan(), {compute_, d_status_});
        const kvscout::cuda_stage_buffers& add = st.added(i, pipeline_t::slot(i));
        if (count) count_rows(add.selection);
        attend_joined(buf, add);
        rec_add_ = &add.selection;
      } else {
        attend_sparse(i, buf);
      }
      rec_sel_ = &buf.selection;
      finish_layer(i, alias_k_[cache_of(i)], alias_v_[cache_of(i)], true);
      rec_sel_ = nullptr;
      rec_add_ = nullptr;
    }
    st.next_step();
  }

  void full_fetch(int l, int b) {
    KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(copy_, ev_free_[b], 0));
    const int c = cache_of(l);
    time_begin(l, copy_);
    for (const auto& [off, n] : full_ranges_) {
      KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(full_k_[b] + off, host_k_[c] + off, n, cudaMemcpyHostToDevice, copy_));
      KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(full_v_[b] + off, host_v_[c] + off, n, cudaMemcpyHostToDevice, copy_));
    }
    time_end(l, copy_);
    KVSCOUT_CUDA_CHECK(cudaEventRecord(ev_fetched_[b], copy_));
  }
  void step_flexgen() {
    // The copy stream joins the compute stream's order at the start (a captured step forks here).
    KVSCOUT_CUDA_CHECK(cudaEventRecord(ev_free_[0], compute_));
    KVSCOUT_CUDA_CHECK(cudaEventRecord(ev_free_[1], compute_));
    full_fetch(0, 0);
    for (int i = 0; i < m_.layers; ++i) {
      if (i + 1 < m_.layers) full_fetch(i + 1, (i + 1) % 2);
      norm_in(i, -1, false);
      qkv_rope(i);
      KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(compute_, ev_fetched_[i % 2], 0));
      attend_dense(full_k_[i % 2], full_v_[i % 2]);
      KVSCOUT_CUDA_CHECK(cudaEventRecord(ev_free_[i % 2], compute_));
      finish_layer(i, alias_k_[cache_of(i)], alias_v_[cache_of(i)], false);
    }
  }

  void step_resident() {
    for (int i = 0; i < m_.layers; ++i) {
      norm_in(i, -1, false);
      qkv_rope(i);
      attend_dense(res_k_[cache_of(i)], res_v_[cache_of(i)]);
      finish_layer(i, res_k_[cache_of(i)], res_v_[cache_of(i)], false);
    }
  }

  // InfiniGen's path: speculation of layer i + 1 on the side stream, its selection copied to
  // pinned host memory; once layer i is enqueued the host waits for that copy, gathers the rows
  // (staged_executor_cuda: host threads, one bulk copy, a scatter) on the copy stream.
  void speculate_to_host(int l) {
    const int b = l % 2;
    KVSCOUT_CUDA_CHECK(cudaEventRecord(ev_x_[b], compute_));
    KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(side_, ev_x_[b], 0));
    slot_stages_->speculate(l, b, {side_, d_status_});
    const auto& sel = slot_stages_->buffers(l, b).selection;
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(host_idx_[b], sel.indices.data(), sel.indices.size() * 4, cudaMemcpyDeviceToHost, side_));
    KVSCOUT_CUDA_CHECK(cudaMemcpyAsync(host_cnt_[b], sel.counts.data(), sel.counts.size() * 4, cudaMemcpyDeviceToHost, side_));
    KVSCOUT_CUDA_CHECK(cudaEventRecord(ev_sel_host_[b], side_));
  }
  void gather_on_host(int l) {
    const int b = l % 2, S = batch(), H = m_.kv_heads;
    KVSCOUT_CUDA_CHECK(cudaEventSynchronize(ev_sel_host_[b]));  // the design's read-back
    const std::size_t slots = static_cast<std::size_t>(S) * H * budget_rows_;
    const kvscout::selection_view<kvscout::host_space> hs{{host_idx_[b], slots},
                                                          {host_cnt_[b], static_cast<std::size_t>(S) * H},
                                                          S, H, budget_rows_};
    KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(copy_, ev_free_[b], 0));  // attention(l - 2) read the rows
    time_begin(l, copy_);
    (void)staged_->submit(host_cache(l), hs, slot_stages_->buffers(l, b).rows, {copy_});
    time_end(l, copy_);
    KVSCOUT_CUDA_CHECK(cudaEventRecord(ev_fetched_[b], copy_));
  }
  void step_infinigen(bool count) {
    KVSCOUT_CUDA_CHECK(cudaEventRecord(ev_free_[0], compute_));
    KVSCOUT_CUDA_CHECK(cudaEventRecord(ev_free_[1], compute_));
    for (int i = 0; i < m_.layers; ++i) {
      norm_in(i, (i + 1) % 2, i == 0);
      if (i == 0) {
        speculate_to_host(0);
        gather_on_host(0);  // nothing to hide layer 0's fetch behind
      }
      if (i + 1 < m_.layers) speculate_to_host(i + 1);
      qkv_rope(i);
      KVSCOUT_CUDA_CHECK(cudaStreamWaitEvent(compute_, ev_fetched_[i % 2], 0));
      const kvscout::cuda_stage_buffers& buf = slot_stages_->buffers(i, i % 2);
      if (count) count_rows(buf.selection);
      attend_sparse(i, buf);
      KVSCOUT_CUDA_CHECK(cudaEventRecord(ev_free_[i % 2], compute_));
      rec_sel_ = &buf.selection;
      finish_layer(i, alias_k_[cache_of(i)], alias_v_[cache_of(i)], true);
      rec_sel_ = nullptr;
      if (i + 1 < m_.layers) gather_on_host(i + 1);  // while the GPU runs layer i
    }
  }

  struct layer_weights {
    half *qkv = nullptr, *o = nullptr, *gu = nullptr, *down = nullptr, *norm1 = nullptr, *norm2 = nullptr;
    std::vector<half> wq_host;
  };

  static constexpr std::size_t kCublasWorkspace = std::size_t{32} << 20;
  arena a_;  // first: freed last
  stack_config cfg_;
  model_shape m_;
  int caches_ = 0, max_len_ = 0, budget_rows_ = 0, extra_rows_ = 0;
  cudaStream_t compute_{}, side_{}, copy_{};
  cublasHandle_t blas_{};
  cudaEvent_t ev_sel_host_[2]{}, ev_fetched_[2]{}, ev_free_[2]{}, ev_x_[2]{};
  std::vector<layer_weights> weights_;
  float *x_ = nullptr, *xspec_[2] = {nullptr, nullptr}, *qkv_ = nullptr, *q_ = nullptr;
  float* inputs_ = nullptr;  // [input_ring, B, d_model]
  int* d_step_ = nullptr;    // which input the next step takes
  half *xn_ = nullptr, *k_new_ = nullptr, *v_new_ = nullptr, *attn_ = nullptr, *gu_ = nullptr, *h_ = nullptr;
  std::int32_t* d_lens_ = nullptr;
  const std::int32_t* seq_ids_ = nullptr;
  int* d_status_ = nullptr;
  long long* d_rows_ = nullptr;
  unsigned long long* d_hits_ = nullptr;
  typename traits::meta meta_{};
  L host_layout_{}, dev_layout_{};
  std::size_t k_bytes_ = 0, v_bytes_ = 0, full_bytes_ = 0, kp_bytes_ = 0, kr_bytes_ = 0;
  const std::int32_t* d_fetch_lens_ = nullptr;
  std::vector<std::byte*> kp_, kr_, vr_;  // KIVI resident buffers, per cache
  std::vector<std::pair<std::size_t, std::size_t>> full_ranges_;
  std::vector<std::byte*> host_k_, host_v_, alias_k_, alias_v_, res_k_, res_v_;
  std::byte *full_k_[2] = {nullptr, nullptr}, *full_v_[2] = {nullptr, nullptr};
  std::vector<std::unique_ptr<speculator_t>> specs_;
  std::unique_ptr<kvscout::topk_selector_cuda> selector_;
  std::unique_ptr<kvscout::zero_copy_executor_cuda<L>> zc_;
  std::unique_ptr<kvscout::staged_executor_cuda<L>> staged_;
  float* scores_ = nullptr;
  std::unique_ptr<kvscout::correction_selector_cuda> corr_selector_;  // kvscout_corrected
  std::unique_ptr<kvscout::zero_copy_executor_cuda<L>> corr_zc_;
  std::unique_ptr<stages_t> slot_stages_, cache_stages_, corr_stages_;
  std::unique_ptr<pipeline_t> pipe_, cache_pipe_, corr_pipe_;
  kvscout::decode_attention_plan sparse_plan_{}, dense_plan_{}, corr_plan_{};
  kvscout::device_span<std::byte> attn_ws_{};
  std::int32_t* host_idx_[2] = {nullptr, nullptr};
  std::int32_t* host_cnt_[2] = {nullptr, nullptr};
  // records
  float* rec_q_ = nullptr;
  half *rec_k_ = nullptr, *rec_v_ = nullptr, *rec_o_ = nullptr;
  std::int32_t *rec_idx_ = nullptr, *rec_cnt_ = nullptr, *rec_add_idx_ = nullptr, *rec_add_cnt_ = nullptr;
  const kvscout::selection_buffers<kvscout::device_space>* rec_sel_ = nullptr;
  const kvscout::selection_buffers<kvscout::device_space>* rec_add_ = nullptr;
  const cudaEvent_t* ft0_ = nullptr;  // fetch_seconds(): events around each layer's fetch
  const cudaEvent_t* ft1_ = nullptr;
};

namespace detail {
__global__ void sum_counts(const std::int32_t* counts, int n, long long* total) {
  long long s = 0;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) s += counts[i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) atomicAdd(reinterpret_cast<unsigned long long*>(total), static_cast<unsigned long long>(s));
}
}  // namespace detail

template <class L>
void decode_stack<L>::count_rows(const kvscout::selection_buffers<kvscout::device_space>& sel) {
  kvscout::detail::launch(detail::sum_counts, 1, 128, 0, compute_, sel.counts.data(),
                          static_cast<int>(sel.counts.size()), d_rows_);
  KVSCOUT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace decode_step
