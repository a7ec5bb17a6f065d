// The training kernels: every scalar twin's backward against central finite differences of its
// forward in double, then every fast f32 backward against its twin over awkward sizes and threads.
#include "lineage/kernels/backward.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/kernels/norm.h"
#include "lineage/kernels/ref/backward_ref.h"
#include "grad_check.h"

namespace lineage::kernels {
namespace backward_test {
namespace {

using namespace test;  // grad_check.h: randn, expect_fd, expect_close, ...

TEST(TrainKernelsRef, NormsMatchFiniteDifferences) {
  const int64_t T = 3, D = 7;
  for (const bool center : {true, false}) {
    std::vector<double> x = randn(T * D, 1), w = randn(D, 2), b = randn(D, 3), dy = randn(T * D, 4);
    std::vector<double> y(static_cast<size_t>(T * D)), dx(static_cast<size_t>(T * D)), dw(static_cast<size_t>(D), 0.0), db(static_cast<size_t>(D), 0.0);
    const double eps = 1e-5;
    const auto loss = [&] {
      ref::norm(x.data(), T, D, w.data(), center ? b.data() : nullptr, eps, center, y.data());
      return dot(y, dy);
    };
    ref::norm_backward(x.data(), dy.data(), T, D, w.data(), eps, center, dx.data(), dw.data(), db.data());
    expect_fd(x, loss, dx, center ? "LayerNorm dx" : "RMSNorm dx");
    expect_fd(w, loss, dw, "norm dw");
    if (center) expect_fd(b, loss, db, "LayerNorm db");
  }
}

TEST(TrainKernelsRef, ActivationsMatchFiniteDifferences) {
  for (const Activation act : {Activation::GeluTanh, Activation::GeluErf, Activation::Silu, Activation::Sigmoid}) {
    // |x| ≤ 4: further out, 1 + tanh and 1 + erf cancel to a few digits in double and the finite
    // difference, not the derivative, loses accuracy.
    std::vector<double> x = randn(9, 5, 2.0);
    for (double& v : x) v = std::clamp(v, -4.0, 4.0);
    std::vector<double> d(x.size());
    for (size_t i = 0; i < x.size(); ++i) d[i] = ref::activation_derivative(act, x[i]);
    for (size_t i = 0; i < x.size(); ++i) {
      std::vector<double> one{x[i]}, an{d[i]};
      const std::string what = "activation " + std::to_string(int(act)) + " at " + std::to_string(x[i]);
      expect_fd(one, [&] { return ref::activation(act, one[0]); }, an, what.c_str());
    }
  }
}

TEST(TrainKernelsRef, AttentionMatchesFiniteDifferences) {
  const int64_t B = 2, T = 5, H = 2, dk = 3, dv = 4, N = B * T;
  const double scale = 0.7;
  std::vector<double> q = randn(N * H * dk, 6), k = randn(N * H * dk, 7), v = randn(N * H * dv, 8);
  const std::vector<double> dout = randn(N * H * dv, 9);
  std::vector<double> out(static_cast<size_t>(N * H * dv)), dq(q.size()), dk_(k.size()), dv_(v.size());
  const auto loss = [&] {
    ref::attention_causal_train(B, T, H, dk, dv, scale, q.data(), k.data(), v.data(), out.data());
    return dot(out, dout);
  };
  ref::attention_causal_backward(B, T, H, dk, dv, scale, q.data(), k.data(), v.data(), dout.data(), dq.data(),
                                 dk_.data(), dv_.data());
  expect_fd(q, loss, dq, "attention dq");
  expect_fd(k, loss, dk_, "attention dk");
  expect_fd(v, loss, dv_, "attention dv");
}

TEST(TrainKernelsRef, CrossEntropyMatchesFiniteDifferences) {
  const int64_t N = 4, D = 3, V = 7;
  std::vector<double> h = randn(N * D, 10), W = randn(V * D, 11);
  const std::vector<int32_t> targets{3, 0, -1, 6};
  std::vector<double> dh(h.size()), dW(W.size(), 0.0);
  const auto loss = [&] { return ref::cross_entropy<double>(h.data(), N, D, W.data(), V, targets.data(), 0.25, nullptr, nullptr); };
  ref::cross_entropy<double>(h.data(), N, D, W.data(), V, targets.data(), 0.25, dh.data(), dW.data());
  expect_fd(h, loss, dh, "cross-entropy dh");
  expect_fd(W, loss, dW, "cross-entropy dW");
}

Tensor tensor_of(const std::vector<double>& v, Shape shape) {
  Tensor t = Tensor::empty(DType::F32, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = float(v[i]);
  return t;
}

// LayerNorm, RMSNorm, and the zero-centred RMSNorm (scale 1 + w: its twin is the plain norm with the
// weight w + 1, and ∂w the same as for the plain weight).
TEST(TrainKernels, NormsMatchTheirTwins) {
  for (const int threads : {1, 2})
    for (const int64_t D : {1, 17, 64})
      for (const int kind : {0, 1, 2}) {
        ScopedThreads st(threads);
        const bool center = kind == 0;
        const double offset = kind == 2 ? 1.0 : 0.0;
        const int64_t T = 37;
        const std::vector<double> x = randn(T * D, 20 + D, 3.0), w = randn(D, 21), dy = randn(T * D, 22);
        std::vector<double> scale(w);
        for (double& s : scale) s += offset;
        std::vector<double> dx(static_cast<size_t>(T * D)), dw(static_cast<size_t>(D), 0.0), db(static_cast<size_t>(D), 0.0);
        ref::norm_backward(x.data(), dy.data(), T, D, scale.data(), 1e-5, center, dx.data(), dw.data(), db.data());
        const std::vector<float> xf = to_float(x), dyf = to_float(dy);
        std::vector<float> dxf(dx.size()), dwf(dw.size(), 0.0f), dbf(db.size(), 0.0f);
        const Tensor wt = tensor_of(w, {D});
        if (center) layer_norm_backward(xf.data(), dyf.data(), T, D, wt, 1e-5f, dxf.data(), dwf.data(), dbf.data());
        else rms_norm_backward(xf.data(), dyf.data(), T, D, &wt, 1e-5f, dxf.data(), dwf.data(), float(offset));
        if (D > 1) expect_close(dxf.data(), dx, 2e-5, "dx");  // D = 1 LayerNorm: dx is rounding noise around 0
        expect_close(dwf.data(), dw, 1e-5, "dw");
        if (center) expect_close(dbf.data(), db, 1e-6, "db");
      }
}

TEST(TrainKernels, ActivationBackwardMatchesItsTwin) {
  for (const Activation act : {Activation::GeluTanh, Activation::GeluErf, Activation::Silu, Activation::Relu, Activation::Sigmoid}) {
    const std::vector<double> x = randn(1001, 30, 3.0), dy = randn(1001, 31);
    std::vector<double> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = dy[i] * ref::activation_derivative(act, x[i]);
    const std::vector<float> xf = to_float(x), dyf = to_float(dy);
    std::vector<float> got(x.size());
    activation_backward(act, xf.data(), dyf.data(), got.data(), int64_t(x.size()));
    expect_close(got.data(), want, 1e-6, "activation");
  }
}

TEST(TrainKernels, LinearBackwardMatchesItsTwinInBothLayouts) {
  for (const int threads : {1, 2})
    for (const Layout layout : {Layout::OutIn, Layout::InOut})
      for (const int64_t T : {1, 5, 70}) {
        ScopedThreads st(threads);
        const int64_t in = 19, out = 33;
        const std::vector<double> x = randn(T * in, 40), dy = randn(T * out, 41), w = randn(out * in, 42);
        // The oracle: dx = dy·W, dW = dyᵀx ([out, in]), db = Σ dy.
        std::vector<double> dx(static_cast<size_t>(T * in), 0.0), dw(static_cast<size_t>(out * in), 0.0), db(static_cast<size_t>(out), 0.0);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t o = 0; o < out; ++o) {
            db[size_t(o)] += dy[size_t(t * out + o)];
            for (int64_t i = 0; i < in; ++i) {
              dx[size_t(t * in + i)] += dy[size_t(t * out + o)] * w[size_t(o * in + i)];
              dw[size_t(o * in + i)] += dy[size_t(t * out + o)] * x[size_t(t * in + i)];
            }
          }
        Matrix W, dW;
        W.out = dW.out = out, W.in = dW.in = in, W.layout = dW.layout = layout;
        W.data = tensor_of(w, {out, in});
        if (layout == Layout::InOut) W.data = transposed(W.data);
        dW.data = Tensor::zeros(DType::F32, W.data.shape());
        const std::vector<float> xf = to_float(x), dyf = to_float(dy);
        std::vector<float> dxf(dx.size()), dbf(db.size(), 0.0f);
        linear_backward(xf.data(), dyf.data(), T, W, dxf.data(), &dW, dbf.data());
        expect_close(dxf.data(), dx, 1e-6, "dx");
        const Tensor g = layout == Layout::InOut ? transposed(dW.data) : dW.data;
        expect_close(g.data<float>(), dw, 1e-6, "dW");
        expect_close(dbf.data(), db, 1e-6, "dbias");
      }
}

// gemm() is what every backward's products go through: on the engine's own GEMM where B is dense
// (A transposed through the strips path, β = 1 accumulating in the tiles, C's row stride in place),
// on OpenBLAS otherwise. Shapes cross the 8-row tiles, the 16-row strip pairs and the reduction's
// slicing (K > 2048); padded strides on A and C; C starts from values β = 1 must keep.
TEST(TrainKernels, GemmMatchesADoubleProductInEveryLayout) {
  struct Shape3 {
    int64_t M, N, K;
  };
  for (const Shape3 sh : {Shape3{1, 5, 3}, Shape3{37, 50, 300}, Shape3{70, 97, 2500}})
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const int64_t b_pad : {0, 2}) {
          const int64_t M = sh.M, N = sh.N, K = sh.K;
          const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + b_pad, ldc = N + 5;
          const std::vector<double> a = randn((ta ? K : M) * lda, 50), b = randn((tb ? N : K) * ldb, 51),
                                    c0 = randn(M * ldc, 52);
          std::vector<double> product(static_cast<size_t>(M * N), 0.0);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t k = 0; k < K; ++k) {
              const double aik = a[size_t(ta ? k * lda + i : i * lda + k)];
              for (int64_t j = 0; j < N; ++j) product[size_t(i * N + j)] += aik * b[size_t(tb ? j * ldb + k : k * ldb + j)];
            }
          const std::vector<float> af = to_float(a), bf = to_float(b);
          for (const float beta : {0.0f, 1.0f})
            for (const int threads : {1, 2}) {
              ScopedThreads st(threads);
              std::vector<double> want = product;
              for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) want[size_t(i * N + j)] += beta * c0[size_t(i * ldc + j)];
              std::vector<float> c = to_float(c0);
              gemm(ta, tb, M, N, K, af.data(), lda, bf.data(), ldb, beta, c.data(), ldc);
              std::vector<float> got(static_cast<size_t>(M * N));
              for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) got[size_t(i * N + j)] = c[size_t(i * ldc + j)];
              for (int64_t i = 0; i < M; ++i)  // C's padding is not written
                for (int64_t j = N; j < ldc; ++j)
                  ASSERT_EQ(c[size_t(i * ldc + j)], float(c0[size_t(i * ldc + j)])) << "padding at " << i << ", " << j;
              const std::string what = "gemm " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                                       (ta ? " Aᵀ" : " A") + (tb ? " Bᵀ" : " B") + " beta " + std::to_string(beta) +
                                       " threads " + std::to_string(threads);
              expect_close(got.data(), want, 1e-6, what);
            }
        }
}

TEST(TrainKernels, AttentionMatchesItsTwinAcrossTiles) {
  for (const int threads : {1, 2})
    for (const int64_t T : {1, 63, 64, 65, 130}) {
      ScopedThreads st(threads);
      const int64_t B = 2, H = 3, dk = 8, dv = 5, N = B * T;
      const double scale = 1.0 / std::sqrt(double(dk));
      const std::vector<double> q = randn(N * H * dk, 50), k = randn(N * H * dk, 51), v = randn(N * H * dv, 52),
                                dout = randn(N * H * dv, 53);
      std::vector<double> out(static_cast<size_t>(N * H * dv)), dq(q.size()), dk_(k.size()), dv_(v.size());
      ref::attention_causal_train(B, T, H, dk, dv, scale, q.data(), k.data(), v.data(), out.data());
      ref::attention_causal_backward(B, T, H, dk, dv, scale, q.data(), k.data(), v.data(), dout.data(), dq.data(),
                                     dk_.data(), dv_.data());
      const std::vector<float> qf = to_float(q), kf = to_float(k), vf = to_float(v), dof = to_float(dout);
      std::vector<float> of(out.size()), lse(size_t(B * H * T)), dqf(q.size()), dkf(k.size()), dvf(v.size());
      AttentionTrainArgs a;
      a.B = B, a.T = T, a.H = H, a.dk = dk, a.dv = dv, a.scale = float(scale);
      a.q = qf.data(), a.k = kf.data(), a.v = vf.data(), a.ldq = a.ldk = H * dk, a.ldv = H * dv;
      a.out = of.data(), a.ldo = H * dv, a.lse = lse.data();
      attention_causal_train(a);
      expect_close(of.data(), out, 1e-6, "attention out");
      AttentionGrads g{dof.data(), dqf.data(), dkf.data(), dvf.data(), H * dv, H * dk, H * dk, H * dv};
      attention_causal_backward(a, g);
      expect_close(dqf.data(), dq, 1e-5, "attention dq");
      expect_close(dkf.data(), dk_, 1e-5, "attention dk");
      expect_close(dvf.data(), dv_, 1e-5, "attention dv");
    }
}

TEST(TrainKernels, CrossEntropyMatchesItsTwinInChunks) {
  for (const int64_t chunk : {1, 7, 256}) {
    const int64_t N = 23, D = 16, V = 101;
    const std::vector<double> h = randn(N * D, 60), W = randn(V * D, 61, 0.3);
    std::vector<int32_t> targets(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) targets[size_t(n)] = n == 4 ? -1 : int32_t((n * 37) % V);
    std::vector<double> dh(h.size()), dW(W.size(), 0.0);
    const double want = ref::cross_entropy<double>(h.data(), N, D, W.data(), V, targets.data(), 1.0 / 22, dh.data(), dW.data());
    const std::vector<float> hf = to_float(h);
    const Tensor Wt = tensor_of(W, {V, D});
    std::vector<float> dhf(h.size()), dWf(W.size(), 0.0f);
    const double got = cross_entropy_backward(hf.data(), N, D, Wt, targets.data(), 1.0f / 22, dhf.data(), dWf.data(), chunk);
    EXPECT_NEAR(got, want, 1e-6 * std::fabs(want));
    expect_close(dhf.data(), dh, 1e-5, "dh");
    expect_close(dWf.data(), dW, 1e-5, "dW");
  }
}

}  // namespace
}  // namespace backward_test
}  // namespace lineage::kernels
