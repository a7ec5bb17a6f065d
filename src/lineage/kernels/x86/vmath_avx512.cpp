#include "lineage/kernels/x86/vmath.h"

#include "lineage/kernels/x86/vmath_loops.h"

namespace lineage::kernels {

void exp_nonpositive_avx512(const float* x, float* y, int64_t n) { vmath_loops::exp_nonpositive(x, y, n); }
void sigmoid_avx512(const float* x, float* y, int64_t n) { vmath_loops::sigmoid(x, y, n); }
void softplus_avx512(const float* x, float* y, int64_t n) { vmath_loops::softplus(x, y, n); }

}  // namespace lineage::kernels
