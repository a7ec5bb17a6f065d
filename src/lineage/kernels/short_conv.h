// Causal depthwise short convolution (fla ShortConvolution) with its rolling decode state.
#pragma once

#include <cstdint>

#include "lineage/core/tensor.h"

namespace lineage::kernels {

// y[t, c] = act(Σ_{j<W} w[c, j] · x[t − W + 1 + j, c]), where rows before t = 0 come from `tail`
// (the last W − 1 raw inputs of the sequence so far, oldest first; zeros at the start). Afterwards
// `tail` holds the last W − 1 raw inputs including these T rows. x, y: [T, C] with row strides
// ldx, ldy (y may not alias x); w: [C, 1, W] any float dtype; tail: W − 1 rows of C f32, ld_tail
// floats apart (so the channels of several convolutions may share one tail). act = SiLU or none.
void short_conv(const float* x, int64_t T, int64_t C, int64_t ldx, const Tensor& w, float* tail, int64_t ld_tail,
                bool silu, float* y, int64_t ldy);

// One token of short_conv for channels [c0, c1) only: y[c] = act(Σ_{j<W−1} w[c, j] · tail[j][c] +
// w[c, W−1] · x[c]), then those channels of tail shift up one row and its last row takes x[c]. Rows
// of tail are ld_tail floats apart, so the channels of several convolutions may share one tail. Each
// channel gets the same arithmetic as in short_conv, so splitting [0, C) into any ranges (the row
// chunks of a parallel GEMV, each convolved on the thread that computed it) gives short_conv's result
// bit for bit.
void short_conv_step(const float* x, int64_t c0, int64_t c1, const Tensor& w, float* tail, int64_t ld_tail, bool silu,
                     float* y);

}  // namespace lineage::kernels
