// The generic MXFP4 GEMV loops (GemvMxfp4, gemv.h) over a SIMD traits type, for the AVX2 and portable
// tables (AVX-512 has its own, gemv_mxfp4_avx512.cpp; its GEMM takes the scales and x order here). The
// traits add a `Lut` (a block's 16 code values times its scale), `mxfp4_lut(scale)`, `kMxfp4Rows`, and
// `mxfp4_decode(q, lut, even, odd)`: kWidth bytes of codes into the values of their even and odd
// columns. Internal linkage throughout (see gemv_simd.h).
#pragma once

#include <bit>
#include <cstdint>

#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels::simd {
namespace {

// 2^(s - 127) for an E8M0 exponent s, as f32: 0 is the subnormal 2^-127, 255 NaN.
constexpr float mxfp4_scale_value(int s) {
  return s == 255 ? std::bit_cast<float>(0x7fc00000u)
                  : s == 0 ? std::bit_cast<float>(0x00400000u) : std::bit_cast<float>(uint32_t(s) << 23);
}
struct Mxfp4Scales {
  float v[256];
};
constexpr Mxfp4Scales make_mxfp4_scales() {
  Mxfp4Scales t{};
  for (int s = 0; s < 256; ++s) t.v[s] = mxfp4_scale_value(s);
  return t;
}
constexpr Mxfp4Scales kMxfp4Scales = make_mxfp4_scales();

// The e2m1 value of each 4-bit code: bit 3 the sign, bits 0-2 the magnitude's index.
constexpr float kMxfp4Codes[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Within each run of 2W columns, the W even ones, then the W odd ones.
template <int W>
void mxfp4_prepare(const float* x, int64_t in, float* xd) {
  for (int64_t c = 0; c < in; c += 2 * W)
    for (int j = 0; j < W; ++j) {
      xd[c + j] = x[c + 2 * j];
      xd[c + W + j] = x[c + 2 * j + 1];
    }
}

// Block b of 32 columns (codes q + 16b, exponent s) decoded and scaled once, multiplied into the
// accumulators P (even columns) and P + 1 (odd) of each of G prepared rows of x.
template <class S, int G, int P>
inline void mxfp4_block(const float* xd, int64_t ldx, const uint8_t* q, uint8_t s, int64_t b,
                        typename S::Vec (&a)[G][4]) {
  constexpr int W = S::kWidth;
  const typename S::Lut lut = S::mxfp4_lut(kMxfp4Scales.v[s]);
  for (int k = 0; k < 32 / (2 * W); ++k) {
    typename S::Vec even, odd;
    S::mxfp4_decode(q + b * 16 + k * W, lut, even, odd);
    for (int g = 0; g < G; ++g) {
      const float* xg = xd + g * ldx + b * 32 + k * 2 * W;
      a[g][P] = S::fma(S::load_f32(xg), even, a[g][P]);
      a[g][P + 1] = S::fma(S::load_f32(xg + W), odd, a[g][P + 1]);
    }
  }
}

// y[g·ldy] = Σ_c x_g[c]·W[c] for one weight row (codes q, exponents s) and G prepared rows of x. Four
// accumulators a row (a block's even and odd columns; alternate blocks in alternate pairs), combined
// in a fixed tree, so each row's result is the same for every G: G = 1 is the lone GEMV.
template <class S, int G>
inline void mxfp4_dot(const float* xd, int64_t ldx, const uint8_t* q, const uint8_t* s, int64_t in, float* y,
                      int64_t ldy) {
  const int64_t blocks = in / 32;
  typename S::Vec a[G][4];
  for (int g = 0; g < G; ++g) a[g][0] = a[g][1] = a[g][2] = a[g][3] = S::zero();
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    mxfp4_block<S, G, 0>(xd, ldx, q, s[b], b, a);
    mxfp4_block<S, G, 2>(xd, ldx, q, s[b + 1], b + 1, a);
  }
  if (b < blocks) mxfp4_block<S, G, 0>(xd, ldx, q, s[b], b, a);
  for (int g = 0; g < G; ++g) y[g * ldy] = S::sum(S::add(S::add(a[g][0], a[g][1]), S::add(a[g][2], a[g][3])));
}

// One row after the other, front to back: each thread reads its rows (codes, and beside them their
// exponents) as sequential streams, as out_in does for the elementwise formats.
template <class S>
void mxfp4_out_in(const float* xd, const uint8_t* w, const uint8_t* s, int64_t in, int64_t o0, int64_t o1, float* y) {
  for (int64_t o = o0; o < o1; ++o) mxfp4_dot<S, 1>(xd, 0, w + o * (in / 2), s + o * (in / 32), in, y + o, 0);
}

// Each weight row against S::kMxfp4Rows rows of x at a time (the register budget of G × 4
// accumulators), the rest one by one; later passes over a row read it from L1.
template <class S>
void mxfp4_out_in_rows(const float* xd, int64_t ldx, int64_t rows, const uint8_t* w, const uint8_t* s, int64_t in,
                       int64_t o0, int64_t o1, float* y, int64_t ldy) {
  constexpr int G = S::kMxfp4Rows;
  for (int64_t o = o0; o < o1; ++o) {
    const uint8_t* q = w + o * (in / 2);
    const uint8_t* so = s + o * (in / 32);
    int64_t g = 0;
    for (; g + G <= rows; g += G) mxfp4_dot<S, G>(xd + g * ldx, ldx, q, so, in, y + g * ldy + o, ldy);
    for (; g < rows; ++g) mxfp4_dot<S, 1>(xd + g * ldx, 0, q, so, in, y + g * ldy + o, 0);
  }
}

template <class S>
void mxfp4_decode_rows(const uint8_t* w, const uint8_t* s, int64_t in, int64_t o0, int64_t o1, float* dst) {
  constexpr int W = S::kWidth;
  for (int64_t o = o0; o < o1; ++o, dst += in) {
    const uint8_t* q = w + o * (in / 2);
    for (int64_t b = 0; b < in / 32; ++b) {
      const typename S::Lut lut = S::mxfp4_lut(kMxfp4Scales.v[s[o * (in / 32) + b]]);
      for (int k = 0; k < 32 / (2 * W); ++k) {
        typename S::Vec even, odd;
        S::mxfp4_decode(q + b * 16 + k * W, lut, even, odd);
        S::store(dst + b * 32 + k * 2 * W, even);
        S::store(dst + b * 32 + k * 2 * W + W, odd);
      }
    }
  }
}

template <class S>
GemvMxfp4 make_mxfp4_table() {
  return GemvMxfp4{2 * S::kWidth, mxfp4_prepare<S::kWidth>, mxfp4_out_in<S>, mxfp4_out_in_rows<S>,
                   mxfp4_decode_rows<S>};
}

}  // namespace
}  // namespace lineage::kernels::simd
