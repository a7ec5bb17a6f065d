// What the tests of the packed weight formats share (mxfp4_test.cpp, quant_test.cpp): seeded inputs,
// the error metric and its worst element, the tolerance of f32 sums against ref::'s double ones, and
// the ISA tables this CPU can run.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "lineage/core/rng.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels::packed_test {

inline std::vector<float> random_floats(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(size_t(n), 0.0f);
  for (float& f : v) f = rng.normal();
  return v;
}

inline double rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d, den += double(want[i]) * double(want[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

inline std::string worst(const std::vector<float>& got, const std::vector<float>& want) {
  size_t w = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(double(got[i]) - want[i]) <= std::fabs(double(got[w]) - want[w]))) w = i;
  std::ostringstream s;
  s << "worst element " << w << ": got " << got[w] << ", want " << want[w];
  return s.str();
}

// The kernels sum in f32 what ref:: sums in double. The GEMVs split a row's sum over 4 × width
// accumulators (2e-7 relative RMS at 4096 inputs); the GEMM sums each output in one FMA chain over
// `in`, whose rounding error grows as √in (1.0-1.1e-6 measured at 4096): 1e-6, scaled by √(in/1024)
// from 1024 inputs on.
inline double tolerance(int64_t in) { return 1e-6 * std::max(1.0, std::sqrt(double(in) / 1024.0)); }

// Every GEMV table this CPU runs: scalar always, AVX2 beside AVX-512, and the chosen one.
inline std::vector<const GemvTable*> tables() {
  std::vector<const GemvTable*> t = {&gemv_table_scalar()};
  if (std::string(gemv_table().isa) == "avx512") t.push_back(&gemv_table_avx2());
  if (std::string(gemv_table().isa) != "scalar") t.push_back(&gemv_table());
  return t;
}

}  // namespace lineage::kernels::packed_test
