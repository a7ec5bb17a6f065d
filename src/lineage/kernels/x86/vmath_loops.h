// The math loops of vmath.h, written once: included by vmath.cpp (the portable build)
// and by vmath_avx512.cpp (compiled with AVX-512 flags, so the same loops become 16-lane code).
// Internal linkage, so the linker can never hand the AVX-512 copy to the portable code.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace lineage::kernels::vmath_loops {
namespace {

// Three simd loops because the baseline build keeps a float compare that feeds arithmetic as a
// branch; libm's expf was 10% of a per-channel delta-rule prefill.
inline void exp_nonpositive(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < -87.0f ? -87.0f : x[i];
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = y[i];
    const float shifted = v * 1.44269504088896341f + 12582912.0f;  // 1.5·2²³ + round(v / ln 2)
    const float fn = shifted - 12582912.0f;                         // round(v / ln 2)
    const float r = (v - fn * 0.693359375f) + fn * 2.12194440e-4f;  // v − fn ln 2, in two parts
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    // 2^fn from the integer in shifted's low mantissa bits: no float → int conversion, which a NaN
    // input (a damaged weight) would make undefined; a NaN still gives NaN through p.
    y[i] = p * std::bit_cast<float>((std::bit_cast<uint32_t>(shifted) - 0x4B400000u + 127u) << 23);
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < -87.0f ? 0.0f : y[i];
}

// Calls finish(b, m, e) for blocks [b, b + m) of x with e[i] = exp(−|x[b + i]|): the one exponent
// that sigmoid and softplus need, never positive.
template <class Finish>
inline void with_exp_neg_abs(const float* x, int64_t n, Finish finish) {
  constexpr int64_t kBlock = 256;
  float t[kBlock], e[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) t[i] = -std::abs(x[b + i]);
    exp_nonpositive(t, e, m);
    finish(b, m, e);
  }
}

inline void sigmoid(const float* x, float* y, int64_t n) {
  with_exp_neg_abs(x, n, [&](int64_t b, int64_t m, const float* e) {
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) {
      const float r = 1.0f / (1.0f + e[i]);
      y[b + i] = x[b + i] >= 0.0f ? r : e[i] * r;
    }
  });
}

// log(w) for w in [1, 2]: Cephes logf, split at sqrt(2) so the polynomial runs on f in
// [-0.29, 0.41]. Scalar so the caller's simd loop inlines it.
inline float log_1_to_2(float w) {
  const bool big = w > 1.41421356f;
  const float fe = big ? 1.0f : 0.0f;
  const float f = (big ? 0.5f * w : w) - 1.0f;
  const float z = f * f;
  float p = 7.0376836292e-2f;
  p = p * f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  const float r = f * z * p - 2.12194440e-4f * fe - 0.5f * z;
  return f + r + 0.693359375f * fe;
}

// y = softplus(x) = log(1 + e^x) = max(x, 0) + log1p(e^−|x|), and x itself above 20 (PyTorch's
// threshold). log1p(u) as log(1+u)·u / ((1+u) − 1) keeps full precision for tiny u. y may alias x.
inline void softplus(const float* x, float* y, int64_t n) {
  with_exp_neg_abs(x, n, [&](int64_t b, int64_t m, const float* e) {
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) {
      const float u = e[i], w = 1.0f + u;
      const float l1p = w == 1.0f ? u : log_1_to_2(w) * u / (w - 1.0f);
      const float v = x[b + i];
      y[b + i] = v > 20.0f ? v : std::max(v, 0.0f) + l1p;
    }
  });
}

// tanh(x) with t = exp(−2|x|): Cephes tanhf's odd polynomial below |x| = 0.625 (where (1 − t)/(1 + t)
// would lose the relative precision of small x), (1 − t)/(1 + t) with x's sign above.
inline float tanh_from(float x, float t) {
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float big = (1.0f - t) / (1.0f + t);
  return std::abs(x) < 0.625f ? small : (x < 0.0f ? -big : big);
}

// Kimi K3's SiTU-GLU, in one pass over the gate and up rows: g ← β·tanh(g/β)·σ(g) · β_lin·tanh(u/β_lin)
// (the sigmoid of the uncapped g; beta_lin = 0: u uncapped). Three exponentials of non-positive
// arguments per element, no temporaries beyond a block on the stack.
inline void situ_glu(float* g, const float* u, int64_t n, float beta, float beta_lin) {
  constexpr int64_t kBlock = 256;
  float a[kBlock], ea[kBlock], b[kBlock], eb[kBlock], c[kBlock], ec[kBlock];
  const float ib = 2.0f / beta, il = beta_lin > 0.0f ? 2.0f / beta_lin : 0.0f;
  for (int64_t o = 0; o < n; o += kBlock) {
    const int64_t m = std::min(kBlock, n - o);
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) {
      a[i] = -std::abs(g[o + i]);
      b[i] = a[i] * ib;
      c[i] = -std::abs(u[o + i]) * il;
    }
    exp_nonpositive(a, ea, m);
    exp_nonpositive(b, eb, m);
    exp_nonpositive(c, ec, m);
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) {
      const float x = g[o + i], y = u[o + i];
      const float r = 1.0f / (1.0f + ea[i]);
      const float sig = x >= 0.0f ? r : ea[i] * r;
      const float capped = beta * tanh_from(x / beta, eb[i]);
      const float up = beta_lin > 0.0f ? beta_lin * tanh_from(y / beta_lin, ec[i]) : y;
      g[o + i] = capped * sig * up;
    }
  }
}

// One row of LayerNorm, y = (x − mean) / sqrt(var + eps) · w + b (biased variance, as PyTorch): the
// sums in double, over several partial sums (omp simd), not one serial chain. y may alias x.
inline void layer_norm_row(const float* x, int64_t D, const float* w, const float* b, float eps, float* y) {
  double mean = 0, var = 0;
#pragma omp simd reduction(+ : mean)
  for (int64_t i = 0; i < D; ++i) mean += x[i];
  mean /= double(D);
#pragma omp simd reduction(+ : var)
  for (int64_t i = 0; i < D; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= double(D);
  const float inv = float(1.0 / std::sqrt(var + eps)), mu = float(mean);
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) y[i] = (x[i] - mu) * inv * w[i] + b[i];
}

// One row of RMSNorm, y = x / sqrt(mean(x²) + eps) · w, the sum in double as above. y may alias x.
inline void rms_norm_row(const float* x, int64_t D, const float* w, float eps, float* y) {
  double ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < D; ++i) ss += double(x[i]) * x[i];
  const float inv = float(1.0 / std::sqrt(ss / double(D) + eps));
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) y[i] = x[i] * inv * w[i];
}

// y[c] = Σ_j taps[j·C + c] · rows[j][c] over j < W, in order of j, for c in [c0, c1): one output row
// of a depthwise causal convolution with tap-major weights. Tap by tap, each a plain loop over the
// channels (y stays in L1): GCC leaves a channel loop with the taps' loop inside it scalar, even
// under `omp simd`, and that made the short conv ~6 % of a KDA prefill.
inline void conv_taps(const float* const* rows, const float* taps, int64_t C, int64_t W, int64_t c0, int64_t c1,
                      float* y) {
#pragma omp simd
  for (int64_t c = c0; c < c1; ++c) y[c] = 0.0f;
  for (int64_t j = 0; j < W; ++j) {
    const float *t = taps + j * C, *r = rows[j];
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c) y[c] += t[c] * r[c];
  }
}

}  // namespace
}  // namespace lineage::kernels::vmath_loops
