// AVX-512 builds of the vmath.h loops; vmath.cpp calls them where the dispatcher chose AVX-512.
#pragma once

#include <cstdint>

namespace lineage::kernels {

void exp_nonpositive_avx512(const float* x, float* y, int64_t n);
void sigmoid_avx512(const float* x, float* y, int64_t n);
void softplus_avx512(const float* x, float* y, int64_t n);

}  // namespace lineage::kernels
