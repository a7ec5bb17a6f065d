// Room kernels/: the numerics, on raw pointers and Tensors: linear maps (GEMV, rows GEMV, GEMM),
// attention, the delta-rule recurrences (recurrent and chunked), norms, RoPE, short convolutions,
// vector math and their backward passes. Each fast kernel has a scalar twin in ref/ it is tested
// against; the x86/ files hold the AVX2 / AVX-512 inner loops, chosen at start-up from cpuid
// (x86/dispatch.cpp). Uses core only.
//
// Linear maps with weights in their stored dtype (F32, F16, BF16), widened to f32 inside the kernel,
// or as MXFP4 codes decoded in registers (matrix.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "lineage/core/tensor.h"
#include "lineage/kernels/activation.h"

namespace lineage::kernels {

// How a weight matrix is stored. nn.Linear: [out, in]; GPT-2's Conv1D: [in, out].
enum class Layout : uint8_t { OutIn, InOut };

// The shape of a weight with `in` inputs and `out` outputs stored in `layout`.
inline Shape stored_shape(Layout layout, int64_t in, int64_t out) {
  return layout == Layout::OutIn ? Shape{out, in} : Shape{in, out};
}

// A matrix of 4- or 8-bit codes with an f32 scale (and, asymmetric, a zero point) per row and run of
// `group` columns: element (o, c) = (value(code) - zero[o, c / group]) · scale[o, c / group], computed
// in f32 (one rounding: none where the scale has at most 16 significant bits, as bf16, f16, FP8 and
// E8M0 scales do). The codes, [out, in] OutIn, `row_bytes` apart:
//   Int4 (compressed-tensors pack-quantized int4): column c in the nibble c % 2 of byte c / 2 (low
//     nibble the even column), value u - 8 for a nibble u;
//   Fp4 (E2M1, NVFP4 and MXFP4 written by lineage quantize): the same nibbles, value e2m1(u) (bit 3 the
//     sign; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6);
//   Int8: one byte a column, value u - 128;
//   Fp8 (E4M3): one byte a column, its FP8 value (S.1111.111 NaN).
// The scales and zero points are tables prepare_quant (matrix.h) makes from the stored ones;
// `in` is a multiple of 32 (4-bit codes) or 16 (8-bit), and `group` a multiple of 16 (or `in`, one scale a row).
//   Ggml (GGUF's block formats, below): each row whole blocks of the format `ggml` names, scales and
//     codes together as llama.cpp stores them; `scale` and `zero` are null, `group` the block's values.
enum class QuantCodes : uint8_t { Int4, Fp4, Int8, Fp8, Ggml };

// ggml's block formats (spec quantized-formats.md §3.2; ggml-common.h, ggml-quants.c), computed on their
// stored blocks: every weight decoded to the value ggml's dequantize_row_* gives it (its products are
// exact in f32, so the one rounding, a K-quant's `- dmin·m` or Q4_1's `+ m`, is ggml's whatever the
// order of its operations), then f32 products with x and f32 sums. MXFP4 here is GGUF's block (an E8M0
// byte, then 16 bytes: value j in the low nibble of byte j, value j + 16 in its high nibble), unlike the
// nibble pairs of MatrixFormat::MXFP4.
enum class GgmlBlock : uint8_t { Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4 };
struct GgmlBlockInfo {
  GgmlBlock block;
  const char* name;  // ggml's: "Q4_K"
  uint32_t type_id;  // ggml_type
  int64_t values, bytes;
};
// Every format above, in enum order.
std::span<const GgmlBlockInfo> ggml_blocks();
const GgmlBlockInfo& ggml_block_info(GgmlBlock b);
// The format with ggml type id `id`, or null.
const GgmlBlockInfo* ggml_block_of_type(uint32_t id);

struct QuantWeight {
  QuantCodes codes = QuantCodes::Int4;
  GgmlBlock ggml = GgmlBlock::Q8_0;  // codes Ggml: the format
  const uint8_t* q = nullptr;    // [out, row_bytes]
  const float* scale = nullptr;  // [out, groups] f32
  const float* zero = nullptr;   // [out, groups] f32 code values, or null (symmetric)
  int64_t in = 0, out = 0, group = 0, groups = 0, row_bytes = 0;
  // Multiply int4 and int8 codes with int8 activations where int8_dot_available() (below).
  bool int8_dot = false;
  bool nibbles() const { return codes == QuantCodes::Int4 || codes == QuantCodes::Fp4; }
};

// A weight matrix as it sits in memory (mapped or owned), with its layout, and how this call may
// multiply it: bf16_dot lets BF16 and MXFP4 weights use bf16 dot products (see bf16_dot_available());
// false selects the exact path. The option travels with the call, not the process (layers::Options).
// An MXFP4 matrix (matrix.h) is its packed codes in `w` ([out, in/2] U8) with their block exponents
// in `scales` ([out, in/32] U8), OutIn only, `in` a multiple of 32; `scales` is null otherwise.
struct Weight {
  const Tensor* w = nullptr;
  Layout layout = Layout::OutIn;
  bool bf16_dot = false;
  const Tensor* scales = nullptr;
  // A quantized matrix (then w holds its codes as U8 [out, row_bytes]); null otherwise.
  const QuantWeight* quant = nullptr;
  bool mxfp4() const { return scales != nullptr; }
  int64_t in() const {
    return quant ? quant->in : mxfp4() ? 2 * w->dim(1) : layout == Layout::OutIn ? w->dim(1) : w->dim(0);
  }
  int64_t out() const { return layout == Layout::OutIn ? w->dim(0) : w->dim(1); }
};

// y[t, o] = Σ_i x[t, i] · W(i, o) (+ bias[o]).   x: [T, in] f32; y: [T, out] f32; bias: [out] any
// float dtype or null. y must not alias x. T = 1 runs the streaming GEMV (one pass over W, split
// over output rows, or over input rows for [in, out] weights); 2 ≤ T ≤ 8 with [out, in] weights the
// same GEMV loop shared by the T rows (W streamed once; each row bit for bit what T = 1 gives it, so
// a batch of decode tokens gets each sequence's lone result); otherwise GEMM. Threaded over the
// engine's pool. With `act`, y ← act(y) afterwards. The GEMVs add the bias and apply `act` to each
// run of finished rows on the thread that computed them; the engine's own GEMM adds the bias and
// GeluTanh as it stores y; otherwise a second pass over y does. MXFP4 weights: every product is
// (code value · 2^(scale - 127)) · x in f32, the codes decoded in registers by the GEMVs and into a
// per-thread panel by the GEMM (the matrix is never dequantized whole); f32 accumulation.
void linear(const float* x, int64_t T, const Weight& W, const Tensor* bias, float* y,
            std::optional<Activation> act = std::nullopt);

// y (+)= op(x) · W for an F32 weight (either layout) on the engine's own GEMM, reading x and y in
// place: op(x)[t, i] is x[t·ldx + i], or x[i·ldx + t] when x_trans (x stored [in, T], as the
// output gradient is in a weight gradient dW = dYᵀ·X); y[t, o] is y[t·ldy + o]. With `accumulate`,
// y += op(x)·W, each element one FMA chain starting from y's value. Returns false, doing nothing,
// where the own GEMM does not run (no AVX-512 table; LINEAGE_ISA) or W is not F32.
bool linear_strided(const float* x, int64_t ldx, bool x_trans, int64_t T, const Weight& W, float* y, int64_t ldy,
                    bool accumulate);

// BF16 weights with Weight::bf16_dot: multiplied with bf16 dot products (vdpbf16ps) instead of
// widening W to f32. x is rounded to bf16 once per product, in decode (T = 1) and prefill alike, so
// the two stay interchangeable; the price is a relative error of ~1.7e-3 per product (llama.cpp
// rounds its activations the same way for bf16 weights, and PyTorch's bf16 matmul takes bf16
// inputs). About twice the exact path's arithmetic rate in prefill (decode, bound by reading the
// same bytes, runs at about the same speed either way). MXFP4 weights with Weight::bf16_dot: each
// code's value (exact in bf16) times x rounded to bf16 in vdpbf16ps, the block's power of two applied
// to sums of 8 such products (exact): the same products, f32 sums, about twice the exact decode's
// speed (the exact path's decoding to f32 bounds it below the memory's); prefill rounds x the same
// way and runs the exact GEMM on it. Whether this CPU can: AVX512_BF16, and LINEAGE_ISA not forcing a
// lower ISA. Where it cannot, bf16_dot is ignored (the exact path runs).
bool bf16_dot_available();
// Whether linear() multiplies W with bf16 dot products: bf16_dot set, the CPU able, BF16 or MXFP4 weights.
bool runs_bf16_dot(const Weight& W);

// Int4 and int8 codes with QuantWeight::int8_dot: x quantized to int8 per block of 32 columns (scale
// d = max|x| / 127 in f32, codes nearbyint(x · (127 / max|x|)), ref::quantize_x_int8), and the
// weights' codes multiplied with x's in int32 (vpdpbusd, 64 products an instruction) over runs of 8
// (int4) or 4 (int8) columns, each run's sum less the zero point's share scaled by (scale · d) in f32.
// The opt-in trade llama.cpp makes for its integer formats (Q8_0 / Q8_K activations): a relative error
// of up to 1/254 of a block's largest |x| on each x, measured end to end in docs/quantization.md. The
// same arithmetic for every T, so decode and prefill, alone and batched, stay interchangeable. Whether
// this CPU can: AVX512_VNNI, and LINEAGE_ISA not forcing a lower ISA. Where it cannot, or a matrix's
// groups (or rows) are no whole 128-column (int4) or 64-column (int8) lines, the exact path runs.
bool int8_dot_available();
// Whether linear() multiplies W in that mode: int8_dot set, the CPU able, and W's codes and groups ones
// it takes.
bool runs_int8_dot(const QuantWeight& W);

// The kernels this process runs, chosen once from cpuid: the GEMV table ("avx512", "avx2" or
// "scalar"; LINEAGE_ISA=avx2|scalar narrows it), whether T > 1 runs the engine's own GEMM (the
// AVX-512 table) rather than OpenBLAS, and whether bf16 dot products can run (AVX512_BF16 too).
struct KernelTable {
  const char* isa;
  bool own_gemm, bf16_dot;
};
KernelTable kernel_table();

// One of several linear maps of the same input: y = act(x·W (+ bias)).
struct LinearOut {
  Weight W;
  const Tensor* bias = nullptr;
  float* y = nullptr;
  std::optional<Activation> act = std::nullopt;
  // One token (T = 1) only: called as then(o0, o1) once outputs [o0, o1) of y are final (bias and
  // act applied), on the thread that finished them, for work on those outputs alone (a short
  // convolution's step): it joins the GEMV's parallel region and reads y where it was just written,
  // instead of a serial pass pulling half of y from the other cores' caches afterwards.
  std::function<void(int64_t o0, int64_t o1)> then = {};
};

// linear() for each of `outs` on the same x. For one token (T = 1, decode) their GEMVs share one
// parallel region, the row chunks of all outputs split into one share per thread (a thread that
// finishes early takes chunks from the back of the others' shares): fewer thread wake-ups per
// layer than one linear() call each. Results equal linear()'s. `then` needs T = 1.
void linear_group(const float* x, int64_t T, std::span<const LinearOut> outs);

// Widens `n` consecutive elements of a float tensor starting at element `offset` into dst.
void widen_row(const Tensor& t, int64_t offset, int64_t n, float* dst);

}  // namespace lineage::kernels
