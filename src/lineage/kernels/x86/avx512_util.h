// Small AVX-512 helpers shared by the *_avx512*.cpp files. Internal linkage on purpose: each
// includer is compiled with its own ISA flags, so no copy may be shared across files.
#pragma once

#include <immintrin.h>

namespace lineage::kernels::avx512 {
namespace {

// Horizontal sum through memory: GCC 12's _mm512_reduce_add_ps trips -Wmaybe-uninitialized.
inline float hsum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0;
  for (float x : t) s += x;
  return s;
}

// lane i of the result = the sum of the 16 lanes of v[i].
inline __m512 hsum16(const __m512* v) {
  __m512 w[8], z[4], r[2];
  for (int p = 0; p < 8; ++p)  // lanes 0-7: halves of v[2p], lanes 8-15: of v[2p+1]
    w[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
  for (int p = 0; p < 4; ++p)  // quarter q: v[4p + q]
    z[p] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * p], w[2 * p + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * p], w[2 * p + 1], 0xDD));
  for (int p = 0; p < 2; ++p)  // quarter q: lanes 0-1 v[8p + q], lanes 2-3 v[8p + 4 + q]
    r[p] = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(z[2 * p]), _mm512_castps_pd(z[2 * p + 1]))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(z[2 * p]), _mm512_castps_pd(z[2 * p + 1]))));
  // quarter q: lane 0 v[q], lane 1 v[4+q], lane 2 v[8+q], lane 3 v[12+q]
  const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(r[0], r[1], 0x88), _mm512_shuffle_ps(r[0], r[1], 0xDD));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), s);
}

// In-place transpose of 16 rows of 16 32-bit elements: r[i] lane j <- r[j] lane i (packing [out, in]
// GEMM weights, turning prefill attention's queries).
inline void transpose16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4g + q], 128-bit lane L: rows 4g .. 4g+3 of column 4L + q.
  for (int g = 0; g < 16; g += 4) {
    u[g + 0] = _mm512_unpacklo_epi64(t[g + 0], t[g + 2]);
    u[g + 1] = _mm512_unpackhi_epi64(t[g + 0], t[g + 2]);
    u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int q = 0; q < 4; ++q) {
    const __m512i even_ab = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x88), odd_ab = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xdd);
    const __m512i even_cd = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x88), odd_cd = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xdd);
    r[q] = _mm512_shuffle_i32x4(even_ab, even_cd, 0x88);
    r[8 + q] = _mm512_shuffle_i32x4(even_ab, even_cd, 0xdd);
    r[4 + q] = _mm512_shuffle_i32x4(odd_ab, odd_cd, 0x88);
    r[12 + q] = _mm512_shuffle_i32x4(odd_ab, odd_cd, 0xdd);
  }
}

// exp(x) for x ≤ 0: the Cephes polynomial of vmath.cpp (exp_nonpositive), x < −87 gives exactly 0.
inline __m512 exp_nonpositive16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  const __m512 v = _mm512_max_ps(x, lo);
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 fn = _mm512_sub_ps(_mm512_fmadd_ps(v, _mm512_set1_ps(1.44269504088896341f), magic), magic);
  const __m512 r = _mm512_fmadd_ps(fn, _mm512_set1_ps(2.12194440e-4f), _mm512_fnmadd_ps(fn, _mm512_set1_ps(0.693359375f), v));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fn), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~under), p, _mm512_castsi512_ps(bits));
}

}  // namespace
}  // namespace lineage::kernels::avx512
