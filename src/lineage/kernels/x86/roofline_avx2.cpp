// AVX2 roofline loops: 8 ymm accumulators for the streaming read, 12 independent ymm FMA chains for
// the peak (of 16 ymm registers, two hold the constants).
#include <immintrin.h>

#include "lineage/kernels/roofline.h"

namespace lineage::kernels::roofline {

namespace {

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

float sum(const float* p, int64_t n) {
  __m256 a[8];
  for (auto& x : a) x = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 64)
    for (int j = 0; j < 8; ++j) a[j] = _mm256_add_ps(a[j], _mm256_load_ps(p + i + 8 * j));
  for (int j = 1; j < 8; ++j) a[0] = _mm256_add_ps(a[0], a[j]);
  return hsum(a[0]);
}

constexpr int kChains = 12;

float fma_chains(int64_t iters) {
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
  __m256 a[kChains];
  for (int j = 0; j < kChains; ++j) a[j] = _mm256_set1_ps(float(j));
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) a[j] = _mm256_fmadd_ps(a[j], m, c);
  for (int j = 1; j < kChains; ++j) a[0] = _mm256_add_ps(a[0], a[j]);
  return hsum(a[0]);
}

}  // namespace

ReadKernel read_avx2() { return {"avx2", sum}; }
PeakKernel fma_avx2() { return {"avx2 fma", fma_chains, double(kChains) * 8 * 2}; }

}  // namespace lineage::kernels::roofline
