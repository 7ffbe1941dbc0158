#pragma once
// The execution argument: how and where a call runs, passed by value as the LAST argument of
// every call that enqueues device work. Nothing in kvscout stores a stream or a status word, so
// one object (an executor, a selector, a policy) serves several streams.
//
//   kvscout::cuda_exec x{stream, d_status};               // d_status: optional
//   fetch.submit(src, sel, dst, x);                       // executors (fetch/)
//   host_fetch.submit(src, sel, dst, kvscout::host_exec{});   // the host twin
//
// decode_pipeline_cuda spans three streams: its calls take a cuda_pipeline_exec and hand each
// stage a cuda_exec of its role's stream. Builds without the CUDA headers: a cudaStream_t
// converts to CUstream_st* and back with no cast.

struct CUstream_st;  // the CUDA runtime's stream object (cudaStream_t is CUstream_st*)

namespace kvscout {

/// The stream the call enqueues on (null: the legacy default stream) and the optional device status
/// word its kernels report into (core/device_status.hpp).
struct cuda_exec {
  CUstream_st* stream = nullptr;
  int* status = nullptr;
};

class thread_pool;

/// Where a host call runs: on the calling thread, or split over `pool` where the call can use one
/// (decode_attention_host; parts that own threads, such as the host gather, use their own). Host
/// calls throw instead of reporting.
struct host_exec {
  thread_pool* pool = nullptr;
};

}  // namespace kvscout
