#include "lineage/kernels/x86/vmath.h"

#include "lineage/kernels/x86/vmath_loops.h"

namespace lineage::kernels {

void exp_nonpositive_avx512(const float* x, float* y, int64_t n) { vmath_loops::exp_nonpositive(x, y, n); }
void sigmoid_avx512(const float* x, float* y, int64_t n) { vmath_loops::sigmoid(x, y, n); }
void softplus_avx512(const float* x, float* y, int64_t n) { vmath_loops::softplus(x, y, n); }
void situ_glu_avx512(float* g, const float* u, int64_t n, float beta, float beta_lin) {
  vmath_loops::situ_glu(g, u, n, beta, beta_lin);
}
void layer_norm_row_avx512(const float* x, int64_t D, const float* w, const float* b, float eps, float* y) {
  vmath_loops::layer_norm_row(x, D, w, b, eps, y);
}
void rms_norm_row_avx512(const float* x, int64_t D, const float* w, float eps, float* y) {
  vmath_loops::rms_norm_row(x, D, w, eps, y);
}
void conv_taps_avx512(const float* const* rows, const float* taps, int64_t C, int64_t W, int64_t c0, int64_t c1,
                      float* y) {
  vmath_loops::conv_taps(rows, taps, C, W, c0, c1, y);
}

}  // namespace lineage::kernels
