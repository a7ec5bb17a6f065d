// Norm layers as checkpoints store them: LayerNorm (weight + bias) or RMSNorm (weight).
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

  void for_each_tensor(const std::string& prefix, const TensorVisitor& f) {
    f(prefix + ".weight", weight, {dim}, Init::Ones);
    if (kind == Kind::Layer) f(prefix + ".bias", bias, {dim}, Init::Zeros);
  }
};

// y = norm(x) over rows of D; y may alias x.
void forward(const Norm& n, const float* x, int64_t T, float* y);

// Training (train_step.h): dx[T, D] = ∂L/∂x from the forward's input x and dy (dx may alias dy, not
// x); ∂L/∂weight (and bias) added into grad's tensors. F32 weights.
void backward(const Norm& n, const float* x, int64_t T, const float* dy, float* dx, Norm& grad);

}  // namespace lineage::layers
