// The token mixers on a step of several sequences: each sequence reads and writes only its own
// state, and gets what it gets alone, bit for bit (every product of a step of up to 8 rows runs a
// lone GEMV's arithmetic on each row; kernels/linear.h).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "lineage/core/rng.h"
#include "lineage/layers/mixers/attention.h"
#include "lineage/layers/mixers/delta_rule.h"

namespace lineage::layers {
namespace mixers_test {
namespace {

// Seeded weights for every tensor a layer lists: N(0, 0.1), ones and zeros as asked, and for the
// decay's A_log and dt_bias values in their trained ranges.
template <class Layer>
void fill(Layer& l, uint64_t seed) {
  Rng rng(seed);
  l.for_each_tensor("m", [&](const std::string& name, Tensor& t, const Shape& shape, Init init) {
    t = Tensor::empty(DType::F32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      float v = 0.1f * rng.normal();
      if (init == Init::Ones) v = 1.0f;
      if (init == Init::Zeros) v = 0.0f;
      if (init == Init::Custom) v = name.find("A_log") != std::string::npos ? float(std::log(1.0 + 15.0 * rng.uniform()))
                                                                             : float(-4.0 + rng.uniform());
      t.data<float>()[i] = v;
    }
  });
}

std::vector<float> rows(int64_t n, int64_t d, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(size_t(n * d));
  for (float& v : x) v = rng.normal();
  return x;
}

// Runs `lengths` sequences through one step of `layer` from fresh states, and each alone; compares
// the outputs and the final states.
template <class Layer, class State>
void expect_step_equals_alone(const Layer& layer, int64_t D, const std::vector<int64_t>& lengths,
                              const std::function<std::vector<float>(const State&)>& state_of) {
  typename Layer::Buffers buf;
  const Options options;
  int64_t N = 0;
  for (int64_t n : lengths) N += n;
  const std::vector<float> x = rows(N, D, 5);
  std::vector<State> together, alone;
  Step step;
  for (size_t b = 0; b < lengths.size(); ++b) {
    together.push_back(layer.new_state());
    alone.push_back(layer.new_state());
  }
  std::vector<State*> ptrs;
  int64_t t0 = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    step.add(int32_t(b), 0, std::vector<int32_t>(size_t(lengths[b]), 0));
    ptrs.push_back(&together[b]);
  }
  std::vector<float> y(size_t(N * D));
  forward(layer, Call{step, options}, x.data(), ptrs, y.data(), buf, {});
  for (size_t b = 0; b < lengths.size(); ++b) {
    Step one;
    one.add(0, 0, std::vector<int32_t>(size_t(lengths[b]), 0));
    State* s = &alone[b];
    std::vector<float> yb(size_t(lengths[b] * D));
    forward(layer, Call{one, options}, x.data() + t0 * D, {&s, 1}, yb.data(), buf, {});
    EXPECT_EQ(std::vector<float>(y.begin() + t0 * D, y.begin() + (t0 + lengths[b]) * D), yb) << "sequence " << b;
    EXPECT_EQ(state_of(together[b]), state_of(alone[b])) << "state of sequence " << b;
    t0 += lengths[b];
  }
}

TEST(Mixers, AttentionStepKeepsSequencesApart) {
  Attention a;
  a.config = {32, 2, 16, true};
  fill(a, 1);
  const auto kv = [](const Attention::State& s) {
    std::vector<float> v;
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t j = 0; j < s.length * 16; ++j) {
        v.push_back(s.k.data<float>()[h * s.capacity * 16 + j]);
        v.push_back(s.v.data<float>()[h * s.capacity * 16 + j]);
      }
    return v;
  };
  expect_step_equals_alone<Attention, Attention::State>(a, 32, {1, 4, 3}, kv);
  expect_step_equals_alone<Attention, Attention::State>(a, 32, {1, 1, 1, 1, 1, 1, 1, 1}, kv);
}

TEST(Mixers, DeltaRuleStepKeepsSequencesApart) {
  DeltaRule d;  // KDA's switches: per-channel decay, low-rank sigmoid gate, short conv
  DeltaRule::Config& c = d.config;
  c.kind = "KDA";
  c.d_model = 32, c.n_heads = 2, c.n_kv_heads = 2, c.n_v_heads = 2, c.head_k = 16, c.head_v = 16, c.conv_size = 4;
  c.decay = DeltaRule::DecayInput::PerChannelLowRank;
  c.out_gate = DeltaRule::OutGate::SigmoidLowRank;
  fill(d, 2);
  d.prepare();
  const auto state = [](const DeltaRule::State& s) {
    std::vector<float> v(s.S.data<float>(), s.S.data<float>() + s.S.numel());
    v.insert(v.end(), s.conv_tail.data<float>(), s.conv_tail.data<float>() + s.conv_tail.numel());
    return v;
  };
  expect_step_equals_alone<DeltaRule, DeltaRule::State>(d, 32, {1, 4, 2}, state);
  expect_step_equals_alone<DeltaRule, DeltaRule::State>(d, 32, {1, 1, 1, 1, 1}, state);
}

// W = B·A as one [out, in] f32 matrix (A [r, in], B [out, r]).
kernels::Matrix product(const kernels::Matrix& B, const kernels::Matrix& A) {
  const int64_t out = B.data.dim(0), r = B.data.dim(1), in = A.data.dim(1);
  kernels::Matrix W;
  W.data = Tensor::zeros(DType::F32, {out, in});
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double acc = 0;
      for (int64_t k = 0; k < r; ++k) acc += double(B.data.data<float>()[o * r + k]) * A.data.data<float>()[k * in + i];
      W.data.data<float>()[o * in + i] = float(acc);
    }
  return W;
}

// Kimi K3's KDA switches against the low-rank layer they generalize: a full-rank decay input
// f_proj = f_b·f_a and a full-rank output gate g_proj = g_b·g_a (no bias) give the same layer; the
// lower-bounded gate's log decay is lb·σ(exp(A_log[h])·(f + dt_bias)) (spec §1.4, written out here),
// inside (lb, 0), with A_log stored longer than the heads (K3's [head_dim]).
TEST(Mixers, KdaFullRankGatesAndTheLowerBound) {
  for (float lb : {0.0f, -5.0f}) {
    DeltaRule low;
    DeltaRule::Config& c = low.config;
    c.kind = "KDA";
    c.d_model = 32, c.n_heads = c.n_kv_heads = c.n_v_heads = 2, c.head_k = c.head_v = 16, c.conv_size = 4;
    c.decay = DeltaRule::DecayInput::PerChannelLowRank;
    c.out_gate = DeltaRule::OutGate::SigmoidLowRank;
    c.gate_lower_bound = lb;
    c.a_log_len = 16;
    low.g_b_has_bias = false;
    fill(low, 7);
    for (int64_t j = 0; j < 32; j += 2) low.weights.dt_bias.data<float>()[j] = 4.0f;  // decays near the bound
    low.prepare();
    DeltaRule full = low;
    full.config.decay = DeltaRule::DecayInput::PerChannelProj;
    full.config.out_gate = DeltaRule::OutGate::Sigmoid;
    full.weights.f_proj = product(low.weights.f_b, low.weights.f_a);
    full.weights.g_proj = product(low.weights.g_b, low.weights.g_a);
    full.weights.f_a = full.weights.f_b = full.weights.g_a = full.weights.g_b = {};
    full.prepare();
    const int64_t N = 70, D = 32;  // the chunked kernel runs too
    const std::vector<float> x = rows(N, D, 3);
    std::map<std::string, std::vector<float>> traced;
    const Trace trace{[&](const std::string& n, const float* d, const Shape& sh) { traced[n].assign(d, d + shape_numel(sh)); }, ""};
    const auto run = [&](const DeltaRule& m, const Trace& tr) {
      DeltaRule::Buffers buf;
      DeltaRule::State st = m.new_state();
      DeltaRule::State* sp = &st;
      Step step;
      step.add(0, 0, std::vector<int32_t>(size_t(N), 0));
      std::vector<float> y(size_t(N * D));
      forward(m, Call{step, Options{}}, x.data(), {&sp, 1}, y.data(), buf, tr);
      return y;
    };
    const std::vector<float> a = run(low, trace), b = run(full, {});
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) num += std::pow(double(a[i]) - b[i], 2), den += double(a[i]) * a[i];
    EXPECT_LE(std::sqrt(num / den), 1e-5) << "lower bound " << lb;
    if (lb == 0) continue;
    // The log decay by hand from the layer's own pre-gate input f = f_b·f_a·x.
    const std::vector<float>& got = traced["attn.log_decay"];
    ASSERT_EQ(got.size(), size_t(N * 32));
    int near = 0;
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < 32; ++j) {
        double f = 0;
        for (int64_t i = 0; i < D; ++i)
          f += double(full.weights.f_proj.data.data<float>()[j * D + i]) * x[size_t(t * D + i)];
        const double A = std::exp(double(low.weights.A_log.data<float>()[j / 16]));
        const double want = lb / (1.0 + std::exp(-A * (f + low.weights.dt_bias.data<float>()[j])));
        const float g = got[size_t(t * 32 + j)];
        EXPECT_NEAR(g, want, 2e-5 * 5) << t << " " << j;
        EXPECT_TRUE(g <= 0 && g >= lb);
        near += g < 0.9 * lb;
      }
    EXPECT_GT(near, 0) << "some decays near the bound";
  }
}

}  // namespace
}  // namespace mixers_test
}  // namespace lineage::layers
