// AVX512_BF16 GEMV for BF16 weights in the bf16 dot mode: x arrives already rounded to bf16 pairs
// (the GEMM's prepare, so decode and prefill round identically) and each vdpbf16ps adds
// x[2p]·W(2p, o) + x[2p+1]·W(2p+1, o) in f32. One load and one instruction per 32 weights, where the
// exact path widens every weight to f32 first.
#include <immintrin.h>

#include <cstdint>

#include "lineage/kernels/x86/avx512_util.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {
namespace {

inline __mmask32 first32(int64_t n) { return n >= 32 ? __mmask32(0xffffffffu) : n <= 0 ? 0 : __mmask32((1u << n) - 1); }

// W [out, in]: a row's bf16 are already pairs along i. One row at a time, front to back (one
// sequential stream per thread, as in the exact path), four accumulators, fixed combine order.
void out_in(const uint32_t* xp, const uint16_t* w, int64_t in, int64_t o0, int64_t o1, float* y) {
  const int64_t full = in / 128 * 128;
  for (int64_t o = o0; o < o1; ++o) {
    const uint16_t* row = w + o * in;
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i < full; i += 128)
      for (int j = 0; j < 4; ++j)
        a[j] = _mm512_dpbf16_ps(a[j], (__m512bh)_mm512_loadu_si512(row + i + 32 * j),
                                (__m512bh)_mm512_load_si512(xp + (i + 32 * j) / 2));
    for (; i < in; i += 32)  // x pairs past `in` are zero, and so are the masked weights
      a[0] = _mm512_dpbf16_ps(a[0], (__m512bh)_mm512_maskz_loadu_epi16(first32(in - i), row + i),
                              (__m512bh)_mm512_load_si512(xp + i / 2));
    y[o] = avx512::hsum(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
  }
}

}  // namespace

const GemvBf16Dot& gemv_bf16_dot_avx512bf16() {
  static const GemvBf16Dot kernels{out_in};
  return kernels;
}

}  // namespace lineage::kernels
