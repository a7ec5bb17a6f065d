#include "lineage/kernels/activation.h"

#include <algorithm>
#include <cmath>

#include "lineage/core/parallel.h"
#include "lineage/kernels/vmath.h"

namespace lineage::kernels {

namespace {

// x ← x · sigmoid(scale · f(x)) in blocks, where f is the identity (SiLU) or GELU's cubic.
template <bool kCubic>
void times_sigmoid(float* x, int64_t n, float scale) {
  constexpr int64_t kBlock = 256;
  float z[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    float* xb = x + b;
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) z[i] = scale * (kCubic ? xb[i] + 0.044715f * xb[i] * xb[i] * xb[i] : xb[i]);
    sigmoid(z, z, m);
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) xb[i] *= z[i];
  }
}

}  // namespace

void activate_serial(Activation act, float* x, int64_t n) {
  switch (act) {
    case Activation::GeluTanh:
      // 0.5·(1 + tanh(y)) = sigmoid(2y): the tanh form through a sigmoid that never forms exp(+·).
      times_sigmoid<true>(x, n, 2.0f * 0.7978845608028654f);
      break;
    case Activation::GeluErf:
      for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.7071067811865476f));
      break;
    case Activation::Silu:
      times_sigmoid<false>(x, n, 1.0f);
      break;
    case Activation::Relu:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0 ? x[i] : 0.0f;
      break;
    case Activation::Sigmoid:
      sigmoid(x, x, n);
      break;
  }
}

void activate(Activation act, float* x, int64_t n) {
  // Elementwise, so any split gives the same result; about 16 flops per element.
  constexpr int64_t kChunk = 256;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  parallel_for(chunks, [&](int64_t c0, int64_t c1) {
    activate_serial(act, x + c0 * kChunk, std::min(n, c1 * kChunk) - c0 * kChunk);
  }, grain_for(16 * kChunk));
}

}  // namespace lineage::kernels
