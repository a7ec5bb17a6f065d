// Portable roofline loops (baseline x86-64 / any CPU): 8 independent scalar accumulators for the
// read, 8 independent multiply-add chains (a multiply and an add each, no FMA) for the peak.
#include "lineage/kernels/roofline.h"

namespace lineage::kernels::roofline {

namespace {

float sum(const float* p, int64_t n) {
  float a[8] = {};
  for (int64_t i = 0; i < n; i += 8)
    for (int j = 0; j < 8; ++j) a[j] += p[i + j];
  float s = 0;
  for (float x : a) s += x;
  return s;
}

constexpr int kChains = 8;

float mul_add_chains(int64_t iters) {
  const float m = 0.999999f, c = 1e-6f;
  float a[kChains];
  for (int j = 0; j < kChains; ++j) a[j] = float(j);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) a[j] = a[j] * m + c;
  float s = 0;
  for (float x : a) s += x;
  return s;
}

}  // namespace

ReadKernel read_scalar() { return {"scalar", sum}; }
PeakKernel fma_scalar() { return {"scalar mul+add", mul_add_chains, double(kChains) * 2}; }

}  // namespace lineage::kernels::roofline
