#pragma once
// The execution argument: how and where a call runs, passed by value as the LAST argument of
// every call that enqueues device work (CUB's and FlashInfer's stream argument, with the device
// status word beside it). Nothing in kvscout stores a stream or a status word: each call gets
// its own, so one object (an executor, a selector, a policy) serves several streams.
//
//   kvscout::cuda_exec x{stream, d_status};               // d_status: optional, see below
//   fetch.submit(src, sel, dst, x);                       // executors (fetch/)
//   selector.select(scores, out, x);                      // device selectors (select/*.cuh)
//   policy.score(ctx, scores, x);                         // device policies (score/*.cuh)
//   kvscout::decode_attention_cuda(rows, cur, q, out, params, plan, ws, x);
//   kvscout::append_token_cuda(layout, k, v, k_new, v_new, positions, x);
//   host_fetch.submit(src, sel, dst, kvscout::host_exec{});   // the host twin
//
// decode_pipeline_cuda spans three streams: its calls take a cuda_pipeline_exec (the compute,
// speculate and copy streams and the status word; pipeline/cuda_pipeline.hpp) and hand each stage
// a cuda_exec of its role's stream.
//
// cuda_exec::status is the device status word (core/device_status.hpp): an int in device memory
// the kernels OR error bits into; null turns the reporting off, never the checks.
//
// Builds with a plain host compiler and without the CUDA headers: the stream is held as a
// pointer to the runtime's opaque CUstream_st, the type cudaStream_t names, so a cudaStream_t
// converts to it and back with no cast.

struct CUstream_st;  // the CUDA runtime's stream object (cudaStream_t is CUstream_st*)

namespace kvscout {

/// Device execution: the stream the call enqueues on (null: the legacy default stream) and the
/// optional device status word its kernels report into (core/device_status.hpp).
struct cuda_exec {
  CUstream_st* stream = nullptr;
  int* status = nullptr;
};

/// Host execution: the host twin of cuda_exec, empty for now (host calls run on the calling
/// thread or on the pool the object was built with, and throw instead of reporting).
struct host_exec {};

}  // namespace kvscout
