// Scalar twins of kernels/delta_rule_layer_backward.h, forward and backward, templated on the scalar
// type so finite differences can run wholly in double: the oracle of the fast kernels. Plain loops;
// the normalizations' backward written out per element pair (the Jacobian, O(n²) a row).
#pragma once

#include <cmath>
#include <cstdint>

namespace lineage::kernels::ref {

// y[t, c] = Σ_{j<W} w[c·W + j] · x[t − W + 1 + j, c], x before row 0 being 0. x, y: [T, C]; w: [C, W].
template <class F>
void short_conv(const F* x, int64_t T, int64_t C, const F* w, int64_t W, F* y) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      F s = 0;
      for (int64_t j = 0; j < W; ++j) {
        const int64_t src = t - W + 1 + j;
        if (src >= 0) s += w[c * W + j] * x[src * C + c];
      }
      y[t * C + c] = s;
    }
}

// Its backward: dx overwritten, dw [C, W] added to.
template <class F>
void short_conv_backward(const F* x, const F* dy, int64_t T, int64_t C, const F* w, int64_t W, F* dx, F* dw) {
  for (int64_t i = 0; i < T * C; ++i) dx[i] = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t j = 0; j < W; ++j) {
        const int64_t src = t - W + 1 + j;
        if (src < 0) continue;
        dx[src * C + c] += w[c * W + j] * dy[t * C + c];
        dw[c * W + j] += x[src * C + c] * dy[t * C + c];
      }
}

// Rows of n: y = x / sqrt(Σx² + eps) (l2) or x / (Σx + eps) (sum).
template <class F>
void qk_norm(const F* x, int64_t rows, int64_t n, bool l2, F eps, F* y) {
  for (int64_t r = 0; r < rows; ++r) {
    F s = 0;
    for (int64_t i = 0; i < n; ++i) s += l2 ? x[r * n + i] * x[r * n + i] : x[r * n + i];
    const F den = l2 ? std::sqrt(s + eps) : s + eps;
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = x[r * n + i] / den;
  }
}

// Its backward through the Jacobian ∂y_i/∂x_j: dx overwritten.
template <class F>
void qk_norm_backward(const F* x, const F* dy, int64_t rows, int64_t n, bool l2, F eps, F* dx) {
  for (int64_t r = 0; r < rows; ++r) {
    const F* xr = x + r * n;
    F s = 0;
    for (int64_t i = 0; i < n; ++i) s += l2 ? xr[i] * xr[i] : xr[i];
    const F den = l2 ? std::sqrt(s + eps) : s + eps;
    for (int64_t j = 0; j < n; ++j) {
      F g = 0;
      for (int64_t i = 0; i < n; ++i) {
        // y_i = x_i / den: ∂y_i/∂x_j = δ_ij / den − x_i ∂den/∂x_j / den².
        const F dden = l2 ? xr[j] / den : F(1);
        g += dy[r * n + i] * ((i == j ? F(1) : F(0)) / den - xr[i] * dden / (den * den));
      }
      dx[r * n + j] = g;
    }
  }
}

// ELU + 1 and its derivative.
template <class F>
F elu1(F x) {
  return x > F(0) ? x + F(1) : std::exp(x);
}
template <class F>
F elu1_derivative(F x) {
  return x > F(0) ? F(1) : std::exp(x);
}

// y = m · sigmoid(l), and dl from the output.
template <class F>
F scaled_sigmoid(F l, F m) {
  return m / (F(1) + std::exp(-l));
}
template <class F>
F scaled_sigmoid_backward(F y, F dy, F m) {
  return dy * y * (F(1) - y / m);
}

// The log decay from the projection `in` [N, HV·K] and dt_bias [HV·K], per head A_log [HV]:
// softplus form a = −exp(A_log[h]) · softplus(in + dt) (softplus(z) = z above 20), or with lb < 0,
// a = lb · σ(exp(A_log[h]) · (in + dt)).
template <class F>
F softplus(F z) {
  return z > F(20) ? z : std::log1p(std::exp(z));
}
template <class F>
void decay_gate(const F* in, const F* dt, const F* A_log, int64_t N, int64_t HV, int64_t K, F lb, F* a) {
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < HV * K; ++c) {
      const F z = in[t * HV * K + c] + dt[c], E = std::exp(A_log[c / K]);
      a[t * HV * K + c] = lb < F(0) ? lb / (F(1) + std::exp(-E * z)) : -E * softplus(z);
    }
}

// Its backward from z = in + dt: dz overwritten (= ∂L/∂in), dA_log [HV] and ddt [HV·K] added to.
template <class F>
void decay_gate_backward(const F* z, const F* da, const F* A_log, int64_t N, int64_t HV, int64_t K, F lb, F* dz,
                         F* dA_log, F* ddt) {
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < HV * K; ++c) {
      const int64_t i = t * HV * K + c;
      const F E = std::exp(A_log[c / K]), zc = z[i];
      F dzc, dAc;
      if (lb < F(0)) {
        const F s = F(1) / (F(1) + std::exp(-E * zc));
        dzc = da[i] * lb * s * (F(1) - s) * E;
        dAc = da[i] * lb * s * (F(1) - s) * E * zc;
      } else {
        const F sig = F(1) / (F(1) + std::exp(-zc));
        dzc = -da[i] * E * (zc > F(20) ? F(1) : sig);
        dAc = -da[i] * E * softplus(zc);
      }
      dz[i] = dzc;
      ddt[c] += dzc;
      dA_log[c / K] += dAc;
    }
}

// Rows of n: y = x / sqrt(mean(x²) + eps) · w · gate (gate null: 1).
template <class F>
void gated_rms_norm(const F* x, const F* gate, int64_t rows, int64_t n, const F* w, F eps, F* y) {
  for (int64_t r = 0; r < rows; ++r) {
    F ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[r * n + i] * x[r * n + i];
    const F rs = F(1) / std::sqrt(ss / F(n) + eps);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = x[r * n + i] * rs * w[i] * (gate ? gate[r * n + i] : F(1));
  }
}

// Its backward through the Jacobian: dx, dgate overwritten (dgate null: skipped), dw added to.
template <class F>
void gated_rms_norm_backward(const F* x, const F* gate, const F* dy, int64_t rows, int64_t n, const F* w, F eps, F* dx,
                             F* dgate, F* dw) {
  for (int64_t r = 0; r < rows; ++r) {
    const F* xr = x + r * n;
    F ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
    const F rs = F(1) / std::sqrt(ss / F(n) + eps);
    for (int64_t i = 0; i < n; ++i) {
      const F g = gate ? gate[r * n + i] : F(1);
      if (dgate) dgate[r * n + i] = dy[r * n + i] * xr[i] * rs * w[i];
      dw[i] += dy[r * n + i] * xr[i] * rs * g;
    }
    for (int64_t j = 0; j < n; ++j) {
      // y_i = x_i rs w_i g_i: ∂y_i/∂x_j = w_i g_i (δ_ij rs − x_i rs³ x_j / n).
      F s = 0;
      for (int64_t i = 0; i < n; ++i) {
        const F g = gate ? gate[r * n + i] : F(1);
        s += dy[r * n + i] * w[i] * g * ((i == j ? rs : F(0)) - xr[i] * rs * rs * rs * xr[j] / F(n));
      }
      dx[r * n + j] = s;
    }
  }
}

}  // namespace lineage::kernels::ref
