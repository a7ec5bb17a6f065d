#include "lineage/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lineage/core/parallel.h"

namespace lineage::kernels {

namespace {

constexpr int64_t kTile = 64;  // keys scored per step of the online softmax

void attend_one(const float* q, int64_t n_keys, const float* k, const float* v, int64_t hd, float scale,
                float* out, float* acc) {
  float s[kTile];
  float m = -INFINITY, l = 0.0f;
  std::fill(acc, acc + hd, 0.0f);
  for (int64_t j0 = 0; j0 < n_keys; j0 += kTile) {
    const int64_t n = std::min(kTile, n_keys - j0);
    float tile_max = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      const float* kj = k + (j0 + j) * hd;
      float d = 0.0f;
#pragma omp simd reduction(+ : d)
      for (int64_t c = 0; c < hd; ++c) d += q[c] * kj[c];
      s[j] = d * scale;
      tile_max = std::max(tile_max, s[j]);
    }
    const float m_new = std::max(m, tile_max);
    const float correction = std::exp(m - m_new);  // exp(-inf) = 0 on the first tile
    l *= correction;
    for (int64_t c = 0; c < hd; ++c) acc[c] *= correction;
    for (int64_t j = 0; j < n; ++j) {
      const float p = std::exp(s[j] - m_new);
      l += p;
      const float* vj = v + (j0 + j) * hd;
      for (int64_t c = 0; c < hd; ++c) acc[c] += p * vj[c];
    }
    m = m_new;
  }
  const float inv = 1.0f / l;
  for (int64_t c = 0; c < hd; ++c) out[c] = acc[c] * inv;
}

}  // namespace

void attention_causal(const float* q, int64_t T, int64_t p0, const float* k, const float* v,
                      int64_t head_stride, int64_t H, int64_t hd, float scale, float* out) {
  parallel_for(T * H, [&](int64_t b, int64_t e) {
    std::vector<float> acc(hd);
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / H, h = i % H;
      attend_one(q + i * hd, p0 + t + 1, k + h * head_stride, v + h * head_stride, hd, scale, out + i * hd,
                 acc.data());
    }
  }, grain_for(2 * (p0 + T) * hd));
}

}  // namespace lineage::kernels
