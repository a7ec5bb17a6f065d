// Scalar, obviously-correct twins of every fast kernel: the specification and the test oracle.
// Loops are written in the plainest order and accumulate in double where it costs nothing to read.
#pragma once

#include <cstdint>

#include <span>

#include "lineage/kernels/attention.h"
#include "lineage/kernels/linear.h"

namespace lineage::kernels::ref {

// Same contract as kernels::linear (MXFP4 weights included: each element dequantized in double; where
// the bf16 dot mode runs for W, runs_bf16_dot, x rounded to bf16 first, and the products in double).
void linear(const float* x, int64_t T, const Weight& W, const Tensor* bias, float* y);

// Element (o, c) of an MXFP4 matrix (matrix.h): codes [out, in/2] U8, exponents [out, in/32] U8;
// code value · 2^(s - 127), NaN for s = 255.
double mxfp4_element(const Tensor& codes, const Tensor& scales, int64_t o, int64_t c);

// Element (o, c) of a quantized matrix (QuantWeight, linear.h): its code's value minus the zero point,
// times the scale, in f32 (the defined value), decoded from the bytes one at a time.
float quant_element(const QuantWeight& W, int64_t o, int64_t c);

// One block of a ggml format (linear.h, GgmlBlock) decoded to its f32 values, y[0 .. values), each by
// the expression ggml's dequantize_row_* evaluates; a row of n values (whole blocks) block by block.
void ggml_decode_block(GgmlBlock type, const uint8_t* block, float* y);
void ggml_decode_row(GgmlBlock type, const uint8_t* row, int64_t n, float* y);

// The int8-activation mode's x (linear.h, int8_dot_available): per block of 32 values, d = max|x| / 127
// and q = nearbyint(x · (127 / max|x|)) (0 where max|x| is 0; d NaN where the block holds a NaN).
void quantize_x_int8(const float* x, int64_t n, int8_t* q, float* d);

// Causal softmax attention of T new queries at positions p0 .. p0+T-1 over keys 0 .. p0+T-1.
// q[t, h] at q + t*ldq + h*hd; k, v: key/value rows for positions 0 .. p0+T-1, head h of position j
// at k[h*k_head_stride + j*hd]; out: [T, H, hd]. Same contract as kernels::attention_causal.
void attention_causal(const float* q, int64_t ldq, int64_t T, int64_t p0, const float* k, const float* v,
                      int64_t k_head_stride, int64_t H, int64_t hd, float scale, float* out);
// Same contract as the batched kernels::attention_causal (separate q·k and v head dims).
void attention_causal(std::span<const AttentionSeq> seqs, const AttentionHeads& heads);
// Same contract as kernels::latent_attention (double accumulation).
void latent_attention(std::span<const LatentQuery> qs, int64_t H, int64_t dk, int64_t dv, float scale);

}  // namespace lineage::kernels::ref
