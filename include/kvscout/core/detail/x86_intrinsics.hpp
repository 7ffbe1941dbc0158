#pragma once
// The x86 intrinsics kvscout's host scans and copies use, included in one place; each macro is 1
// where the host compiler targets the extension, outside nvcc:
//   KVSCOUT_HOST_SSE2    every x86-64: <emmintrin.h>
//   KVSCOUT_HOST_AVX512  AVX-512F: <immintrin.h>
//   KVSCOUT_HOST_AVX2    AVX2 but not AVX-512F (the scans with an AVX-512 form take that instead)
//   KVSCOUT_HOST_F16C, KVSCOUT_HOST_FMA   x86-64-v3 and later
// GCC 12 reports a false "may be used uninitialized" inside its own _mm512_reduce_max_ps, at the
// intrinsic's definition, so the header is included here, once, with that warning silenced.
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

#if KVSCOUT_HOST_SSE2 && defined(__F16C__) && !defined(__CUDACC__)
#define KVSCOUT_HOST_F16C 1
#else
#define KVSCOUT_HOST_F16C 0
#endif

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
