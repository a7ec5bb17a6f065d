#include "lineage/kernels/glu_backward.h"

#include <algorithm>
#include <cmath>

#include "lineage/core/parallel.h"
#include "lineage/kernels/vmath.h"

namespace lineage::kernels {

namespace {

// σ(x) from exp(−|x|): no exponent is ever positive.
float sigmoid_of(float x) {
  const float e = std::exp(-std::fabs(x));
  return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

}  // namespace

void swiglu_backward(const float* g, const float* u, const float* dh, int64_t n, float* dg, float* du) {
  parallel_for(n, [&](int64_t i0, int64_t i1) {
    // σ(g) a block at a time through vmath's vector exponent, then the products in one simd loop
    // (element i reads dh[i] before it writes dg[i], so dg may alias dh).
    constexpr int64_t kBlock = 256;
    float s[kBlock];
    for (int64_t b = i0; b < i1; b += kBlock) {
      const int64_t m = std::min(kBlock, i1 - b);
      sigmoid(g + b, s, m);
#pragma omp simd
      for (int64_t i = 0; i < m; ++i) {
        const float x = g[b + i], d = dh[b + i], ui = u[b + i], si = s[i];
        dg[b + i] = d * ui * si * (1.0f + x * (1.0f - si));
        du[b + i] = d * x * si;
      }
    }
  }, 1 << 13);
}

void situ_glu_backward(const float* g, const float* u, const float* dh, int64_t n, float beta, float beta_lin,
                       float* dg, float* du) {
  parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float x = g[i], y = u[i], d = dh[i];
      const float s = sigmoid_of(x), th = std::tanh(x / beta);
      const float a = beta * th * s;
      const float da = (1.0f - th * th) * s + beta * th * s * (1.0f - s);
      float b = y, db = 1.0f;
      if (beta_lin > 0.0f) {
        const float tl = std::tanh(y / beta_lin);
        b = beta_lin * tl, db = 1.0f - tl * tl;
      }
      dg[i] = d * b * da;
      du[i] = d * a * db;
    }
  }, 1 << 12);
}

}  // namespace lineage::kernels
