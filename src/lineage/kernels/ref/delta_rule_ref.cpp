#include "lineage/kernels/ref/delta_rule_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lineage/core/error.h"

namespace lineage::kernels::ref {

namespace {

// Everything one value head needs, with pointers to the rows of token t.
struct Head {
  const DeltaRuleArgs& a;
  int64_t j;  // value head
  int64_t h;  // q/k head
  const float* q(int64_t t) const { return a.q + (t * a.H + h) * a.K; }
  const float* k(int64_t t) const { return a.k + (t * a.H + h) * a.K; }
  const float* v(int64_t t) const { return a.v + (t * a.HV + j) * a.V; }
  float* out(int64_t t) const { return a.out + (t * a.HV + j) * a.V; }
  double beta(int64_t t) const { return a.beta ? double(a.beta[t * a.HV + j]) : 1.0; }
  // Log decay of token t for key channel d (0 without a gate).
  double g(int64_t t, int64_t d) const {
    switch (a.gate) {
      case Gate::None: return 0.0;
      case Gate::PerHead: return a.log_decay[t * a.HV + j];
      case Gate::PerChannel: return a.log_decay[(t * a.HV + j) * a.K + d];
    }
    return 0.0;
  }
};

Head head_of(const DeltaRuleArgs& a, int64_t j) { return Head{a, j, j / (a.HV / a.H)}; }

// S: [K, V] and z: [K] of one head, widened to double.
void load_head(const DeltaRuleArgs& a, int64_t j, std::vector<double>& S, std::vector<double>& z) {
  const int64_t K = a.K, V = a.V;
  S.assign(a.state + j * K * V, a.state + (j + 1) * K * V);
  z.assign(K, 0.0);
  if (a.normalize) z.assign(a.z + j * K, a.z + (j + 1) * K);
}

void store_head(const DeltaRuleArgs& a, int64_t j, const std::vector<double>& S, const std::vector<double>& z) {
  const int64_t K = a.K, V = a.V;
  for (int64_t i = 0; i < K * V; ++i) a.state[j * K * V + i] = float(S[i]);
  if (a.normalize)
    for (int64_t d = 0; d < K; ++d) a.z[j * K + d] = float(z[d]);
}

}  // namespace

void delta_rule_recurrent(const DeltaRuleArgs& a) {
  delta_rule_check_args(a);
  const int64_t K = a.K, V = a.V;
  std::vector<double> S, z, u(V);
  for (int64_t j = 0; j < a.HV; ++j) {
    const Head hd = head_of(a, j);
    load_head(a, j, S, z);
    for (int64_t t = 0; t < a.T; ++t) {
      const float *q = hd.q(t), *k = hd.k(t), *v = hd.v(t);
      for (int64_t d = 0; d < K; ++d) {
        const double f = std::exp(hd.g(t, d));
        for (int64_t c = 0; c < V; ++c) S[d * V + c] *= f;
        z[d] *= f;
      }
      for (int64_t c = 0; c < V; ++c) {
        double kS = 0.0;
        for (int64_t d = 0; d < K; ++d) kS += double(k[d]) * S[d * V + c];
        u[c] = hd.beta(t) * (double(v[c]) - (a.delta ? kS : 0.0));
      }
      for (int64_t d = 0; d < K; ++d) {
        for (int64_t c = 0; c < V; ++c) S[d * V + c] += double(k[d]) * u[c];
        z[d] += hd.beta(t) * double(k[d]);
      }
      double qz = 0.0;
      for (int64_t d = 0; d < K; ++d) qz += double(a.scale) * double(q[d]) * z[d];
      for (int64_t c = 0; c < V; ++c) {
        double o = 0.0;
        for (int64_t d = 0; d < K; ++d) o += double(a.scale) * double(q[d]) * S[d * V + c];
        hd.out(t)[c] = float(a.normalize ? o / (qz + 1e-10) : o);
      }
    }
    store_head(a, j, S, z);
  }
}

namespace {

// One chunk of n tokens starting at t0, §1.6 steps 1-8, for one head. S: [K, V], z: [K], double.
void ref_chunk(const Head& hd, int64_t t0, int64_t n, std::vector<double>& S, std::vector<double>& z) {
  const DeltaRuleArgs& a = hd.a;
  const int64_t K = a.K, V = a.V;
  const double scale = a.scale;
  // 1. Chunk-local cumulative log decay G[i][d] (inclusive of token i).
  std::vector<double> G(n * K);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < K; ++d) G[i * K + d] = (i > 0 ? G[(i - 1) * K + d] : 0.0) + hd.g(t0 + i, d);
  const double* G_last = &G[(n - 1) * K];
  std::vector<double> eG(n * K);
  for (int64_t i = 0; i < n * K; ++i) eG[i] = std::exp(G[i]);
  // 2, 6. Decayed Gram N (strict lower, ×β_i) and attention P (lower incl, ×scale); the exponent
  // G_i − G_j is only formed for i ≥ j, where it is ≤ 0.
  std::vector<double> N(n * n, 0.0), P(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const float *qi = hd.q(t0 + i), *ki = hd.k(t0 + i);
    for (int64_t jj = 0; jj <= i; ++jj) {
      const float* kj = hd.k(t0 + jj);
      double nk = 0.0, pq = 0.0;
      for (int64_t d = 0; d < K; ++d) {
        const double e = std::exp(G[i * K + d] - G[jj * K + d]);
        nk += double(ki[d]) * double(kj[d]) * e;
        pq += double(qi[d]) * double(kj[d]) * e;
      }
      if (jj < i) N[i * n + jj] = hd.beta(t0 + i) * nk;
      P[i * n + jj] = scale * pq;
    }
  }
  // 3. X = (I + N)⁻¹, unit lower triangular, by forward substitution row by row.
  std::vector<double> X(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    X[i * n + i] = 1.0;
    for (int64_t jj = 0; jj < i; ++jj) {
      double s = 0.0;
      for (int64_t m = jj; m < i; ++m) s += N[i * n + m] * X[m * n + jj];
      X[i * n + jj] = -s;
    }
  }
  // 4, 5. Corrected values Vn = U − W S with W = X diag(β) (K ⊙ exp G), U = X diag(β) V
  // (delta off: Vn = diag(β) V, no correction).
  std::vector<double> Vn(n * V, 0.0);
  if (a.delta) {
    std::vector<double> W(n * K, 0.0), U(n * V, 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t m = 0; m <= i; ++m) {
        const double xb = X[i * n + m] * hd.beta(t0 + m);
        const float *km = hd.k(t0 + m), *vm = hd.v(t0 + m);
        for (int64_t d = 0; d < K; ++d) W[i * K + d] += xb * double(km[d]) * eG[m * K + d];
        for (int64_t c = 0; c < V; ++c) U[i * V + c] += xb * double(vm[c]);
      }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < V; ++c) {
        double ws = 0.0;
        for (int64_t d = 0; d < K; ++d) ws += W[i * K + d] * S[d * V + c];
        Vn[i * V + c] = U[i * V + c] - ws;
      }
  } else {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < V; ++c) Vn[i * V + c] = hd.beta(t0 + i) * double(hd.v(t0 + i)[c]);
  }
  // 7. O = scale (Q ⊙ exp G) S + P Vn; the normalizer reads z and the β column the same way.
  for (int64_t i = 0; i < n; ++i) {
    const float* qi = hd.q(t0 + i);
    double qz = 0.0;
    for (int64_t d = 0; d < K; ++d) qz += scale * double(qi[d]) * eG[i * K + d] * z[d];
    for (int64_t jj = 0; jj <= i; ++jj) qz += P[i * n + jj] * hd.beta(t0 + jj);
    for (int64_t c = 0; c < V; ++c) {
      double o = 0.0;
      for (int64_t d = 0; d < K; ++d) o += scale * double(qi[d]) * eG[i * K + d] * S[d * V + c];
      for (int64_t jj = 0; jj <= i; ++jj) o += P[i * n + jj] * Vn[jj * V + c];
      hd.out(t0 + i)[c] = float(a.normalize ? o / (qz + 1e-10) : o);
    }
  }
  // 8. S ← exp(G_last) ⊙_rows S + (K ⊙ exp(G_last − G))ᵀ Vn, and z likewise with the β column.
  for (int64_t d = 0; d < K; ++d) {
    const double f = eG[(n - 1) * K + d];
    for (int64_t c = 0; c < V; ++c) S[d * V + c] *= f;
    z[d] *= f;
    for (int64_t jj = 0; jj < n; ++jj) {
      const double kl = double(hd.k(t0 + jj)[d]) * std::exp(G_last[d] - G[jj * K + d]);
      for (int64_t c = 0; c < V; ++c) S[d * V + c] += kl * Vn[jj * V + c];
      z[d] += kl * hd.beta(t0 + jj);
    }
  }
}

}  // namespace

void delta_rule_chunked(const DeltaRuleArgs& a, int chunk) {
  delta_rule_check_args(a);
  LINEAGE_CHECK(chunk >= 1, "chunk must be positive, got ", chunk);
  std::vector<double> S, z;
  for (int64_t j = 0; j < a.HV; ++j) {
    load_head(a, j, S, z);
    for (int64_t t0 = 0; t0 < a.T; t0 += chunk) ref_chunk(head_of(a, j), t0, std::min<int64_t>(chunk, a.T - t0), S, z);
    store_head(a, j, S, z);
  }
}

}  // namespace lineage::kernels::ref
