// AVX-512 MXFP4 GEMV (GemvMxfp4, gemv.h), 128 columns (a 64-byte line of codes) a step: vpermps reads
// an index's low 4 bits, so the line shifted by 4k, permuted through the 16 code values, gives code k
// of each of its 16 dwords (8 permutes, 7 shifts a line; widening 16 bytes a block to dwords first ran
// at 2/3 the speed: one core, codes in L2, 30 vs 42 G codes/s). Lane j lies in block j / 4, so the
// exponents scale each lane's sum of 8 products (exact: powers of two).
// GCC 12 flags the _mm512_undefined_* placeholders inside _mm512_reduce_add_ps once inlined (GCC bug
// 105593, fixed in GCC 13), as gemv_avx512.cpp says.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "lineage/kernels/x86/gemv.h"

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

// A step's codes and exponents: a whole line and four, or the `blocks` (1 to 3) of a row's tail,
// the rest zero (code 0, whose value 0 meets x's zero padding).
inline __m512i codes_line(const uint8_t* q, int blocks) {
  return blocks == 4 ? _mm512_loadu_si512(q) : _mm512_maskz_loadu_epi8(__mmask64((1ull << (16 * blocks)) - 1), q);
}
inline uint32_t exponents4(const uint8_t* s, int blocks) {
  uint32_t four = 0;
  if (blocks == 4) std::memcpy(&four, s, 4);
  else
    for (int b = 0; b < blocks; ++b) four |= uint32_t(s[b]) << (8 * b);
  return four;
}

// The step's four exponents (byte b for block b, `four` in a register, `at` in memory) as f32
// factors 2^(s - 127), lane j holding block j / 4's: s << 23 is the factor's bits for 1 ≤ s ≤ 254 (a
// byte shuffle and a shift); 0 (the subnormal 2^-127) and 255 (NaN) take two fixes more, in the rare
// steps that hold one (found with scalar bit tricks off the vector pipes, which bound this loop).
inline __m512 factors(uint32_t four, const uint8_t* at) {
  const __m512i spread = _mm512_set_epi8(3, -1, -1, -1, 3, -1, -1, -1, 3, -1, -1, -1, 3, -1, -1, -1,  //
                                         2, -1, -1, -1, 2, -1, -1, -1, 2, -1, -1, -1, 2, -1, -1, -1,  //
                                         1, -1, -1, -1, 1, -1, -1, -1, 1, -1, -1, -1, 1, -1, -1, -1,  //
                                         0, -1, -1, -1, 0, -1, -1, -1, 0, -1, -1, -1, 0, -1, -1, -1);
  const __m512i bytes = at ? _mm512_broadcastd_epi32(_mm_loadu_si32(at)) : _mm512_set1_epi32(int(four));
  __m512i bits = _mm512_srli_epi32(_mm512_shuffle_epi8(bytes, spread), 1);
  const uint32_t flipped = ~four;
  const uint32_t zero_or_ff = ((four - 0x01010101u) & ~four) | ((flipped - 0x01010101u) & ~flipped);
  if (__builtin_expect((zero_or_ff & 0x80808080u) != 0, 0)) {
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(bits, _mm512_setzero_si512()),
                                 _mm512_set1_epi32(0x00400000));
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(bits, _mm512_set1_epi32(0x7f800000)),
                                 _mm512_set1_epi32(0x7fc00000));
  }
  return _mm512_castsi512_ps(bits);
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
template <int G>
inline void dot(const float* xd, int64_t ldx, const uint8_t* q, const uint8_t* s, int64_t in, float* y, int64_t ldy) {
  __m512 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + kGroup <= in; c += kGroup) {
    uint32_t four;
    std::memcpy(&four, s + c / 32, 4);
    step<G>(xd, ldx, c, _mm512_loadu_si512(q + c / 2), factors(four, s + c / 32), acc);
  }
  if (c < in) {
    const int blocks = int((in - c) / 32);
    step<G>(xd, ldx, c, codes_line(q + c / 2, blocks), factors(exponents4(s + c / 32, blocks), nullptr), acc);
  }
  for (int g = 0; g < G; ++g) y[g * ldy] = _mm512_reduce_add_ps(acc[g]);
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
      const __m512 f = factors(exponents4(s + o * (in / 32) + c / 32, blocks), nullptr);
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
