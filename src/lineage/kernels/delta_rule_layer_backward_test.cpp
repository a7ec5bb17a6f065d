// The delta-rule layer's small backward kernels: every scalar twin against central
// finite differences of its forward in double (relative error ≤ 1e-6), then every fast f32 kernel against
// its twin over awkward sizes with 1 and 2 threads.
#include "lineage/kernels/delta_rule_layer_backward.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "grad_check.h"
#include "lineage/kernels/ref/delta_rule_layer_backward_ref.h"

namespace lineage::kernels {
namespace delta_rule_layer_backward_test {
namespace {

using namespace test;  // grad_check.h: randn, expect_fd, expect_close, ...

Tensor conv_weight(const Vec& w, int64_t C, int64_t W) {
  Tensor t = Tensor::empty(DType::F32, {C, 1, W});
  for (int64_t i = 0; i < C * W; ++i) t.data<float>()[i] = float(w[size_t(i)]);
  return t;
}

// ---------------------------------------------------------------------------------------------
// Scalar twins against finite differences.

TEST(DeltaRuleLayerBackwardRef, ShortConvMatchesFiniteDifferences) {
  for (const int64_t W : {1, 2, 4}) {
    const int64_t T = 6, C = 3;
    Vec x = randn(T * C, 1), w = randn(C * W, 2), dy = randn(T * C, 3), y(size_t(T * C));
    Vec dx(x.size()), dw(w.size(), 0.0);
    const auto loss = [&] {
      ref::short_conv(x.data(), T, C, w.data(), W, y.data());
      return dot(y, dy);
    };
    ref::short_conv_backward(x.data(), dy.data(), T, C, w.data(), W, dx.data(), dw.data());
    expect_fd(x, loss, dx, "short conv dx, W " + std::to_string(W));
    expect_fd(w, loss, dw, "short conv dw, W " + std::to_string(W));
  }
}

TEST(DeltaRuleLayerBackwardRef, QkNormsMatchFiniteDifferences) {
  const int64_t rows = 3, n = 5;
  struct Norm {
    bool l2;
    double eps;
  };
  for (const Norm nm : {Norm{true, kL2NormEps}, Norm{false, 0.0}, Norm{false, 1e-4}}) {
    // Sum norms divide by Σx: keep it away from 0 (ELU + 1 features are positive).
    Vec x = nm.l2 ? randn(rows * n, 4) : randn(rows * n, 4, 0.3, 1.0), dy = randn(rows * n, 5), y(x.size()), dx(x.size());
    const auto loss = [&] {
      ref::qk_norm(x.data(), rows, n, nm.l2, nm.eps, y.data());
      return dot(y, dy);
    };
    ref::qk_norm_backward(x.data(), dy.data(), rows, n, nm.l2, nm.eps, dx.data());
    expect_fd(x, loss, dx, std::string(nm.l2 ? "l2" : "sum") + " norm, eps " + std::to_string(nm.eps));
  }
}

TEST(DeltaRuleLayerBackwardRef, ElementwiseMatchFiniteDifferences) {
  Vec x = randn(9, 6, 2.0);
  for (double& v : x)
    if (std::fabs(v) < 1e-3) v = 0.5;  // ELU + 1 has a kink at 0
  for (size_t i = 0; i < x.size(); ++i) {
    Vec one{x[i]};
    expect_fd(one, [&] { return ref::elu1(one[0]); }, Vec{ref::elu1_derivative(x[i])}, "elu1 at " + std::to_string(x[i]));
    for (const double m : {1.0, 2.0}) {
      const double y = ref::scaled_sigmoid(x[i], m);
      expect_fd(one, [&] { return ref::scaled_sigmoid(one[0], m); }, Vec{ref::scaled_sigmoid_backward(y, 1.0, m)},
                "scaled sigmoid at " + std::to_string(x[i]));
    }
  }
}

TEST(DeltaRuleLayerBackwardRef, DecayGateMatchesFiniteDifferences) {
  const int64_t N = 4, HV = 3;
  for (const int64_t K : {1, 4})
    for (const double lb : {0.0, -5.0}) {
      Vec in = randn(N * HV * K, 7, 2.0), dt = randn(HV * K, 8), A_log = randn(HV, 9, 0.7), da = randn(N * HV * K, 10);
      in[0] = 24.0;  // softplus past its threshold (the identity there)
      Vec a(in.size()), z(in.size()), dz(in.size()), dA(A_log.size(), 0.0), ddt(dt.size(), 0.0);
      const auto loss = [&] {
        ref::decay_gate(in.data(), dt.data(), A_log.data(), N, HV, K, lb, a.data());
        return dot(a, da);
      };
      for (size_t i = 0; i < in.size(); ++i) z[i] = in[i] + dt[i % size_t(HV * K)];
      ref::decay_gate_backward(z.data(), da.data(), A_log.data(), N, HV, K, lb, dz.data(), dA.data(), ddt.data());
      const std::string what = (lb < 0 ? "lower-bound" : "softplus") + std::string(" gate, K ") + std::to_string(K);
      expect_fd(in, loss, dz, what + " d input");
      expect_fd(dt, loss, ddt, what + " d dt_bias");
      expect_fd(A_log, loss, dA, what + " d A_log");
    }
}

TEST(DeltaRuleLayerBackwardRef, GatedRmsNormMatchesFiniteDifferences) {
  const int64_t rows = 3, n = 6;
  for (const bool gated : {false, true}) {
    Vec x = randn(rows * n, 11), g = randn(rows * n, 12), w = randn(n, 13), dy = randn(rows * n, 14), y(x.size());
    Vec dx(x.size()), dg(x.size()), dw(w.size(), 0.0);
    const double eps = 1e-5;
    const auto loss = [&] {
      ref::gated_rms_norm(x.data(), gated ? g.data() : nullptr, rows, n, w.data(), eps, y.data());
      return dot(y, dy);
    };
    ref::gated_rms_norm_backward(x.data(), gated ? g.data() : nullptr, dy.data(), rows, n, w.data(), eps, dx.data(),
                                 gated ? dg.data() : nullptr, dw.data());
    const std::string what = gated ? "gated RMSNorm" : "RMSNorm";
    expect_fd(x, loss, dx, what + " dx");
    expect_fd(w, loss, dw, what + " dw");
    if (gated) expect_fd(g, loss, dg, what + " dgate");
  }
}

// ---------------------------------------------------------------------------------------------
// Fast kernels against their twins.

class LayerBackwardFast : public ::testing::TestWithParam<int> {};

TEST_P(LayerBackwardFast, ShortConvMatchesRef) {
  ScopedThreads st(GetParam());
  for (const int64_t T : {1, 3, 17})
    for (const int64_t C : {1, 5, 33})
      for (const int64_t W : {1, 4}) {
        const int64_t ld = C + 3;  // strided rows, as the layer's packed q | k | v
        Vec x = randn(T * C, 20), w = randn(C * W, 21), dy = randn(T * C, 22), dx(x.size()), dw(w.size(), 0.0);
        ref::short_conv_backward(x.data(), dy.data(), T, C, w.data(), W, dx.data(), dw.data());
        std::vector<float> xs(size_t(T * ld)), dys(size_t(T * ld)), dxs(size_t(T * ld), 7.0f), dws(w.size(), 0.0f);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t c = 0; c < C; ++c) {
            xs[size_t(t * ld + c)] = float(x[size_t(t * C + c)]);
            dys[size_t(t * ld + c)] = float(dy[size_t(t * C + c)]);
          }
        short_conv_backward(xs.data(), dys.data(), T, C, ld, ld, conv_weight(w, C, W), dxs.data(), ld, dws.data());
        std::vector<float> dxc(size_t(T * C));
        for (int64_t t = 0; t < T; ++t)
          for (int64_t c = 0; c < C; ++c) dxc[size_t(t * C + c)] = dxs[size_t(t * ld + c)];
        const std::string what = "T " + std::to_string(T) + " C " + std::to_string(C) + " W " + std::to_string(W);
        expect_close(dxc.data(), dx, 1e-6, "short conv dx, " + what);
        expect_close(dws.data(), dw, 1e-6, "short conv dw, " + what);
      }
}

TEST_P(LayerBackwardFast, QkNormsMatchRef) {
  ScopedThreads st(GetParam());
  for (const int64_t rows : {1, 7, 130})
    for (const int64_t n : {1, 16, 17}) {
      const Vec xl = randn(rows * n, 23), xs = randn(rows * n, 23, 0.3, 1.0), dy = randn(rows * n, 24);
      Vec want(xl.size());
      std::vector<float> got(xl.size());
      const std::string what = "rows " + std::to_string(rows) + " n " + std::to_string(n);
      ref::qk_norm_backward(xl.data(), dy.data(), rows, n, true, kL2NormEps, want.data());
      const std::vector<float> xlf = to_float(xl), xsf = to_float(xs), dyf = to_float(dy);
      l2_norm_backward(xlf.data(), dyf.data(), rows, n, got.data());
      expect_close(got.data(), want, 1e-6, "l2 norm, " + what);
      ref::qk_norm_backward(xs.data(), dy.data(), rows, n, false, 1e-4, want.data());
      got = dyf;  // in place
      sum_norm_backward(xsf.data(), got.data(), rows, n, 1e-4f, got.data());
      expect_close(got.data(), want, 1e-5, "sum norm, " + what);
    }
}

TEST_P(LayerBackwardFast, ElementwiseMatchRef) {
  ScopedThreads st(GetParam());
  for (const int64_t n : {1, 15, 40000}) {
    const Vec x = randn(n, 25, 2.0), dy = randn(n, 26);
    const std::vector<float> xf = to_float(x), dyf = to_float(dy);
    Vec want(static_cast<size_t>(n));
    std::vector<float> got(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) want[size_t(i)] = dy[size_t(i)] * ref::elu1_derivative(double(xf[size_t(i)]));
    elu1_backward(xf.data(), dyf.data(), got.data(), n);
    expect_close(got.data(), want, 1e-6, "elu1, n " + std::to_string(n));
    std::vector<float> y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      y[size_t(i)] = float(ref::scaled_sigmoid(x[size_t(i)], 2.0));
      want[size_t(i)] = ref::scaled_sigmoid_backward(double(y[size_t(i)]), dy[size_t(i)], 2.0);
    }
    scaled_sigmoid_backward(y.data(), dyf.data(), 2.0f, got.data(), n);
    expect_close(got.data(), want, 1e-6, "scaled sigmoid, n " + std::to_string(n));
  }
}

TEST_P(LayerBackwardFast, DecayGateMatchesRef) {
  ScopedThreads st(GetParam());
  for (const int64_t N : {1, 19})
    for (const int64_t HV : {1, 3})
      for (const int64_t K : {1, 5})
        for (const float lb : {0.0f, -5.0f}) {
          const int64_t width = HV * K;
          Vec z = randn(N * width, 27, 3.0), A_log = randn(HV, 28, 0.7), da = randn(N * width, 29);
          z[0] = 23.0;
          for (double& v : z) v = double(float(v));
          for (double& v : A_log) v = double(float(v));
          Vec dz(z.size()), dA(size_t(HV), 0.5), ddt(size_t(width), -0.25);
          ref::decay_gate_backward(z.data(), da.data(), A_log.data(), N, HV, K, double(lb), dz.data(), dA.data(), ddt.data());
          std::vector<float> A(static_cast<size_t>(HV));
          for (int64_t h = 0; h < HV; ++h) {
            const float e = std::exp(float(A_log[size_t(h)]));
            A[size_t(h)] = lb < 0 ? e : -e;
          }
          const std::vector<float> zf = to_float(z), daf = to_float(da);
          std::vector<float> dzf(z.size()), dAf(size_t(HV), 0.5f), ddtf(size_t(width), -0.25f);
          decay_gate_backward({N, HV, K, A.data(), lb, zf.data(), daf.data(), dzf.data(), dAf.data(), ddtf.data()});
          const std::string what = "N " + std::to_string(N) + " HV " + std::to_string(HV) + " K " + std::to_string(K) +
                                   (lb < 0 ? " lower bound" : " softplus");
          expect_close(dzf.data(), dz, 1e-6, "decay dz, " + what);
          expect_close(dAf.data(), dA, 1e-6, "decay dA_log, " + what);
          expect_close(ddtf.data(), ddt, 1e-6, "decay ddt_bias, " + what);
        }
}

TEST_P(LayerBackwardFast, GatedRmsNormMatchesRef) {
  ScopedThreads st(GetParam());
  for (const int64_t rows : {1, 9, 70})
    for (const int64_t n : {1, 8, 13})
      for (const bool gated : {false, true}) {
        const Vec x = randn(rows * n, 30), g = randn(rows * n, 31), w = randn(n, 32), dy = randn(rows * n, 33);
        Vec dx(x.size()), dg(x.size()), dw(size_t(n), 1.0);
        ref::gated_rms_norm_backward(x.data(), gated ? g.data() : nullptr, dy.data(), rows, n, w.data(), 1e-6, dx.data(),
                                     gated ? dg.data() : nullptr, dw.data());
        const std::vector<float> xf = to_float(x), gf = to_float(g), wf = to_float(w);
        std::vector<float> io = to_float(dy), dgf(x.size()), dwf(size_t(n), 1.0f);
        gated_rms_norm_backward(xf.data(), gated ? gf.data() : nullptr, io.data(), rows, n, wf.data(), 1e-6f, io.data(),
                                gated ? dgf.data() : nullptr, dwf.data());
        const std::string what = "rows " + std::to_string(rows) + " n " + std::to_string(n) + (gated ? " gated" : "");
        expect_close(io.data(), dx, 1e-5, "gated RMSNorm dx (in place), " + what);
        expect_close(dwf.data(), dw, 1e-6, "gated RMSNorm dw, " + what);
        if (gated) expect_close(dgf.data(), dg, 1e-6, "gated RMSNorm dgate, " + what);
      }
}

INSTANTIATE_TEST_SUITE_P(Threads, LayerBackwardFast, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "_threads"; });

}  // namespace
}  // namespace delta_rule_layer_backward_test
}  // namespace lineage::kernels
