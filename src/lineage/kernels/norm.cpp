#include "lineage/kernels/norm.h"

#include <vector>

#include "lineage/core/parallel.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/vmath.h"

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
    for (int64_t t = t0; t < t1; ++t) layer_norm_row(x + t * D, D, wp, bp, eps, y + t * D);
  }, grain_for(4 * D));
}

void rms_norm(const float* x, int64_t T, int64_t D, const Tensor* w, float eps, float* y, float w_offset) {
  thread_local std::vector<float> wv;
  wv.assign(D, 1.0f);
  if (w) {
    widen_row(*w, 0, D, wv.data());
    if (w_offset != 0.0f)
      for (float& v : wv) v += w_offset;
  }
  const float* wp = wv.data();
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) rms_norm_row(x + t * D, D, wp, eps, y + t * D);
  }, grain_for(3 * D));
}

}  // namespace lineage::kernels
