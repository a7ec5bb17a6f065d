// AVX-512 roofline loops: the streaming read sums into 8 zmm accumulators (enough to hide the add
// latency at two loads per cycle); the peak runs 12 independent zmm FMA chains (2 FMA pipes × 4-6
// cycles latency on Zen 4/5 and Sapphire Rapids).
#include <immintrin.h>

#include "lineage/kernels/roofline.h"
#include "lineage/kernels/x86/avx512_util.h"

namespace lineage::kernels::roofline {

namespace {

using avx512::hsum;

float sum(const float* p, int64_t n) {
  __m512 a[8];
  for (auto& x : a) x = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 128)
    for (int j = 0; j < 8; ++j) a[j] = _mm512_add_ps(a[j], _mm512_load_ps(p + i + 16 * j));
  for (int j = 1; j < 8; ++j) a[0] = _mm512_add_ps(a[0], a[j]);
  return hsum(a[0]);
}

constexpr int kChains = 12;

float fma_chains(int64_t iters) {
  // acc ← acc·m + c converges to c / (1 − m): finite for any iteration count.
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
  __m512 a[kChains];
  for (int j = 0; j < kChains; ++j) a[j] = _mm512_set1_ps(float(j));
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) a[j] = _mm512_fmadd_ps(a[j], m, c);
  for (int j = 1; j < kChains; ++j) a[0] = _mm512_add_ps(a[0], a[j]);
  return hsum(a[0]);
}

}  // namespace

ReadKernel read_avx512() { return {"avx512", sum}; }
PeakKernel fma_avx512() { return {"avx512 fma", fma_chains, double(kChains) * 16 * 2}; }

}  // namespace lineage::kernels::roofline
