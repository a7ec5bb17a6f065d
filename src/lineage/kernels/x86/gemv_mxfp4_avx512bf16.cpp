// AVX512_BF16 MXFP4 GEMV for the bf16 dot mode (GemvMxfp4Dot, gemv.h): x rounded to bf16 once, each
// code's e2m1 value (two significant bits: exact in bf16) multiplied with it by vdpbf16ps, and each
// block's power of two applied in f32 to every lane's sum of 8 products. A 64-byte line of 128 codes
// is 4 vpermw (the codes' bf16 values straight from 16-bit lanes) and 3 shifts, then 4 vdpbf16ps and
// one FMA a row of x, where the exact kernels take 8 permutes, 7 shifts and 10 multiplies and FMAs.
// Lane j of every product vector holds codes of the line's dword j (block j / 4), so the factors of
// mxfp4_avx512.h serve unchanged.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as gemv_mxfp4_avx512.cpp says
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "lineage/kernels/x86/gemv.h"
#include "lineage/kernels/x86/mxfp4_avx512.h"

namespace lineage::kernels {
namespace {

constexpr int64_t kGroup = 128;  // columns a step; x is prepared (and zero-padded) in runs of these

// The bf16 bits of the 16 codes' e2m1 values (bit 3 the sign), twice over: vpermw reads five index
// bits, and a word of codes shifted right by 4k holds the next code's lowest bit in its fifth.
alignas(64) constexpr uint16_t kCodeWords[32] = {
    0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0,  // 0 .5 1 1.5 2 3 4 6
    0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0,  // their negatives
    0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0,  //
    0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0};

// Word i of a line holds codes 4i .. 4i+3 in its nibbles, so shifting the line right by 4k bits and
// looking up every word gives code 4i + k at word i: product vector k's lane j pairs codes 8j + k and
// 8j + 4 + k. Prepared x matches: within each run of 128 columns, vector k's pair j is
// (x[8j + k], x[8j + 4 + k]), rounded to nearest even (vcvtne2ps2bf16, which reads subnormal x as 0).
void prepare(const float* x, int64_t in, uint16_t* xd) {
  const int64_t padded = (in + kGroup - 1) / kGroup * kGroup;
  alignas(64) float t[kGroup];
  for (int64_t g = 0; g < padded; g += kGroup) {
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 16; ++j)
        for (int h = 0; h < 2; ++h) {
          const int64_t c = g + 8 * j + 4 * h + k;
          t[32 * k + 2 * j + h] = c < in ? x[c] : 0.0f;
        }
    for (int k = 0; k < 4; ++k)
      _mm512_storeu_si512(xd + g + 32 * k,
                          (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(t + 32 * k + 16), _mm512_load_ps(t + 32 * k)));
  }
}

// r = x rounded as prepare rounds it, back in f32.
void round_bf16(const float* x, int64_t n, float* r) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
    _mm512_mask_storeu_ps(r + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
}

// One step (128 columns at c) for G prepared rows of x (stride ldx): per row two chains of two
// vdpbf16ps (vectors 0, 2 and 1, 3) from zero, added, scaled lane-wise into accumulator `a` of the
// row (lines alternate between its two, so the FMA's latency is not the loop's; `A` a template
// argument, so that the accumulators stay in registers).
template <int G, int A>
inline void step(const uint16_t* xd, int64_t ldx, int64_t c, __m512i line, __m512 f, __m512 (&acc)[G][2]) {
  const __m512i table = _mm512_load_si512(kCodeWords);
  __m512bh w[4];
  w[0] = (__m512bh)_mm512_permutexvar_epi16(line, table);
  w[1] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(line, 4), table);
  w[2] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(line, 8), table);
  w[3] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(line, 12), table);
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    const uint16_t* xg = xd + g * ldx + c;
    __m512 s0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), w[0], (__m512bh)_mm512_loadu_si512(xg));
    __m512 s1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), w[1], (__m512bh)_mm512_loadu_si512(xg + 32));
    s0 = _mm512_dpbf16_ps(s0, w[2], (__m512bh)_mm512_loadu_si512(xg + 64));
    s1 = _mm512_dpbf16_ps(s1, w[3], (__m512bh)_mm512_loadu_si512(xg + 96));
    acc[g][A] = _mm512_fmadd_ps(_mm512_add_ps(s0, s1), f, acc[g][A]);
  }
}

// y[g·ldy] = Σ_c x_g[c]·W[c] for one weight row and G prepared rows of x, each line of codes decoded
// once for all G; the same operations for every G, so G = 1 (the lone GEMV) gives each row's bits.
// Rare: the row holds an exponent 0 or 255 (rare_exponents).
template <int G, bool Rare>
inline void dot_row(const uint16_t* xd, int64_t ldx, const uint8_t* q, const uint8_t* s, int64_t in, float* y,
                    int64_t ldy) {
  __m512 acc[G][2];
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = _mm512_setzero_ps();
  const auto line = [&](int64_t c) {
    _mm_prefetch(reinterpret_cast<const char*>(q + c / 2) + kStreamAheadBytes, _MM_HINT_NTA);
    return _mm512_loadu_si512(q + c / 2);
  };
  const auto whole = [&](int64_t c) { return factors<Rare>(exponents_at(s + c / 32)); };
  int64_t c = 0;
  for (; c + 2 * kGroup <= in; c += 2 * kGroup) {
    step<G, 0>(xd, ldx, c, line(c), whole(c), acc);
    step<G, 1>(xd, ldx, c + kGroup, line(c + kGroup), whole(c + kGroup), acc);
  }
  if (c + kGroup <= in) {
    step<G, 0>(xd, ldx, c, line(c), whole(c), acc);
    c += kGroup;
  }
  if (c < in) {
    const int blocks = int((in - c) / 32);
    step<G, 1>(xd, ldx, c, codes_line(q + c / 2, blocks), factors<Rare>(exponents_of(exponents4(s + c / 32, blocks))),
               acc);
  }
  for (int g = 0; g < G; ++g) y[g * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc[g][0], acc[g][1]));
}
template <int G>
inline void dot(const uint16_t* xd, int64_t ldx, const uint8_t* q, const uint8_t* s, int64_t in, float* y,
                int64_t ldy) {
  if (rare_exponents(s, in / 32)) dot_row<G, true>(xd, ldx, q, s, in, y, ldy);
  else dot_row<G, false>(xd, ldx, q, s, in, y, ldy);
}

void out_in(const uint16_t* xd, const uint8_t* w, const uint8_t* s, int64_t in, int64_t o0, int64_t o1, float* y) {
  for (int64_t o = o0; o < o1; ++o) dot<1>(xd, 0, w + o * (in / 2), s + o * (in / 32), in, y + o, 0);
}

// Up to 8 rows of x at once (4 decoded vectors and 2 accumulators a row stay in registers), more in
// passes of 8 that read the weight row again from L1.
void out_in_rows(const uint16_t* xd, int64_t ldx, int64_t rows, const uint8_t* w, const uint8_t* s, int64_t in,
                 int64_t o0, int64_t o1, float* y, int64_t ldy) {
  for (int64_t o = o0; o < o1; ++o) {
    const uint8_t* q = w + o * (in / 2);
    const uint8_t* so = s + o * (in / 32);
    for (int64_t g = 0; g < rows; g += 8) {
      const uint16_t* xg = xd + g * ldx;
      float* yg = y + g * ldy + o;
      switch (std::min<int64_t>(8, rows - g)) {
        case 8: dot<8>(xg, ldx, q, so, in, yg, ldy); break;
        case 7: dot<7>(xg, ldx, q, so, in, yg, ldy); break;
        case 6: dot<6>(xg, ldx, q, so, in, yg, ldy); break;
        case 5: dot<5>(xg, ldx, q, so, in, yg, ldy); break;
        case 4: dot<4>(xg, ldx, q, so, in, yg, ldy); break;
        case 3: dot<3>(xg, ldx, q, so, in, yg, ldy); break;
        case 2: dot<2>(xg, ldx, q, so, in, yg, ldy); break;
        default: dot<1>(xg, ldx, q, so, in, yg, ldy); break;
      }
    }
  }
}

}  // namespace

const GemvMxfp4Dot& gemv_mxfp4_dot_avx512bf16() {
  static const GemvMxfp4Dot table{kGroup, prepare, out_in, out_in_rows, round_bf16};
  return table;
}

}  // namespace lineage::kernels
