#pragma once
// The host selectors' vectorised row scans (SSE2 / AVX2 / AVX-512, each with a portable form):
// the row maximum and the count of scores at or above a bound (max_of, count_at_least, the
// carried maxima max_carry256 / max_carry512 that other scans step), and the compress / emit
// steps that write the indices of the scores at or above a bound. select/detail/host_rows.hpp
// builds the selectors' row pipeline on them.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvscout/core/config.hpp"
#include "kvscout/core/detail/host_vec.hpp"
#include "kvscout/core/detail/x86_intrinsics.hpp"

namespace kvscout::detail {

inline constexpr bool select_simd = KVSCOUT_HOST_SSE2 != 0;

#if KVSCOUT_HOST_AVX512
/// The largest non-NaN of q[0, qn) and init, 64 scores a step, so that another scan's loop can
/// carry it; max_of uses it too, so both give the same bits.
struct max_carry512 {
  __m512 a[4];
  int j = 0;  // q[0, j) is in a
  explicit max_carry512(float init)
      : a{_mm512_set1_ps(init), _mm512_set1_ps(init), _mm512_set1_ps(init),
          _mm512_set1_ps(init)} {}
  void step(const float* q, int qn) {
    if (j + 64 > qn) return;
    // _mm512_max_ps(x, acc) returns acc where x is NaN: NaN is ignored.
    KVSCOUT_HOST_UNROLL
    for (int v = 0; v < 4; ++v) a[v] = _mm512_max_ps(_mm512_loadu_ps(q + j + 16 * v), a[v]);
    j += 64;
  }
  float result(const float* q, int qn) {
    while (j + 64 <= qn) step(q, qn);
    float m = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_max_ps(a[0], a[1]), _mm512_max_ps(a[2], a[3])));
    for (; j < qn; ++j) m = q[j] > m ? q[j] : m;
    return m;
  }
};
#elif KVSCOUT_HOST_AVX2
inline float horizontal_max256(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_shuffle_ps(m, m, 0x4e));
  m = _mm_max_ps(m, _mm_shuffle_ps(m, m, 0xb1));
  return _mm_cvtss_f32(m);
}

struct max_carry256 {
  __m256 a[4];
  int j = 0;  // q[0, j) is in a
  explicit max_carry256(float init)
      : a{_mm256_set1_ps(init), _mm256_set1_ps(init), _mm256_set1_ps(init),
          _mm256_set1_ps(init)} {}
  void step(const float* q, int qn) {
    if (j + 32 > qn) return;
    KVSCOUT_HOST_UNROLL
    for (int v = 0; v < 4; ++v) a[v] = _mm256_max_ps(_mm256_loadu_ps(q + j + 8 * v), a[v]);
    j += 32;
  }
  float result(const float* q, int qn) {
    while (j + 32 <= qn) step(q, qn);
    float m = horizontal_max256(
        _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3])));
    for (; j < qn; ++j) m = q[j] > m ? q[j] : m;
    return m;
  }
};
#endif

template <bool Simd = select_simd>
float max_of(const float* p, int n, float init) {
  int i = 0;
  float m = init;
#if KVSCOUT_HOST_AVX512
  if constexpr (Simd) return max_carry512(init).result(p, n);
#elif KVSCOUT_HOST_AVX2
  if constexpr (Simd) return max_carry256(init).result(p, n);
#else
  if constexpr (Simd) {  // the library's one plain row maximum (core/detail/host_vec.hpp)
    const float r = max_non_nan(p, n);
    return r > m ? r : m;
  }
#endif
  for (; i < n; ++i) m = p[i] > m ? p[i] : m;
  return m;
}

template <bool Simd = select_simd>
int count_at_least(const float* p, int n, float bound) {
  int i = 0;
  int c = 0;
#if KVSCOUT_HOST_AVX512
  if constexpr (Simd) {
    // Four 16-lane counters: an ordered compare (NaN never counts), a masked subtract of -1.
    const __m512 b = _mm512_set1_ps(bound);
    const __m512i minus_one = _mm512_set1_epi32(-1);
    __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
    for (; i + 64 <= n; i += 64) {
      KVSCOUT_HOST_UNROLL
      for (int v = 0; v < 4; ++v)
        acc[v] = _mm512_mask_sub_epi32(
            acc[v], _mm512_cmp_ps_mask(_mm512_loadu_ps(p + i + 16 * v), b, _CMP_GE_OQ), acc[v],
            minus_one);
    }
    c = _mm512_reduce_add_epi32(
        _mm512_add_epi32(_mm512_add_epi32(acc[0], acc[1]), _mm512_add_epi32(acc[2], acc[3])));
  }
#elif KVSCOUT_HOST_AVX2
  if constexpr (Simd) {
    const __m256 b = _mm256_set1_ps(bound);
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                      _mm256_setzero_si256()};
    for (; i + 32 <= n; i += 32) {
      KVSCOUT_HOST_UNROLL
      for (int v = 0; v < 4; ++v)
        acc[v] = _mm256_sub_epi32(acc[v], _mm256_castps_si256(_mm256_cmp_ps(
                                              _mm256_loadu_ps(p + i + 8 * v), b, _CMP_GE_OQ)));
    }
    const __m256i s8 =
        _mm256_add_epi32(_mm256_add_epi32(acc[0], acc[1]), _mm256_add_epi32(acc[2], acc[3]));
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    alignas(16) std::int32_t lanes[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes), s4);
    c = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  }
#elif KVSCOUT_HOST_SSE2
  if constexpr (Simd) {
    const __m128 b = _mm_set1_ps(bound);
    __m128i c0 = _mm_setzero_si128(), c1 = c0, c2 = c0, c3 = c0;
    for (; i + 16 <= n; i += 16) {
      c0 = _mm_sub_epi32(c0, _mm_castps_si128(_mm_cmpge_ps(_mm_loadu_ps(p + i), b)));
      c1 = _mm_sub_epi32(c1, _mm_castps_si128(_mm_cmpge_ps(_mm_loadu_ps(p + i + 4), b)));
      c2 = _mm_sub_epi32(c2, _mm_castps_si128(_mm_cmpge_ps(_mm_loadu_ps(p + i + 8), b)));
      c3 = _mm_sub_epi32(c3, _mm_castps_si128(_mm_cmpge_ps(_mm_loadu_ps(p + i + 12), b)));
    }
    alignas(16) std::int32_t lanes[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes),
                    _mm_add_epi32(_mm_add_epi32(c0, c1), _mm_add_epi32(c2, c3)));
    c = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  }
#endif
  for (; i < n; ++i) c += static_cast<int>(p[i] >= bound);
  return c;
}

#if KVSCOUT_HOST_SSE2
struct compress_table {
  alignas(16) std::int32_t lanes[16][4];
  std::int32_t count[16];
  constexpr compress_table() : lanes{}, count{} {
    for (int m = 0; m < 16; ++m) {
      int c = 0;
      for (int j = 0; j < 4; ++j)
        if ((m >> j) & 1) lanes[m][c++] = j;
      count[m] = c;
    }
  }
};
inline constexpr compress_table compress_lut{};

inline int compress_store(int mask, __m128i base, std::int32_t* out, int c) {
  const __m128i lanes = _mm_load_si128(reinterpret_cast<const __m128i*>(compress_lut.lanes[mask]));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), _mm_add_epi32(base, lanes));
  return c + compress_lut.count[mask];
}

inline int compress_block(const __m128 (&x)[4], int first, __m128 bound, std::int32_t* out, int c) {
  const __m128i four = _mm_set1_epi32(4);
  __m128i base = _mm_set1_epi32(first);
  KVSCOUT_HOST_UNROLL
  for (int q = 0; q < 4; ++q) {
    c = compress_store(_mm_movemask_ps(_mm_cmpge_ps(x[q], bound)), base, out, c);
    base = _mm_add_epi32(base, four);
  }
  return c;
}

inline float horizontal_max(__m128 v) {
  v = _mm_max_ps(v, _mm_shuffle_ps(v, v, 0x4e));
  v = _mm_max_ps(v, _mm_shuffle_ps(v, v, 0xb1));
  return _mm_cvtss_f32(v);
}
#endif

#if KVSCOUT_HOST_AVX512
inline __mmask64 at_least_mask64(const __m512 (&x)[4], __m512 b) {
  const __mmask16 k0 = _mm512_cmp_ps_mask(x[0], b, _CMP_GE_OQ);
  const __mmask16 k1 = _mm512_cmp_ps_mask(x[1], b, _CMP_GE_OQ);
  const __mmask16 k2 = _mm512_cmp_ps_mask(x[2], b, _CMP_GE_OQ);
  const __mmask16 k3 = _mm512_cmp_ps_mask(x[3], b, _CMP_GE_OQ);
  return _mm512_kunpackd(_mm512_kunpackw(k3, k2), _mm512_kunpackw(k1, k0));
}

/// Appends first + j for every set bit j of `bits`, ascending, inside out[c, c + 64).
inline int emit_bits64(__mmask64 bits, int first, std::int32_t* out, int c) {
  const __m512i base = _mm512_set1_epi32(first);
#if defined(__AVX512VBMI2__)
  // One compress of the byte offsets 0..63.
  const __m512i offsets = _mm512_set_epi8(
      63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43, 42, 41,
      40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18,
      17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i packed = _mm512_maskz_compress_epi8(bits, offsets);
  _mm512_storeu_si512(out + c,
                      _mm512_add_epi32(base, _mm512_cvtepu8_epi32(_mm512_castsi512_si128(packed))));
  const int taken = __builtin_popcountll(static_cast<unsigned long long>(bits));
  if (taken > 16) [[unlikely]] {
    _mm512_storeu_si512(out + c + 16, _mm512_add_epi32(base, _mm512_cvtepu8_epi32(
                                                               _mm512_extracti32x4_epi32(packed, 1))));
    _mm512_storeu_si512(out + c + 32, _mm512_add_epi32(base, _mm512_cvtepu8_epi32(
                                                               _mm512_extracti32x4_epi32(packed, 2))));
    _mm512_storeu_si512(out + c + 48, _mm512_add_epi32(base, _mm512_cvtepu8_epi32(
                                                               _mm512_extracti32x4_epi32(packed, 3))));
  }
  return c + taken;
#else
  // Four 16-lane compresses in registers: the memory form of compress is microcoded on some CPUs.
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  KVSCOUT_HOST_UNROLL
  for (int q = 0; q < 4; ++q) {
    const auto k = static_cast<__mmask16>(bits >> (16 * q));
    const __m512i pos = _mm512_add_epi32(_mm512_add_epi32(base, _mm512_set1_epi32(16 * q)), lane);
    _mm512_storeu_si512(out + c, _mm512_maskz_compress_epi32(k, pos));
    c += __builtin_popcount(static_cast<unsigned>(k));
  }
  return c;
#endif
}
#endif

#if KVSCOUT_HOST_AVX2
struct compress_table8 {
  alignas(64) std::uint8_t lanes[256][8];
  std::uint8_t count[256];
  constexpr compress_table8() : lanes{}, count{} {
    for (int m = 0; m < 256; ++m) {
      int c = 0;
      for (int j = 0; j < 8; ++j)
        if ((m >> j) & 1) lanes[m][c++] = static_cast<std::uint8_t>(j);
      count[m] = static_cast<std::uint8_t>(c);
    }
  }
};
inline constexpr compress_table8 compress_lut8{};

inline std::uint32_t at_least_mask32(const __m256 (&x)[4], __m256 b) {
  std::uint32_t bits = 0;
  KVSCOUT_HOST_UNROLL
  for (int q = 0; q < 4; ++q)
    bits |= static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(x[q], b, _CMP_GE_OQ)))
            << (8 * q);
  return bits;
}

/// Both write inside out[c, c + 32) (bits not 0): `sparse` one store per set bit (for one or two),
/// the dense one 8-lane store per 8 bits, branch-free (for many).
inline int emit_bits32_sparse(std::uint32_t bits, int first, std::int32_t* out, int c) {
  do {
    out[c++] = first + __builtin_ctz(bits);
    bits &= bits - 1;
  } while (bits != 0);
  return c;
}
inline int emit_bits32(std::uint32_t bits, int first, std::int32_t* out, int c) {
  KVSCOUT_HOST_UNROLL
  for (int q = 0; q < 4; ++q) {
    const unsigned m = (bits >> (8 * q)) & 0xffu;
    const __m256i lanes = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(compress_lut8.lanes[m])));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c),
                        _mm256_add_epi32(_mm256_set1_epi32(first + 8 * q), lanes));
    c += compress_lut8.count[m];
  }
  return c;
}

#endif

inline constexpr int collect_window = 256;

/// collect_candidates' state between its vector and scalar parts: the next position, the count
/// kept, the maximum so far, the maximum the next window's bound comes from, the bound in force.
struct collect_state {
  int i;
  int c;
  float m;
  float pend;
  float bound;
};

/// collect_candidates' vector part: whole vectors from st.i on, st updated for the scalar tail.
/// Returns false as soon as more than `limit` positions are kept. One version per instruction set.
#if KVSCOUT_HOST_AVX512
template <class WindowBound>
bool collect_vectors(const float* p, int n, int first, WindowBound window_bound,
                     collect_state& st, std::int32_t* out, int limit) {
  int i = st.i, c = st.c;
  float m = st.m, pend = st.pend, bound = st.bound;
  const float m0 = st.m;
  // _mm512_max_ps(x, acc) returns acc where x is NaN; a NaN compares false (ordered): never kept.
  __m512 acc[4] = {_mm512_set1_ps(m0), _mm512_set1_ps(m0), _mm512_set1_ps(m0),
                   _mm512_set1_ps(m0)};
  __m512 bv = _mm512_set1_ps(bound);
  for (; i + 64 <= n; i += 64) {
    if (i % collect_window == 0) {
      if (c > limit) return false;
      bound = window_bound(pend);
      bv = _mm512_set1_ps(bound);
      pend = _mm512_reduce_max_ps(
          _mm512_max_ps(_mm512_max_ps(acc[0], acc[1]), _mm512_max_ps(acc[2], acc[3])));
    }
    __m512 x[4];
    KVSCOUT_HOST_UNROLL
    for (int q = 0; q < 4; ++q) {
      x[q] = _mm512_loadu_ps(p + i + 16 * q);
      acc[q] = _mm512_max_ps(x[q], acc[q]);
    }
    // Skip groups without a candidate. Stores write inside out[c, c + 64) with c <= i.
    const __mmask64 bits = at_least_mask64(x, bv);
    if (bits != 0) c = emit_bits64(bits, first + i, out, c);
  }
  m = _mm512_reduce_max_ps(
      _mm512_max_ps(_mm512_max_ps(acc[0], acc[1]), _mm512_max_ps(acc[2], acc[3])));
  st = {i, c, m, pend, bound};
  return true;
}
#elif KVSCOUT_HOST_AVX2
template <class WindowBound>
bool collect_vectors(const float* p, int n, int first, WindowBound window_bound,
                     collect_state& st, std::int32_t* out, int limit) {
  int i = st.i, c = st.c;
  float m = st.m, pend = st.pend, bound = st.bound;
  const float m0 = st.m;
  __m256 acc[4] = {_mm256_set1_ps(m0), _mm256_set1_ps(m0), _mm256_set1_ps(m0),
                   _mm256_set1_ps(m0)};
  __m256 bv = _mm256_set1_ps(bound);
  bool dense = false;  // as in compact_at_least_impl
  for (; i + 32 <= n; i += 32) {
    if (i % collect_window == 0) {
      if (c > limit) return false;
      dense = c * 16 > i;
      bound = window_bound(pend);
      bv = _mm256_set1_ps(bound);
      pend = horizontal_max256(
          _mm256_max_ps(_mm256_max_ps(acc[0], acc[1]), _mm256_max_ps(acc[2], acc[3])));
    }
    __m256 x[4];
    // Prefetch 4 KiB ahead into L1, or loads after a mispredicted emission wait on L3. An integer
    // address: past the row's end it is no pointer into an object, and a prefetch does not fault.
    const auto ahead_of = reinterpret_cast<std::uintptr_t>(p + i) + 4096;
    _mm_prefetch(reinterpret_cast<const char*>(ahead_of), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(ahead_of + 64), _MM_HINT_T0);
    KVSCOUT_HOST_UNROLL
    for (int q = 0; q < 4; ++q) {
      x[q] = _mm256_loadu_ps(p + i + 8 * q);
      acc[q] = _mm256_max_ps(x[q], acc[q]);
    }
    const std::uint32_t bits = at_least_mask32(x, bv);
    if (bits != 0) c = dense ? emit_bits32(bits, first + i, out, c)
                             : emit_bits32_sparse(bits, first + i, out, c);
  }
  m = horizontal_max256(
      _mm256_max_ps(_mm256_max_ps(acc[0], acc[1]), _mm256_max_ps(acc[2], acc[3])));
  st = {i, c, m, pend, bound};
  return true;
}
#elif KVSCOUT_HOST_SSE2
template <class WindowBound>
bool collect_vectors(const float* p, int n, int first, WindowBound window_bound,
                     collect_state& st, std::int32_t* out, int limit) {
  int i = st.i, c = st.c;
  float m = st.m, pend = st.pend, bound = st.bound;
  const float m0 = st.m;
  __m128 acc[4] = {_mm_set1_ps(m0), _mm_set1_ps(m0), _mm_set1_ps(m0), _mm_set1_ps(m0)};
  __m128 bv = _mm_set1_ps(bound);
  for (; i + 16 <= n; i += 16) {
    if (i % collect_window == 0) {
      if (c > limit) return false;
      bound = window_bound(pend);
      bv = _mm_set1_ps(bound);
      pend = horizontal_max(_mm_max_ps(_mm_max_ps(acc[0], acc[1]), _mm_max_ps(acc[2], acc[3])));
    }
    const __m128 x[4] = {_mm_loadu_ps(p + i), _mm_loadu_ps(p + i + 4), _mm_loadu_ps(p + i + 8),
                         _mm_loadu_ps(p + i + 12)};
    // Skip blocks without a candidate by the OR of the compares; a max of the block would let a
    // NaN lane hide a candidate.
    const __m128 any = _mm_or_ps(_mm_or_ps(_mm_cmpge_ps(x[0], bv), _mm_cmpge_ps(x[1], bv)),
                                 _mm_or_ps(_mm_cmpge_ps(x[2], bv), _mm_cmpge_ps(x[3], bv)));
    if (_mm_movemask_ps(any) != 0) c = compress_block(x, first + i, bv, out, c);
    KVSCOUT_HOST_UNROLL
    for (int q = 0; q < 4; ++q) acc[q] = _mm_max_ps(x[q], acc[q]);
  }
  m = horizontal_max(_mm_max_ps(_mm_max_ps(acc[0], acc[1]), _mm_max_ps(acc[2], acc[3])));
  st = {i, c, m, pend, bound};
  return true;
}
#else
template <class WindowBound>
bool collect_vectors(const float*, int, int, WindowBound, collect_state&, std::int32_t*, int) {
  return true;  // no vector instructions: the scalar loop does it all
}
#endif

}  // namespace kvscout::detail
