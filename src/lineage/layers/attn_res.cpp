#include "lineage/layers/attn_res.h"

#include <cmath>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/linear.h"

namespace lineage::layers {

void AttnRes::for_each_tensor(const std::string& norm_name, const std::string& proj_name, const TensorVisitor& f) {
  f(norm_name + ".weight", norm, {dim}, Init::Ones);
  // Zero pseudo-queries mix uniformly (the paper's initialization); presets draw them at random so
  // the mixes are not all uniform.
  f(proj_name + ".weight", proj, {1, dim}, Init::Normal);
}

void AttnRes::prepare() {
  std::vector<float> w(static_cast<size_t>(dim), 1.0f), q(static_cast<size_t>(dim));
  if (norm.defined()) kernels::widen_row(norm, 0, dim, w.data());
  kernels::widen_row(proj, 0, dim, q.data());
  fold.resize(size_t(dim));
  for (int64_t d = 0; d < dim; ++d) fold[size_t(d)] = w[size_t(d)] * q[size_t(d)];
}

void mix(const AttnRes& m, std::span<const float* const> sources, int64_t N, float* out, float* weights) {
  const int64_t D = m.dim, S = int64_t(sources.size());
  LINEAGE_CHECK(S >= 1 && int64_t(m.fold.size()) == D, "AttnRes mix needs sources and prepare()");
  const float* fold = m.fold.data();
  const double eps = m.eps;
  parallel_for(N, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* p = weights + t * S;
      float top = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {  // the score of source j: its RMSNormed row against the query
        const float* s = sources[size_t(j)] + t * D;
        double ss = 0, dot = 0;
        for (int64_t d = 0; d < D; ++d) ss += double(s[d]) * s[d], dot += double(fold[d]) * s[d];
        p[j] = float(dot / std::sqrt(ss / double(D) + eps));
        top = std::max(top, p[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j < S; ++j) sum += (p[j] = std::exp(p[j] - top));
      for (int64_t j = 0; j < S; ++j) p[j] /= sum;
      float* o = out + t * D;
      const float* s0 = sources[0] + t * D;
      for (int64_t d = 0; d < D; ++d) o[d] = p[0] * s0[d];
      for (int64_t j = 1; j < S; ++j) {
        const float* s = sources[size_t(j)] + t * D;
        const float pj = p[j];
        for (int64_t d = 0; d < D; ++d) o[d] += pj * s[d];
      }
    }
  }, grain_for(4 * S * D));
}

void mix_backward(const AttnRes& m, std::span<const float* const> sources, int64_t N, const float* weights,
                  const float* dout, std::span<float* const> dsources, AttnRes& grad) {
  const int64_t D = m.dim, S = int64_t(sources.size());
  LINEAGE_CHECK(S >= 1 && int64_t(dsources.size()) == S && int64_t(m.fold.size()) == D,
                "AttnRes mix_backward needs one gradient per source and prepare()");
  LINEAGE_CHECK(grad.proj.dtype() == DType::F32 && (!m.norm.defined() || grad.norm.dtype() == DType::F32));
  const float* fold = m.fold.data();
  const double eps = m.eps;
  // coef[t, j] = ∂L/∂z_j / r_j: what the pseudo-query's gradient sums over the rows.
  thread_local std::vector<float> coef_buf;
  coef_buf.resize(size_t(N * S));
  float* coef = coef_buf.data();
  parallel_for(N, [&](int64_t t0, int64_t t1) {
    std::vector<double> dp(static_cast<size_t>(S));
    for (int64_t t = t0; t < t1; ++t) {
      const float* g = dout + t * D;
      const float* p = weights + t * S;
      double mean_dp = 0;  // Σ_k p_k dp_k: the softmax's backward
      for (int64_t j = 0; j < S; ++j) {
        const float* s = sources[size_t(j)] + t * D;
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += double(g[d]) * s[d];
        dp[size_t(j)] = acc;
        mean_dp += p[j] * acc;
      }
      for (int64_t j = 0; j < S; ++j) {
        const float* s = sources[size_t(j)] + t * D;
        double ss = 0, dot = 0;
        for (int64_t d = 0; d < D; ++d) ss += double(s[d]) * s[d], dot += double(fold[d]) * s[d];
        const double r = std::sqrt(ss / double(D) + eps), dz = p[j] * (dp[size_t(j)] - mean_dp);
        // z_j = fold·s / r: ∂z/∂s = fold / r − (fold·s) s / (D r³).
        const float pj = p[j], a = float(dz / r), b = float(dz * dot / (double(D) * r * r * r));
        coef[t * S + j] = a;
        float* ds = dsources[size_t(j)] + t * D;
        for (int64_t d = 0; d < D; ++d) ds[d] += pj * g[d] + a * fold[d] - b * s[d];
      }
    }
  }, grain_for(6 * S * D));
  // ∂L/∂fold[d] = Σ_t Σ_j coef[t, j] s_j[t, d]; fold = norm ⊙ proj.
  std::vector<float> w(static_cast<size_t>(D), 1.0f), q(static_cast<size_t>(D));
  if (m.norm.defined()) kernels::widen_row(m.norm, 0, D, w.data());
  kernels::widen_row(m.proj, 0, D, q.data());
  float* dproj = grad.proj.data<float>();
  float* dnorm = m.norm.defined() ? grad.norm.data<float>() : nullptr;
  parallel_for(D, [&](int64_t d0, int64_t d1) {
    std::vector<float> dfold(static_cast<size_t>(d1 - d0), 0.0f);
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < S; ++j) {
        const float c = coef[t * S + j];
        const float* s = sources[size_t(j)] + t * D;
        for (int64_t d = d0; d < d1; ++d) dfold[size_t(d - d0)] += c * s[d];
      }
    for (int64_t d = d0; d < d1; ++d) {
      dproj[d] += dfold[size_t(d - d0)] * w[size_t(d)];
      if (dnorm) dnorm[d] += dfold[size_t(d - d0)] * q[size_t(d)];
    }
  }, 16);
}

}  // namespace lineage::layers
