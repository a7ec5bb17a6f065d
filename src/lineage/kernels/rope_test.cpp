// RoPE's backward, interleaved (MLA) and rotate-half (Qwen): the scalar twins against central finite
// differences in double (relative error <= 1e-6), then the fast f32 forward and backward against the
// twin over widths, positions and bases, and the backward as the exact transpose of the forward.
#include "lineage/kernels/rope.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "grad_check.h"
#include "lineage/kernels/ref/rope_ref.h"

namespace lineage::kernels {
namespace rope_test {
namespace {

using test::expect_close;
using test::expect_fd;
using test::randn;
using test::to_float;
using Vec = test::Vec;

// L(x) = ½ Σ w_i (R x)_i², so ∂L/∂x = Rᵀ (w ⊙ R x): the twin's transpose is the gradient.
void twin(bool neox, double* x, int64_t d, int64_t p, double theta, int sign) {
  if (neox) ref::rope_neox(x, d, p, theta, sign);
  else ref::rope_interleaved(x, d, p, theta, sign);
}

void fast(bool neox, float* x, int64_t d, int64_t p, double theta, int sign) {
  if (neox) sign > 0 ? rope_neox(x, d, p, theta) : rope_neox_backward(x, d, p, theta);
  else sign > 0 ? rope_interleaved(x, d, p, theta) : rope_interleaved_backward(x, d, p, theta);
}

TEST(RopeRef, BackwardMatchesFiniteDifferences) {
  for (const bool neox : {false, true})
    for (const int64_t d : {2, 6, 16})
      for (const int64_t p : {0, 1, 7, 5000}) {
        Vec x = randn(d, 1 + uint64_t(d + p), 1.5);
        const Vec w = randn(d, 2 + uint64_t(d + p));
        const auto loss = [&] {
          Vec y = x;
          twin(neox, y.data(), d, p, 10000.0, 1);
          double l = 0;
          for (int64_t i = 0; i < d; ++i) l += 0.5 * w[size_t(i)] * y[size_t(i)] * y[size_t(i)];
          return l;
        };
        Vec g = x;
        twin(neox, g.data(), d, p, 10000.0, 1);
        for (int64_t i = 0; i < d; ++i) g[size_t(i)] *= w[size_t(i)];
        twin(neox, g.data(), d, p, 10000.0, -1);
        expect_fd(x, loss, g, std::string(neox ? "rotate-half" : "interleaved") + ", d " + std::to_string(d) + ", p " +
                                  std::to_string(p));
      }
}

TEST(Rope, FastMatchesTwinAndBackwardIsTheTranspose) {
  for (const bool neox : {false, true})
    for (const double theta : {100.0, 10000.0, 1e6})
      for (const int64_t d : {2, 4, 6, 64})
        for (const int64_t p : {0, 1, 13, 4096, 1000003}) {
          const std::string what = std::string(neox ? "rotate-half, " : "interleaved, ") + "θ " +
                                   std::to_string(theta) + ", d " + std::to_string(d) + ", p " + std::to_string(p);
          const Vec x = randn(d, uint64_t(d * 7 + p), 2.0), dy = randn(d, uint64_t(d * 11 + p));
          for (const int sign : {1, -1}) {
            Vec want = sign > 0 ? x : dy;
            std::vector<float> got = to_float(want);
            for (size_t i = 0; i < want.size(); ++i) want[i] = double(got[i]);  // the twin from the same f32 inputs
            twin(neox, want.data(), d, p, theta, sign);
            fast(neox, got.data(), d, p, theta, sign);
            expect_close(got.data(), want, 1e-6, what + (sign > 0 ? ", forward" : ", backward"));
          }
          // ⟨dy, R x⟩ = ⟨Rᵀ dy, x⟩ with the f32 kernels (the same rounded cosines and sines both ways).
          std::vector<float> rx = to_float(x), rdy = to_float(dy);
          fast(neox, rx.data(), d, p, theta, 1);
          fast(neox, rdy.data(), d, p, theta, -1);
          double lhs = 0, rhs = 0, scale = 0;
          for (int64_t i = 0; i < d; ++i) {
            lhs += double(float(dy[size_t(i)])) * rx[size_t(i)], rhs += double(rdy[size_t(i)]) * double(float(x[size_t(i)]));
            scale += std::fabs(dy[size_t(i)] * x[size_t(i)]);
          }
          EXPECT_LE(std::fabs(lhs - rhs), 1e-6 * scale) << what;
        }
}

}  // namespace
}  // namespace rope_test
}  // namespace lineage::kernels
