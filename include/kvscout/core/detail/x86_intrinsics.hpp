#pragma once
// The x86 intrinsics kvscout's host scans and copies use, included in one place:
//   KVSCOUT_HOST_SSE2    1 where the host compiler targets SSE2 (every x86-64), outside the
//                        device pass of nvcc: <emmintrin.h>
//   KVSCOUT_HOST_AVX512  1 where it also targets AVX-512F (e.g. -march=native on such a CPU),
//                        and the file is not compiled by nvcc: <immintrin.h>
//   KVSCOUT_HOST_AVX2    1 where it targets AVX2 but not AVX-512F (x86-64-v3: AMD Zen 1 to 3,
//                        Intel Haswell to Alder Lake), not under nvcc: <immintrin.h>. The scans
//                        that have an AVX-512 form take this one in its place.
//   KVSCOUT_HOST_F16C    1 where it targets F16C (x86-64-v3 and later), not under nvcc:
//                        <immintrin.h>
//   KVSCOUT_HOST_FMA     1 where it targets FMA (with AVX; x86-64-v3 and later), not under
//                        nvcc: <immintrin.h>
// GCC 12 reports a false "may be used uninitialized" inside its own _mm512_reduce_max_ps; the
// warning is issued at the intrinsic's definition, so the header is included here, once, with
// that warning silenced, before anything else can include it without.
//
// Every translation unit of a program that includes kvscout should be compiled for the same
// target: the vector paths are chosen at compile time, and inline functions compiled for
// different targets are different definitions of one function.

#include "kvscout/core/config.hpp"

#if defined(__SSE2__) && !KVSCOUT_DEVICE_PASS
#define KVSCOUT_HOST_SSE2 1
#else
#define KVSCOUT_HOST_SSE2 0
#endif

#if KVSCOUT_HOST_SSE2 && defined(__AVX512F__) && !defined(__CUDACC__)
#define KVSCOUT_HOST_AVX512 1
#else
#define KVSCOUT_HOST_AVX512 0
#endif

#if KVSCOUT_HOST_SSE2 && defined(__AVX2__) && !KVSCOUT_HOST_AVX512 && !defined(__CUDACC__)
#define KVSCOUT_HOST_AVX2 1
#else
#define KVSCOUT_HOST_AVX2 0
#endif

// F16C (every x86-64-v3 target): the half <-> float conversions of the host GEMV.
#if KVSCOUT_HOST_SSE2 && defined(__F16C__) && !defined(__CUDACC__)
#define KVSCOUT_HOST_F16C 1
#else
#define KVSCOUT_HOST_F16C 0
#endif

// FMA (the host kernels' explicit multiply-adds, core/simd.hpp).
#if KVSCOUT_HOST_SSE2 && defined(__FMA__) && !defined(__CUDACC__)
#define KVSCOUT_HOST_FMA 1
#else
#define KVSCOUT_HOST_FMA 0
#endif

#if KVSCOUT_HOST_AVX512 || KVSCOUT_HOST_AVX2 || KVSCOUT_HOST_F16C || KVSCOUT_HOST_FMA
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#elif KVSCOUT_HOST_SSE2
#include <emmintrin.h>
#endif
