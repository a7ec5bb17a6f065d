// MLA against a naive double-precision implementation of spec §2.3 written here (q-LoRA, RoPE on the
// shared slot, the output gate: the switches Kimi Linear's checkpoints leave off and K3's turn on),
// in both forms: explicit over a prompt, absorbed token by token, and mixed in pieces.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lineage/core/rng.h"
#include "lineage/layers/mixers/mla.h"

namespace lineage::layers {
namespace mla_test {
namespace {

struct Shape5 {
  int64_t D, n, rq, r, dn, dr, dv;
};

Mla make(const Shape5& s, bool rope, bool gate, uint64_t seed) {
  Mla m;
  m.config = {s.D, s.n, s.rq, s.r, s.dn, s.dr, s.dv, rope, 10000.0, gate, 1e-6f};
  m.weights.kv_a_norm = {Norm::Kind::Rms, s.r, 1e-6f, {}, {}};
  m.weights.q_a_norm = {Norm::Kind::Rms, s.rq, 1e-6f, {}, {}};
  Rng rng(seed);
  m.for_each_tensor("m", [&](const std::string& name, Tensor& t, const Shape& shape, Init init) {
    t = Tensor::empty(DType::F32, shape);
    for (int64_t i = 0; i < t.numel(); ++i)
      t.data<float>()[i] = init == Init::Ones ? float(1.0 + 0.1 * rng.normal()) : float(0.2 * rng.normal());
  });
  m.prepare();
  return m;
}

// y = W x for W [out, in] f32.
std::vector<double> mv(const Tensor& w, const std::vector<double>& x) {
  const int64_t out = w.dim(0), in = w.dim(1);
  std::vector<double> y(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) y[size_t(o)] += double(w.data<float>()[o * in + i]) * x[size_t(i)];
  return y;
}

void rms(std::vector<double>& x, int64_t n, const Tensor& w, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[size_t(i)] * x[size_t(i)];
  const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] *= inv * double(w.data<float>()[i]);
}

void rot(double* x, int64_t d, int64_t p) {
  for (int64_t i = 0; i < d / 2; ++i) {
    const double a = double(p) * std::pow(10000.0, -2.0 * double(i) / double(d));
    const double u = x[2 * i], v = x[2 * i + 1];
    x[2 * i] = u * std::cos(a) - v * std::sin(a);
    x[2 * i + 1] = u * std::sin(a) + v * std::cos(a);
  }
}

// The explicit form of §2.3 with a full causal softmax, in double: y [T, D].
std::vector<double> naive(const Mla& m, const std::vector<float>& xf, int64_t T) {
  const Mla::Config& c = m.config;
  const int64_t D = c.d_model, n = c.n_heads, r = c.kv_lora_rank, dn = c.d_nope, dr = c.d_rope, dv = c.d_v;
  const int64_t dq = dn + dr;
  const size_t nT = static_cast<size_t>(T);
  std::vector<std::vector<double>> Q(nT), K(nT), V(nT), X(nT);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> x(xf.begin() + t * D, xf.begin() + (t + 1) * D);
    X[size_t(t)] = x;
    std::vector<double> q;
    if (c.q_lora_rank) {
      std::vector<double> low = mv(m.weights.q_a_proj.data, x);
      rms(low, c.q_lora_rank, m.weights.q_a_norm.weight, 1e-6);
      q = mv(m.weights.q_b_proj.data, low);
    } else {
      q = mv(m.weights.q_proj.data, x);
    }
    std::vector<double> kv = mv(m.weights.kv_a_proj.data, x);
    rms(kv, r, m.weights.kv_a_norm.weight, 1e-6);  // the latent only; k_r stays as projected
    if (c.rope) {
      for (int64_t h = 0; h < n; ++h) rot(q.data() + h * dq + dn, dr, t);
      rot(kv.data() + r, dr, t);
    }
    const std::vector<double> up = mv(m.weights.kv_b_proj.data, std::vector<double>(kv.begin(), kv.begin() + r));
    std::vector<double> k(size_t(n * dq)), v(size_t(n * dv));
    for (int64_t h = 0; h < n; ++h) {
      for (int64_t i = 0; i < dn; ++i) k[size_t(h * dq + i)] = up[size_t(h * (dn + dv) + i)];
      for (int64_t i = 0; i < dr; ++i) k[size_t(h * dq + dn + i)] = kv[size_t(r + i)];
      for (int64_t i = 0; i < dv; ++i) v[size_t(h * dv + i)] = up[size_t(h * (dn + dv) + dn + i)];
    }
    Q[size_t(t)] = q, K[size_t(t)] = k, V[size_t(t)] = v;
  }
  std::vector<double> y;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> u(size_t(n * dv));
    for (int64_t h = 0; h < n; ++h) {
      std::vector<double> s(static_cast<size_t>(t + 1));
      double mx = -1e300, z = 0;
      for (int64_t j = 0; j <= t; ++j) {
        double d = 0;
        for (int64_t i = 0; i < dq; ++i) d += Q[size_t(t)][size_t(h * dq + i)] * K[size_t(j)][size_t(h * dq + i)];
        s[size_t(j)] = d / std::sqrt(double(dq));
        mx = std::max(mx, s[size_t(j)]);
      }
      for (double& e : s) z += (e = std::exp(e - mx));
      for (int64_t j = 0; j <= t; ++j)
        for (int64_t i = 0; i < dv; ++i) u[size_t(h * dv + i)] += s[size_t(j)] / z * V[size_t(j)][size_t(h * dv + i)];
    }
    if (c.output_gate) {
      const std::vector<double> g = mv(m.weights.g_proj.data, X[size_t(t)]);
      for (size_t i = 0; i < u.size(); ++i) u[i] *= 1.0 / (1.0 + std::exp(-g[i]));
    }
    const std::vector<double> o = mv(m.weights.o_proj.data, u);
    y.insert(y.end(), o.begin(), o.end());
  }
  return y;
}

// The layer over the T rows in pieces of `piece` tokens of one sequence.
std::vector<float> run(const Mla& m, const std::vector<float>& x, int64_t T, int64_t piece, MlaPath path) {
  Mla::State state = m.new_state();
  Mla::Buffers buf;
  Options options;
  options.mla_path = path;
  std::vector<float> y(x.size());
  const int64_t D = m.config.d_model;
  for (int64_t t0 = 0; t0 < T; t0 += piece) {
    const int64_t n = std::min(piece, T - t0);
    Step step;
    step.add(0, t0, std::vector<int32_t>(size_t(n), 0));
    Mla::State* s = &state;
    forward(m, Call{step, options}, x.data() + t0 * D, {&s, 1}, y.data() + t0 * D, buf, {});
  }
  EXPECT_EQ(state.length, T);
  return y;
}

double rel_rms(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / den);
}

std::vector<float> inputs(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = float(rng.normal());
  return x;
}

TEST(Mla, BothFormsMatchTheNaiveAttentionWithEverySwitch) {
  const Shape5 s{48, 3, 24, 32, 16, 8, 12};
  const int64_t T = 37;
  const std::vector<float> x = inputs(T * s.D, 1);
  for (int64_t rq : {int64_t(0), s.rq})
    for (bool rope : {false, true})
      for (bool gate : {false, true}) {
        SCOPED_TRACE(testing::Message() << "q-LoRA " << rq << " rope " << rope << " gate " << gate);
        Shape5 sh = s;
        sh.rq = rq;
        const Mla m = make(sh, rope, gate, 7 + rq + rope * 2 + gate);
        const std::vector<double> want = naive(m, x, T);
        const std::vector<float> expl = run(m, x, T, T, MlaPath::Explicit);
        const std::vector<float> absorbed = run(m, x, T, 1, MlaPath::Absorbed);
        const std::vector<float> mixed = run(m, x, T, 5, MlaPath::Auto);       // absorbed pieces of 5
        const std::vector<float> chunks = run(m, x, T, 17, MlaPath::Auto);     // explicit 17s with a past
        EXPECT_LE(rel_rms(expl, want), 1e-5);
        EXPECT_LE(rel_rms(absorbed, want), 1e-5);
        EXPECT_LE(rel_rms(mixed, want), 1e-5);
        EXPECT_LE(rel_rms(chunks, want), 1e-5);
      }
}

// The NoPE trap (spec §2.3): the d_rope slot is still scored, and the scale is (d_nope + d_rope)^−½.
// Dropping the slot's scores changes the output far beyond rounding.
TEST(Mla, TheUnrotatedSharedSlotIsScored) {
  const Shape5 s{32, 2, 0, 16, 8, 8, 8};
  const int64_t T = 9;
  const std::vector<float> x = inputs(T * s.D, 2);
  Mla m = make(s, false, false, 3);
  const std::vector<float> with = run(m, x, T, T, MlaPath::Explicit);
  // Zero the k_r rows of kv_a: the slot then scores nothing.
  float* w = m.weights.kv_a_proj.data.data<float>();
  for (int64_t i = s.r * s.D; i < (s.r + s.dr) * s.D; ++i) w[i] = 0.0f;
  const std::vector<float> without = run(m, x, T, T, MlaPath::Explicit);
  std::vector<double> w64(with.begin(), with.end());
  EXPECT_GT(rel_rms(without, w64), 1e-2);
}

}  // namespace
}  // namespace mla_test
}  // namespace lineage::layers
