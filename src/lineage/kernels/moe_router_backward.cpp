#include "lineage/kernels/moe_router_backward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "lineage/core/parallel.h"

namespace lineage::kernels {

void moe_router_backward(const MoeRouterArgs& a, const float* logits, const int32_t* ids, const float* dw,
                         float* dlogits) {
  const int64_t E = a.E, k = a.k;
  const bool renorm = a.renormalize && (k > 1 || a.softmax);
  parallel_for(a.N, [&](int64_t t0, int64_t t1) {
    std::vector<double> r(static_cast<size_t>(E));
    for (int64_t t = t0; t < t1; ++t) {
      const float* z = logits + t * E;
      const int32_t* id = ids + t * k;
      const float* g = dw + t * k;
      float* dz = dlogits + t * E;
      std::memset(dz, 0, size_t(E) * sizeof(float));
      if (a.softmax) {  // r over every expert: max subtracted, the sum in double
        double top = z[0], sum = 0;
        for (int64_t e = 1; e < E; ++e) top = std::max(top, double(z[e]));
        for (int64_t e = 0; e < E; ++e) sum += r[size_t(e)] = std::exp(double(z[e]) - top);
        for (int64_t e = 0; e < E; ++e) r[size_t(e)] /= sum;
      } else {
        for (int64_t j = 0; j < k; ++j)
          r[size_t(id[j])] = 1.0 / (1.0 + std::exp(-double(z[id[j]]))) + (a.bias ? double(a.bias[id[j]]) : 0.0);
      }
      double sum = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) sum += r[size_t(id[j])], dot += double(g[j]) * r[size_t(id[j])];
      const double S = renorm ? sum + 1e-20 : 1.0;
      if (a.softmax) {  // dz = r ⊙ (dr − Σ r·dr), dr nonzero only on the selection
        double rdr = 0;
        for (int64_t j = 0; j < k; ++j)
          rdr += r[size_t(id[j])] * a.scaling * (renorm ? double(g[j]) / S - dot / (S * S) : double(g[j]));
        for (int64_t e = 0; e < E; ++e) dz[e] = float(-r[size_t(e)] * rdr);
        for (int64_t j = 0; j < k; ++j) {
          const double dr = a.scaling * (renorm ? double(g[j]) / S - dot / (S * S) : double(g[j]));
          dz[id[j]] = float(r[size_t(id[j])] * (dr - rdr));
        }
      } else {
        for (int64_t j = 0; j < k; ++j) {
          const double s = 1.0 / (1.0 + std::exp(-double(z[id[j]])));
          const double dr = a.scaling * (renorm ? double(g[j]) / S - dot / (S * S) : double(g[j]));
          dz[id[j]] += float(dr * s * (1.0 - s));
        }
      }
    }
  }, 64);
}

}  // namespace lineage::kernels
