// A weight matrix as a checkpoint stores it: its storage format, logical [out, in] shape, layout and
// data (+ block scales). The linear kernels dispatch on the format in one place (linear.cpp).
#pragma once

#include <cstdint>

#include "lineage/core/tensor.h"
#include "lineage/kernels/linear.h"

namespace lineage::kernels {

// F32, F16, BF16: one element each, widened (or bf16-dotted) inside the kernels. MXFP4 (Kimi K3's
// experts, OCP microscaling, compressed-tensors `mxfp4-pack-quantized`): e2m1 values packed two to a
// byte along `in` (column c in byte c/2, the low nibble the even column; bit 3 the sign, bits 0-2 index
// {0, 0.5, 1, 1.5, 2, 3, 4, 6}) with one E8M0 exponent s per 32 of them (the value's factor 2^(s-127);
// 255 is NaN), stored as a `weight_packed` [out, in/2] U8 + `weight_scale` [out, in/32] U8 pair, OutIn,
// `in` a multiple of 32. Multiplied on the packed codes (linear.h).
enum class MatrixFormat : uint8_t { F32, F16, BF16, MXFP4 };

struct Matrix {
  Tensor data;    // F32/F16/BF16: the elements, [out, in] (OutIn) or [in, out] (InOut); MXFP4: [out, in/2] U8
  Tensor scales;  // MXFP4: [out, in/32] U8 (E8M0); undefined otherwise
  Layout layout = Layout::OutIn;
  int64_t out = 0, in = 0;
  // Stored as a packed pair (`weight_packed` + `weight_scale`, MXFP4): set by the family's file
  // before binding (from the config's quantization), so the layer lists both under those names.
  bool packed = false;

  // The format from the data's dtype (U8 data with scales: MXFP4).
  MatrixFormat format() const;
  // The call view: the data (and, for MXFP4, the scales) with the layout and the call's bf16 option.
  Weight view(bool bf16_dot) const;
  size_t bytes() const { return data.nbytes() + scales.nbytes(); }
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

// W in [out, in] layout, owned: a no-op where it already is; the GPT-2 Conv1D [in, out] matrices of
// owned weights are transposed once (model::prepare).
void store_out_in(Matrix& W);

}  // namespace lineage::kernels
