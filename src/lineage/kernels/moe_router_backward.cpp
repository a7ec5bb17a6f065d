#include "lineage/kernels/moe_router_backward.h"

#include <cmath>
#include <cstring>

#include "lineage/core/parallel.h"

namespace lineage::kernels {

void moe_router_backward(const MoeRouterArgs& a, const float* logits, const int32_t* ids, const float* dw,
                         float* dlogits) {
  const int64_t E = a.E, k = a.k;
  const bool renorm = a.renormalize && k > 1;
  parallel_for(a.N, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* z = logits + t * E;
      const int32_t* id = ids + t * k;
      const float* g = dw + t * k;
      float* dz = dlogits + t * E;
      std::memset(dz, 0, size_t(E) * sizeof(float));
      double sum = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) {
        const double r = 1.0 / (1.0 + std::exp(-double(z[id[j]]))) + (a.bias ? double(a.bias[id[j]]) : 0.0);
        sum += r, dot += double(g[j]) * r;
      }
      const double S = renorm ? sum + 1e-20 : 1.0;
      for (int64_t j = 0; j < k; ++j) {
        const double s = 1.0 / (1.0 + std::exp(-double(z[id[j]])));
        const double dr = a.scaling * (renorm ? double(g[j]) / S - dot / (S * S) : double(g[j]));
        dz[id[j]] += float(dr * s * (1.0 - s));
      }
    }
  }, 64);
}

}  // namespace lineage::kernels
