// The vectorized exp / sigmoid / softplus against double-precision libm, in the portable build of the
// loops and (where the CPU has it) the AVX-512 build, over a dense sweep of the ranges the models
// feed them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "lineage/kernels/vmath.h"
#include "lineage/kernels/x86/gemv.h"
#include "lineage/kernels/x86/vmath.h"
#include "lineage/kernels/x86/vmath_loops.h"

namespace lineage::kernels {
namespace vmath_test {
namespace {

using Fn = std::function<void(const float*, float*, int64_t)>;

struct Build {
  std::string name;
  Fn exp, sigmoid, softplus;
};

std::vector<Build> builds() {
  std::vector<Build> b = {{"portable", vmath_loops::exp_nonpositive, vmath_loops::sigmoid, vmath_loops::softplus},
                          {"dispatched", exp_nonpositive, sigmoid, softplus}};
  if (!std::strcmp(isa_name(), "avx512")) b.push_back({"avx512", exp_nonpositive_avx512, sigmoid_avx512, softplus_avx512});
  return b;
}

// n points evenly spaced over [lo, hi], plus a few exact values of interest.
std::vector<float> sweep(float lo, float hi, int n, std::vector<float> extra) {
  for (int i = 0; i < n; ++i) extra.push_back(lo + (hi - lo) * float(i) / float(n - 1));
  return extra;
}

// |got − want| <= rel·|want| + abs for every point; reports the worst.
void expect_close(const std::string& what, const std::vector<float>& x, const std::vector<float>& got,
                  double (*want)(double), double rel, double abs) {
  for (size_t i = 0; i < x.size(); ++i) {
    const double w = want(double(x[i]));
    ASSERT_LE(std::fabs(double(got[i]) - w), rel * std::fabs(w) + abs) << what << " at x = " << x[i] << ": got " << got[i]
                                                                       << ", want " << w;
  }
}

double ref_exp(double x) { return x < -87.0 ? 0.0 : std::exp(x); }
double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double ref_softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

TEST(Vmath, ExpSigmoidSoftplusMatchDoubleLibm) {
  for (const Build& b : builds()) {
    const auto xe = sweep(-90.0f, 0.0f, 20001, {0.0f, -1e-30f, -86.9f, -87.0f, -87.1f});
    std::vector<float> y(xe.size());
    b.exp(xe.data(), y.data(), int64_t(xe.size()));
    expect_close(b.name + " exp", xe, y, ref_exp, 3e-7, 1e-38);

    const auto xs = sweep(-40.0f, 40.0f, 20001, {0.0f, 1e-20f, -1e-20f, 87.5f, -87.5f, 100.0f, -100.0f});
    std::vector<float> s(xs.size()), sp(xs.size());
    b.sigmoid(xs.data(), s.data(), int64_t(xs.size()));
    expect_close(b.name + " sigmoid", xs, s, ref_sigmoid, 1e-6, 1e-37);
    b.softplus(xs.data(), sp.data(), int64_t(xs.size()));
    expect_close(b.name + " softplus", xs, sp, ref_softplus, 1e-6, 1e-37);

    std::vector<float> in_place = xs;  // y may alias x
    b.softplus(in_place.data(), in_place.data(), int64_t(in_place.size()));
    EXPECT_EQ(in_place, sp) << b.name;
  }
}

// SiTU-GLU against double libm: β·tanh(g/β)·σ(g) · β_lin·tanh(u/β_lin), over gates and ups from tiny
// (where tanh's polynomial branch keeps the relative precision) to far past the caps, with the
// linear cap off (β_lin = 0: u passes through), in every build.
TEST(Vmath, SituGluMatchesDoubleLibm) {
  using SituFn = std::function<void(float*, const float*, int64_t, float, float)>;
  std::vector<std::pair<std::string, SituFn>> fns = {{"portable", vmath_loops::situ_glu}, {"dispatched", situ_glu}};
  if (!std::strcmp(isa_name(), "avx512")) fns.push_back({"avx512", situ_glu_avx512});
  std::vector<float> g, u;
  for (float a : sweep(-300.0f, 300.0f, 601, {0.0f, 1e-20f, -1e-7f, 1e-3f, 2.49f, 2.5f, 2.51f, -2.5f}))
    for (float b : sweep(-200.0f, 200.0f, 41, {0.0f, 3e-6f, -1e-2f, 15.6f, 15.7f})) g.push_back(a), u.push_back(b);
  for (const auto& [name, fn] : fns)
    for (float beta_lin : {25.0f, 0.0f, 1.5f}) {
      const float beta = beta_lin == 1.5f ? 0.75f : 4.0f;  // small betas that bite
      std::vector<float> y = g;
      fn(y.data(), u.data(), int64_t(y.size()), beta, beta_lin);
      for (size_t i = 0; i < g.size(); ++i) {
        const double x = g[i], v = u[i];
        const double up = beta_lin > 0 ? beta_lin * std::tanh(v / beta_lin) : v;
        const double want = beta * std::tanh(x / beta) / (1.0 + std::exp(-x)) * up;
        ASSERT_LE(std::fabs(y[i] - want), 1e-6 * std::fabs(want) + 1e-34)  // σ underflows below −87
            << name << " beta_lin " << beta_lin << " at g = " << g[i] << ", u = " << u[i] << ": got " << y[i]
            << ", want " << want;
      }
    }
}

}  // namespace
}  // namespace vmath_test
}  // namespace lineage::kernels
