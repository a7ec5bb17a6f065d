#include "lineage/layers/norm.h"

#include "lineage/core/error.h"
#include "lineage/kernels/backward.h"
#include "lineage/kernels/norm.h"

namespace lineage::layers {

void forward(const Norm& n, const float* x, int64_t T, float* y) {
  if (n.kind == Norm::Kind::Layer)
    kernels::layer_norm(x, T, n.dim, n.weight, &n.bias, n.eps, y);
  else
    kernels::rms_norm(x, T, n.dim, &n.weight, n.eps, y, n.unit_offset ? 1.0f : 0.0f);
}

void backward(const Norm& n, const float* x, int64_t T, const float* dy, float* dx, Norm& grad) {
  if (n.kind == Norm::Kind::Layer)
    kernels::layer_norm_backward(x, dy, T, n.dim, n.weight, n.eps, dx, grad.weight.data<float>(), grad.bias.data<float>());
  else
    kernels::rms_norm_backward(x, dy, T, n.dim, &n.weight, n.eps, dx, grad.weight.data<float>(),
                               n.unit_offset ? 1.0f : 0.0f);
}

}  // namespace lineage::layers
