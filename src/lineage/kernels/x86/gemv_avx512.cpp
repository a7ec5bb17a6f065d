// AVX-512 GEMV (16 lanes): f16 widened with vcvtph2ps, bf16 with a 16-bit shift; MXFP4 in
// gemv_mxfp4_avx512.cpp.

// GCC 12 flags the _mm512_undefined_* placeholders inside its own AVX-512 intrinsics as maybe
// uninitialized once they are inlined (_mm512_reduce_add_ps here; GCC bug 105593, fixed in GCC 13),
// and, inlined into the batched rows' blocks, as uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "lineage/kernels/x86/gemv.h"
#include "lineage/kernels/x86/gemv_simd.h"

namespace lineage::kernels {
namespace {
struct Avx512 {
  using Vec = __m512;
  static constexpr int kWidth = 16;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec broadcast(float v) { return _mm512_set1_ps(v); }
  static Vec load_f32(const float* p) { return _mm512_loadu_ps(p); }
  static Vec load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static Vec load_bf16(const uint16_t* p) {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
  // The first n (0 < n ≤ 16) elements, the other lanes zero; masked, so nothing past them is read.
  static __mmask16 first(int n) { return __mmask16((1u << n) - 1); }
  static Vec load_f32_n(const float* p, int n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static Vec load_f16_n(const uint16_t* p, int n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first(n), p)); }
  static Vec load_bf16_n(const uint16_t* p, int n) {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(first(n), p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static float sum(Vec v) { return _mm512_reduce_add_ps(v); }
  static void prefetch_stream(const char* p) { _mm_prefetch(p, _MM_HINT_NTA); }
  static void prefetch(const char* p) { _mm_prefetch(p, _MM_HINT_T0); }
};
}  // namespace

const GemvTable& gemv_table_avx512() {
  static const GemvTable table = [] {
    GemvTable t = simd::make_table<Avx512>("avx512");
    t.mxfp4 = gemv_mxfp4_avx512();
    return t;
  }();
  return table;
}

}  // namespace lineage::kernels
