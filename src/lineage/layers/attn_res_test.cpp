// One Block Attention Residuals mix against spec §6.3 written out in double (RMSNorm of each source
// with the norm weight, the dot with the pseudo-query, softmax over sources, raw sources summed),
// and the paper's initialization: an all-zero query mixes uniformly. The mix's backward: its double
// twin against central finite differences, the f32 kernel against the twin at 1 and 2 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "grad_check.h"
#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/kernels/ref/backward_ref.h"
#include "lineage/layers/attn_res.h"

namespace lineage::layers {
namespace attn_res_test {
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

// Sources of different scales, their pointers, and a pseudo-query.
struct MixCase {
  int64_t N, D, S;
  std::vector<test::Vec> src;
  test::Vec fold, dout;
  MixCase(int64_t n, int64_t d, int64_t s, uint64_t seed) : N(n), D(d), S(s) {
    for (int64_t j = 0; j < S; ++j) src.push_back(test::randn(N * D, seed + uint64_t(j), 1.0 + 0.7 * double(j)));
    fold = test::randn(D, seed + 100, 0.3);
    dout = test::randn(N * D, seed + 200);
  }
  std::vector<const double*> ptrs() const {
    std::vector<const double*> p;
    for (const auto& s : src) p.push_back(s.data());
    return p;
  }
};

TEST(AttnResBackwardRef, MatchesFiniteDifferences) {
  for (const int64_t S : {1, 2, 4}) {
    MixCase c(3, 5, S, 40 + uint64_t(S));
    const double eps = 1e-5;
    const auto loss = [&] {
      test::Vec out(static_cast<size_t>(c.N * c.D)), p(static_cast<size_t>(c.N * c.S));
      kernels::ref::attn_res_mix(c.ptrs().data(), c.S, c.N, c.D, c.fold.data(), eps, out.data(), p.data());
      return test::dot(out, c.dout);
    };
    test::Vec out(static_cast<size_t>(c.N * c.D)), p(static_cast<size_t>(c.N * c.S)), dfold(static_cast<size_t>(c.D), 0.0);
    std::vector<test::Vec> dsrc(static_cast<size_t>(S), test::Vec(static_cast<size_t>(c.N * c.D), 0.0));
    std::vector<double*> dptr;
    for (auto& d : dsrc) dptr.push_back(d.data());
    kernels::ref::attn_res_mix(c.ptrs().data(), c.S, c.N, c.D, c.fold.data(), eps, out.data(), p.data());
    kernels::ref::attn_res_mix_backward(c.ptrs().data(), c.S, c.N, c.D, c.fold.data(), eps, p.data(), c.dout.data(),
                                        dptr.data(), dfold.data());
    for (int64_t j = 0; j < S; ++j) test::expect_fd(c.src[size_t(j)], loss, dsrc[size_t(j)], "d source " + std::to_string(j));
    test::expect_fd(c.fold, loss, dfold, "d fold");
  }
}

TEST(AttnResBackward, MatchesItsTwin) {
  for (const int threads : {1, 2})
    for (const int64_t S : {1, 3, 6}) {
      ScopedThreads st(threads);
      const int64_t N = 37, D = 40;
      MixCase c(N, D, S, 60 + uint64_t(S));
      AttnRes m = make(D, 70 + uint64_t(S), false);
      // The twin takes the folded query; the kernel splits its gradient over norm and proj.
      for (int64_t d = 0; d < D; ++d) c.fold[size_t(d)] = m.fold[size_t(d)];
      test::Vec out(static_cast<size_t>(N * D)), p(static_cast<size_t>(N * S)), dfold(static_cast<size_t>(D), 0.0);
      std::vector<test::Vec> dsrc(static_cast<size_t>(S), test::Vec(static_cast<size_t>(N * D), 0.0));
      std::vector<double*> dptr;
      for (auto& d : dsrc) dptr.push_back(d.data());
      kernels::ref::attn_res_mix(c.ptrs().data(), S, N, D, c.fold.data(), double(m.eps), out.data(), p.data());
      kernels::ref::attn_res_mix_backward(c.ptrs().data(), S, N, D, c.fold.data(), double(m.eps), p.data(),
                                          c.dout.data(), dptr.data(), dfold.data());

      std::vector<std::vector<float>> src, dsrc_f(static_cast<size_t>(S), std::vector<float>(static_cast<size_t>(N * D), 0.0f));
      std::vector<const float*> sp;
      std::vector<float*> dp;
      for (int64_t j = 0; j < S; ++j) src.push_back(test::to_float(c.src[size_t(j)]));
      for (int64_t j = 0; j < S; ++j) sp.push_back(src[size_t(j)].data()), dp.push_back(dsrc_f[size_t(j)].data());
      std::vector<float> out_f(static_cast<size_t>(N * D)), p_f(static_cast<size_t>(N * S));
      mix(m, sp, N, out_f.data(), p_f.data());
      test::expect_close(out_f.data(), out, 1e-6, "mix");
      AttnRes g{D, m.eps, Tensor::zeros(DType::F32, {D}), Tensor::zeros(DType::F32, {1, D}), {}};
      const std::vector<float> dout = test::to_float(c.dout);
      mix_backward(m, sp, N, p_f.data(), dout.data(), dp, g);
      for (int64_t j = 0; j < S; ++j) test::expect_close(dp[size_t(j)], dsrc[size_t(j)], 1e-5, "d source " + std::to_string(j));
      test::Vec dnorm(static_cast<size_t>(D)), dproj(static_cast<size_t>(D));
      for (int64_t d = 0; d < D; ++d) {
        dnorm[size_t(d)] = dfold[size_t(d)] * m.proj.data<float>()[d];
        dproj[size_t(d)] = dfold[size_t(d)] * m.norm.data<float>()[d];
      }
      test::expect_close(g.norm.data<float>(), dnorm, 1e-5, "d norm");
      test::expect_close(g.proj.data<float>(), dproj, 1e-5, "d proj");
    }
}

}  // namespace
}  // namespace attn_res_test
}  // namespace lineage::layers
