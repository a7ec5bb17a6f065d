// Backward of the delta-rule family: the ref backward against central finite differences of the ref
// forward (all in double), the fast recurrent and chunked backward against the ref, chunked against
// recurrent, determinism, and the read-only initial state.
#include "lineage/kernels/delta_rule_backward.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/kernels/ref/delta_rule_backward_ref.h"

namespace lineage {
namespace delta_rule_backward_test {
namespace {

using kernels::DeltaRuleArgs;
using kernels::DeltaRuleGrads;
using kernels::Gate;

// Relative RMS tolerances: the double ref backward against double finite differences, and the f32
// kernels against the double ref.
constexpr double kTolFiniteDifference = 1e-6;
constexpr double kTolF32 = 1e-5;

enum class Decay { None, Mild, Strong };

struct Family {
  const char* name;
  Gate gate;
  Decay decay;
  bool delta, normalize;
};

void PrintTo(const Family& f, std::ostream* os) { *os << f.name; }

const Family kFamilies[] = {
    {"deltanet", Gate::None, Decay::None, true, false},
    {"gated_deltanet_mild", Gate::PerHead, Decay::Mild, true, false},
    {"gated_deltanet_strong", Gate::PerHead, Decay::Strong, true, false},
    {"kda_mild", Gate::PerChannel, Decay::Mild, true, false},
    {"kda_strong", Gate::PerChannel, Decay::Strong, true, false},
    {"linear_attention", Gate::None, Decay::None, false, false},
    {"linear_attention_normalized", Gate::None, Decay::None, false, true},
    {"scalar_decay_strong", Gate::PerHead, Decay::Strong, false, false},
    {"channel_decay_additive_strong", Gate::PerChannel, Decay::Strong, false, false},
    {"scalar_decay_normalized", Gate::PerHead, Decay::Mild, false, true},
    {"channel_decay_normalized", Gate::PerChannel, Decay::Strong, false, true},
};

const Family& family(const std::string& name) {
  for (const Family& f : kFamilies)
    if (name == f.name) return f;
  ADD_FAILURE() << "no family " << name;
  return kFamilies[0];
}

struct Case {
  int64_t T = 1, H = 2, HV = 4, K = 16, V = 24;
  Family f{};
  bool with_beta = true;
  uint64_t seed = 1;
  std::string name() const {
    std::ostringstream os;
    os << f.name << (with_beta ? "" : "_beta_null") << "_T" << T << "_H" << H << "_HV" << HV << "_K" << K << "_V" << V;
    return os.str();
  }
  int64_t gate_width() const { return f.gate == Gate::PerChannel ? K : 1; }
};

// Inputs and incoming gradients of one case, drawn from its seed (f32, so the fast kernels and the
// double ref see the same numbers): unit-norm q, k for the delta rule, positive ones for the
// normalizer, β ∈ [0.05, 1), mild log decays ≈ −0.05, strong ones log-uniform in [−20, −1e-3] (per
// channel) or [−5, −1e-3] (per head), a random initial state and z, random dO, dS_T, dz_T.
struct Inputs {
  Case c;
  std::vector<float> q, k, v, beta, log_decay, state, z, dout, dstate_final, dz_final;
};

void fill_qk(const Case& c, Rng& rng, std::vector<float>& x) {
  x.resize(c.T * c.H * c.K);
  for (float& e : x) e = c.f.normalize ? float(0.1 + rng.uniform()) : rng.normal();
  if (!c.f.delta) return;
  for (int64_t r = 0; r < c.T * c.H; ++r) {
    double n2 = 0.0;
    for (int64_t d = 0; d < c.K; ++d) n2 += double(x[r * c.K + d]) * x[r * c.K + d];
    for (int64_t d = 0; d < c.K; ++d) x[r * c.K + d] = float(x[r * c.K + d] / std::sqrt(n2));
  }
}

Inputs make_inputs(const Case& c) {
  Rng rng(c.seed);
  Inputs in;
  in.c = c;
  fill_qk(c, rng, in.q);
  fill_qk(c, rng, in.k);
  auto normals = [&](std::vector<float>& x, int64_t n, float s) {
    x.resize(n);
    for (float& e : x) e = s * rng.normal();
  };
  normals(in.v, c.T * c.HV * c.V, 1.0f);
  if (c.with_beta) {
    in.beta.resize(c.T * c.HV);
    for (float& e : in.beta) e = float(0.05 + 0.95 * rng.uniform());
  }
  if (c.f.gate != Gate::None) {
    const double strongest = c.f.gate == Gate::PerChannel ? 20.0 : 5.0;
    in.log_decay.resize(c.T * c.HV * c.gate_width());
    for (float& e : in.log_decay)
      e = c.f.decay == Decay::Strong ? -float(1e-3 * std::exp(std::log(strongest / 1e-3) * rng.uniform()))
                                     : -0.05f * float(0.5 + rng.uniform());
  }
  normals(in.state, c.HV * c.K * c.V, 0.5f);
  if (c.f.normalize) {
    in.z.resize(c.HV * c.K);
    for (float& e : in.z) e = float(0.5 + rng.uniform());
  }
  normals(in.dout, c.T * c.HV * c.V, 1.0f);
  normals(in.dstate_final, c.HV * c.K * c.V, 1.0f);
  if (c.f.normalize) normals(in.dz_final, c.HV * c.K, 1.0f);
  return in;
}

const float* data_or_null(const std::vector<float>& x) { return x.empty() ? nullptr : x.data(); }

DeltaRuleArgs forward_args(const Inputs& in) {
  const Case& c = in.c;
  DeltaRuleArgs a;
  a.T = c.T, a.H = c.H, a.HV = c.HV, a.K = c.K, a.V = c.V;
  a.gate = c.f.gate, a.delta = c.f.delta, a.normalize = c.f.normalize;
  a.scale = 1.0f / std::sqrt(float(c.K));
  a.q = in.q.data(), a.k = in.k.data(), a.v = in.v.data();
  a.beta = data_or_null(in.beta), a.log_decay = data_or_null(in.log_decay);
  a.state = const_cast<float*>(in.state.data());  // read-only in every backward
  a.z = const_cast<float*>(data_or_null(in.z));
  return a;
}

// Every gradient a backward produces, NaN-filled so that an unwritten element fails.
struct Grads {
  std::vector<float> dq, dk, dv, dbeta, dlog_decay, dstate0, dz0;
};

struct GradTensor {
  const char* name;
  std::vector<float> Grads::*field;
  std::vector<int64_t> dims;
};

std::vector<GradTensor> grad_tensors(const Case& c) {
  std::vector<GradTensor> t = {{"dq", &Grads::dq, {c.T, c.H, c.K}},
                               {"dk", &Grads::dk, {c.T, c.H, c.K}},
                               {"dv", &Grads::dv, {c.T, c.HV, c.V}},
                               {"dstate0", &Grads::dstate0, {c.HV, c.K, c.V}}};
  if (c.with_beta) t.push_back({"dbeta", &Grads::dbeta, {c.T, c.HV}});
  if (c.f.gate == Gate::PerChannel) t.push_back({"dlog_decay", &Grads::dlog_decay, {c.T, c.HV, c.K}});
  if (c.f.gate == Gate::PerHead) t.push_back({"dlog_decay", &Grads::dlog_decay, {c.T, c.HV}});
  if (c.f.normalize) t.push_back({"dz0", &Grads::dz0, {c.HV, c.K}});
  return t;
}

enum class Path { Ref, Recurrent, Chunked };

Grads run_backward(const Inputs& in, Path path, int chunk = 64) {
  const Case& c = in.c;
  Grads r;
  for (const GradTensor& t : grad_tensors(c)) {
    int64_t n = 1;
    for (int64_t d : t.dims) n *= d;
    (r.*t.field).assign(n, NAN);
  }
  DeltaRuleGrads g;
  g.dout = in.dout.data(), g.dstate_final = in.dstate_final.data(), g.dz_final = data_or_null(in.dz_final);
  auto out = [](std::vector<float>& x) { return x.empty() ? nullptr : x.data(); };
  g.dq = out(r.dq), g.dk = out(r.dk), g.dv = out(r.dv), g.dbeta = out(r.dbeta), g.dlog_decay = out(r.dlog_decay);
  g.dstate0 = out(r.dstate0), g.dz0 = out(r.dz0);
  const DeltaRuleArgs a = forward_args(in);
  switch (path) {
    case Path::Ref: kernels::ref::delta_rule_backward(a, g); break;
    case Path::Recurrent: kernels::delta_rule_recurrent_backward(a, g); break;
    case Path::Chunked: kernels::delta_rule_chunked_backward(a, g, chunk); break;
  }
  return r;
}

// Relative RMS of got against want (‖got − want‖ / ‖want‖, in double); above tol, a failure that
// names the worst element by its coordinates. Returns the error.
template <class A, class B>
double expect_close(const std::string& what, const A& got, const B& want, const std::vector<int64_t>& dims,
                    double tol) {
  EXPECT_EQ(got.size(), want.size()) << what;
  if (want.empty() || got.size() != want.size()) return 0.0;
  double num = 0.0, den = 0.0, worst = -1.0;
  size_t w = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff = double(got[i]) - double(want[i]);
    num += diff * diff;
    den += double(want[i]) * double(want[i]);
    const double ad = std::fabs(diff);
    if (std::isnan(ad) ? !std::isnan(worst) : ad > worst) worst = ad, w = i;  // the first NaN is the worst
  }
  const double err = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
  if (err <= tol) return err;
  std::ostringstream at;
  size_t rest = w;
  std::vector<int64_t> coord(dims.size());
  for (size_t d = dims.size(); d-- > 0;) coord[d] = int64_t(rest % size_t(dims[d])), rest /= size_t(dims[d]);
  for (size_t d = 0; d < coord.size(); ++d) at << (d ? ", " : "[") << coord[d];
  ADD_FAILURE() << what << ": relative RMS " << err << " > " << tol << "; worst element " << at.str() << "] got "
                << got[w] << " want " << want[w];
  return err;
}

double expect_same_grads(const std::string& what, const Grads& got, const Grads& want, const Case& c, double tol) {
  double worst = 0.0;
  for (const GradTensor& t : grad_tensors(c))
    worst = std::max(worst, expect_close(what + " " + t.name, got.*t.field, want.*t.field, t.dims, tol));
  return worst;
}

// ---------------------------------------------------------------------------------------------
// The ref backward in double against central finite differences of the ref forward in double.

using Problem = kernels::ref::DeltaRuleProblem<double>;

struct DoubleInputs {
  std::vector<double> q, k, v, beta, log_decay, state, z;
};

std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

const double* ptr(const std::vector<double>& v) { return v.empty() ? nullptr : v.data(); }

Problem problem(const Case& c, const DoubleInputs& x) {
  Problem p;
  p.T = c.T, p.H = c.H, p.HV = c.HV, p.K = c.K, p.V = c.V;
  p.gate = c.f.gate, p.delta = c.f.delta, p.normalize = c.f.normalize, p.scale = 1.0 / std::sqrt(double(c.K));
  p.q = ptr(x.q), p.k = ptr(x.k), p.v = ptr(x.v), p.beta = ptr(x.beta), p.log_decay = ptr(x.log_decay);
  p.state0 = ptr(x.state), p.z0 = ptr(x.z);
  return p;
}

// L = Σ dO ⊙ O + Σ dS_T ⊙ S_T + Σ dz_T ⊙ z_T, all in double.
double loss(const Inputs& in, const DoubleInputs& x) {
  const Case& c = in.c;
  const Problem p = problem(c, x);
  std::vector<double> out(c.T * c.HV * c.V), S(c.HV * c.K * c.V), z(c.HV * c.K);
  kernels::ref::delta_rule_forward<double>(p, {out.data(), S.data(), z.data()});
  double L = 0.0;
  for (size_t i = 0; i < out.size(); ++i) L += in.dout[i] * out[i];
  for (size_t i = 0; i < S.size(); ++i) L += in.dstate_final[i] * S[i];
  for (size_t i = 0; i < in.dz_final.size(); ++i) L += in.dz_final[i] * z[i];
  return L;
}

// The ref backward of `in`, computed in double (not rounded to f32).
struct DoubleGrads {
  std::vector<double> dq, dk, dv, dbeta, dlog_decay, dstate0, dz0;
};

DoubleGrads ref_backward_double(const Inputs& in, const DoubleInputs& x) {
  const Case& c = in.c;
  const Problem p = problem(c, x);
  const std::vector<double> dout = widen(in.dout), dSf = widen(in.dstate_final), dzf = widen(in.dz_final);
  DoubleGrads r;
  r.dq.resize(x.q.size()), r.dk.resize(x.k.size()), r.dv.resize(x.v.size()), r.dbeta.resize(x.beta.size());
  r.dlog_decay.resize(x.log_decay.size()), r.dstate0.resize(x.state.size()), r.dz0.resize(x.z.size());
  kernels::ref::DeltaRuleGradsT<double> g;
  g.dout = dout.data(), g.dstate_final = dSf.data(), g.dz_final = ptr(dzf);
  auto out = [](std::vector<double>& v) { return v.empty() ? nullptr : v.data(); };
  g.dq = out(r.dq), g.dk = out(r.dk), g.dv = out(r.dv), g.dbeta = out(r.dbeta), g.dlog_decay = out(r.dlog_decay);
  g.dstate0 = out(r.dstate0), g.dz0 = out(r.dz0);
  kernels::ref::delta_rule_backward<double>(p, g);
  return r;
}

class DeltaRuleBackwardRef : public ::testing::TestWithParam<Family> {};

TEST_P(DeltaRuleBackwardRef, MatchesFiniteDifferences) {
  double worst = 0.0;
  for (bool with_beta : {true, false}) {
    Case c;
    c.T = 6, c.H = 1, c.HV = 2, c.K = 3, c.V = 2, c.f = GetParam(), c.with_beta = with_beta, c.seed = 11;
    SCOPED_TRACE(c.name());
    const Inputs in = make_inputs(c);
    DoubleInputs x{widen(in.q),         widen(in.k),     widen(in.v), widen(in.beta),
                   widen(in.log_decay), widen(in.state), widen(in.z)};
    const DoubleGrads analytic = ref_backward_double(in, x);
    struct Wrt {
      const char* name;
      std::vector<double> DoubleInputs::*x;
      const std::vector<double>* grad;
      std::vector<int64_t> dims;
    };
    const Wrt wrts[] = {{"dq", &DoubleInputs::q, &analytic.dq, {c.T, c.H, c.K}},
                        {"dk", &DoubleInputs::k, &analytic.dk, {c.T, c.H, c.K}},
                        {"dv", &DoubleInputs::v, &analytic.dv, {c.T, c.HV, c.V}},
                        {"dbeta", &DoubleInputs::beta, &analytic.dbeta, {c.T, c.HV}},
                        {"dlog_decay", &DoubleInputs::log_decay, &analytic.dlog_decay, {c.T, c.HV, c.gate_width()}},
                        {"dstate0", &DoubleInputs::state, &analytic.dstate0, {c.HV, c.K, c.V}},
                        {"dz0", &DoubleInputs::z, &analytic.dz0, {c.HV, c.K}}};
    for (const Wrt& w : wrts) {
      std::vector<double>& xs = x.*w.x;
      std::vector<double> fd(xs.size());
      for (size_t i = 0; i < xs.size(); ++i) {
        const double x0 = xs[i], h = 1e-5 * std::max(1.0, std::fabs(x0));
        xs[i] = x0 + h;
        const double up = loss(in, x);
        xs[i] = x0 - h;
        const double down = loss(in, x);
        xs[i] = x0;
        fd[i] = (up - down) / (2.0 * h);
      }
      worst = std::max(worst, expect_close(w.name, *w.grad, fd, w.dims, kTolFiniteDifference));
    }
  }
  std::cout << "[ measured ] " << GetParam().name << ": worst relative RMS vs finite differences " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(DeltaRuleBackward, DeltaRuleBackwardRef, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<Family>& info) { return std::string(info.param.name); });

// The float instantiation of the ref computes the same gradients as the double one, to f32 rounding.
TEST(DeltaRuleBackwardRef, FloatInstantiationMatchesDouble) {
  Case c;
  c.T = 20, c.f = family("kda_strong");
  const Inputs in = make_inputs(c);
  kernels::ref::DeltaRuleProblem<float> p;
  p.T = c.T, p.H = c.H, p.HV = c.HV, p.K = c.K, p.V = c.V, p.gate = c.f.gate, p.delta = c.f.delta;
  p.scale = 1.0f / std::sqrt(float(c.K));
  p.q = in.q.data(), p.k = in.k.data(), p.v = in.v.data(), p.beta = in.beta.data(), p.log_decay = in.log_decay.data();
  p.state0 = in.state.data();
  Grads got;
  got.dq.resize(in.q.size()), got.dk.resize(in.k.size()), got.dv.resize(in.v.size()), got.dbeta.resize(in.beta.size());
  got.dlog_decay.resize(in.log_decay.size()), got.dstate0.resize(in.state.size());
  kernels::ref::DeltaRuleGradsT<float> g;
  g.dout = in.dout.data(), g.dstate_final = in.dstate_final.data();
  g.dq = got.dq.data(), g.dk = got.dk.data(), g.dv = got.dv.data(), g.dbeta = got.dbeta.data();
  g.dlog_decay = got.dlog_decay.data(), g.dstate0 = got.dstate0.data();
  kernels::ref::delta_rule_backward<float>(p, g);
  expect_same_grads("ref<float> vs ref<double>", got, run_backward(in, Path::Ref), c, kTolF32);
}

// ---------------------------------------------------------------------------------------------
// Fast kernels against the ref, over lengths not divisible by the chunk, chunks and thread counts.

class DeltaRuleBackwardFast : public ::testing::TestWithParam<Family> {};

TEST_P(DeltaRuleBackwardFast, MatchesRef) {
  double worst_recurrent = 0.0, worst_chunked = 0.0;
  for (int64_t T : {1, 15, 17, 33, 64}) {
    for (bool gva : {true, false}) {
      Case c;
      c.T = T, c.f = GetParam(), c.with_beta = !(gva && T == 33), c.seed = 100 + uint64_t(T);
      if (!gva) c.H = 3, c.HV = 3, c.K = 8, c.V = 5;
      SCOPED_TRACE(c.name());
      const Inputs in = make_inputs(c);
      const Grads oracle = run_backward(in, Path::Ref);
      for (int threads : {1, 2}) {
        const ScopedThreads scope(threads);
        const std::string at = " threads=" + std::to_string(threads);
        worst_recurrent =
            std::max(worst_recurrent,
                     expect_same_grads("recurrent" + at, run_backward(in, Path::Recurrent), oracle, c, kTolF32));
        for (int C : {16, 32, 64})
          worst_chunked =
              std::max(worst_chunked, expect_same_grads("chunked C=" + std::to_string(C) + at,
                                                        run_backward(in, Path::Chunked, C), oracle, c, kTolF32));
      }
    }
  }
  std::cout << "[ measured ] " << GetParam().name << ": worst relative RMS vs ref: recurrent " << worst_recurrent
            << ", chunked " << worst_chunked << "\n";
}

INSTANTIATE_TEST_SUITE_P(DeltaRuleBackward, DeltaRuleBackwardFast, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<Family>& info) { return std::string(info.param.name); });

// Chunked = recurrent at a longer length and larger heads (Kimi Linear's K = V = 128 included), odd
// chunks included.
TEST(DeltaRuleBackwardFast, ChunkedMatchesRecurrent) {
  double worst = 0.0;
  for (const Family& f : kFamilies) {
    Case c;
    c.T = 150, c.H = 1, c.HV = 2, c.K = 64, c.V = 48, c.f = f, c.seed = 5;
    SCOPED_TRACE(c.name());
    const Inputs in = make_inputs(c);
    const Grads recurrent = run_backward(in, Path::Recurrent);
    for (int C : {1, 7, 16, 64})
      worst = std::max(worst, expect_same_grads("chunked C=" + std::to_string(C) + " vs recurrent",
                                                run_backward(in, Path::Chunked, C), recurrent, c, kTolF32));
  }
  for (const Family& f : {family("gated_deltanet_strong"), family("kda_strong")}) {
    Case c;
    c.T = 100, c.H = 1, c.HV = 1, c.K = 128, c.V = 128, c.f = f, c.seed = 6;
    SCOPED_TRACE(c.name());
    const Inputs in = make_inputs(c);
    worst = std::max(worst, expect_same_grads("chunked C=32 vs recurrent", run_backward(in, Path::Chunked, 32),
                                              run_backward(in, Path::Recurrent), c, kTolF32));
  }
  std::cout << "[ measured ] worst relative RMS chunked vs recurrent: " << worst << "\n";
}

// A null dstate_final / dz_final is zero, and null outputs (dβ, dlog_decay, dS_0, dz_0) are skipped.
TEST(DeltaRuleBackwardFast, NullOptionalGradients) {
  for (const Family& f : {family("kda_strong"), family("channel_decay_normalized")}) {
    Case c;
    c.T = 40, c.f = f;
    SCOPED_TRACE(c.name());
    Inputs zero = make_inputs(c);
    std::fill(zero.dstate_final.begin(), zero.dstate_final.end(), 0.0f);
    std::fill(zero.dz_final.begin(), zero.dz_final.end(), 0.0f);
    for (Path p : {Path::Ref, Path::Recurrent, Path::Chunked}) {
      const Grads want = run_backward(zero, p, 16);
      Grads got{std::vector<float>(want.dq.size(), NAN),
                std::vector<float>(want.dk.size(), NAN),
                std::vector<float>(want.dv.size(), NAN),
                {},
                {},
                {},
                {}};
      DeltaRuleGrads g;
      g.dout = zero.dout.data(), g.dq = got.dq.data(), g.dk = got.dk.data(), g.dv = got.dv.data();
      const DeltaRuleArgs a = forward_args(zero);
      if (p == Path::Ref) kernels::ref::delta_rule_backward(a, g);
      if (p == Path::Recurrent) kernels::delta_rule_recurrent_backward(a, g);
      if (p == Path::Chunked) kernels::delta_rule_chunked_backward(a, g, 16);
      EXPECT_EQ(got.dq, want.dq) << int(p);
      EXPECT_EQ(got.dk, want.dk) << int(p);
      EXPECT_EQ(got.dv, want.dv) << int(p);
    }
  }
}

// ---------------------------------------------------------------------------------------------

// No tokens: the initial-state gradient is the final-state gradient.
TEST(DeltaRuleBackwardFast, ZeroTokensPassTheStateGradientThrough) {
  Case c;
  c.T = 0, c.f = family("channel_decay_normalized");
  const Inputs in = make_inputs(c);
  for (Path p : {Path::Ref, Path::Recurrent, Path::Chunked}) {
    const Grads g = run_backward(in, p, 16);
    EXPECT_EQ(g.dstate0, in.dstate_final) << int(p);
    EXPECT_EQ(g.dz0, in.dz_final) << int(p);
  }
}

// The forward's state and z are the initial state, read and left as they were.
TEST(DeltaRuleBackwardFast, InitialStateIsReadOnly) {
  Case c;
  c.T = 40, c.f = family("channel_decay_normalized");
  const Inputs in = make_inputs(c);
  const Inputs before = in;
  for (Path p : {Path::Ref, Path::Recurrent, Path::Chunked}) {
    run_backward(in, p, 16);
    EXPECT_EQ(in.state, before.state) << int(p);
    EXPECT_EQ(in.z, before.z) << int(p);
  }
}

// Same bits on every run for a thread count; and both kernels give the same bits on 1 and 2 threads
// (each head's arithmetic and the order of the GVA sums do not depend on the split).
TEST(DeltaRuleBackwardFast, DeterministicAcrossRunsAndThreadCounts) {
  for (const char* name : {"kda_strong", "gated_deltanet_mild"}) {
    Case c;
    c.T = 100, c.H = 2, c.HV = 4, c.K = 32, c.V = 32, c.f = family(name);
    SCOPED_TRACE(c.name());
    const Inputs in = make_inputs(c);
    for (Path p : {Path::Recurrent, Path::Chunked}) {
      Grads one, two, again;
      {
        const ScopedThreads scope(1);
        one = run_backward(in, p, 32);
      }
      {
        const ScopedThreads scope(2);
        two = run_backward(in, p, 32);
        again = run_backward(in, p, 32);
      }
      for (const GradTensor& t : grad_tensors(c)) {
        const std::vector<float>&a = one.*t.field, &b = two.*t.field, &b2 = again.*t.field;
        EXPECT_EQ(0, std::memcmp(b.data(), b2.data(), b.size() * sizeof(float))) << t.name << " path " << int(p);
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << t.name << " path " << int(p);
      }
    }
  }
}

}  // namespace
}  // namespace delta_rule_backward_test
}  // namespace lineage
