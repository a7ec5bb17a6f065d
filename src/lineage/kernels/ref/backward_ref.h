// Scalar twins of the training kernels (backward.h), forward and backward, templated on the scalar
// type so finite differences can run wholly in double: the oracle of the fast backward kernels.
// Plain loops in the textbook order; attention forms the whole T × T score matrix per head.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "lineage/kernels/activation.h"

namespace lineage::kernels::ref {

template <class F>
F activation(Activation act, F x) {
  switch (act) {
    case Activation::GeluTanh:
      return F(0.5) * x * (F(1) + std::tanh(F(0.7978845608028654) * (x + F(0.044715) * x * x * x)));
    case Activation::GeluErf: return F(0.5) * x * (F(1) + std::erf(x / std::sqrt(F(2))));
    case Activation::Silu: return x / (F(1) + std::exp(-x));
    case Activation::Relu: return x > F(0) ? x : F(0);
    case Activation::Sigmoid: return F(1) / (F(1) + std::exp(-x));
  }
  return F(0);
}

template <class F>
F activation_derivative(Activation act, F x) {
  switch (act) {
    case Activation::GeluTanh: {
      const F c = F(0.7978845608028654), th = std::tanh(c * (x + F(0.044715) * x * x * x));
      return F(0.5) * (F(1) + th) + F(0.5) * x * (F(1) - th * th) * c * (F(1) + F(3 * 0.044715) * x * x);
    }
    case Activation::GeluErf:
      return F(0.5) * (F(1) + std::erf(x / std::sqrt(F(2)))) + x * std::exp(-x * x / F(2)) / std::sqrt(F(2 * M_PI));
    case Activation::Silu: {
      const F s = F(1) / (F(1) + std::exp(-x));
      return s * (F(1) + x * (F(1) - s));
    }
    case Activation::Relu: return x > F(0) ? F(1) : F(0);
    case Activation::Sigmoid: {
      const F s = F(1) / (F(1) + std::exp(-x));
      return s * (F(1) - s);
    }
  }
  return F(0);
}

// LayerNorm (center) or RMSNorm over rows of D: y = (x − [center] mean)/sqrt(var + eps)·w (+ b).
// w, b may be null.
template <class F>
void norm(const F* x, int64_t T, int64_t D, const F* w, const F* b, F eps, bool center, F* y) {
  for (int64_t t = 0; t < T; ++t) {
    const F* r = x + t * D;
    F mu = 0, var = 0;
    if (center) {
      for (int64_t c = 0; c < D; ++c) mu += r[c];
      mu /= F(D);
    }
    for (int64_t c = 0; c < D; ++c) var += (r[c] - mu) * (r[c] - mu);
    const F rstd = F(1) / std::sqrt(var / F(D) + eps);
    for (int64_t c = 0; c < D; ++c)
      y[t * D + c] = (r[c] - mu) * rstd * (w ? w[c] : F(1)) + (b ? b[c] : F(0));
  }
}

// Its backward by the chain rule written out per element pair (O(D²) a row, unlike the fast
// kernel's closed form): dx overwritten, dw and db added to (null: skipped).
template <class F>
void norm_backward(const F* x, const F* dy, int64_t T, int64_t D, const F* w, F eps, bool center, F* dx, F* dw, F* db) {
  for (int64_t t = 0; t < T; ++t) {
    const F* r = x + t * D;
    const F* g = dy + t * D;
    F mu = 0, var = 0;
    if (center) {
      for (int64_t c = 0; c < D; ++c) mu += r[c];
      mu /= F(D);
    }
    for (int64_t c = 0; c < D; ++c) var += (r[c] - mu) * (r[c] - mu);
    const F rstd = F(1) / std::sqrt(var / F(D) + eps);
    for (int64_t c = 0; c < D; ++c) {
      if (dw) dw[c] += g[c] * (r[c] - mu) * rstd;
      if (db) db[c] += g[c];
    }
    // ∂xhat_c/∂x_i = rstd·(δ_ci − [center]/D) − xhat_c·xhat_i·rstd/D
    for (int64_t i = 0; i < D; ++i) {
      F s = 0;
      const F xi = (r[i] - mu) * rstd;
      for (int64_t c = 0; c < D; ++c) {
        const F xc = (r[c] - mu) * rstd;
        const F jac = rstd * ((c == i ? F(1) : F(0)) - (center ? F(1) / F(D) : F(0))) - xc * xi * rstd / F(D);
        s += g[c] * (w ? w[c] : F(1)) * jac;
      }
      dx[t * D + i] = s;
    }
  }
}

// y[T, out] = x[T, in]·Wᵀ with W [out, in] (+ bias).
template <class F>
void linear(const F* x, int64_t T, const F* W, int64_t out, int64_t in, const F* bias, F* y) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      F s = bias ? bias[o] : F(0);
      for (int64_t i = 0; i < in; ++i) s += x[t * in + i] * W[o * in + i];
      y[t * out + o] = s;
    }
}

// The attention probabilities of query i of sequence b, head h, over keys 0 .. i into p.
template <class F>
void causal_probs(int64_t b, int64_t h, int64_t i, int64_t T, int64_t H, int64_t dk, F scale, const F* q, const F* k,
                  F* p) {
  const F* qi = q + ((b * T + i) * H + h) * dk;
  F m = -INFINITY, l = 0;
  for (int64_t j = 0; j <= i; ++j) {
    F s = 0;
    for (int64_t c = 0; c < dk; ++c) s += qi[c] * k[((b * T + j) * H + h) * dk + c];
    p[j] = s * scale;
    m = std::max(m, p[j]);
  }
  for (int64_t j = 0; j <= i; ++j) l += (p[j] = std::exp(p[j] - m));
  for (int64_t j = 0; j <= i; ++j) p[j] /= l;
}

// Causal attention of B sequences of T tokens, layouts of backward.h's AttentionTrainArgs with packed
// [N, H, d] rows (ld = H·d).
template <class F>
void attention_causal_train(int64_t B, int64_t T, int64_t H, int64_t dk, int64_t dv, F scale, const F* q, const F* k,
                            const F* v, F* out) {
  std::vector<F> p(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        causal_probs(b, h, i, T, H, dk, scale, q, k, p.data());
        F* o = out + ((b * T + i) * H + h) * dv;
        for (int64_t c = 0; c < dv; ++c) {
          F s = 0;
          for (int64_t j = 0; j <= i; ++j) s += p[size_t(j)] * v[((b * T + j) * H + h) * dv + c];
          o[c] = s;
        }
      }
}

// Its backward (dq, dk, dv overwritten), through the probabilities formed again in full.
template <class F>
void attention_causal_backward(int64_t B, int64_t T, int64_t H, int64_t dk, int64_t dv, F scale, const F* q,
                               const F* k, const F* v, const F* dout, F* dq, F* dkk, F* dvv) {
  const int64_t N = B * T;
  for (int64_t n = 0; n < N * H * dk; ++n) dq[n] = dkk[n] = 0;
  for (int64_t n = 0; n < N * H * dv; ++n) dvv[n] = 0;
  std::vector<F> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const F* qi = q + ((b * T + i) * H + h) * dk;
        const F* gi = dout + ((b * T + i) * H + h) * dv;
        causal_probs(b, h, i, T, H, dk, scale, q, k, p.data());
        F dot = 0;  // Σ_j p_j dp_j
        for (int64_t j = 0; j <= i; ++j) {
          F s = 0;
          for (int64_t c = 0; c < dv; ++c) s += gi[c] * v[((b * T + j) * H + h) * dv + c];
          dp[size_t(j)] = s;
          dot += p[size_t(j)] * s;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const F ds = p[size_t(j)] * (dp[size_t(j)] - dot) * scale;
          for (int64_t c = 0; c < dk; ++c) {
            dq[((b * T + i) * H + h) * dk + c] += ds * k[((b * T + j) * H + h) * dk + c];
            dkk[((b * T + j) * H + h) * dk + c] += ds * qi[c];
          }
          for (int64_t c = 0; c < dv; ++c) dvv[((b * T + j) * H + h) * dv + c] += p[size_t(j)] * gi[c];
        }
      }
}

// Σ_rows CE(h·Wᵀ, target)·scale with W [V, D]; dh overwritten, dW added to (either may be null).
template <class F>
F cross_entropy(const F* h, int64_t N, int64_t D, const F* W, int64_t V, const int32_t* targets, F scale, F* dh, F* dW) {
  std::vector<F> z(static_cast<size_t>(V));
  F loss = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (dh)
      for (int64_t c = 0; c < D; ++c) dh[n * D + c] = 0;
    if (targets[n] < 0) continue;
    linear(h + n * D, 1, W, V, D, static_cast<const F*>(nullptr), z.data());
    F m = -INFINITY, l = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, z[size_t(j)]);
    for (int64_t j = 0; j < V; ++j) l += std::exp(z[size_t(j)] - m);
    loss += (m + std::log(l) - z[size_t(targets[n])]) * scale;
    for (int64_t j = 0; j < V; ++j) {
      const F g = (std::exp(z[size_t(j)] - m) / l - (j == targets[n] ? F(1) : F(0))) * scale;
      for (int64_t c = 0; c < D; ++c) {
        if (dh) dh[n * D + c] += g * W[j * D + c];
        if (dW) dW[j * D + c] += g * h[n * D + c];
      }
    }
  }
  return loss;
}

// Block Attention Residuals' mix (layers/attn_res.h) over S sources src[j] [N, D]: per row,
// z_j = fold·s_j / sqrt(mean(s_j²) + eps), p = softmax(z), out = Σ_j p_j s_j. p: [N, S].
template <class F>
void attn_res_mix(const F* const* src, int64_t S, int64_t N, int64_t D, const F* fold, F eps, F* out, F* p) {
  for (int64_t t = 0; t < N; ++t) {
    F* pt = p + t * S;
    F top = -INFINITY, sum = 0;
    for (int64_t j = 0; j < S; ++j) {
      F ss = 0, dot = 0;
      for (int64_t d = 0; d < D; ++d) ss += src[j][t * D + d] * src[j][t * D + d], dot += fold[d] * src[j][t * D + d];
      pt[j] = dot / std::sqrt(ss / F(D) + eps);
      top = std::max(top, pt[j]);
    }
    for (int64_t j = 0; j < S; ++j) sum += (pt[j] = std::exp(pt[j] - top));
    for (int64_t j = 0; j < S; ++j) pt[j] /= sum;
    for (int64_t d = 0; d < D; ++d) {
      F o = 0;
      for (int64_t j = 0; j < S; ++j) o += pt[j] * src[j][t * D + d];
      out[t * D + d] = o;
    }
  }
}

// Its backward: dsrc[j] [N, D] and dfold [D] are added to. p is the forward's.
template <class F>
void attn_res_mix_backward(const F* const* src, int64_t S, int64_t N, int64_t D, const F* fold, F eps, const F* p,
                           const F* dout, F* const* dsrc, F* dfold) {
  std::vector<F> dp(static_cast<size_t>(S));
  for (int64_t t = 0; t < N; ++t) {
    const F* pt = p + t * S;
    const F* g = dout + t * D;
    F mean_dp = 0;
    for (int64_t j = 0; j < S; ++j) {
      dp[size_t(j)] = 0;
      for (int64_t d = 0; d < D; ++d) dp[size_t(j)] += g[d] * src[j][t * D + d];
      mean_dp += pt[j] * dp[size_t(j)];
    }
    for (int64_t j = 0; j < S; ++j) {
      const F* s = src[j] + t * D;
      F ss = 0, dot = 0;
      for (int64_t d = 0; d < D; ++d) ss += s[d] * s[d], dot += fold[d] * s[d];
      const F r = std::sqrt(ss / F(D) + eps), dz = pt[j] * (dp[size_t(j)] - mean_dp);
      for (int64_t d = 0; d < D; ++d) {
        dsrc[j][t * D + d] += pt[j] * g[d] + dz * (fold[d] / r - dot * s[d] / (F(D) * r * r * r));
        dfold[d] += dz * s[d] / r;
      }
    }
  }
}

}  // namespace lineage::kernels::ref
