// AVX-512 MXFP4 GEMV (GemvMxfp4, gemv.h), 128 columns (a 64-byte line of codes) a step: vpermps reads
// an index's low 4 bits, so the line shifted by 4k, permuted through the 16 code values, gives code k
// of each of its 16 dwords (8 permutes, 7 shifts a line; widening 16 bytes a block to dwords first ran
// at 2/3 the speed: one core, codes in L2, 30 vs 42 G codes/s). Lane j lies in block j / 4, so the
// exponents scale each lane's sum of 8 products (exact: powers of two).
// The codes and exponents of a line are read by mxfp4_avx512.h, shared with the bf16 dot kernels.
// GCC 12 flags the _mm512_undefined_* placeholders inside _mm512_reduce_add_ps once inlined (GCC bug
// 105593, fixed in GCC 13), as gemv_avx512.cpp says.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>

#include "lineage/kernels/x86/gemv.h"
#include "lineage/kernels/x86/mxfp4_avx512.h"

namespace lineage::kernels {
namespace {

constexpr int64_t kGroup = 128;  // columns a step; x is prepared (and zero-padded) in runs of these

// x[c] for c = 128g + 8j + k at 128g + 16k + j: the step's k-th vector of x holds code k of each dword.
void prepare(const float* x, int64_t in, float* xd) {
  const int64_t padded = (in + kGroup - 1) / kGroup * kGroup;
  for (int64_t g = 0; g < padded; g += kGroup)
    for (int64_t j = 0; j < 16; ++j)
      for (int64_t k = 0; k < 8; ++k) {
        const int64_t c = g + 8 * j + k;
        xd[g + 16 * k + j] = c < in ? x[c] : 0.0f;
      }
}

// The e2m1 values of the 16 codes (bit 3 the sign).
inline __m512 code_values() {
  return _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f,
                        -4.0f, -6.0f);
}

// One step (128 columns at c) for G prepared rows of x (stride ldx): two sums of four products each
// (codes 0, 2, 4, 6 and 1, 3, 5, 7 of every dword), added, scaled lane-wise into the row's accumulator.
template <int G>
inline void step(const float* xd, int64_t ldx, int64_t c, __m512i line, __m512 f, __m512 (&acc)[G]) {
  const __m512 table = code_values();
  __m512 sum[G][2];
  // Unrolled whole, so that the sums stay in registers (GCC left G = 4's loop rolled, the sums on the stack).
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    const __m512 w = _mm512_permutexvar_ps(k ? _mm512_srli_epi32(line, unsigned(4 * k)) : line, table);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512 xv = _mm512_loadu_ps(xd + g * ldx + c + 16 * k);
      sum[g][k & 1] = k < 2 ? _mm512_mul_ps(xv, w) : _mm512_fmadd_ps(xv, w, sum[g][k & 1]);
    }
  }
  // One FMA a row and step on the multiply pipes (the two sums added on an adder), the accumulator's
  // chain still shorter than a step.
  for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(_mm512_add_ps(sum[g][0], sum[g][1]), f, acc[g]);
}

// y[g·ldy] = Σ_c x_g[c]·W[c] for one weight row and G prepared rows of x, each line of codes decoded
// once for all G; the same operations for every G, so G = 1 (the lone GEMV) gives each row's bits.
// Rare: the row holds an exponent 0 or 255 (rare_exponents).
template <int G, bool Rare>
inline void dot_row(const float* xd, int64_t ldx, const uint8_t* q, const uint8_t* s, int64_t in, float* y,
                    int64_t ldy) {
  __m512 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + kGroup <= in; c += kGroup)
    step<G>(xd, ldx, c, _mm512_loadu_si512(q + c / 2), factors<Rare>(exponents_at(s + c / 32)), acc);
  if (c < in) {
    const int blocks = int((in - c) / 32);
    step<G>(xd, ldx, c, codes_line(q + c / 2, blocks), factors<Rare>(exponents_of(exponents4(s + c / 32, blocks))),
            acc);
  }
  for (int g = 0; g < G; ++g) y[g * ldy] = _mm512_reduce_add_ps(acc[g]);
}
template <int G>
inline void dot(const float* xd, int64_t ldx, const uint8_t* q, const uint8_t* s, int64_t in, float* y, int64_t ldy) {
  if (rare_exponents(s, in / 32)) dot_row<G, true>(xd, ldx, q, s, in, y, ldy);
  else dot_row<G, false>(xd, ldx, q, s, in, y, ldy);
}

void out_in(const float* xd, const uint8_t* w, const uint8_t* s, int64_t in, int64_t o0, int64_t o1, float* y) {
  for (int64_t o = o0; o < o1; ++o) dot<1>(xd, 0, w + o * (in / 2), s + o * (in / 32), in, y + o, 0);
}

// Four rows of x at a time (4 accumulators and 8 partial sums in registers), the rest one by one;
// the later passes over a weight row read it from L1. Bound by the f32 FMAs (about 10 a row and step,
// against 15 decoding operations shared by the four).
void out_in_rows(const float* xd, int64_t ldx, int64_t rows, const uint8_t* w, const uint8_t* s, int64_t in, int64_t o0,
                 int64_t o1, float* y, int64_t ldy) {
  for (int64_t o = o0; o < o1; ++o) {
    const uint8_t* q = w + o * (in / 2);
    const uint8_t* so = s + o * (in / 32);
    int64_t g = 0;
    for (; g + 4 <= rows; g += 4) dot<4>(xd + g * ldx, ldx, q, so, in, y + g * ldy + o, ldy);
    for (; g < rows; ++g) dot<1>(xd + g * ldx, 0, q, so, in, y + g * ldy + o, 0);
  }
}

// Rows of W in prepared order (zero in the padding), each decoded value times its factor.
void decode(const uint8_t* w, const uint8_t* s, int64_t in, int64_t o0, int64_t o1, float* dst) {
  const int64_t padded = (in + kGroup - 1) / kGroup * kGroup;
  const __m512 table = code_values();
  for (int64_t o = o0; o < o1; ++o, dst += padded) {
    for (int64_t c = 0; c < padded; c += kGroup) {
      const int blocks = int(in - c >= kGroup ? 4 : (in - c) / 32);
      const __m512i line = codes_line(w + o * (in / 2) + c / 2, blocks);
      const __m512 f = factors<true>(exponents_of(exponents4(s + o * (in / 32) + c / 32, blocks)));
      for (int k = 0; k < 8; ++k) {
        const __m512 v = _mm512_permutexvar_ps(k ? _mm512_srli_epi32(line, unsigned(4 * k)) : line, table);
        _mm512_storeu_ps(dst + c + 16 * k, _mm512_mul_ps(v, f));
      }
    }
  }
}

}  // namespace

const GemvMxfp4& gemv_mxfp4_avx512() {
  static const GemvMxfp4 table{kGroup, prepare, out_in, out_in_rows, decode};
  return table;
}

}  // namespace lineage::kernels
