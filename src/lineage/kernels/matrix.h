// A weight matrix as a checkpoint stores it: its storage format, logical [out, in] shape, layout and
// data (+ block scales). The linear kernels dispatch on the format in one place (linear.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "lineage/core/tensor.h"
#include "lineage/kernels/linear.h"

namespace lineage::kernels {

// F32, F16, BF16: one element each, widened (or bf16-dotted) inside the kernels. MXFP4 (Kimi K3's
// experts, OCP microscaling, compressed-tensors `mxfp4-pack-quantized`): e2m1 values packed two to a
// byte along `in` (column c in byte c/2, the low nibble the even column; bit 3 the sign, bits 0-2 index
// {0, 0.5, 1, 1.5, 2, 3, 4, 6}) with one E8M0 exponent s per 32 of them (the value's factor 2^(s-127);
// 255 is NaN), stored as a `weight_packed` [out, in/2] U8 + `weight_scale` [out, in/32] U8 pair, OutIn,
// `in` a multiple of 32. Multiplied on the packed codes (linear.h).
// Quantized: codes with a scale per row and group (QuantWeight, linear.h), prepared at load from one of
// the layouts StoredQuant names.
enum class MatrixFormat : uint8_t { F32, F16, BF16, MXFP4, Quantized };

// How a checkpoint stores a quantized matrix `X.weight` (spec quantized-formats.md §2), set from the
// config's quantization_config before binding (model/quantization.h):
//   PackedInt (compressed-tensors pack-quantized, int4 or int8): X.weight_packed I32 [out, in·bits/32],
//     X.weight_scale [out, groups] (float), X.weight_zero_point I32 [ceil(out·bits/32), groups] when
//     asymmetric, X.weight_shape [2];
//   Fp8 (compressed-tensors float-quantized): X.weight F8_E4M3 [out, in], X.weight_scale [out, 1]
//     (channel), [ceil(out/br), ceil(in/bc)] (block) or [1] (tensor);
//   HfFp8 (transformers' quant_method fp8): X.weight F8_E4M3 [out, in], X.weight_scale_inv
//     [ceil(out/br), ceil(in/bc)], which multiplies as the compressed-tensors scale does;
//   Nvfp4 (nvfp4-pack-quantized): X.weight_packed U8 [out, in/2], X.weight_scale F8_E4M3 [out, in/16],
//     X.weight_global_scale F32 [1], element = e2m1 · (scale / global_scale).
//   Ggml (a GGUF file's block types, linear.h GgmlBlock): X.weight U8 [out, row bytes], each row
//     whole blocks of scales and codes as llama.cpp stores them.
// MXFP4 (mxfp4-pack-quantized) is Matrix::packed.
struct StoredQuant {
  enum class Kind : uint8_t { None, PackedInt, Fp8, HfFp8, Nvfp4, Ggml };
  Kind kind = Kind::None;
  int bits = 0;                 // PackedInt: 4 or 8
  int64_t group = 0;            // PackedInt: columns per scale, 0 for one a row (channel)
  int64_t block_rows = 0, block_cols = 0;  // Fp8, HfFp8: the scale's block; 0 per channel, -1 one scale
  bool symmetric = true;        // PackedInt: false stores zero points
  std::string origin;           // the config field that chose it, for messages
  GgmlBlock ggml = GgmlBlock::Q8_0;  // Ggml: the block format (a GGUF file's tensor type)
  bool defined() const { return kind != Kind::None; }
};

struct Matrix {
  Tensor data;    // F32/F16/BF16: the elements, [out, in] (OutIn) or [in, out] (InOut); MXFP4: [out, in/2] U8;
                  // Quantized: the codes as stored (I32 packed, U8, F8_E4M3)
  Tensor scales;  // MXFP4: [out, in/32] U8 (E8M0); Quantized: the stored scale tensor; undefined otherwise
  Layout layout = Layout::OutIn;
  int64_t out = 0, in = 0;
  // Stored as a packed pair (`weight_packed` + `weight_scale`, MXFP4): set by the family's file
  // before binding (from the config's quantization), so the layer lists both under those names.
  bool packed = false;
  // Quantized: how it is stored (set before binding), the stored tensors beside data and scales, and
  // what prepare_quant made of them: the codes as U8 [out, row_bytes] (a view), f32 scale and zero
  // tables (owned, small: one value a row and group) and the kernels' view of them.
  StoredQuant quant;
  Tensor zero_point, global_scale, weight_shape;
  Tensor codes, scale_table, zero_table;
  QuantWeight qw;
  // A routed expert streamed from disk (io/expert_stream.h): its tensors live in the expert store,
  // which prepares each copy it reads; this one is shapes and format only, never prepared or run.
  bool streamed = false;

  // The format from the data's dtype (U8 data with scales: MXFP4).
  MatrixFormat format() const;
  // The call view: the data (and, for MXFP4, the scales) with the layout and the call's bf16 option.
  Weight view(bool bf16_dot) const;
  size_t bytes() const { return data.nbytes() + scales.nbytes() + zero_point.nbytes() + global_scale.nbytes(); }
};

// y = act(x·W (+ bias)) for any format (kernels::linear for the elementwise ones). T rows of x.
void linear(const float* x, int64_t T, const Matrix& W, const Tensor* bias, float* y,
            std::optional<Activation> act = std::nullopt, bool bf16_dot = false);

// MXFP4: the flat index into W.scales of the first exponent 255 (NaN), or -1 where there is none (and
// for every other format). The loader rejects such a matrix, naming row index / (in/32), block
// index % (in/32).
int64_t first_nan_scale(const Matrix& W);
// The same over one weight_scale tensor (U8): the flat index of its first 255, or -1.
int64_t first_nan_scale(const Tensor& scales);

// A bound quantized matrix (quant set, its stored tensors bound with the shapes visit_quantized
// gives) made ready for the kernels: checks each stored tensor's dtype, every scale finite (at every
// load) and weight_shape, then builds codes, scale_table, zero_table and qw. Throws Error naming the
// tensor (from `name`, "….weight"), what was found and expected, and the config field.
void prepare_quant(Matrix& W, const std::string& name);

// Rows [r0, r1) of a prepared quantized or MXFP4 matrix as one (views of its codes and tables, no copy).
Matrix quant_rows(const Matrix& W, int64_t r0, int64_t r1);
// Rows [o0, o1) of a prepared quantized or MXFP4 matrix decoded to their defined values, f32
// [o1 - o0, in] in column order (a layer that needs a transposed copy, as MLA's absorbed W_UK; a token's
// row of an embedding in ggml's blocks, which decodes without allocating).
void decode_rows(const Matrix& W, int64_t o0, int64_t o1, float* dst);

// W in [out, in] layout, owned: a no-op where it already is; the GPT-2 Conv1D [in, out] matrices of
// owned weights are transposed once (model::prepare).
void store_out_in(Matrix& W);

}  // namespace lineage::kernels
