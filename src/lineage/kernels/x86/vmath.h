// AVX-512 builds of the vmath.h loops; vmath.cpp calls them where the dispatcher chose AVX-512.
#pragma once

#include <cstdint>

namespace lineage::kernels {

void exp_nonpositive_avx512(const float* x, float* y, int64_t n);
void sigmoid_avx512(const float* x, float* y, int64_t n);
void softplus_avx512(const float* x, float* y, int64_t n);
void situ_glu_avx512(float* g, const float* u, int64_t n, float beta, float beta_lin);
void layer_norm_row_avx512(const float* x, int64_t D, const float* w, const float* b, float eps, float* y);
void rms_norm_row_avx512(const float* x, int64_t D, const float* w, float eps, float* y);
void conv_taps_avx512(const float* const* rows, const float* taps, int64_t C, int64_t W, int64_t c0, int64_t c1,
                      float* y);

}  // namespace lineage::kernels
