// AVX512_BF16 peak: 16 independent vdpbf16ps chains. Each instruction multiplies 32 bf16 pairs and
// adds them pairwise into 16 f32 lanes: 4 FLOP per lane. Sixteen chains cover the 6-cycle latency at
// two instructions per cycle (Zen 4/5).
#include <immintrin.h>

#include "lineage/kernels/roofline.h"
#include "lineage/kernels/x86/avx512_util.h"

namespace lineage::kernels::roofline {

namespace {

using avx512::hsum;

constexpr int kChains = 16;

float dpbf16_chains(int64_t iters) {
  // 2^-8 · 2^-8 products: each chain grows by 2^-15 per step, far from overflow for any count used.
  const __m512 x = _mm512_set1_ps(1.0f / 256);
  const __m512bh a = _mm512_cvtne2ps_pbh(x, x), b = _mm512_cvtne2ps_pbh(x, x);
  __m512 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_ps(float(j));
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
  for (int j = 1; j < kChains; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  return hsum(acc[0]);
}

}  // namespace

PeakKernel dpbf16_avx512bf16() { return {"avx512_bf16 dpbf16", dpbf16_chains, double(kChains) * 16 * 4}; }

}  // namespace lineage::kernels::roofline
