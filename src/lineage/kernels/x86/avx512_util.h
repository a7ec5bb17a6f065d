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
