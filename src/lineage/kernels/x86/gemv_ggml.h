// The GEMV loops for ggml's block formats (linear.h, GgmlBlock; QuantWeight codes Ggml) over a SIMD
// traits type, one instantiation per instruction set; x in its own order. Each block is decoded in
// registers, a vector of S::kWidth consecutive columns at a time, to the values ggml's dequantize_row_*
// gives (ref::ggml_decode_block): 4-bit codes (Q4_0, Q4_1, Q4_K, MXFP4) and Q2_K's 2-bit ones through a
// 16-entry table of a sub-block's values (its scale and min folded in by the same expression ggml
// evaluates per value: every product in it is exact, so one rounding, ggml's; Q4_K's codes in lines on
// AVX-512, below), the 5-, 6- and 8-bit and Q3_K's codes as small integers in f32 (exact) times their
// scale (Q5_K's and Q6_K's combined as integers, then one FMA with the scale and the offset, whose
// product is exact: ggml's single rounding again). Each vector then meets x in one f32
// FMA into one of four accumulators a row, chosen by its place in the block (and the block's parity
// for 32-value blocks), the same operations for every number of rows, so each row of x gets the lone
// GEMV's bits. The traits add `look(q, shift, lut)` (lut[(q[i] >> shift) & 15]), `lut_muladd(values,
// a, b)` (values·a + b: values·a is exact wherever it is used, so an FMA rounds as ggml's product and
// sum do), `field(q, shift, mask)` ((q[i] >> shift) & mask as f32), `sbytes(q)` (int8
// as f32), `bits(word, first)` (bit first + i of word as f32), `half(p)` (the f16 at p, F16C where
// the ISA has it), `scale_bytes16(p, a, b, f)` (f[i] = p[i]·a for i < 8, p[i]·b for 8 ≤ i < 16) and
// `combine(lo, ls, hi, hs, mask)` (((lo[i] >> ls) & 15) | (((hi[i] >> hs) & mask) << 4) as f32: Q5_K's
// and Q6_K's codes). Internal linkage (see gemv_simd.h).
#pragma once

#include <cstdint>
#include <cstring>

#include "lineage/kernels/linear.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels::simd {
namespace {

// The 16 nibble values as floats; Q2_K's 2-bit code in the low bits of a 4-bit index (its table
// repeats every 4); MXFP4's e2m1 values doubled (ggml's kvalues_mxfp4).
struct GgmlTables {
  float iota[16], iota4[16], mxfp4[16];
};
constexpr GgmlTables make_ggml_tables() {
  GgmlTables t{};
  constexpr float kMx[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  for (int u = 0; u < 16; ++u) t.iota[u] = float(u), t.iota4[u] = float(u & 3), t.mxfp4[u] = kMx[u];
  return t;
}
constexpr GgmlTables kGgml = make_ggml_tables();

// 2^(e - 128) as ggml's GGML_E8M0_TO_FP32_HALF builds it.
inline float ggml_e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t(0x00200000) << e : uint32_t(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Q4_K's and Q5_K's sub-block factors from the block's d, dmin and 12 bytes of 6-bit scales and mins
// (ggml's get_scale_min_k4 for j = 0 .. 7, unpacked four at a time in 32-bit words): f[j] = d·sc(j)
// and f[8 + j] = −(dmin·m(j)), both exact.
// Traits with `factors_k4(block, f)` (AVX-512) unpack them with byte shuffles instead.
template <class S>
constexpr bool kFactorsK4 = requires { &S::factors_k4; };

template <class S>
inline void ggml_factors_k4(const uint8_t* block, float (&f)[16]) {
  if constexpr (kFactorsK4<S>) {
    S::factors_k4(block, f);
    return;
  }
  const float d = S::half(block), dmin = S::half(block + 2);
  const uint8_t* s = block + 4;
  uint32_t w[3], sm[4];
  std::memcpy(w, s, 12);
  constexpr uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
  sm[0] = w[0] & k6;                                         // sc(0 .. 3): low 6 bits of bytes 0-3
  sm[1] = (w[2] & k4) | (((w[0] >> 6) & k2) << 4);           // sc(4 .. 7): bytes 8-11 low, bytes 0-3 top
  sm[2] = w[1] & k6;                                         // m(0 .. 3): low 6 bits of bytes 4-7
  sm[3] = ((w[2] >> 4) & k4) | (((w[1] >> 6) & k2) << 4);    // m(4 .. 7): bytes 8-11 high, bytes 4-7 top
  S::scale_bytes16(reinterpret_cast<const uint8_t*>(sm), d, -dmin, f);
}

// Q4_K in lines (traits with `q4k_chunk`, AVX-512): a 32-byte chunk of codes broadcast to both halves
// of a register and shifted lane by lane, so that each vector's 16 nibbles index the sub-block's table
// straight away: vector v of a sub-block holds, in lane l, the value of byte 4·(l % 8) + 2v + l / 8 (a
// shift and a permute a vector, no widening). x is prepared to match (ggml_prepare_lines): the order
// kOrderGgmlLines of GemvQuant. Other formats and ISAs read x as it is.
template <class S>
constexpr bool kGgmlLines = requires { &S::q4k_chunk; };
constexpr int kOrderGgmlLines = 5;

template <class S>
int ggml_order(const QuantWeight& W) {
  if constexpr (kGgmlLines<S>) {
    if (W.ggml == GgmlBlock::Q4_K) return kOrderGgmlLines;
  }
  return 0;  // as it is (kOrderBytes)
}

inline void ggml_prepare_lines(const float* x, int64_t in, float* xd) {
  for (int64_t s = 0; s < in; s += 32)
    for (int v = 0; v < 2; ++v)
      for (int l = 0; l < 16; ++l) xd[s + 16 * v + l] = x[s + 4 * (l % 8) + 2 * v + l / 8];
}

// Block `b` of format B decoded: emit(j, w) for each vector w of columns j .. j + kWidth - 1 of it (in
// the prepared order of kOrderGgmlLines where that applies).
// Q4_K and Q5_K: the block's sub-block factors (ggml_factors_k4), computed ahead by the caller (a run
// of blocks at a time, so that their arithmetic overlaps the decoding instead of leading each block),
// or here where `factors` is null.
constexpr bool ggml_k4(GgmlBlock b) { return b == GgmlBlock::Q4_K || b == GgmlBlock::Q5_K; }

template <class S, GgmlBlock B, class E>
inline void ggml_block(const uint8_t* b, E&& emit, const float* factors = nullptr) {
  using Vec = typename S::Vec;
  constexpr int V = S::kWidth;
  if constexpr (B == GgmlBlock::Q8_0) {
    const Vec d = S::broadcast(S::half(b));
    for (int j = 0; j < 32; j += V) emit(j, S::mul(S::sbytes(b + 2 + j), d));
  } else if constexpr (B == GgmlBlock::Q4_0 || B == GgmlBlock::Q4_1 || B == GgmlBlock::MXFP4) {
    const uint8_t* q = b + (B == GgmlBlock::Q4_0 ? 2 : B == GgmlBlock::Q4_1 ? 4 : 1);
    typename S::Lut16 lut;
    if constexpr (B == GgmlBlock::Q4_0) lut = S::lut16(kGgml.iota, S::half(b), 8.0f);  // (u - 8)·d
    else if constexpr (B == GgmlBlock::Q4_1) lut = S::lut_muladd(kGgml.iota, S::half(b), S::half(b + 2));  // u·d + m
    else lut = S::lut16(kGgml.mxfp4, ggml_e8m0_half(b[0]), 0.0f);  // kv[u]·d
    for (int j = 0; j < 16; j += V) emit(j, S::look(q + j, 0, lut));
    for (int j = 0; j < 16; j += V) emit(16 + j, S::look(q + j, 4, lut));
  } else if constexpr (B == GgmlBlock::Q5_0 || B == GgmlBlock::Q5_1) {
    constexpr bool kOne = B == GgmlBlock::Q5_1;
    const Vec d = S::broadcast(S::half(b)), m = S::broadcast(kOne ? S::half(b + 2) : 0.0f);
    const Vec sixteen = S::broadcast(16.0f);
    uint32_t qh;
    std::memcpy(&qh, b + (kOne ? 4 : 2), 4);
    const uint8_t* q = b + (kOne ? 8 : 6);
    const auto value = [&](Vec u) { return kOne ? S::add(S::mul(u, d), m) : S::mul(S::sub(u, sixteen), d); };
    for (int j = 0; j < 16; j += V) emit(j, value(S::add(S::field(q + j, 0, 15), S::mul(S::bits(qh, j), sixteen))));
    for (int j = 0; j < 16; j += V) emit(16 + j, value(S::add(S::field(q + j, 4, 15), S::mul(S::bits(qh, 16 + j), sixteen))));
  } else if constexpr (B == GgmlBlock::Q2_K) {
    const float d = S::half(b + 80), dmin = S::half(b + 82);
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 4; ++s)
        for (int part = 0; part < 2; ++part) {
          const uint8_t sc = b[8 * h + 2 * s + part];
          const typename S::Lut16 lut = S::lut_muladd(kGgml.iota4, d * float(sc & 15), -(dmin * float(sc >> 4)));
          const uint8_t* q = b + 16 + 32 * h + 16 * part;
          for (int l = 0; l < 16; l += V) emit(128 * h + 32 * s + 16 * part + l, S::look(q + l, 2 * s, lut));
        }
  } else if constexpr (B == GgmlBlock::Q3_K) {
    const uint8_t* s = b + 96;
    const float d = S::half(b + 108);
    const Vec four = S::broadcast(4.0f);
    for (int h = 0; h < 2; ++h)
      for (int sh = 0; sh < 4; ++sh)
        for (int part = 0; part < 2; ++part) {
          const int j = 8 * h + 2 * sh + part;  // the scale's index
          const int low = j < 8 ? s[j] & 15 : s[j - 8] >> 4, high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
          const Vec dl = S::broadcast(d * float((low | (high << 4)) - 32));
          for (int l = 0; l < 16; l += V) {
            const int i = 16 * part + l;
            const Vec u = S::add(S::sub(S::field(b + 32 + 32 * h + i, 2 * sh, 3), four),
                                 S::mul(S::field(b + i, 4 * h + sh, 1), four));
            emit(128 * h + 32 * sh + 16 * part + l, S::mul(dl, u));
          }
        }
  } else if constexpr (B == GgmlBlock::Q4_K) {
    alignas(64) float own[16];
    if (!factors) ggml_factors_k4<S>(b, own);
    const float* f = factors ? factors : own;
    for (int j = 0; j < 4; ++j) {
      const typename S::Lut16 lo = S::lut_muladd(kGgml.iota, f[2 * j], f[8 + 2 * j]);
      const typename S::Lut16 hi = S::lut_muladd(kGgml.iota, f[2 * j + 1], f[8 + 2 * j + 1]);
      const uint8_t* q = b + 16 + 32 * j;
      if constexpr (kGgmlLines<S>) {
        Vec w[4];
        S::q4k_chunk(q, lo, hi, w);
        for (int k = 0; k < 4; ++k) emit(64 * j + 16 * k, w[k]);
        continue;
      }
      for (int l = 0; l < 32; l += V) emit(64 * j + l, S::look(q + l, 0, lo));
      for (int l = 0; l < 32; l += V) emit(64 * j + 32 + l, S::look(q + l, 4, hi));
    }
  } else if constexpr (B == GgmlBlock::Q5_K) {
    alignas(64) float own[16];
    if (!factors) ggml_factors_k4<S>(b, own);
    const float* f = factors ? factors : own;
    for (int j = 0; j < 8; ++j) {
      const Vec dj = S::broadcast(f[j]), mj = S::broadcast(f[8 + j]);
      const uint8_t* q = b + 48 + 32 * (j / 2);
      for (int l = 0; l < 32; l += V) emit(32 * j + l, S::fma(S::combine(q + l, 4 * (j & 1), b + 16 + l, j, 1), dj, mj));
    }
  } else if constexpr (B == GgmlBlock::Q6_K) {
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = S::half(b + 208);
    for (int n = 0; n < 2; ++n) {
      const uint8_t* ql = b + 64 * n;
      const uint8_t* qh = b + 128 + 32 * n;
      for (int k = 0; k < 4; ++k)  // q1 .. q4 of ggml's loop: columns 32k .. 32k + 31 of this half
        for (int l = 0; l < 32; l += V) {
          // (d·sc)·(u − 32) as one FMA of the 6-bit code u: d·sc·u and 32·d·sc are exact, so it rounds once
          // as ggml's product does.
          const float ds = d * float(sc[8 * n + 2 * k + l / 16]);
          emit(128 * n + 32 * k + l, S::fma(S::combine(ql + 32 * (k & 1) + l, 4 * (k >> 1), qh + l, 2 * k, 3),
                                            S::broadcast(ds), S::broadcast(-32.0f * ds)));
        }
    }
  }
}

// One weight row (o) of format B against G rows of x (stride ldx) into y (stride ldy).
template <class S, int G, GgmlBlock B>
inline void ggml_row(const float* x, int64_t ldx, const QuantWeight& W, int64_t o, float* y, int64_t ldy) {
  using Vec = typename S::Vec;
  constexpr int V = S::kWidth;
  constexpr int64_t kValues = B == GgmlBlock::Q2_K || B == GgmlBlock::Q3_K || B == GgmlBlock::Q4_K ||
                                      B == GgmlBlock::Q5_K || B == GgmlBlock::Q6_K
                                  ? 256
                                  : 32;
  const int64_t bytes = W.row_bytes / (W.in / kValues);
  const uint8_t* q = W.q + o * W.row_bytes;
  Vec a[G][4];
  for (int g = 0; g < G; ++g) a[g][0] = a[g][1] = a[g][2] = a[g][3] = S::zero();
  // Block c0's vector at column j into accumulator (P + j / V) % 4.
  const auto block = [&](int64_t c0, const uint8_t* blk, auto p, const float* factors = nullptr) {
    S::prefetch_stream(reinterpret_cast<const char*>(blk) + kStreamAheadBytes);
    if constexpr (kValues == 256) S::prefetch_stream(reinterpret_cast<const char*>(blk) + kStreamAheadBytes + 128);
    ggml_block<S, B>(
        blk,
        [&](int j, Vec w) {
          const int k = (p.value + j / V) & 3;
          for (int g = 0; g < G; ++g) a[g][k] = S::fma(S::load_f32(x + g * ldx + c0 + j), w, a[g][k]);
        },
        factors);
  };
  int64_t c = 0;
  if constexpr (ggml_k4(B)) {  // the factors of up to kRun blocks first, then those blocks
    constexpr int64_t kRun = 16;
    alignas(64) float fac[kRun][16];
    while (c < W.in) {
      const int64_t n = (W.in - c) / kValues < kRun ? (W.in - c) / kValues : kRun;
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* blk = q + i * bytes;
        ggml_factors_k4<S>(blk, fac[i]);
      }
      for (int64_t i = 0; i < n; ++i, c += kValues, q += bytes) block(c, q, std::integral_constant<int, 0>{}, fac[i]);
    }
  }
  if constexpr (kValues == 32 && V == 16) {  // two vectors a block: pairs of blocks fill all four
    for (; c + 64 <= W.in; c += 64, q += 2 * bytes) {
      block(c, q, std::integral_constant<int, 0>{});
      block(c + 32, q + bytes, std::integral_constant<int, 2>{});
    }
  }
  for (; c < W.in; c += kValues, q += bytes) block(c, q, std::integral_constant<int, 0>{});
  for (int g = 0; g < G; ++g) y[g * ldy] = S::sum(S::add(S::add(a[g][0], a[g][1]), S::add(a[g][2], a[g][3])));
}

template <class S, int G>
inline void ggml_dot(const float* x, int64_t ldx, const QuantWeight& W, int64_t o, float* y, int64_t ldy) {
  switch (W.ggml) {
    case GgmlBlock::Q4_0: return ggml_row<S, G, GgmlBlock::Q4_0>(x, ldx, W, o, y, ldy);
    case GgmlBlock::Q4_1: return ggml_row<S, G, GgmlBlock::Q4_1>(x, ldx, W, o, y, ldy);
    case GgmlBlock::Q5_0: return ggml_row<S, G, GgmlBlock::Q5_0>(x, ldx, W, o, y, ldy);
    case GgmlBlock::Q5_1: return ggml_row<S, G, GgmlBlock::Q5_1>(x, ldx, W, o, y, ldy);
    case GgmlBlock::Q8_0: return ggml_row<S, G, GgmlBlock::Q8_0>(x, ldx, W, o, y, ldy);
    case GgmlBlock::Q2_K: return ggml_row<S, G, GgmlBlock::Q2_K>(x, ldx, W, o, y, ldy);
    case GgmlBlock::Q3_K: return ggml_row<S, G, GgmlBlock::Q3_K>(x, ldx, W, o, y, ldy);
    case GgmlBlock::Q4_K: return ggml_row<S, G, GgmlBlock::Q4_K>(x, ldx, W, o, y, ldy);
    case GgmlBlock::Q5_K: return ggml_row<S, G, GgmlBlock::Q5_K>(x, ldx, W, o, y, ldy);
    case GgmlBlock::Q6_K: return ggml_row<S, G, GgmlBlock::Q6_K>(x, ldx, W, o, y, ldy);
    case GgmlBlock::MXFP4: return ggml_row<S, G, GgmlBlock::MXFP4>(x, ldx, W, o, y, ldy);
  }
}

// Rows [o0, o1) decoded (natural column order), dst row stride W.in: the values the GEMVs multiply.
template <class S, GgmlBlock B>
void ggml_decode_rows(const QuantWeight& W, int64_t o0, int64_t o1, float* dst) {
  const GgmlBlockInfo& info = ggml_block_info(B);
  for (int64_t o = o0; o < o1; ++o, dst += W.in) {
    const uint8_t* q = W.q + o * W.row_bytes;
    for (int64_t c = 0; c < W.in; c += info.values, q += info.bytes)
      ggml_block<S, B>(q, [&](int j, typename S::Vec w) { S::store(dst + c + j, w); });
  }
}

template <class S>
void ggml_decode(const QuantWeight& W, int64_t o0, int64_t o1, float* dst) {
  switch (W.ggml) {
    case GgmlBlock::Q4_0: return ggml_decode_rows<S, GgmlBlock::Q4_0>(W, o0, o1, dst);
    case GgmlBlock::Q4_1: return ggml_decode_rows<S, GgmlBlock::Q4_1>(W, o0, o1, dst);
    case GgmlBlock::Q5_0: return ggml_decode_rows<S, GgmlBlock::Q5_0>(W, o0, o1, dst);
    case GgmlBlock::Q5_1: return ggml_decode_rows<S, GgmlBlock::Q5_1>(W, o0, o1, dst);
    case GgmlBlock::Q8_0: return ggml_decode_rows<S, GgmlBlock::Q8_0>(W, o0, o1, dst);
    case GgmlBlock::Q2_K: return ggml_decode_rows<S, GgmlBlock::Q2_K>(W, o0, o1, dst);
    case GgmlBlock::Q3_K: return ggml_decode_rows<S, GgmlBlock::Q3_K>(W, o0, o1, dst);
    case GgmlBlock::Q4_K: return ggml_decode_rows<S, GgmlBlock::Q4_K>(W, o0, o1, dst);
    case GgmlBlock::Q5_K: return ggml_decode_rows<S, GgmlBlock::Q5_K>(W, o0, o1, dst);
    case GgmlBlock::Q6_K: return ggml_decode_rows<S, GgmlBlock::Q6_K>(W, o0, o1, dst);
    case GgmlBlock::MXFP4: return ggml_decode_rows<S, GgmlBlock::MXFP4>(W, o0, o1, dst);
  }
}

}  // namespace
}  // namespace lineage::kernels::simd
