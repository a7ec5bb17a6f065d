#include "lineage/kernels/backward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/blas_threads.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/vmath.h"

namespace lineage::kernels {

namespace {

// A softmax row's largest element (attention's scores, the loss's logits) and a sum in double, over
// kLanes running maxima or sums side by side (one chain would wait on the previous step for every one
// of a vocabulary's 50,257 logits); the maximum is exact in any order, the sum's order is fixed.
constexpr int64_t kLanes = 8;

float row_max(const float* z, int64_t n) {
  float m[kLanes];
  std::fill(m, m + kLanes, -INFINITY);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t c = 0; c < kLanes; ++c) m[c] = z[j + c] > m[c] ? z[j + c] : m[c];
  for (; j < n; ++j) m[0] = std::max(m[0], z[j]);
  return *std::max_element(m, m + kLanes);
}

double row_sum(const float* e, int64_t n) {
  double l[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t c = 0; c < kLanes; ++c) l[c] += double(e[j + c]);
  for (; j < n; ++j) l[0] += double(e[j]);
  double sum = 0;
  for (int64_t c = 0; c < kLanes; ++c) sum += l[c];
  return sum;
}

void gemm_blas(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  // Parts of at least 16 rows or columns: smaller panels lose more to packing than threads gain.
  if (M >= N) {
    parallel_for(M, [&](int64_t i0, int64_t i1) {
      single_threaded_blas();
      const float* a = trans_a ? A + i0 : A + i0 * lda;
      cblas_sgemm(CblasRowMajor, ta, tb, int(i1 - i0), int(N), int(K), 1.0f, a, int(lda), B, int(ldb), beta,
                  C + i0 * ldc, int(ldc));
    }, 16);
  } else {
    parallel_for(N, [&](int64_t j0, int64_t j1) {
      single_threaded_blas();
      const float* b = trans_b ? B + j0 * ldb : B + j0;
      cblas_sgemm(CblasRowMajor, ta, tb, int(M), int(j1 - j0), int(K), 1.0f, A, int(lda), b, int(ldb), beta, C + j0,
                  int(ldc));
    }, 16);
  }
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  // The engine's own AVX-512 GEMM (linear(): x [M, K] times a weight stored [N, K] or [K, N]) runs
  // about twice OpenBLAS's AVX2 code here; it reads a transposed A and C's strides in place.
  if ((beta == 0.0f || beta == 1.0f) && ldb == (trans_b ? K : N)) {
    const Tensor w = Tensor::borrow(DType::F32, trans_b ? Shape{N, K} : Shape{K, N}, B, nullptr);
    if (linear_strided(A, lda, trans_a, M, Weight{&w, trans_b ? Layout::OutIn : Layout::InOut}, C, ldc, beta == 1.0f))
      return;
  }
  gemm_blas(trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654, kGeluC = 0.044715;

// dx = dy · act'(pre) over one block of n ≤ 256, the sigmoids through the vectorized vmath one
// (the tanh form of GELU as 0.5·(1 + tanh y) = σ(2y), as activate() computes it):
//   GELU tanh: σ(2y) + x·σ(2y)(1 − σ(2y))·2·y',  y = √(2/π)(x + 0.044715x³)
//   SiLU: σ(x)(1 + x(1 − σ(x)));  sigmoid: σ(x)(1 − σ(x)).
void activation_backward_block(Activation act, const float* x, const float* dy, float* dx, int64_t n) {
  if (n <= 0) return;  // (also tells GCC that the first loop writes s before sigmoid reads it)
  float s[256];
  const float c = float(kSqrt2OverPi), a = float(kGeluC);
  switch (act) {
    case Activation::GeluTanh:
      for (int64_t i = 0; i < n; ++i) s[i] = 2.0f * c * (x[i] + a * x[i] * x[i] * x[i]);
      sigmoid(s, s, n);
      for (int64_t i = 0; i < n; ++i)
        dx[i] = dy[i] * (s[i] + x[i] * s[i] * (1.0f - s[i]) * 2.0f * c * (1.0f + 3.0f * a * x[i] * x[i]));
      return;
    case Activation::GeluErf:
      for (int64_t i = 0; i < n; ++i)
        dx[i] = dy[i] * (0.5f * (1.0f + std::erf(x[i] * 0.70710678f)) + x[i] * std::exp(-0.5f * x[i] * x[i]) * 0.3989422804f);
      return;
    case Activation::Silu:
      sigmoid(x, s, n);
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * s[i] * (1.0f + x[i] * (1.0f - s[i]));
      return;
    case Activation::Relu:
      for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
      return;
    case Activation::Sigmoid:
      sigmoid(x, s, n);
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * s[i] * (1.0f - s[i]);
      return;
  }
}


const float* f32_data(const Tensor& t, const char* what) {
  LINEAGE_CHECK(t.dtype() == DType::F32, what, " must be F32 for training");
  return t.data<float>();
}

// Row statistics of a norm: the mean (LayerNorm) and the reciprocal of the RMS or standard deviation.
void row_stats(const float* x, int64_t T, int64_t D, float eps, bool center, float* mean, float* rstd) {
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* r = x + t * D;
      double mu = 0;
      if (center) {
        for (int64_t c = 0; c < D; ++c) mu += r[c];
        mu /= double(D);
      }
      double var = 0;
      for (int64_t c = 0; c < D; ++c) var += (r[c] - mu) * (r[c] - mu);
      mean[t] = float(mu);
      rstd[t] = float(1.0 / std::sqrt(var / double(D) + double(eps)));
    }
  }, 16);
}

// The shared body of both norms' backward: xhat = (x − mean)·rstd, g = dy·w;
// dx = rstd·(g − [center] mean(g) − xhat·mean(g·xhat)); dw += Σ_t dy·xhat; db += Σ_t dy. The scale is
// w + w_offset (the zero-centred RMSNorm's 1 + w, the 1 added in f32 as the forward adds it).
void norm_backward(const float* x, const float* dy, int64_t T, int64_t D, const float* w, float eps, bool center,
                   float* dx, float* dw, float* db, float w_offset = 0.0f) {
  std::vector<float> mean(static_cast<size_t>(T)), rstd(static_cast<size_t>(T));
  row_stats(x, T, D, eps, center, mean.data(), rstd.data());
  // Parameter gradients first: dx may alias dy.
  if (dw || db)
    parallel_for(D, [&](int64_t c0, int64_t c1) {
      for (int64_t t = 0; t < T; ++t) {
        const float* xr = x + t * D;
        const float* g = dy + t * D;
        for (int64_t c = c0; c < c1; ++c) {
          if (dw) dw[c] += g[c] * (xr[c] - mean[size_t(t)]) * rstd[size_t(t)];
          if (db) db[c] += g[c];
        }
      }
    }, 16);
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* xr = x + t * D;
      const float* g = dy + t * D;
      const float mu = mean[size_t(t)], r = rstd[size_t(t)];
      double sum_g = 0, sum_gx = 0;
      for (int64_t c = 0; c < D; ++c) {
        const float gc = w ? g[c] * (w[c] + w_offset) : g[c];
        sum_g += gc;
        sum_gx += gc * (xr[c] - mu) * r;
      }
      const float mg = center ? float(sum_g / double(D)) : 0.0f, mgx = float(sum_gx / double(D));
      float* d = dx + t * D;
      for (int64_t c = 0; c < D; ++c) {
        const float gc = w ? g[c] * (w[c] + w_offset) : g[c];
        d[c] = r * (gc - mg - (xr[c] - mu) * r * mgx);
      }
    }
  }, 4);
}

}  // namespace

void activation_backward(Activation act, const float* pre, const float* dy, float* dx, int64_t n) {
  constexpr int64_t kBlock = 256;
  parallel_for((n + kBlock - 1) / kBlock, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t i = b * kBlock;
      activation_backward_block(act, pre + i, dy + i, dx + i, std::min(kBlock, n - i));
    }
  }, grain_for(24 * kBlock));
}

void layer_norm_backward(const float* x, const float* dy, int64_t T, int64_t D, const Tensor& w, float eps, float* dx,
                         float* dw, float* db) {
  norm_backward(x, dy, T, D, f32_data(w, "LayerNorm weight"), eps, true, dx, dw, db);
}

void rms_norm_backward(const float* x, const float* dy, int64_t T, int64_t D, const Tensor* w, float eps, float* dx,
                       float* dw, float w_offset) {
  norm_backward(x, dy, T, D, w ? f32_data(*w, "RMSNorm weight") : nullptr, eps, false, dx, w ? dw : nullptr, nullptr,
                w_offset);
}

void linear_backward(const float* x, const float* dy, int64_t T, const Matrix& W, float* dx, Matrix* dW, float* dbias) {
  LINEAGE_CHECK(W.format() == MatrixFormat::F32, "training needs F32 weight matrices");
  const int64_t in = W.in, out = W.out;
  const float* w = W.data.data<float>();
  const bool out_in = W.layout == Layout::OutIn;
  // dx[T, in] = dy[T, out] · W[out, in]
  if (dx) gemm(false, !out_in, T, in, out, dy, out, w, out_in ? in : out, 0.0f, dx, in);
  if (dW) {
    LINEAGE_CHECK(dW->layout == W.layout && dW->format() == MatrixFormat::F32);
    float* g = dW->data.data<float>();
    if (out_in) gemm(true, false, out, in, T, dy, out, x, in, 1.0f, g, in);  // dW[out, in] += dyᵀ x
    else gemm(true, false, in, out, T, x, in, dy, out, 1.0f, g, out);        // dW[in, out] += xᵀ dy
  }
  if (dbias)
    parallel_for(out, [&](int64_t o0, int64_t o1) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = o0; o < o1; ++o) dbias[o] += dy[t * out + o];
    }, 16);
}

// ---------------------------------------------------------------------------------------------
// Attention.

namespace {

// The scaled scores of queries [i0, i0 + nq) of one (sequence, head) against keys [0, i0 + nq), the
// causal mask applied (−inf above the diagonal), into S [nq, nk].
void tile_scores(const AttentionTrainArgs& a, const float* q, const float* k, int64_t i0, int64_t nq, float* S) {
  const int64_t nk = i0 + nq;
  single_threaded_blas();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(nq), int(nk), int(a.dk), a.scale, q + i0 * a.ldq, int(a.ldq), k,
              int(a.ldk), 0.0f, S, int(nk));
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t j = i0 + i + 1; j < nk; ++j) S[i * nk + j] = -INFINITY;
}

// f(b, h, S, dP, e) for every (sequence, head), with two [tile, T] buffers and a row of T floats
// (the exponentials of one row: exp_nonpositive writes apart from its input). The buffers are each
// thread's own and only grow: every layer of every step reuses the same pages, unzeroed.
template <class F>
void for_each_head(const AttentionTrainArgs& a, F&& f) {
  parallel_for(a.B * a.H, [&](int64_t p0, int64_t p1) {
    thread_local std::vector<float> S, dP, e;
    const size_t tile = size_t(kAttentionTrainTile * a.T);
    if (S.size() < tile) S.resize(tile), dP.resize(tile);
    if (e.size() < size_t(a.T)) e.resize(size_t(a.T));
    for (int64_t p = p0; p < p1; ++p) f(p / a.H, p % a.H, S.data(), dP.data(), e.data());
  });
}

}  // namespace

void attention_causal_train(const AttentionTrainArgs& a) {
  for_each_head(a, [&](int64_t b, int64_t h, float* S, float*, float* e) {
    const int64_t row0 = b * a.T;
    const float* q = a.q + row0 * a.ldq + h * a.dk;
    const float* k = a.k + row0 * a.ldk + h * a.dk;
    const float* v = a.v + row0 * a.ldv + h * a.dv;
    float* out = a.out + row0 * a.ldo + h * a.dv;
    float* lse = a.lse + (b * a.H + h) * a.T;
    for (int64_t i0 = 0; i0 < a.T; i0 += kAttentionTrainTile) {
      const int64_t nq = std::min(kAttentionTrainTile, a.T - i0), nk = i0 + nq;
      tile_scores(a, q, k, i0, nq, S);
      for (int64_t i = 0; i < nq; ++i) {
        float* s = S + i * nk;
        const float m = row_max(s, nk);
        for (int64_t j = 0; j < nk; ++j) s[j] -= m;
        exp_nonpositive(s, e, nk);  // exp(−inf) = 0 above the diagonal
        const double l = row_sum(e, nk);
        const float inv = float(1.0 / l);
        for (int64_t j = 0; j < nk; ++j) s[j] = e[j] * inv;
        lse[i0 + i] = m + float(std::log(l));
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(nq), int(a.dv), int(nk), 1.0f, S, int(nk), v, int(a.ldv),
                  0.0f, out + i0 * a.ldo, int(a.ldo));
    }
  });
}

void attention_causal_backward(const AttentionTrainArgs& a, const AttentionGrads& g) {
  for_each_head(a, [&](int64_t b, int64_t h, float* P, float* dP, float* e) {
    const int64_t row0 = b * a.T;
    const float* q = a.q + row0 * a.ldq + h * a.dk;
    const float* k = a.k + row0 * a.ldk + h * a.dk;
    const float* v = a.v + row0 * a.ldv + h * a.dv;
    const float* out = a.out + row0 * a.ldo + h * a.dv;
    const float* lse = a.lse + (b * a.H + h) * a.T;
    const float* dout = g.dout + row0 * g.lddo + h * a.dv;
    float* dq = g.dq + row0 * g.lddq + h * a.dk;
    float* dk = g.dk + row0 * g.lddk + h * a.dk;
    float* dv = g.dv + row0 * g.lddv + h * a.dv;
    for (int64_t j = 0; j < a.T; ++j) {
      std::fill(dk + j * g.lddk, dk + j * g.lddk + a.dk, 0.0f);
      std::fill(dv + j * g.lddv, dv + j * g.lddv + a.dv, 0.0f);
    }
    for (int64_t i0 = 0; i0 < a.T; i0 += kAttentionTrainTile) {
      const int64_t nq = std::min(kAttentionTrainTile, a.T - i0), nk = i0 + nq;
      tile_scores(a, q, k, i0, nq, P);
      // dP = dO·Vᵀ; then dS = P ∘ (dP − rowsum(dO ∘ O)), the softmax's backward.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(nq), int(nk), int(a.dv), 1.0f, dout + i0 * g.lddo,
                  int(g.lddo), v, int(a.ldv), 0.0f, dP, int(nk));
      for (int64_t i = 0; i < nq; ++i) {
        const float* o = out + (i0 + i) * a.ldo;
        const float* d = dout + (i0 + i) * g.lddo;
        double di = 0;
        for (int64_t c = 0; c < a.dv; ++c) di += double(o[c]) * d[c];
        float* p = P + i * nk;
        float* dp = dP + i * nk;
        const float l = lse[i0 + i];
        for (int64_t j = 0; j < nk; ++j) e[j] = p[j] - l;  // ≤ 0: lse is at least the row's maximum
        exp_nonpositive(e, p, nk);                         // exp(−inf) = 0 above the diagonal
        for (int64_t j = 0; j < nk; ++j) dp[j] = p[j] * (dp[j] - float(di)) * a.scale;
      }
      // dV[0:nk] += Pᵀ·dO; dQ = dS·K (scale folded into dS); dK[0:nk] += dSᵀ·Q.
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(nk), int(a.dv), int(nq), 1.0f, P, int(nk),
                  dout + i0 * g.lddo, int(g.lddo), 1.0f, dv, int(g.lddv));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(nq), int(a.dk), int(nk), 1.0f, dP, int(nk), k, int(a.ldk),
                  0.0f, dq + i0 * g.lddq, int(g.lddq));
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(nk), int(a.dk), int(nq), 1.0f, dP, int(nk), q + i0 * a.ldq,
                  int(a.ldq), 1.0f, dk, int(g.lddk));
    }
  });
}

// ---------------------------------------------------------------------------------------------
// The loss.

double cross_entropy_backward(const float* h, int64_t N, int64_t D, const Tensor& W, const int32_t* targets,
                              float scale, float* dh, float* dW, int64_t chunk) {
  const int64_t V = W.dim(0), rows = std::min(chunk, N);
  const float* w = f32_data(W, "the LM head");
  // The chunk's logits, turned into ∂/∂logits in place; kept across calls (tens of MB with a 50k
  // vocabulary: new pages every call would cost more than the softmax).
  static std::vector<float> logits;
  if (logits.size() < size_t(rows * V)) logits.resize(size_t(rows * V));
  std::vector<double> row_loss(static_cast<size_t>(rows));
  double loss = 0;
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t n = std::min(chunk, N - r0);
    gemm(false, true, n, V, D, h + r0 * D, D, w, D, 0.0f, logits.data(), V);
    parallel_for(n, [&](int64_t i0, int64_t i1) {
      thread_local std::vector<float> exps;  // grow-only: the same pages every step
      if (exps.size() < size_t(V)) exps.resize(size_t(V));
      float* e = exps.data();
      for (int64_t i = i0; i < i1; ++i) {
        float* z = logits.data() + i * V;
        const int32_t target = targets[r0 + i];
        if (target < 0) {
          std::fill(z, z + V, 0.0f);
          row_loss[size_t(i)] = 0;
          continue;
        }
        LINEAGE_CHECK(target < V, "target ", target, " outside the vocabulary of ", V);
        const float m = row_max(z, V), zt = z[target];
        for (int64_t j = 0; j < V; ++j) z[j] -= m;
        exp_nonpositive(z, e, V);
        const double l = row_sum(e, V);
        row_loss[size_t(i)] = double(m) + std::log(l) - double(zt);
        const float inv = float(double(scale) / l);
        for (int64_t j = 0; j < V; ++j) z[j] = e[j] * inv;
        z[target] -= scale;
      }
    }, 4);
    for (int64_t i = 0; i < n; ++i) loss += row_loss[size_t(i)];
    if (dh) gemm(false, false, n, D, V, logits.data(), V, w, D, 0.0f, dh + r0 * D, D);
    if (dW) gemm(true, false, V, D, n, logits.data(), V, h + r0 * D, D, 1.0f, dW, D);
  }
  return loss * double(scale);
}

}  // namespace lineage::kernels
