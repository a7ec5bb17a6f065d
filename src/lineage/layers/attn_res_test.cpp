// One Block Attention Residuals mix against spec §6.3 written out in double (RMSNorm of each source
// with the norm weight, the dot with the pseudo-query, softmax over sources, raw sources summed),
// and the paper's initialization: an all-zero query mixes uniformly.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lineage/core/rng.h"
#include "lineage/layers/attn_res.h"

namespace lineage::layers {
namespace {

AttnRes make(int64_t D, uint64_t seed, bool zero_query) {
  AttnRes m{D, 1e-5f, Tensor::empty(DType::F32, {D}), Tensor::empty(DType::F32, {1, D}), {}};
  Rng rng(seed);
  for (int64_t d = 0; d < D; ++d) {
    m.norm.data<float>()[d] = float(1.0 + 0.5 * rng.normal());
    m.proj.data<float>()[d] = zero_query ? 0.0f : float(0.2 * rng.normal());
  }
  m.prepare();
  return m;
}

TEST(AttnRes, MixMatchesTheSpecInDouble) {
  const int64_t D = 96, N = 7;
  Rng rng(3);
  for (int64_t S : {1, 2, 5, 9}) {
    const AttnRes m = make(D, 11 + S, false);
    std::vector<std::vector<float>> src(static_cast<size_t>(S), std::vector<float>(static_cast<size_t>(N * D)));
    for (int64_t j = 0; j < S; ++j)
      for (auto& v : src[size_t(j)]) v = float((1.0 + j) * rng.normal());  // sources of different scales
    std::vector<const float*> ptr;
    for (const auto& s : src) ptr.push_back(s.data());
    std::vector<float> out(static_cast<size_t>(N * D)), w(static_cast<size_t>(N * S));
    mix(m, ptr, N, out.data(), w.data());
    for (int64_t t = 0; t < N; ++t) {
      std::vector<double> z(static_cast<size_t>(S));
      double top = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        const float* s = src[size_t(j)].data() + t * D;
        double ss = 0;
        for (int64_t d = 0; d < D; ++d) ss += double(s[d]) * s[d];
        const double inv = 1.0 / std::sqrt(ss / D + 1e-5);
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += double(m.proj.data<float>()[d]) * (s[d] * inv * m.norm.data<float>()[d]);
        z[size_t(j)] = dot;
        top = std::max(top, dot);
      }
      double sum = 0;
      for (double& v : z) sum += (v = std::exp(v - top));
      for (int64_t j = 0; j < S; ++j) EXPECT_NEAR(w[size_t(t * S + j)], z[size_t(j)] / sum, 2e-6) << S << " " << t;
      for (int64_t d = 0; d < D; ++d) {
        double want = 0;
        for (int64_t j = 0; j < S; ++j) want += z[size_t(j)] / sum * src[size_t(j)][size_t(t * D + d)];
        EXPECT_NEAR(out[size_t(t * D + d)], want, 2e-5 * (1 + std::abs(want)));
      }
    }
  }
}

TEST(AttnRes, ZeroQueryMixesUniformly) {
  const int64_t D = 64, N = 3, S = 4;
  const AttnRes m = make(D, 5, true);
  Rng rng(8);
  std::vector<std::vector<float>> src(static_cast<size_t>(S), std::vector<float>(static_cast<size_t>(N * D)));
  for (auto& s : src)
    for (auto& v : s) v = float(rng.normal());
  std::vector<const float*> ptr;
  for (const auto& s : src) ptr.push_back(s.data());
  std::vector<float> out(static_cast<size_t>(N * D)), w(static_cast<size_t>(N * S));
  mix(m, ptr, N, out.data(), w.data());
  for (float p : w) EXPECT_FLOAT_EQ(p, 0.25f);
  for (int64_t i = 0; i < N * D; ++i)
    EXPECT_NEAR(out[size_t(i)], 0.25 * (src[0][size_t(i)] + src[1][size_t(i)] + src[2][size_t(i)] + src[3][size_t(i)]), 1e-6);
}

}  // namespace
}  // namespace lineage::layers
