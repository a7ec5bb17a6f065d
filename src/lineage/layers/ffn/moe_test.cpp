// The MoE router against a scalar reference written from the spec (double, full sorts), on ties,
// negative biases, group masking and both bias behaviours; the layer against its dense MLP.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "lineage/core/rng.h"
#include "lineage/layers/ffn/moe.h"

namespace lineage::layers {
namespace moe_test {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<double> w;
};

// spec §3.2, literally: scores, biased scores, group scores (sum of the top two), the kept groups by
// a stable sort, 0.0 for the others, the top k by a stable sort of (score desc, index asc).
Routed reference_route(const Moe::Config& c, const std::vector<float>& logits, const std::vector<float>& bias) {
  const int64_t E = c.n_experts;
  std::vector<double> s(static_cast<size_t>(E)), sb(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    s[size_t(e)] = double(1.0f / (1.0f + std::exp(-logits[size_t(e)])));
    sb[size_t(e)] = double(float(s[size_t(e)]) + bias[size_t(e)]);
  }
  std::vector<double> rank = sb;
  if (c.n_group > 1) {
    const int64_t per = E / c.n_group;
    std::vector<double> g(static_cast<size_t>(c.n_group));
    for (int64_t i = 0; i < c.n_group; ++i) {
      std::vector<double> v(sb.begin() + i * per, sb.begin() + (i + 1) * per);
      std::sort(v.rbegin(), v.rend());
      g[size_t(i)] = v[0] + (per > 1 ? v[1] : 0.0);
    }
    std::vector<int64_t> order(static_cast<size_t>(c.n_group));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return g[size_t(a)] > g[size_t(b)]; });
    std::vector<char> kept(size_t(c.n_group), 0);
    for (int64_t i = 0; i < c.topk_group; ++i) kept[size_t(order[size_t(i)])] = 1;
    for (int64_t e = 0; e < E; ++e)
      if (!kept[size_t(e / per)]) rank[size_t(e)] = c.mask_neg_inf ? -INFINITY : 0.0;
  }
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return rank[size_t(a)] > rank[size_t(b)]; });
  Routed r;
  double sum = 0;
  for (int64_t j = 0; j < c.top_k; ++j) {
    r.ids.push_back(order[size_t(j)]);
    r.w.push_back(c.bias_in_weights ? sb[size_t(order[size_t(j)])] : s[size_t(order[size_t(j)])]);
    sum += r.w.back();
  }
  for (double& w : r.w) {
    if (c.top_k > 1 && c.renormalize) w /= sum + 1e-20;
    w *= c.scaling;
  }
  return r;
}

void expect_route(const Moe::Config& c, const std::vector<float>& logits, const std::vector<float>& bias,
                  const char* what) {
  std::vector<int32_t> ids(static_cast<size_t>(c.top_k)), scratch;
  std::vector<float> w(static_cast<size_t>(c.top_k));
  route(c, logits.data(), bias.data(), ids.data(), w.data(), scratch);
  const Routed want = reference_route(c, logits, bias);
  EXPECT_EQ(ids, want.ids) << what;
  for (int64_t j = 0; j < c.top_k; ++j) EXPECT_NEAR(w[size_t(j)], want.w[size_t(j)], 1e-6 * std::abs(want.w[size_t(j)]) + 1e-12) << what;
}

Moe::Config config(int64_t E, int64_t k, int64_t groups = 1, int64_t keep = 1) {
  Moe::Config c;
  c.d_model = 16, c.n_experts = E, c.top_k = k, c.hidden = 8, c.n_group = groups, c.topk_group = keep;
  c.scaling = 2.446;
  return c;
}

TEST(MoeRoute, TiesGoToTheLowerIndex) {
  const Moe::Config c = config(8, 3);
  expect_route(c, std::vector<float>(8, 0.0f), std::vector<float>(8, 0.0f), "all equal");
  std::vector<int32_t> ids(3), scratch;
  std::vector<float> w(3);
  route(c, std::vector<float>(8, 0.0f).data(), std::vector<float>(8, 0.0f).data(), ids.data(), w.data(), scratch);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2}));
  // Equal biased scores from different logits and biases: still the lower index first.
  const std::vector<float> logits = {0.0f, 1.0f, 0.0f, 1.0f, -1.0f, 1.0f, 0.0f, 0.0f};
  expect_route(c, logits, std::vector<float>(8, 0.25f), "partial ties");
  route(c, logits.data(), std::vector<float>(8, 0.25f).data(), ids.data(), w.data(), scratch);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 5}));
}

TEST(MoeRoute, RandomScoresNegativeBiasesGroupsAndBothBiasBehaviours) {
  Rng rng(7);
  for (auto [E, k, groups, keep] : std::vector<std::array<int64_t, 4>>{{8, 2, 1, 1}, {16, 4, 4, 2}, {64, 6, 8, 3},
                                                                      {896, 16, 1, 1}, {12, 1, 1, 1}, {16, 8, 4, 1}})
    for (bool in_weights : {false, true}) {
      Moe::Config c = config(E, k, groups, keep);
      c.bias_in_weights = in_weights;
      for (int t = 0; t < 50; ++t) {
        std::vector<float> logits(static_cast<size_t>(E)), bias(static_cast<size_t>(E));
        for (auto& x : logits) x = 2 * rng.normal();
        for (auto& b : bias) b = float(rng.uniform() * 1.2 - 1.0);  // mostly negative
        expect_route(c, logits, bias, "random");
      }
    }
}

// All biased scores negative: the 0.0 mask ranks every expert of a dropped group above every kept
// one, as the references' masking does (with −∞ the kept ones would win).
TEST(MoeRoute, TheZeroMaskLetsDroppedGroupsOutrankNegativeScores) {
  const Moe::Config c = config(16, 4, 4, 2);
  Rng rng(3);
  std::vector<float> logits(16), bias(16, -2.0f);
  for (auto& x : logits) x = rng.normal();
  expect_route(c, logits, bias, "negative");
  std::vector<int32_t> ids(4), scratch;
  std::vector<float> w(4);
  route(c, logits.data(), bias.data(), ids.data(), w.data(), scratch);
  std::map<int32_t, int> groups;
  for (int32_t e : ids) ++groups[e / 4];
  // Which two groups were kept follows from the scores; every chosen expert lies in the others.
  const Routed want = reference_route(c, logits, bias);
  EXPECT_EQ(ids, want.ids);
  std::vector<double> g(4);
  for (int i = 0; i < 4; ++i) {
    std::vector<double> v;
    for (int e = 4 * i; e < 4 * i + 4; ++e) v.push_back(1.0 / (1.0 + std::exp(-double(logits[size_t(e)]))) - 2.0);
    std::sort(v.rbegin(), v.rend());
    g[size_t(i)] = v[0] + v[1];
  }
  std::vector<int> order = {0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return g[size_t(a)] > g[size_t(b)]; });
  for (int32_t e : ids) EXPECT_TRUE(e / 4 != order[0] && e / 4 != order[1]) << "expert " << e;
}

// Kimi K3 masks the dropped groups with −∞: with every biased score negative, the chosen experts
// all lie in the kept groups (the opposite of the 0.0 mask above), as the reference computes it.
TEST(MoeRoute, KimiK3sInfinityMaskKeepsTheChoiceInTheKeptGroups) {
  Moe::Config c = config(16, 4, 4, 2);
  c.mask_neg_inf = true;
  Rng rng(3);
  std::vector<float> logits(16), bias(16, -2.0f);
  for (auto& x : logits) x = rng.normal();
  expect_route(c, logits, bias, "negative, -inf mask");
  std::vector<int32_t> ids(4), scratch, zero_ids(4);
  std::vector<float> w(4);
  route(c, logits.data(), bias.data(), ids.data(), w.data(), scratch);
  c.mask_neg_inf = false;
  route(c, logits.data(), bias.data(), zero_ids.data(), w.data(), scratch);
  std::set<int32_t> groups, zero_groups;
  for (int32_t e : ids) groups.insert(e / 4);
  for (int32_t e : zero_ids) zero_groups.insert(e / 4);
  EXPECT_LE(groups.size(), 2u);
  for (int32_t g : groups) EXPECT_EQ(zero_groups.count(g), 0u) << "the two masks choose from opposite groups here";
  for (auto& b : bias) b = float(rng.uniform() * 1.2 - 1.0);
  c.mask_neg_inf = true;
  for (int t = 0; t < 50; ++t) {
    for (auto& x : logits) x = 2 * rng.normal();
    expect_route(c, logits, bias, "random, -inf mask");
  }
}

// Fills every tensor of the layer with seeded values (gate zero when asked).
void fill(Moe& m, uint64_t seed, bool zero_gate) {
  Rng rng(seed);
  m.for_each_tensor("moe", [&](const std::string& name, Tensor& t, const Shape& shape, Init) {
    if (t.defined() && t.shape() == shape) return;  // set by the test
    t = Tensor::empty(DType::F32, shape);
    const bool zero = (zero_gate && name == "moe.gate.weight") || name == "moe.gate.e_score_correction_bias";
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = zero ? 0.0f : 0.3f * rng.normal();
  });
  m.prepare();
}

std::vector<float> run(const Moe& m, const std::vector<float>& x, int64_t N, const Trace& trace = {}) {
  Step step;
  step.add(0, 0, std::vector<int32_t>(size_t(N), 0));
  const Options options{.bf16_dot = false};
  Moe::Buffers buf;
  std::vector<float> y(size_t(N * m.config.d_model));
  forward(m, Call{step, options}, x.data(), y.data(), buf, trace);
  return y;
}

// One expert chosen with weight exactly 1 (all scores σ(0) = ½ tie, expert 0 wins, ½·2 = 1): the MoE
// is that expert's dense SwiGLU MLP, bit for bit; with a shared expert, the two added.
TEST(Moe, OneExpertOfWeightOneIsItsDenseMlp) {
  for (int64_t shared : {0, 12}) {
    Moe m;
    m.config = config(4, 1);
    m.config.scaling = 2.0;
    m.config.shared_hidden = shared;
    fill(m, 5, true);
    const int64_t N = 11, D = m.config.d_model;
    Rng rng(9);
    std::vector<float> x(size_t(N * D));
    for (auto& v : x) v = rng.normal();
    const std::vector<float> y = run(m, x, N);
    GatedMlp::Buffers buf;
    std::vector<float> want(size_t(N * D)), sh(size_t(N * D));
    forward_rows(m.weights.experts[0], x.data(), N, want.data(), buf, false);
    if (shared) {
      forward_rows(m.weights.shared, x.data(), N, sh.data(), buf, false);
      for (size_t i = 0; i < want.size(); ++i) want[i] += sh[i];
    }
    EXPECT_EQ(y, want) << "shared width " << shared;
  }
}

// The trace names the chosen experts and their weights, as route() gives them per token; each
// token's output is its experts' outputs weighted, whatever the other tokens of the step chose.
TEST(Moe, TraceExposesExpertIdsAndWeightsAndTokensAreIndependent) {
  Moe m;
  m.config = config(8, 3);
  m.config.shared_hidden = 8;
  fill(m, 11, false);
  const int64_t N = 20, D = m.config.d_model, k = m.config.top_k;
  Rng rng(4);
  std::vector<float> x(size_t(N * D));
  for (auto& v : x) v = rng.normal();
  std::map<std::string, std::vector<float>> got;
  const Trace trace{[&](const std::string& name, const float* d, const Shape& s) {
    got[name].assign(d, d + shape_numel(s));
  }, ""};
  const std::vector<float> y = run(m, x, N, trace);
  ASSERT_TRUE(got.count("moe.expert_ids") && got.count("moe.expert_weights") && got.count("moe.router_logits"));
  std::vector<int32_t> ids(static_cast<size_t>(k)), scratch;
  std::vector<float> w(static_cast<size_t>(k));
  int64_t distinct = 0;
  std::vector<char> seen(8, 0);
  for (int64_t t = 0; t < N; ++t) {
    route(m.config, got["moe.router_logits"].data() + t * 8, m.prepared.bias.data(), ids.data(), w.data(), scratch);
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(got["moe.expert_ids"][size_t(t * k + j)], float(ids[size_t(j)]));
      EXPECT_EQ(got["moe.expert_weights"][size_t(t * k + j)], w[size_t(j)]);
      distinct += !seen[size_t(ids[size_t(j)])];
      seen[size_t(ids[size_t(j)])] = 1;
    }
    const std::vector<float> row(x.begin() + t * D, x.begin() + (t + 1) * D);
    const std::vector<float> alone = run(m, row, 1);
    double num = 0, den = 0;
    for (int64_t d = 0; d < D; ++d) {
      num += std::pow(double(alone[size_t(d)]) - y[size_t(t * D + d)], 2);
      den += std::pow(double(alone[size_t(d)]), 2);
    }
    EXPECT_LE(std::sqrt(num / den), 1e-6) << "token " << t;
  }
  EXPECT_GE(distinct, 5) << "the test wants tokens that route differently";
}

// Stable LatentMoE with identity projections and no norm is the plain MoE on the same experts
// (every product by the identity exact); with the norm, the aggregate is RMSNormed once before
// the up-projection (written out here from spec §4.2), and the shared expert reads the full-width x.
TEST(Moe, LatentWithIdentityProjectionsIsThePlainMoe) {
  Moe plain;
  plain.config = config(8, 3);
  plain.config.shared_hidden = 8;
  fill(plain, 13, false);
  const int64_t N = 9, D = plain.config.d_model, E = 8;
  Moe latent;
  latent.config = plain.config;
  latent.config.latent = D;
  Tensor eye = Tensor::zeros(DType::F32, {D, D});
  for (int64_t i = 0; i < D; ++i) eye.data<float>()[i * D + i] = 1.0f;
  latent.weights.latent_down.data = eye;
  latent.weights.latent_up.data = eye;
  fill(latent, 1, false);
  latent.weights.gate = plain.weights.gate;
  latent.weights.bias = plain.weights.bias;
  latent.weights.experts = plain.weights.experts;
  latent.weights.shared = plain.weights.shared;
  latent.prepare();
  Rng rng(21);
  std::vector<float> x(size_t(N * D));
  for (auto& v : x) v = rng.normal();
  EXPECT_EQ(run(latent, x, N), run(plain, x, N));

  // A real latent space of 8 with its norm: against the experts, the norm and the projections by hand.
  Moe m;
  m.config = config(E, 2);
  m.config.shared_hidden = 8;
  m.config.latent = 8, m.config.latent_norm = true, m.config.latent_eps = 1e-5f;
  fill(m, 17, false);
  std::map<std::string, std::vector<float>> got;
  const Trace trace{[&](const std::string& name, const float* d, const Shape& s) { got[name].assign(d, d + shape_numel(s)); }, ""};
  const std::vector<float> y = run(m, x, N, trace);
  ASSERT_TRUE(got.count("moe.latent") && got.count("moe.routed"));
  const auto mat = [](const kernels::Matrix& w, const float* v, int64_t rows, int64_t cols) {
    std::vector<double> o(static_cast<size_t>(rows), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) o[size_t(r)] += double(w.data.data<float>()[r * cols + c]) * v[c];
    return o;
  };
  double num = 0, den = 0;
  std::vector<int32_t> ids(2), scratch;
  std::vector<float> w(2);
  GatedMlp::Buffers buf;
  for (int64_t t = 0; t < N; ++t) {
    const std::vector<double> z = mat(m.weights.latent_down, x.data() + t * D, 8, D);
    const std::vector<float> zf(z.begin(), z.end());
    route(m.config, got["moe.router_logits"].data() + t * E, m.prepared.bias.data(), ids.data(), w.data(), scratch);
    std::vector<double> a(8, 0.0);
    for (int j = 0; j < 2; ++j) {
      std::vector<float> out(8);
      forward_rows(m.weights.experts[size_t(ids[size_t(j)])], zf.data(), 1, out.data(), buf, false);
      for (int d = 0; d < 8; ++d) a[size_t(d)] += double(w[size_t(j)]) * out[size_t(d)];
    }
    double ss = 0;
    for (double v : a) ss += v * v;
    std::vector<float> an(8);
    for (int d = 0; d < 8; ++d)
      an[size_t(d)] = float(a[size_t(d)] / std::sqrt(ss / 8 + 1e-5) * m.weights.latent_norm.data<float>()[d]);
    const std::vector<double> r = mat(m.weights.latent_up, an.data(), D, 8);
    std::vector<float> sh(static_cast<size_t>(D));
    forward_rows(m.weights.shared, x.data() + t * D, 1, sh.data(), buf, false);
    for (int64_t d = 0; d < D; ++d) {
      num += std::pow(r[size_t(d)] + sh[size_t(d)] - y[size_t(t * D + d)], 2);
      den += std::pow(r[size_t(d)] + sh[size_t(d)], 2);
    }
  }
  EXPECT_LE(std::sqrt(num / den), 1e-5);
}

}  // namespace
}  // namespace moe_test
}  // namespace lineage::layers
