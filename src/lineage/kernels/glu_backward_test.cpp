// The gated MLP's fused gates (SwiGLU, SiTU-GLU) backward: the scalar twins against central finite
// differences in double (relative error <= 1e-6), then the fast f32 kernels against them with 1 and 2 threads.
#include "lineage/kernels/glu_backward.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "grad_check.h"
#include "lineage/kernels/ref/glu_backward_ref.h"

namespace lineage::kernels {
namespace glu_backward_test {
namespace {

using namespace test;  // grad_check.h: randn, expect_fd, expect_close, ...

TEST(GluBackwardRef, SwiGluAndSituMatchFiniteDifferences) {
  const Vec g = randn(12, 15, 3.0), u = randn(12, 16, 20.0);
  for (size_t i = 0; i < g.size(); ++i) {
    Vec p{g[i], u[i]};
    double dg = 0, du = 0;
    ref::swiglu_backward(g[i], u[i], 1.0, dg, du);
    expect_fd(p, [&] { return ref::swiglu(p[0], p[1]); }, Vec{dg, du}, "swiglu");
    for (const double beta_lin : {0.0, 25.0, 3.0}) {
      ref::situ_glu_backward(g[i], u[i], 1.0, 4.0, beta_lin, dg, du);
      expect_fd(p, [&] { return ref::situ_glu(p[0], p[1], 4.0, beta_lin); }, Vec{dg, du},
                "situ, beta_lin " + std::to_string(beta_lin) + " at g " + std::to_string(g[i]));
    }
  }
}

class GluBackwardFast : public ::testing::TestWithParam<int> {};

TEST_P(GluBackwardFast, MatchesRef) {
  ScopedThreads st(GetParam());
  for (const int64_t n : {1, 31, 20000})
    for (const double beta_lin : {-1.0, 0.0, 25.0}) {  // -1: SwiGLU
      const Vec g = randn(n, 34, 4.0), u = randn(n, 35, 30.0), dh = randn(n, 36);
      Vec dg(static_cast<size_t>(n)), du(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const double gi = double(float(g[size_t(i)])), ui = double(float(u[size_t(i)])), d = double(float(dh[size_t(i)]));
        if (beta_lin < 0) ref::swiglu_backward(gi, ui, d, dg[size_t(i)], du[size_t(i)]);
        else ref::situ_glu_backward(gi, ui, d, 4.0, beta_lin, dg[size_t(i)], du[size_t(i)]);
      }
      const std::vector<float> gf = to_float(g), uf = to_float(u);
      std::vector<float> dgf = to_float(dh), duf(static_cast<size_t>(n));
      if (beta_lin < 0) swiglu_backward(gf.data(), uf.data(), dgf.data(), n, dgf.data(), duf.data());
      else situ_glu_backward(gf.data(), uf.data(), dgf.data(), n, 4.0f, float(beta_lin), dgf.data(), duf.data());
      const std::string what = "n " + std::to_string(n) + (beta_lin < 0 ? " swiglu" : " situ " + std::to_string(beta_lin));
      expect_close(dgf.data(), dg, 1e-6, "dg (in place), " + what);
      expect_close(duf.data(), du, 1e-6, "du, " + what);
    }
}

INSTANTIATE_TEST_SUITE_P(Threads, GluBackwardFast, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "_threads"; });

}  // namespace
}  // namespace glu_backward_test
}  // namespace lineage::kernels
