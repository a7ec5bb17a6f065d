#include "lineage/layers/attn_res.h"

#include <cmath>

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

}  // namespace lineage::layers
