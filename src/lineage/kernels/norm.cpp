#include "lineage/kernels/norm.h"

#include <cmath>
#include <vector>

#include "lineage/core/parallel.h"
#include "lineage/kernels/linear.h"

namespace lineage::kernels {

void layer_norm(const float* x, int64_t T, int64_t D, const Tensor& w, const Tensor* b, float eps, float* y) {
  thread_local std::vector<float> wv, bv;
  wv.resize(D);
  bv.assign(D, 0.0f);
  widen_row(w, 0, D, wv.data());
  if (b) widen_row(*b, 0, D, bv.data());
  const float* wp = wv.data();
  const float* bp = bv.data();
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* xt = x + t * D;
      // The sums in double, over several partial sums (omp simd), not one serial chain.
      double mean = 0, var = 0;
#pragma omp simd reduction(+ : mean)
      for (int64_t i = 0; i < D; ++i) mean += xt[i];
      mean /= D;
#pragma omp simd reduction(+ : var)
      for (int64_t i = 0; i < D; ++i) var += (xt[i] - mean) * (xt[i] - mean);
      var /= D;
      const float inv = float(1.0 / std::sqrt(var + eps)), mu = float(mean);
      for (int64_t i = 0; i < D; ++i) y[t * D + i] = (xt[i] - mu) * inv * wp[i] + bp[i];
    }
  }, grain_for(4 * D));
}

void rms_norm(const float* x, int64_t T, int64_t D, const Tensor* w, float eps, float* y) {
  thread_local std::vector<float> wv;
  wv.assign(D, 1.0f);
  if (w) widen_row(*w, 0, D, wv.data());
  const float* wp = wv.data();
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* xt = x + t * D;
      double ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < D; ++i) ss += double(xt[i]) * xt[i];
      const float inv = float(1.0 / std::sqrt(ss / D + eps));
      for (int64_t i = 0; i < D; ++i) y[t * D + i] = xt[i] * inv * wp[i];
    }
  }, grain_for(3 * D));
}

}  // namespace lineage::kernels
