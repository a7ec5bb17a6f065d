#include <algorithm>
#include <cmath>
#include <vector>

#include "lineage/kernels/ref/ref.h"

namespace lineage::kernels::ref {

void attention_causal(std::span<const AttentionSeq> seqs, const AttentionHeads& hs) {
  const int64_t H = hs.H, dk = hs.dk, dv = hs.dv;
  std::vector<double> s;
  for (const AttentionSeq& sq : seqs) {
    const int64_t ldk = sq.ldk ? sq.ldk : dk, ldv = sq.ldv ? sq.ldv : dv;
    for (int64_t t = 0; t < sq.T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t n = sq.p0 + t + 1;  // keys visible to this query
        const float* qv = sq.q + t * sq.ldq + h * dk;
        s.assign(n, 0.0);
        double m = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const float* kv = sq.k + h * sq.k_stride + j * ldk;
          double d = 0;
          for (int64_t c = 0; c < dk; ++c) d += double(qv[c]) * kv[c];
          s[j] = d * hs.scale;
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (int64_t j = 0; j < n; ++j) z += (s[j] = std::exp(s[j] - m));
        for (int64_t c = 0; c < dv; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < n; ++j) acc += s[j] * sq.v[h * sq.v_stride + j * ldv + c];
          sq.out[t * sq.ldo + h * dv + c] = float(acc / z);
        }
      }
  }
}

void latent_attention(std::span<const LatentQuery> qs, int64_t H, int64_t dk, int64_t dv, float scale) {
  // The same rows as one attention sequence whose every head reads them (head stride 0) at the
  // last position: the multi-query form is ordinary attention with shared keys.
  for (const LatentQuery& q : qs) {
    std::vector<float> packed(size_t(H * dk)), out(size_t(H * dv));  // heads side by side, as AttentionSeq reads them
    for (int64_t h = 0; h < H; ++h) std::copy(q.q + h * q.ldq, q.q + h * q.ldq + dk, packed.begin() + h * dk);
    const AttentionSeq one{packed.data(), H * dk, 1, q.n_keys - 1, q.kv, q.kv, 0, 0, out.data(), H * dv, q.ldkv, q.ldkv};
    attention_causal({&one, 1}, {H, dk, dv, scale});
    for (int64_t h = 0; h < H; ++h) std::copy(out.begin() + h * dv, out.begin() + (h + 1) * dv, q.out + h * q.ldo);
  }
}

void attention_causal(const float* q, int64_t ldq, int64_t T, int64_t p0, const float* k, const float* v,
                      int64_t k_head_stride, int64_t H, int64_t hd, float scale, float* out) {
  const AttentionSeq s{q, ldq, T, p0, k, v, k_head_stride, k_head_stride, out, H * hd};
  attention_causal({&s, 1}, {H, hd, hd, scale});
}

}  // namespace lineage::kernels::ref
