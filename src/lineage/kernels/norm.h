// Normalizations over the last dim, computed in f32 with weights widened from their stored dtype.
#pragma once

#include <cstdint>

#include "lineage/core/tensor.h"

namespace lineage::kernels {

// y = (x − mean) / sqrt(var + eps) · w + b, biased variance (PyTorch LayerNorm). x, y: [T, D];
// w, b: [D]; b may be null. y may alias x.
void layer_norm(const float* x, int64_t T, int64_t D, const Tensor& w, const Tensor* b, float eps, float* y);

// y = x / sqrt(mean(x²) + eps) · (w + w_offset) (HF RMSNorm: offset 0; the zero-centred RMSNorm of
// Qwen3-Next and Qwen3.5: offset 1, added to the widened weight in f32). w may be null (no scale).
void rms_norm(const float* x, int64_t T, int64_t D, const Tensor* w, float eps, float* y, float w_offset = 0.0f);

}  // namespace lineage::kernels
