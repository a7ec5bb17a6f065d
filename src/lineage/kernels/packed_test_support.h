// What the tests of the packed weight formats share (mxfp4_test.cpp, quant_test.cpp, ggml_test.cpp):
// seeded inputs, the error metric and its worst element, the tolerance of f32 sums against ref::'s
// double ones, the ISA tables this CPU can run, linear()'s check over tokens and threads, and the
// message of an expected error.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "lineage/core/dtype.h"
#include "lineage/core/error.h"
#include "lineage/core/tensor.h"
#include "lineage/core/rng.h"
#include "lineage/kernels/activation.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"
#include "lineage/kernels/random_blocks.h"
#include "lineage/kernels/ref/ref.h"
#include "lineage/kernels/threads.h"
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

// linear() on m through whichever path each T takes, with a bias and an activation, 1 to 3 threads:
// against ref:: then activate(); the same bits at every thread count; 2 to 8 rows each row's lone bits.
inline void check_linear(const Matrix& m, const std::string& label, std::initializer_list<int64_t> tokens) {
  const int64_t in = m.in, out = m.out;
  Tensor bias = Tensor::empty(DType::F32, {out});
  const std::vector<float> b = random_floats(out, 9);
  std::memcpy(bias.data<float>(), b.data(), b.size() * 4);
  for (int64_t T : tokens) {
    const std::vector<float> x = random_floats(T * in, uint64_t(T * 5 + in));
    std::vector<float> want(size_t(T * out)), got(want.size()), first, one(static_cast<size_t>(out));
    ref::linear(x.data(), T, m.view(false), &bias, want.data());
    activate(Activation::Silu, want.data(), T * out);
    for (int threads : {1, 2, 3}) {
      set_threads(threads);
      linear(x.data(), T, m, &bias, got.data(), Activation::Silu);
      ASSERT_LE(rel_rms(got, want), tolerance(in)) << worst(got, want) << "; " << label << " " << out << "x" << in << " T " << T;
      if (threads == 1) first = got;
      else ASSERT_EQ(got, first) << label << " T " << T << " threads " << threads;
      if (T > 8) continue;
      for (int64_t t = 0; t < T; ++t) {
        linear(x.data() + t * in, 1, m, &bias, one.data(), Activation::Silu);
        ASSERT_EQ(std::vector<float>(got.begin() + t * out, got.begin() + (t + 1) * out), one)
            << label << " T " << T << " row " << t << " threads " << threads;
      }
    }
  }
  set_threads(0);
}

// The message of the Error f throws, or "" where it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace lineage::kernels::packed_test
