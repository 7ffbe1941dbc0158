#pragma once
// streaming_policy_cuda: attention sinks + a recent window (StreamingLLM) on the device, the
// scores of streaming_policy_host bit for bit:
//
//   score[s, h, t] = +inf for t < sinks, float(t) otherwise,   t < seq_lens[s]
//
// so a top-k selector with budget B keeps the sinks and the B - sinks most recent tokens. A
// threshold selector is no use here: with sinks the row maximum is +inf. The policy needs no
// query, no keys and no workspace, and one object serves every layer: the smallest example of a
// speculation_policy_cuda.
//
//   kvscout::streaming_policy_cuda p({.shape = {.num_kv_heads = 8}, .sinks = 4});
//   p.score({.seq_lens = lens, .max_seq_len = max_len}, scores, {stream, d_status});

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvscout/core/device_status.hpp"
#include "kvscout/core/cuda_check.hpp"
#include "kvscout/core/detail/launch.cuh"
#include "kvscout/core/error.hpp"
#include "kvscout/core/exec.hpp"
#include "kvscout/core/shape.hpp"
#include "kvscout/score/device_concepts.hpp"
#include "kvscout/score/streaming.hpp"

namespace kvscout {

namespace detail {

inline constexpr int streaming_block_threads = 256;
inline constexpr int streaming_tokens_per_thread = 4;

struct streaming_params {
  float* scores;
  const int32_t* seq_lens;
  int num_kv_heads;
  int stride;
  int max_len;
  int sinks;
  int* status;  // the device status word, or null
};

// Each thread writes tokens_per_thread tokens, block_threads apart (coalesced stores). A template
// only so that the header can be included by several translation units.
template <int Unused = 0>
__global__ void __launch_bounds__(streaming_block_threads)
    streaming_scores(const __grid_constant__ streaming_params p) {
  const int s = static_cast<int>(blockIdx.z);
  const int h = static_cast<int>(blockIdx.y);
  const int n = p.seq_lens[s];
  const bool bad = n < 0 || n > p.max_len;
  if (bad && threadIdx.x == 0) detail::raise_device_status(p.status, device_status::bad_length);
  const int len = n < 0 ? 0 : (n > p.max_len ? p.max_len : n);
  const int t0 = static_cast<int>(blockIdx.x) * streaming_block_threads * streaming_tokens_per_thread;
  float* row = p.scores + (static_cast<std::size_t>(s) * p.num_kv_heads + h) * p.stride;
  for (int k = 0; k < streaming_tokens_per_thread; ++k) {
    const int t = t0 + k * streaming_block_threads + static_cast<int>(threadIdx.x);
    if (t >= len) break;
    row[t] = t < p.sinks ? INFINITY : static_cast<float>(t);
  }
}

}  // namespace detail

class streaming_policy_cuda {
 public:
  using config = detail::streaming_config;  // streaming_policy_host's
  using config_type = config;

  explicit streaming_policy_cuda(const config& cfg) : cfg_(cfg) {
    KVSCOUT_EXPECTS(cfg.shape.num_kv_heads > 0, "num_kv_heads must be positive, got ",
                    cfg.shape.num_kv_heads);
    KVSCOUT_EXPECTS(cfg.shape.num_kv_heads <= 65535, "num_kv_heads = ", cfg.shape.num_kv_heads,
                    " exceeds the grid's 65535");
    KVSCOUT_EXPECTS(cfg.sinks >= 0, "sinks must be non-negative, got ", cfg.sinks);
  }

  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }

  /// seq_lens clamped to max_seq_len (raising device_status::bad_length). max_seq_len = 0 launches
  /// nothing.
  void score(const score_context<device_space>& ctx, const score_buffer<device_space>& out,
             const cuda_exec& exec) const {
    const cudaStream_t stream = exec.stream;
    detail::check_device_score_call(cfg_.shape.num_kv_heads, ctx, out);
    constexpr int per_block = detail::streaming_block_threads * detail::streaming_tokens_per_thread;
    KVSCOUT_EXPECTS(out.num_seqs <= 65535, "score buffer num_seqs = ", out.num_seqs,
                    " exceeds the grid's 65535");
    KVSCOUT_EXPECTS(ctx.max_seq_len <= INT_MAX - per_block, "max_seq_len = ", ctx.max_seq_len,
                    " exceeds ", INT_MAX - per_block);
    if (ctx.max_seq_len == 0) return;
    const dim3 grid(static_cast<unsigned>((ctx.max_seq_len + per_block - 1) / per_block),
                    static_cast<unsigned>(cfg_.shape.num_kv_heads),
                    static_cast<unsigned>(out.num_seqs));
    detail::launch(detail::streaming_scores<>, grid, detail::streaming_block_threads, 0, stream,
                   detail::streaming_params{out.scores.data(), ctx.seq_lens.data(),
                                            cfg_.shape.num_kv_heads, out.stride, ctx.max_seq_len,
                                            cfg_.sinks, exec.status});
    KVSCOUT_CUDA_CHECK(cudaGetLastError());
  }

 private:
  config cfg_;
};

static_assert(speculation_policy_cuda<streaming_policy_cuda>);

}  // namespace kvscout
