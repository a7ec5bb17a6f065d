#include "lineage/kernels/vmath.h"

#include <cstring>

#include "lineage/kernels/x86/gemv.h"
#include "lineage/kernels/x86/vmath.h"
#include "lineage/kernels/x86/vmath_loops.h"

namespace lineage::kernels {

namespace {
bool use_avx512() {
  static const bool yes = !std::strcmp(isa_name(), "avx512");
  return yes;
}
}  // namespace

void exp_nonpositive(const float* x, float* y, int64_t n) {
  if (use_avx512()) exp_nonpositive_avx512(x, y, n);
  else vmath_loops::exp_nonpositive(x, y, n);
}

void sigmoid(const float* x, float* y, int64_t n) {
  if (use_avx512()) sigmoid_avx512(x, y, n);
  else vmath_loops::sigmoid(x, y, n);
}

void softplus(const float* x, float* y, int64_t n) {
  if (use_avx512()) softplus_avx512(x, y, n);
  else vmath_loops::softplus(x, y, n);
}

void situ_glu(float* g, const float* u, int64_t n, float beta, float beta_lin) {
  if (use_avx512()) situ_glu_avx512(g, u, n, beta, beta_lin);
  else vmath_loops::situ_glu(g, u, n, beta, beta_lin);
}

void layer_norm_row(const float* x, int64_t D, const float* w, const float* b, float eps, float* y) {
  if (use_avx512()) layer_norm_row_avx512(x, D, w, b, eps, y);
  else vmath_loops::layer_norm_row(x, D, w, b, eps, y);
}

void rms_norm_row(const float* x, int64_t D, const float* w, float eps, float* y) {
  if (use_avx512()) rms_norm_row_avx512(x, D, w, eps, y);
  else vmath_loops::rms_norm_row(x, D, w, eps, y);
}

void conv_taps(const float* const* rows, const float* taps, int64_t C, int64_t W, int64_t c0, int64_t c1, float* y) {
  if (use_avx512()) conv_taps_avx512(rows, taps, C, W, c0, c1, y);
  else vmath_loops::conv_taps(rows, taps, C, W, c0, c1, y);
}

}  // namespace lineage::kernels
