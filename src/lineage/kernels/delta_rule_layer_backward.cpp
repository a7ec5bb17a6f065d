#include "lineage/kernels/delta_rule_layer_backward.h"

#include <cmath>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"

namespace lineage::kernels {

void short_conv_backward(const float* x, const float* dy, int64_t T, int64_t C, int64_t ldx, int64_t ldy,
                         const Tensor& w, float* dx, int64_t lddx, float* dw) {
  LINEAGE_CHECK(w.dtype() == DType::F32 && w.ndim() == 3 && w.dim(0) == C && w.dim(1) == 1,
                "short_conv_backward: F32 weights [C, 1, W]");
  const int64_t W = w.dim(2);
  const float* wt = w.data<float>();
  parallel_for(C, [&](int64_t c0, int64_t c1) {
    const int64_t n = c1 - c0;
    std::vector<float> acc(size_t(W * n), 0.0f);  // tap-major dw of these channels
    for (int64_t s = 0; s < T; ++s) {
      float* d = dx + s * lddx;
      for (int64_t c = c0; c < c1; ++c) d[c] = 0.0f;
      // Output row t = s + W − 1 − j reads input row s through tap j.
      for (int64_t j = 0; j < W; ++j) {
        const int64_t t = s + W - 1 - j;
        if (t >= T) continue;
        const float* g = dy + t * ldy;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) d[c] += wt[c * W + j] * g[c];
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      const float* g = dy + t * ldy;
      for (int64_t j = 0; j < W; ++j) {
        const int64_t s = t - W + 1 + j;
        if (s < 0) continue;
        const float* xs = x + s * ldx;
        float* a = acc.data() + j * n - c0;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) a[c] += g[c] * xs[c];
      }
    }
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t j = 0; j < W; ++j) dw[c * W + j] += acc[size_t(j * n + c - c0)];
  }, grain_for(4 * W * T));
}

namespace {

// row(r) for every row of n, the rows split across the threads.
template <class Row>
void over_rows_of(int64_t rows, int64_t n, Row row) {
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) row(r);
  }, grain_for(4 * n));
}

}  // namespace

void l2_norm_backward(const float* x, const float* dy, int64_t rows, int64_t n, float* dx) {
  over_rows_of(rows, n, [&](int64_t r) {
    const float* xr = x + r * n;
    const float* g = dy + r * n;
    double ss = 0, xg = 0;
#pragma omp simd reduction(+ : ss, xg)
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i], xg += double(xr[i]) * g[i];
    // (dy ρ² − x (x·dy)) / ρ³ in double: the two terms cancel where dy is nearly radial.
    const double rho2 = ss + kL2NormEps, inv3 = 1.0 / (rho2 * std::sqrt(rho2));
    float* d = dx + r * n;
    for (int64_t i = 0; i < n; ++i) d[i] = float((double(g[i]) * rho2 - double(xr[i]) * xg) * inv3);
  });
}

void sum_norm_backward(const float* x, const float* dy, int64_t rows, int64_t n, float eps, float* dx) {
  over_rows_of(rows, n, [&](int64_t r) {
    const float* xr = x + r * n;
    const float* g = dy + r * n;
    double s = 0, xg = 0;
#pragma omp simd reduction(+ : s, xg)
    for (int64_t i = 0; i < n; ++i) s += xr[i], xg += double(xr[i]) * g[i];
    const double sigma = s + eps, inv2 = 1.0 / (sigma * sigma);
    float* d = dx + r * n;
    for (int64_t i = 0; i < n; ++i) d[i] = float((double(g[i]) * sigma - xg) * inv2);
  });
}

void elu1_backward(const float* x, const float* dy, float* dx, int64_t n) {
  parallel_for(n, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) dx[i] = x[i] > 0.0f ? dy[i] : dy[i] * std::exp(x[i]);
  }, 1 << 14);
}

void scaled_sigmoid_backward(const float* y, const float* dy, float m, float* dl, int64_t n) {
  const float inv = 1.0f / m;
  parallel_for(n, [&](int64_t a, int64_t b) {
#pragma omp simd
    for (int64_t i = a; i < b; ++i) dl[i] = dy[i] * y[i] * (1.0f - y[i] * inv);
  }, 1 << 14);
}

void decay_gate_backward(const DecayGateGrads& g) {
  const int64_t width = g.HV * g.K, N = g.N, K = g.K;
  std::vector<double> dA(size_t(width), 0.0);  // per column: Σ_rows da · ∂a/∂A_log
  parallel_for(width, [&](int64_t c0, int64_t c1) {
    std::vector<double> ddt(size_t(c1 - c0), 0.0);
    for (int64_t t = 0; t < N; ++t) {
      const float* z = g.z + t * width;
      const float* da = g.dlog_decay + t * width;
      float* dz = g.dz + t * width;
      for (int64_t c = c0; c < c1; ++c) {
        const double A = g.A[c / K], zc = z[c], d = da[c];
        double dzc, dAc;
        if (g.lower_bound < 0) {
          const double s = 1.0 / (1.0 + std::exp(-A * zc)), ds = g.lower_bound * s * (1.0 - s);
          dzc = d * ds * A, dAc = d * ds * A * zc;
        } else {
          // softplus' = σ(z), written from exp(−|z|) so no exponent is positive.
          const double e = std::exp(-std::fabs(zc));
          const double sig = zc >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
          const double sp = zc > 20.0 ? zc : std::max(zc, 0.0) + std::log1p(e);
          dzc = d * A * (zc > 20.0 ? 1.0 : sig), dAc = d * A * sp;
        }
        dz[c] = float(dzc);
        ddt[size_t(c - c0)] += double(float(dzc));
        dA[size_t(c)] += dAc;
      }
    }
    for (int64_t c = c0; c < c1; ++c) g.ddt_bias[c] += float(ddt[size_t(c - c0)]);
  }, grain_for(16 * N));
  for (int64_t h = 0; h < g.HV; ++h) {
    double s = 0;
    for (int64_t d = 0; d < K; ++d) s += dA[size_t(h * K + d)];
    g.dA_log[h] += float(s);
  }
}

void gated_rms_norm_backward(const float* x, const float* gate, const float* dy, int64_t rows, int64_t n,
                             const float* w, float eps, float* dx, float* dgate, float* dw) {
  std::vector<double> rstd(static_cast<size_t>(rows));  // double: 1 − x̂² must not round away
  over_rows_of(rows, n, [&](int64_t r) {
    const float* xr = x + r * n;
    double ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    rstd[size_t(r)] = 1.0 / std::sqrt(ss / double(n) + eps);
  });
  // dw first: dx may overwrite dy.
  if (dw)
    parallel_for(n, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double s = 0;
        for (int64_t r = 0; r < rows; ++r)
          s += double(dy[r * n + c]) * (gate ? gate[r * n + c] : 1.0f) * x[r * n + c] * rstd[size_t(r)];
        dw[c] += float(s);
      }
    }, grain_for(4 * rows));
  over_rows_of(rows, n, [&](int64_t r) {
    const float* xr = x + r * n;
    const float* g = dy + r * n;
    const float* gt = gate ? gate + r * n : nullptr;
    const double rs = rstd[size_t(r)];
    double hx = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double xh = xr[i] * rs;
      if (dgate) dgate[r * n + i] = float(g[i] * xh * w[i]);
      hx += double(g[i]) * (gt ? gt[i] : 1.0f) * w[i] * xh;
    }
    const double mean_hx = hx / double(n);
    float* d = dx + r * n;
    for (int64_t i = 0; i < n; ++i) {  // in double: h and x̂ mean(h x̂) cancel where dy is nearly radial
      const double h = double(g[i]) * (gt ? gt[i] : 1.0f) * w[i];
      d[i] = float(rs * (h - double(xr[i]) * rs * mean_hx));
    }
  });
}

}  // namespace lineage::kernels
