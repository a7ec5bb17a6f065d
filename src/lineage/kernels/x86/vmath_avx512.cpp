#include "lineage/kernels/x86/vmath.h"

#include "lineage/kernels/x86/vmath_loops.h"

namespace lineage::kernels {

void exp_nonpositive_avx512(const float* x, float* y, int64_t n) { vmath_loops::exp_nonpositive(x, y, n); }
void sigmoid_avx512(const float* x, float* y, int64_t n) { vmath_loops::sigmoid(x, y, n); }
void softplus_avx512(const float* x, float* y, int64_t n) { vmath_loops::softplus(x, y, n); }
void layer_norm_row_avx512(const float* x, int64_t D, const float* w, const float* b, float eps, float* y) {
  vmath_loops::layer_norm_row(x, D, w, b, eps, y);
}
void rms_norm_row_avx512(const float* x, int64_t D, const float* w, float eps, float* y) {
  vmath_loops::rms_norm_row(x, D, w, eps, y);
}

}  // namespace lineage::kernels
