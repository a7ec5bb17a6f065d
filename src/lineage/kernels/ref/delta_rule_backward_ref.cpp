#include "lineage/kernels/ref/delta_rule_backward_ref.h"

#include <cmath>
#include <vector>

#include "lineage/core/error.h"

namespace lineage::kernels::ref {

namespace {

// One value head j of a problem, with the rows of token t.
template <class Real>
struct RefHead {
  const DeltaRuleProblem<Real>& p;
  int64_t j, h;
  const Real* q(int64_t t) const { return p.q + (t * p.H + h) * p.K; }
  const Real* k(int64_t t) const { return p.k + (t * p.H + h) * p.K; }
  const Real* v(int64_t t) const { return p.v + (t * p.HV + j) * p.V; }
  Real beta(int64_t t) const { return p.beta ? p.beta[t * p.HV + j] : Real(1); }
  // exp(g) of token t, key channel d.
  Real decay(int64_t t, int64_t d) const {
    switch (p.gate) {
      case Gate::None: return Real(1);
      case Gate::PerHead: return std::exp(p.log_decay[t * p.HV + j]);
      case Gate::PerChannel: return std::exp(p.log_decay[(t * p.HV + j) * p.K + d]);
    }
    return Real(1);
  }
};

// Everything token t computes from the state before it (S = S_{t−1} [K, V], z = z_{t−1} [K]):
// St = S̃ (decayed), r = v − δ S̃ᵀk, u = β r, Sn = S_t, zt = z̃, zn = z_t, pre = scale·S_tᵀq (before the
// normalizer), den = scale·q·z_t + 1e-10, o = the output.
template <class Real>
struct Step {
  std::vector<Real> St, Sn, zt, zn, r, u, pre, o;
  Real den = 1;
};

template <class Real>
void step(const RefHead<Real>& hd, int64_t t, const std::vector<Real>& S, const std::vector<Real>& z, Step<Real>& s) {
  const auto& p = hd.p;
  const int64_t K = p.K, V = p.V;
  const Real *q = hd.q(t), *k = hd.k(t), *v = hd.v(t), b = hd.beta(t);
  s.St.assign(K * V, 0), s.zt.assign(K, 0), s.r.assign(V, 0), s.u.assign(V, 0), s.pre.assign(V, 0), s.o.assign(V, 0);
  for (int64_t d = 0; d < K; ++d) {
    for (int64_t c = 0; c < V; ++c) s.St[d * V + c] = hd.decay(t, d) * S[d * V + c];
    s.zt[d] = hd.decay(t, d) * z[d];
  }
  for (int64_t c = 0; c < V; ++c) {
    Real kS = 0;
    for (int64_t d = 0; d < K; ++d) kS += k[d] * s.St[d * V + c];
    s.r[c] = p.delta ? v[c] - kS : v[c];
    s.u[c] = b * s.r[c];
  }
  s.Sn = s.St;
  s.zn = s.zt;
  for (int64_t d = 0; d < K; ++d) {
    for (int64_t c = 0; c < V; ++c) s.Sn[d * V + c] += k[d] * s.u[c];
    s.zn[d] += b * k[d];
  }
  Real qz = 0;
  for (int64_t d = 0; d < K; ++d) qz += p.scale * q[d] * s.zn[d];
  s.den = qz + Real(1e-10);
  for (int64_t c = 0; c < V; ++c) {
    for (int64_t d = 0; d < K; ++d) s.pre[c] += p.scale * q[d] * s.Sn[d * V + c];
    s.o[c] = p.normalize ? s.pre[c] / s.den : s.pre[c];
  }
}

template <class Real>
void load_state(const DeltaRuleProblem<Real>& p, int64_t j, std::vector<Real>& S, std::vector<Real>& z) {
  S.assign(p.state0 + j * p.K * p.V, p.state0 + (j + 1) * p.K * p.V);
  z.assign(p.K, 0);
  if (p.normalize) z.assign(p.z0 + j * p.K, p.z0 + (j + 1) * p.K);
}

}  // namespace

template <class Real>
void delta_rule_forward(const DeltaRuleProblem<Real>& p, const DeltaRuleOutputs<Real>& o) {
  const int64_t K = p.K, V = p.V;
  std::vector<Real> S, z;
  Step<Real> s;
  for (int64_t j = 0; j < p.HV; ++j) {
    const RefHead<Real> hd{p, j, j / (p.HV / p.H)};
    load_state(p, j, S, z);
    for (int64_t t = 0; t < p.T; ++t) {
      step(hd, t, S, z, s);
      if (o.out)
        for (int64_t c = 0; c < V; ++c) o.out[(t * p.HV + j) * V + c] = s.o[c];
      S = s.Sn;
      z = s.zn;
    }
    if (o.state_final)
      for (int64_t i = 0; i < K * V; ++i) o.state_final[j * K * V + i] = S[i];
    if (o.z_final && p.normalize)
      for (int64_t d = 0; d < K; ++d) o.z_final[j * K + d] = z[d];
  }
}

// Per token, in reverse (dS, dz: gradients with respect to S_t, z_t, carried from the future):
//   read   o = pre / den:    dpre = do / den, dden = −do·o / den;  dS += scale q dpreᵀ, dz += scale q dden,
//                            dq = scale (S_t dpre + z_t dden)
//   write  S_t = S̃ + k uᵀ:   du = dSᵀk, dk += dS u;  z_t = z̃ + β k: dk += β dz, dβ += k·dz
//   delta  u = β (v − δ S̃ᵀk): dv = β du, dβ += du·r;  δ: dS̃ = dS − β k duᵀ, dk −= β S̃ du
//   decay  S̃ = e ⊙_rows S:    dg[d] = Σ_c dS̃[d,c] S̃[d,c] + dz̃[d] z̃[d] (summed over d per head);
//                            dS_{t−1} = e ⊙_rows dS̃, dz_{t−1} = e ⊙ dz̃
template <class Real>
void delta_rule_backward(const DeltaRuleProblem<Real>& p, const DeltaRuleGradsT<Real>& g) {
  const int64_t T = p.T, K = p.K, V = p.V, H = p.H, HV = p.HV;
  if (g.dq)
    for (int64_t i = 0; i < T * H * K; ++i) g.dq[i] = 0;
  if (g.dk)
    for (int64_t i = 0; i < T * H * K; ++i) g.dk[i] = 0;
  std::vector<std::vector<Real>> S_before(T), z_before(T);  // S_{t−1}, z_{t−1}: the oracle may store all
  std::vector<Real> S, z, dS, dz, du(V), dSt(K * V), dzt(K);
  Step<Real> s;
  for (int64_t j = 0; j < HV; ++j) {
    const int64_t h = j / (HV / H);
    const RefHead<Real> hd{p, j, h};
    load_state(p, j, S, z);
    for (int64_t t = 0; t < T; ++t) {
      S_before[t] = S, z_before[t] = z;
      step(hd, t, S, z, s);
      S = s.Sn, z = s.zn;
    }
    dS.assign(K * V, 0), dz.assign(K, 0);
    if (g.dstate_final) dS.assign(g.dstate_final + j * K * V, g.dstate_final + (j + 1) * K * V);
    if (g.dz_final && p.normalize) dz.assign(g.dz_final + j * K, g.dz_final + (j + 1) * K);
    for (int64_t t = T - 1; t >= 0; --t) {
      step(hd, t, S_before[t], z_before[t], s);
      const Real *q = hd.q(t), *k = hd.k(t), *dout = g.dout + (t * HV + j) * V, b = hd.beta(t);
      std::vector<Real> dq(K, 0), dk(K, 0);
      Real dbeta = 0;
      // read
      std::vector<Real> dpre(V);
      Real dden = 0;
      for (int64_t c = 0; c < V; ++c) {
        dpre[c] = p.normalize ? dout[c] / s.den : dout[c];
        dden -= p.normalize ? dout[c] * s.o[c] / s.den : 0;
      }
      for (int64_t d = 0; d < K; ++d) {
        for (int64_t c = 0; c < V; ++c) {
          dS[d * V + c] += p.scale * q[d] * dpre[c];
          dq[d] += p.scale * s.Sn[d * V + c] * dpre[c];
        }
        if (p.normalize) {
          dz[d] += p.scale * q[d] * dden;
          dq[d] += p.scale * s.zn[d] * dden;
        }
      }
      // write
      for (int64_t c = 0; c < V; ++c) {
        du[c] = 0;
        for (int64_t d = 0; d < K; ++d) du[c] += dS[d * V + c] * k[d];
      }
      for (int64_t d = 0; d < K; ++d) {
        for (int64_t c = 0; c < V; ++c) dk[d] += dS[d * V + c] * s.u[c];
        dk[d] += b * dz[d];
        dbeta += k[d] * dz[d];
      }
      dSt = dS, dzt = dz;
      // delta
      for (int64_t c = 0; c < V; ++c) {
        if (g.dv) g.dv[(t * HV + j) * V + c] = b * du[c];
        dbeta += du[c] * s.r[c];
      }
      if (p.delta)
        for (int64_t d = 0; d < K; ++d)
          for (int64_t c = 0; c < V; ++c) {
            dSt[d * V + c] -= b * k[d] * du[c];
            dk[d] -= b * s.St[d * V + c] * du[c];
          }
      // decay
      for (int64_t d = 0; d < K; ++d) {
        Real dg = dzt[d] * s.zt[d];
        for (int64_t c = 0; c < V; ++c) dg += dSt[d * V + c] * s.St[d * V + c];
        if (g.dlog_decay && p.gate == Gate::PerChannel) g.dlog_decay[(t * HV + j) * K + d] = dg;
        if (g.dlog_decay && p.gate == Gate::PerHead) {
          if (d == 0) g.dlog_decay[t * HV + j] = 0;
          g.dlog_decay[t * HV + j] += dg;
        }
        for (int64_t c = 0; c < V; ++c) dS[d * V + c] = hd.decay(t, d) * dSt[d * V + c];
        dz[d] = hd.decay(t, d) * dzt[d];
      }
      if (g.dbeta && p.beta) g.dbeta[t * HV + j] = dbeta;
      for (int64_t d = 0; d < K; ++d) {
        if (g.dq) g.dq[(t * H + h) * K + d] += dq[d];
        if (g.dk) g.dk[(t * H + h) * K + d] += dk[d];
      }
    }
    if (g.dstate0)
      for (int64_t i = 0; i < K * V; ++i) g.dstate0[j * K * V + i] = dS[i];
    if (g.dz0 && p.normalize)
      for (int64_t d = 0; d < K; ++d) g.dz0[j * K + d] = dz[d];
  }
}

template void delta_rule_forward<float>(const DeltaRuleProblem<float>&, const DeltaRuleOutputs<float>&);
template void delta_rule_forward<double>(const DeltaRuleProblem<double>&, const DeltaRuleOutputs<double>&);
template void delta_rule_backward<float>(const DeltaRuleProblem<float>&, const DeltaRuleGradsT<float>&);
template void delta_rule_backward<double>(const DeltaRuleProblem<double>&, const DeltaRuleGradsT<double>&);

namespace {

std::vector<double> widen(const float* x, int64_t n) {
  return x ? std::vector<double>(x, x + n) : std::vector<double>();
}

void narrow(const std::vector<double>& x, float* dst) {
  if (!dst) return;
  for (size_t i = 0; i < x.size(); ++i) dst[i] = float(x[i]);
}

}  // namespace

void delta_rule_backward(const DeltaRuleArgs& a, const DeltaRuleGrads& g) {
  delta_rule_check_grads(a, g);
  const int64_t T = a.T, H = a.H, HV = a.HV, K = a.K, V = a.V;
  const int64_t gw = a.gate == Gate::PerChannel ? K : 1;
  const std::vector<double> q = widen(a.q, T * H * K), k = widen(a.k, T * H * K), v = widen(a.v, T * HV * V),
                            beta = widen(a.beta, T * HV), log_decay = widen(a.log_decay, T * HV * gw),
                            state0 = widen(a.state, HV * K * V), z0 = widen(a.normalize ? a.z : nullptr, HV * K),
                            dout = widen(a.T > 0 ? g.dout : nullptr, T * HV * V),
                            dstate_final = widen(g.dstate_final, HV * K * V), dz_final = widen(g.dz_final, HV * K);
  DeltaRuleProblem<double> p;
  p.T = T, p.H = H, p.HV = HV, p.K = K, p.V = V, p.gate = a.gate, p.delta = a.delta, p.normalize = a.normalize;
  p.scale = a.scale;
  auto ptr = [](const std::vector<double>& x) { return x.empty() ? nullptr : x.data(); };
  p.q = ptr(q), p.k = ptr(k), p.v = ptr(v), p.beta = ptr(beta), p.log_decay = ptr(log_decay);
  p.state0 = ptr(state0), p.z0 = ptr(z0);
  std::vector<double> dq(T * H * K), dk(T * H * K), dv(T * HV * V), dbeta(g.dbeta ? T * HV : 0),
      dlog_decay(g.dlog_decay ? T * HV * gw : 0), dstate0(g.dstate0 ? HV * K * V : 0), dz0(g.dz0 ? HV * K : 0);
  DeltaRuleGradsT<double> gd;
  gd.dout = ptr(dout), gd.dstate_final = ptr(dstate_final), gd.dz_final = ptr(dz_final);
  gd.dq = dq.data(), gd.dk = dk.data(), gd.dv = dv.data();
  gd.dbeta = g.dbeta ? dbeta.data() : nullptr, gd.dlog_decay = g.dlog_decay ? dlog_decay.data() : nullptr;
  gd.dstate0 = g.dstate0 ? dstate0.data() : nullptr, gd.dz0 = g.dz0 ? dz0.data() : nullptr;
  delta_rule_backward(p, gd);
  narrow(dq, g.dq), narrow(dk, g.dk), narrow(dv, g.dv), narrow(dbeta, g.dbeta), narrow(dlog_decay, g.dlog_decay);
  narrow(dstate0, g.dstate0), narrow(dz0, g.dz0);
}

}  // namespace lineage::kernels::ref
