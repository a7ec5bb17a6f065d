// Per-ISA inner loops of the streaming GEMV, one table per instruction set; dispatch.cpp picks one
// table at start-up from cpuid. Element types are indexed F32 = 0, F16 = 1, BF16 = 2.
#pragma once

#include <cstdint>

#include "lineage/kernels/linear.h"

namespace lineage::kernels {

// How far ahead of its loads a 16-bit weight stream requests lines non-temporally (prefetchnta):
// the bf16 dot GEMV and the 16-bit [in, out] GEMV (gemv_simd.h, stream_ahead; measured there).
inline constexpr int64_t kStreamAheadBytes = 2048;

// MXFP4 weights [out, in] (matrix.h): codes `w` [out, in/2] U8 (column c in byte c/2, the low nibble
// the even column), E8M0 exponents `s` [out, in/32] U8; `in` a multiple of 32. The kernels read x in
// their own order, `prepare`'s, in runs of `group` columns, zero-padded to whole runs (stride(in)
// floats a row): AVX2 and scalar, within each run of 2·width columns the even ones, then the odd ones;
// AVX-512 (gemv_mxfp4_avx512.cpp), its own order over runs of 128. f32 products of the decoded values
// (code value · 2^(s - 127), or the code value with the power of two applied to a block's sum: exact
// either way), f32 sums.
struct GemvMxfp4 {
  int64_t group;
  int64_t stride(int64_t in) const { return (in + group - 1) / group * group; }
  // xd[0, stride(in)) = x in the kernels' order, zero-padded.
  void (*prepare)(const float* x, int64_t in, float* xd);
  // y[o] = Σ_c x[c]·W[o, c] for o in [o0, o1), x prepared.
  void (*out_in)(const float* xd, const uint8_t* w, const uint8_t* s, int64_t in, int64_t o0, int64_t o1, float* y);
  // The same for `rows` prepared rows of x (stride ldx) into rows of y (stride ldy), each weight row
  // read from memory once for all of them; row r's results equal out_in's on that row alone, bit for bit.
  void (*out_in_rows)(const float* xd, int64_t ldx, int64_t rows, const uint8_t* w, const uint8_t* s, int64_t in,
                      int64_t o0, int64_t o1, float* y, int64_t ldy);
  // dst[(o - o0)·stride(in) + j] = W[o, c(j)] for rows [o0, o1), j in prepared order (zero in the
  // padding): the values the GEMVs multiply, for a GEMM that runs on prepared x.
  void (*decode)(const uint8_t* w, const uint8_t* s, int64_t in, int64_t o0, int64_t o1, float* dst);
};

// Quantized matrices (QuantWeight, linear.h). 4-bit codes read x in the order `prepare` writes (per run
// of 2·width columns the even ones, then the odd ones; W.in floats), 8-bit codes x as it is (prepare
// copies it). Each weight decoded to its defined value in f32, f32 products and sums.
struct GemvQuant {
  // Which order `prepare` puts x in for W (0 … kOrders - 1): weights of one order share one prepared x.
  int (*order)(const QuantWeight& W);
  // bytes, runs and lines (gemv_quant.h); int8 x for nibbles and for bytes (gemv_quant_avx512vnni.cpp);
  // Q4_K's lines (gemv_ggml.h)
  static constexpr int kOrders = 6;
  void (*prepare)(const QuantWeight& W, const float* x, float* xd);
  // y[o] = Σ_c x[c]·W[o, c] for o in [o0, o1), x prepared.
  void (*out_in)(const float* xd, const QuantWeight& W, int64_t o0, int64_t o1, float* y);
  // The same for `rows` prepared rows of x (stride ldx) into rows of y (stride ldy), each weight row
  // read from memory once for all of them; row r's results equal out_in's on that row alone, bit for bit.
  void (*out_in_rows)(const float* xd, int64_t ldx, int64_t rows, const QuantWeight& W, int64_t o0, int64_t o1,
                      float* y, int64_t ldy);
  // dst[(o - o0)·W.in + j] = W[o, c(j)] for rows [o0, o1), j in prepared order: the values the GEMVs
  // multiply, for a GEMM that runs on prepared x.
  void (*decode)(const QuantWeight& W, int64_t o0, int64_t o1, float* dst);
};

struct GemvTable {
  const char* isa;
  // OutIn weights [out, in]: y[o] = Σ_i x[i]·W[o, i] for o in [o0, o1).
  void (*out_in[3])(const float* x, const void* w, int64_t in, int64_t o0, int64_t o1, float* y);
  // The same for `rows` rows of x (stride ldx) into rows of y (stride ldy), each weight row read
  // once for all of them; row r's results equal out_in's on that row alone, bit for bit.
  void (*out_in_rows[3])(const float* x, int64_t ldx, int64_t rows, const void* w, int64_t in, int64_t o0,
                         int64_t o1, float* y, int64_t ldy);
  // InOut weights [in, out], rows [i0, i1) of them: p[o] = Σ_{i0 <= i < i1} x[i]·W[i, o] for every
  // o < out (partial sums over a range of inputs; p is overwritten).
  void (*in_out[3])(const float* x, const void* w, int64_t out, int64_t i0, int64_t i1, float* p);
  // dst[i] = widen(src[i]) for i in [0, n).
  void (*widen[3])(const void* src, int64_t n, float* dst);
  // y[o] = Σ_k parts[k·stride + o] over k in [0, n), in order of k, for o < out.
  void (*sum_parts)(const float* parts, int64_t n, int64_t stride, int64_t out, float* y);
  GemvMxfp4 mxfp4;
  GemvQuant quant;
};

// BF16 weights in the bf16 dot mode (Weight::bf16_dot, linear.h): xp holds x
// as bf16 pairs (x[2p], x[2p+1]) exactly as the bf16 GEMM's `prepare` writes one row of them (zero
// past `in`, 64-byte aligned, whole 16-pair vectors), so decode and prefill round x identically.
// [in, out] weights take the exact in_out kernel on x rounded the same way (a product of two bf16
// is exact in f32, so only the order of the additions differs from vdpbf16ps).
struct GemvBf16Dot {
  void (*out_in)(const uint32_t* xp, const uint16_t* w, int64_t in, int64_t o0, int64_t o1, float* y);
  // The same for `rows` rows of pairs (stride ldxp pairs) into rows of y (stride ldy); bit for bit
  // out_in's result on each row alone.
  void (*out_in_rows)(const uint32_t* xp, int64_t ldxp, int64_t rows, const uint16_t* w, int64_t in, int64_t o0,
                      int64_t o1, float* y, int64_t ldy);
};
const GemvBf16Dot& gemv_bf16_dot_avx512bf16();
// The bf16 dot GEMV where this CPU (and the chosen ISA) has the bf16 dot GEMM, else null.
const GemvBf16Dot* gemv_bf16_dot();

// MXFP4 weights in the bf16 dot mode (Weight::bf16_dot, linear.h; gemv_mxfp4_avx512bf16.cpp): x
// rounded to bf16 (nearest even, as the bf16 GEMM's prepare rounds it), each code's e2m1 value (exact
// in bf16) multiplied with it in vdpbf16ps, a block's power of two applied to a lane's sum of 8
// products in f32 (exact, barring underflow): the products of x rounded to bf16 with the weights'
// defined values, f32 sums. x is prepared as bf16, stride(in) values a row, in the kernels' order
// over runs of `group` columns, zero-padded.
struct GemvMxfp4Dot {
  int64_t group;
  int64_t stride(int64_t in) const { return (in + group - 1) / group * group; }
  void (*prepare)(const float* x, int64_t in, uint16_t* xd);
  // y[o] = Σ_c x[c]·W[o, c] for o in [o0, o1), x prepared.
  void (*out_in)(const uint16_t* xd, const uint8_t* w, const uint8_t* s, int64_t in, int64_t o0, int64_t o1, float* y);
  // The same for `rows` prepared rows of x (stride ldx) into rows of y (stride ldy), each weight row
  // read from memory once for all of them; row r's results equal out_in's on that row alone, bit for bit.
  void (*out_in_rows)(const uint16_t* xd, int64_t ldx, int64_t rows, const uint8_t* w, const uint8_t* s, int64_t in,
                      int64_t o0, int64_t o1, float* y, int64_t ldy);
  // r[i] = x[i] rounded to bf16 as prepare rounds it, in f32, for i < n: the x of the GEMM in this mode
  // (the exact MXFP4 GEMM on it forms the same products; only the order of the additions differs).
  void (*round)(const float* x, int64_t n, float* r);
};
const GemvMxfp4Dot& gemv_mxfp4_dot_avx512bf16();
// The MXFP4 bf16 dot kernels where this CPU (and the chosen ISA) has the bf16 dot GEMM, else null.
const GemvMxfp4Dot* gemv_mxfp4_dot();

// The AVX-512 table's MXFP4 kernels.
const GemvMxfp4& gemv_mxfp4_avx512();

const GemvTable& gemv_table_scalar();
const GemvTable& gemv_table_avx2();
const GemvTable& gemv_table_avx512();

// The table this CPU runs (chosen once); LINEAGE_ISA=scalar|avx2 narrows it (for tests).
const GemvTable& gemv_table();

// The int8-activation kernels for int4 and int8 codes (QuantWeight::int8_dot): where this CPU has
// AVX512_VNNI and the AVX-512 table runs, else null. Their `order` is -1 for a weight they do not take
// (other codes; groups or rows that are not whole lines), which then runs the exact kernels; `decode`
// is null.
const GemvQuant& gemv_quant_int8_avx512vnni();
const GemvQuant* gemv_quant_int8();
const char* isa_name();

}  // namespace lineage::kernels
