// Norm layers as checkpoints store them: LayerNorm (weight + bias) or RMSNorm (weight), and the
// zero-centred RMSNorm of Qwen3-Next and Qwen3.5, whose stored weight w scales by 1 + w.
#pragma once

#include "lineage/layers/common.h"

namespace lineage::layers {

struct Norm {
  enum class Kind : uint8_t { Layer, Rms };
  Kind kind = Kind::Layer;
  int64_t dim = 0;
  float eps = 1e-5f;
  Tensor weight;  // [D]
  Tensor bias;    // [D], LayerNorm only
  bool unit_offset = false;  // RMSNorm scaled by (1 + weight), the 1 added in f32 (zero-centred)

  void for_each_tensor(const std::string& prefix, const TensorVisitor& f) {
    f(prefix + ".weight", weight, {dim}, unit_offset ? Init::Zeros : Init::Ones);  // zero-centred: 1 + 0
    if (kind == Kind::Layer) f(prefix + ".bias", bias, {dim}, Init::Zeros);
  }
};

// y = norm(x) over rows of D; y may alias x.
void forward(const Norm& n, const float* x, int64_t T, float* y);

// Training (train_step.h): dx[T, D] = ∂L/∂x from the forward's input x and dy (dx may alias dy, not
// x); ∂L/∂weight (and bias) added into grad's tensors. F32 weights.
void backward(const Norm& n, const float* x, int64_t T, const float* dy, float* dx, Norm& grad);

}  // namespace lineage::layers
