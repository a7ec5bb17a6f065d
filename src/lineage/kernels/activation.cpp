#include "lineage/kernels/activation.h"

#include <cmath>

namespace lineage::kernels {

void activate(Activation act, float* x, int64_t n) {
  switch (act) {
    case Activation::GeluTanh: {
      constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
      for (int64_t i = 0; i < n; ++i) {
        const float u = x[i];
        x[i] = 0.5f * u * (1.0f + std::tanh(kC * (u + 0.044715f * u * u * u)));
      }
      break;
    }
    case Activation::GeluErf:
      for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.7071067811865476f));
      break;
    case Activation::Silu:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i]));
      break;
    case Activation::Relu:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0 ? x[i] : 0.0f;
      break;
  }
}

}  // namespace lineage::kernels
