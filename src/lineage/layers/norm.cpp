#include "lineage/layers/norm.h"

#include "lineage/kernels/norm.h"

namespace lineage::layers {

void forward(const Norm& n, const float* x, int64_t T, float* y) {
  if (n.kind == Norm::Kind::Layer)
    kernels::layer_norm(x, T, n.dim, n.weight, &n.bias, n.eps, y);
  else
    kernels::rms_norm(x, T, n.dim, &n.weight, n.eps, y);
}

}  // namespace lineage::layers
