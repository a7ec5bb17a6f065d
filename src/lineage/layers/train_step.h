// What a training forward and its backward hand every layer: B sequences of T tokens, each from
// position 0 with an empty state; row b·T + t of every [N, ·] activation (N = B·T).
//
// Each trainable layer X has, beside its inference forward():
//   struct X::Saved { ... };   // what backward reads, kept by the training forward
//   void forward_train(const X&, const TrainShape&, const float* x, float* y, X::Saved&);
//   void backward(const X&, const TrainShape&, const float* x, const float* dy, X::Saved&,
//                 float* dx, X& grad);
// dx (∂L/∂x, [N, D]) is overwritten; the parameter gradients are added into `grad`, a layer of the
// same config whose tensors are F32 and shaped as the layer's own (gradient accumulation over
// micro-batches adds). Training needs F32 weights.
#pragma once

#include <cstdint>

namespace lineage::layers {

struct TrainShape {
  int64_t B = 0, T = 0;
  int64_t N() const { return B * T; }
};

}  // namespace lineage::layers
