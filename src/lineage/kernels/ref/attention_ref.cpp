#include <cmath>
#include <vector>

#include "lineage/kernels/ref/ref.h"

namespace lineage::kernels::ref {

void attention_causal(const float* q, int64_t ldq, int64_t T, int64_t p0, const float* k, const float* v,
                      int64_t k_head_stride, int64_t H, int64_t hd, float scale, float* out) {
  std::vector<double> s;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t n = p0 + t + 1;  // keys visible to this query
      const float* qv = q + t * ldq + h * hd;
      s.assign(n, 0.0);
      double m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const float* kv = k + h * k_head_stride + j * hd;
        double d = 0;
        for (int64_t c = 0; c < hd; ++c) d += double(qv[c]) * kv[c];
        s[j] = d * scale;
        m = std::max(m, s[j]);
      }
      double z = 0;
      for (int64_t j = 0; j < n; ++j) z += (s[j] = std::exp(s[j] - m));
      for (int64_t c = 0; c < hd; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < n; ++j) acc += s[j] * v[h * k_head_stride + j * hd + c];
        out[(t * H + h) * hd + c] = float(acc / z);
      }
    }
}

}  // namespace lineage::kernels::ref
