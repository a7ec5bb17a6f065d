// Causal depthwise short convolution (fla ShortConvolution) with its rolling decode state.
#pragma once

#include <cstdint>

#include "lineage/core/tensor.h"

namespace lineage::kernels {

// y[t, c] = act(Σ_{j<W} w[c, j] · x[t − W + 1 + j, c]), where rows before t = 0 come from `tail`
// (the last W − 1 raw inputs of the sequence so far, oldest first; zeros at the start). Afterwards
// `tail` holds the last W − 1 raw inputs including these T rows. x, y: [T, C] with row strides
// ldx, ldy (y may not alias x); w: [C, 1, W] any float dtype; tail: [W − 1, C] f32. act = SiLU or none.
void short_conv(const float* x, int64_t T, int64_t C, int64_t ldx, const Tensor& w, float* tail, bool silu,
                float* y, int64_t ldy);

}  // namespace lineage::kernels
