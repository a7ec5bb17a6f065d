// The delta rule's backward, recurrent and chunked (docs/math/delta_rule_backward.md); over 400
// lines, one concept: one derivation, whose stages share their buffers and index helpers.
#include "lineage/kernels/delta_rule_backward.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/blas_threads.h"
#include "lineage/kernels/delta_rule_loops.h"
#include "lineage/kernels/vmath.h"

namespace lineage::kernels {

void delta_rule_check_grads(const DeltaRuleArgs& a, const DeltaRuleGrads& g) {
  DeltaRuleArgs fwd = a;
  fwd.out = g.dv;  // the forward's out is not read; dv has its shape [T, HV, V]
  delta_rule_check_args(fwd);
  LINEAGE_CHECK(a.T == 0 || (g.dout && g.dq && g.dk && g.dv), "delta rule backward needs dout, dq, dk and dv");
  LINEAGE_CHECK(!g.dbeta || a.beta, "dbeta asked for, but the forward had no β");
  LINEAGE_CHECK(!g.dlog_decay || a.gate != Gate::None, "dlog_decay asked for, but the forward had no gate");
  LINEAGE_CHECK(a.normalize || (!g.dz_final && !g.dz0), "dz_final / dz0 given, but the forward had no normalizer");
}

namespace {

// ---------------------------------------------------------------------------------------------
// Shared by both paths.

using namespace delta_rule_loops;

// y += s·x
void axpy(float s, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += s * x[i];
}

// The rows of one value head's dq and dk: straight into [T, H, K] when the q/k head has only this
// value head, else into the head's own [T, K] rows, summed over the group afterwards in head order
// (a fixed order whatever thread computed which head).
struct QkGradRows {
  float* dq;
  float* dk;
  int64_t ld;
  float* dq_row(int64_t t) const { return dq + t * ld; }
  float* dk_row(int64_t t) const { return dk + t * ld; }
};

// Writes value head j's gradients of the per-step log decay: the K channel values of token t, summed
// to one for a per-head gate.
void store_dlog_decay(const DeltaRuleArgs& a, const DeltaRuleGrads& g, int64_t t, int64_t j, const float* dg) {
  if (!g.dlog_decay) return;
  if (a.gate == Gate::PerChannel) std::copy_n(dg, a.K, g.dlog_decay + (t * a.HV + j) * a.K);
  else {
    float s = 0.0f;
    for (int64_t d = 0; d < a.K; ++d) s += dg[d];
    g.dlog_decay[t * a.HV + j] = s;
  }
}

// Runs head(j, rows) for every value head over the thread pool, then sums the per-head dq, dk rows of
// each q/k group in head order.
template <class HeadFn>
void for_each_value_head(const DeltaRuleArgs& a, const DeltaRuleGrads& g, int64_t work_per_head, HeadFn&& head) {
  const int64_t T = a.T, H = a.H, HV = a.HV, K = a.K, group = HV / H;
  std::vector<float> part(group > 1 ? 2 * HV * T * K : 0);  // [HV, T, K] dq partials, then dk partials
  parallel_for(
      HV,
      [&](int64_t j0, int64_t j1) {
        single_threaded_blas();
        for (int64_t j = j0; j < j1; ++j) {
          const int64_t h = qk_head(a, j);
          const QkGradRows rows = group > 1 ? QkGradRows{part.data() + j * T * K, part.data() + (HV + j) * T * K, K}
                                            : QkGradRows{g.dq + h * K, g.dk + h * K, H * K};
          head(j, rows);
        }
      },
      grain_for(work_per_head));
  if (group == 1 || T == 0) return;
  parallel_for(
      T * H,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t t = r / H, h = r % H;
          for (int which = 0; which < 2; ++which) {
            float* dst = (which == 0 ? g.dq : g.dk) + r * K;
            const float* src = part.data() + (which * HV + h * group) * T * K + t * K;
            std::copy_n(src, K, dst);
            for (int64_t i = 1; i < group; ++i) axpy(1.0f, src + i * T * K, dst, K);
          }
        }
      },
      grain_for(2 * group * K));
}

// Value head j's dS (and dz) before the last token: the given final-state gradient or zero.
void init_state_grads(const DeltaRuleArgs& a, const DeltaRuleGrads& g, int64_t j, float* dS, float* dz) {
  const int64_t KV = a.K * a.V;
  if (g.dstate_final) std::copy_n(g.dstate_final + j * KV, KV, dS);
  else std::fill_n(dS, KV, 0.0f);
  if (g.dz_final) std::copy_n(g.dz_final + j * a.K, a.K, dz);
  else std::fill_n(dz, a.K, 0.0f);
}

void store_state_grads(const DeltaRuleArgs& a, const DeltaRuleGrads& g, int64_t j, const float* dS, const float* dz) {
  if (g.dstate0) std::copy_n(dS, a.K * a.V, g.dstate0 + j * a.K * a.V);
  if (g.dz0) std::copy_n(dz, a.K, g.dz0 + j * a.K);
}

// ---------------------------------------------------------------------------------------------
// Recurrent path. docs/math/delta_rule_backward.md §2.

constexpr int64_t kRecurrentCheckpoint = 32;

// Per-thread buffers of one value head; C = kRecurrentCheckpoint, ew = gate_width.
struct RecurrentScratch {
  std::vector<float> z;             // [K] running z of the recompute
  std::vector<float> St;            // [C, K, V] S̃_t = decay_t(S_{t−1}) of the segment's tokens
  std::vector<float> zt;            // [C, K] z̃_t
  std::vector<float> u, r;          // [C, V] u_t and r_t = v_t − δ S̃_tᵀk_t (u = β r)
  std::vector<float> qs;            // [C, V] S̃_tᵀq_t (normalize only)
  std::vector<float> e;             // [C, ew] exp(g_t)
  std::vector<float> dS, dz;        // [K, V], [K] ∂L/∂S, ∂L/∂z at the current point of the walk back
  std::vector<float> dpre;          // [C, V] ∂L/∂(scale·S_tᵀq_t)
  std::vector<float> dden;          // [C] ∂L/∂den_t (normalize)
  std::vector<float> du;            // [V] dSᵀk of the token being read
  std::vector<float> da;            // [V] −β du of the token being decayed
  std::vector<float> dg, q_scaled;  // [K] dlog_decay per channel, [K] scale·q of the token being read
  std::vector<float> ks;            // [V] S̃ᵀk
  // One segment of the head's rows as a one-head problem for the forward kernel.
  std::vector<float> seg_q, seg_k, seg_v, seg_beta, seg_g, seg_out;  // [C, K], [C, K], [C, V], [C], [C, ew], [C, V]

  void size_for(const DeltaRuleArgs& a) {
    const int64_t K = a.K, V = a.V, C = kRecurrentCheckpoint;
    z.resize(K);
    St.resize(C * K * V), zt.resize(C * K), u.resize(C * V), r.resize(C * V), qs.resize(a.normalize ? C * V : 0);
    e.resize(C * gate_width(a)), dS.resize(K * V), dz.resize(K), dpre.resize(C * V), dden.resize(C);
    du.resize(V), da.resize(V), dg.resize(K), q_scaled.resize(K), ks.resize(V);
    seg_q.resize(C * K), seg_k.resize(C * K), seg_v.resize(C * V), seg_beta.resize(C);
    seg_g.resize(C * gate_width(a)), seg_out.resize(C * V);
  }
};

// One sweep over the rows of a head's state for token t: dst = decay_t(src + kp upᵀ) (the previous
// token's write, pending, fused into this token's pass; kp null: none), ks = dstᵀk and, when qs is
// given, qs = dstᵀq. dst may alias src.
void forward_sweep(int64_t K, int64_t V, const float* src, const float* kp, const float* up, const float* e, int64_t ew,
                   const float* k, const float* q, float* dst, float* ks, float* qs) {
  std::fill_n(ks, V, 0.0f);
  if (qs) std::fill_n(qs, V, 0.0f);
  for (int64_t d = 0; d < K; ++d) {
    const float *s = src + d * V, ed = e[ew == 1 ? 0 : d], kd = k[d], pk = kp ? kp[d] : 0.0f;
    float* o = dst + d * V;
#pragma omp simd
    for (int64_t c = 0; c < V; ++c) {
      const float x = ed * (s[c] + pk * up[c]);
      o[c] = x;
      ks[c] += kd * x;
    }
    if (qs) axpy(q[d], o, qs, V);
  }
}

// u_t = β (v_t − δ ks), r_t = v_t − δ ks from ks = S̃_tᵀk_t; and z̃_t, z_t (normalize: z ← z_t).
void token_values(const DeltaRuleArgs& a, int64_t t, int64_t j, const float* e, const float* ks, float* u, float* r,
                  float* z, float* zt) {
  const int64_t K = a.K, V = a.V, ew = gate_width(a);
  const float *v = a.v + (t * a.HV + j) * V, *k = a.k + (t * a.H + qk_head(a, j)) * K, b = beta_at(a, t, j);
#pragma omp simd
  for (int64_t c = 0; c < V; ++c) {
    r[c] = a.delta ? v[c] - ks[c] : v[c];
    u[c] = b * r[c];
  }
  if (!a.normalize) return;
  for (int64_t d = 0; d < K; ++d) {
    zt[d] = e[ew == 1 ? 0 : d] * z[d];
    z[d] = zt[d] + b * k[d];
  }
}

// The rows that one backward sweep reads and writes for the token being decayed (part "delta + decay"
// of token i) and for the token being read (part "read + write" of token i − 1).
struct DecayPart {
  const float *St, *k, *da, *e;  // S̃_i [K, V], k_i, −β du_i (delta) [V], exp(g_i) [ew]
  float *dk, *dg;                // dk_i (accumulated), dg_i per channel (written)
};
struct ReadPart {
  const float *St, *k, *u, *q, *dpre;  // S̃, k, u, scale·q, dpre of the token
  float *du, *dq, *dk;                 // du accumulated; dq (before the k·(u·dpre) term), dk written
};

// One pass over the rows d of dS: first token i's delta and decay (dS̃ = dS + k daᵀ, dk += S̃ da,
// dg = rowsum(dS̃ ⊙ S̃), dS ← e ⊙ dS̃), then token i−1's read and write (dS += scale q dpreᵀ,
// dq = S̃ dpre, dk = dS u, du += dSᵀk). Fusing the two halves of neighbouring tokens keeps the walk
// back to one pass over the state per token.
template <bool kDecay, bool kRead>
void backward_sweep(int64_t K, int64_t V, int64_t ew, float* dS, const DecayPart& b, const ReadPart& r) {
  for (int64_t d = 0; d < K; ++d) {
    float* dSd = dS + d * V;
    const float *Sb = kDecay ? b.St + d * V : nullptr, *Sr = kRead ? r.St + d * V : nullptr;
    const float kb = kDecay ? b.k[d] : 0.0f, eb = kDecay ? b.e[ew == 1 ? 0 : d] : 0.0f;
    const float kr = kRead ? r.k[d] : 0.0f, qr = kRead ? r.q[d] : 0.0f;
    float sb = 0.0f, sg = 0.0f, sq = 0.0f, sk = 0.0f;
#pragma omp simd reduction(+ : sb, sg, sq, sk)
    for (int64_t c = 0; c < V; ++c) {
      float x = dSd[c];
      if constexpr (kDecay) {
        const float dst = x + kb * b.da[c];
        sb += Sb[c] * b.da[c];
        sg += dst * Sb[c];
        x = eb * dst;
      }
      if constexpr (kRead) {
        x += qr * r.dpre[c];
        sq += Sr[c] * r.dpre[c];
        sk += x * r.u[c];
        r.du[c] += x * kr;
      }
      dSd[c] = x;
    }
    if constexpr (kDecay) b.dk[d] += sb, b.dg[d] = sg;
    if constexpr (kRead) r.dq[d] = sq, r.dk[d] = sk;
  }
}

// Everything of token t (row i of the segment buffers) that the sweeps need beyond the stored rows:
// dpre = dO / den and, with the normalizer, dden = −(dO·o) / den with o = scale (S̃ᵀq + (q·k) u) / den.
void read_grads(const DeltaRuleArgs& a, const DeltaRuleGrads& g, int64_t t, int64_t j, int64_t i, RecurrentScratch& w) {
  const int64_t K = a.K, V = a.V, h = qk_head(a, j);
  const float *dO = g.dout + (t * a.HV + j) * V, *q = a.q + (t * a.H + h) * K, *k = a.k + (t * a.H + h) * K;
  float* dpre = w.dpre.data() + i * V;
  if (!a.normalize) {
    std::copy_n(dO, V, dpre);
    return;
  }
  const float *zt = w.zt.data() + i * K, *u = w.u.data() + i * V, *qs = w.qs.data() + i * V, b = beta_at(a, t, j);
  const float den = a.scale * (dot(q, zt, K) + b * dot(q, k, K)) + 1e-10f, qk = dot(q, k, K);
  float dO_pre = 0.0f;
  for (int64_t c = 0; c < V; ++c) dO_pre += dO[c] * a.scale * (qs[c] + qk * u[c]);
  scale(dO, 1.0f / den, dpre, V);
  w.dden[i] = -dO_pre / (den * den);
}

ReadPart read_part(const DeltaRuleArgs& a, int64_t t, int64_t j, int64_t i, const QkGradRows& rows,
                   const float* q_scaled, RecurrentScratch& w) {
  const int64_t K = a.K, V = a.V;
  return ReadPart{w.St.data() + i * K * V, a.k + (t * a.H + qk_head(a, j)) * K,
                  w.u.data() + i * V,      q_scaled,
                  w.dpre.data() + i * V,   w.du.data(),
                  rows.dq_row(t),          rows.dk_row(t)};
}

// After token t's read sweep: the rest of dq (S_t = S̃ + k uᵀ: + k (u·dpre)), the normalizer's read
// and write (dz += scale q dden, dq += scale z_t dden, dk += β dz, dβ += k·dz), then the delta
// (dv = β du, dβ += du·r, da = −β du) for the decay sweep that follows.
void finish_read(const DeltaRuleArgs& a, const DeltaRuleGrads& g, int64_t t, int64_t j, int64_t i,
                 const QkGradRows& rows, RecurrentScratch& w) {
  const int64_t K = a.K, V = a.V, h = qk_head(a, j);
  const float *q = a.q + (t * a.H + h) * K, *k = a.k + (t * a.H + h) * K, b = beta_at(a, t, j), sc = a.scale;
  const float *u = w.u.data() + i * V, *r = w.r.data() + i * V;
  float *dq = rows.dq_row(t), *dk = rows.dk_row(t), *du = w.du.data();
  const float u_dpre = dot(u, w.dpre.data() + i * V, V);
  for (int64_t d = 0; d < K; ++d) dq[d] = sc * (dq[d] + k[d] * u_dpre);
  float dbeta = 0.0f;
  if (a.normalize) {
    const float *zt = w.zt.data() + i * K, dden = w.dden[i];
    float* dz = w.dz.data();
    for (int64_t d = 0; d < K; ++d) {
      dz[d] += sc * q[d] * dden;
      dq[d] += sc * (zt[d] + b * k[d]) * dden;
      dk[d] += b * dz[d];
      dbeta += k[d] * dz[d];
    }
  }
  scale(du, b, g.dv + (t * a.HV + j) * V, V);
  dbeta += dot(du, r, V);
  if (g.dbeta) g.dbeta[t * a.HV + j] = dbeta;
  scale(du, a.delta ? -b : 0.0f, w.da.data(), V);
  std::fill_n(du, V, 0.0f);
}

// After token t's decay sweep: the normalizer's decay (dg += dz ⊙ z̃, dz ← e ⊙ dz) and dlog_decay.
void finish_decay(const DeltaRuleArgs& a, const DeltaRuleGrads& g, int64_t t, int64_t j, int64_t i,
                  RecurrentScratch& w) {
  const int64_t K = a.K, ew = gate_width(a);
  float *dz = w.dz.data(), *dg = w.dg.data();
  if (a.normalize) {
    const float *zt = w.zt.data() + i * K, *e = w.e.data() + i * ew;
    for (int64_t d = 0; d < K; ++d) {
      dg[d] += dz[d] * zt[d];
      dz[d] *= e[ew == 1 ? 0 : d];
    }
  }
  if (a.gate != Gate::None) store_dlog_decay(a, g, t, j, dg);
}

// One value head's S and z at every segment start, [segments, K, V] and [segments, K]; allocated per
// head (no thread keeps O(T) memory after the call) and filled by the forward kernel itself, run on the
// head's rows of one segment at a time, copied into a one-head problem.
struct Checkpoints {
  std::unique_ptr<float[]> S, z;
};

Checkpoints recurrent_checkpoints(const DeltaRuleArgs& a, int64_t j, RecurrentScratch& w) {
  const int64_t K = a.K, V = a.V, C = kRecurrentCheckpoint, ew = gate_width(a), h = qk_head(a, j);
  const int64_t segments = (a.T + C - 1) / C;
  Checkpoints ck{std::make_unique_for_overwrite<float[]>(size_t(segments * K * V)),
                 std::make_unique_for_overwrite<float[]>(size_t(segments * K))};
  if (segments == 0) return ck;
  std::copy_n(a.state + j * K * V, K * V, ck.S.get());
  if (a.normalize) std::copy_n(a.z + j * K, K, ck.z.get());
  DeltaRuleArgs f = a;
  f.T = C, f.H = 1, f.HV = 1;
  f.q = w.seg_q.data(), f.k = w.seg_k.data(), f.v = w.seg_v.data(), f.out = w.seg_out.data();
  f.beta = a.beta ? w.seg_beta.data() : nullptr, f.log_decay = a.log_decay ? w.seg_g.data() : nullptr;
  for (int64_t s = 0; s + 1 < segments; ++s) {
    for (int64_t i = 0; i < C; ++i) {
      const int64_t t = s * C + i;
      std::copy_n(a.q + (t * a.H + h) * K, K, w.seg_q.data() + i * K);
      std::copy_n(a.k + (t * a.H + h) * K, K, w.seg_k.data() + i * K);
      std::copy_n(a.v + (t * a.HV + j) * V, V, w.seg_v.data() + i * V);
      if (a.beta) w.seg_beta[i] = a.beta[t * a.HV + j];
      if (a.log_decay) std::copy_n(a.log_decay + (t * a.HV + j) * ew, ew, w.seg_g.data() + i * ew);
    }
    f.state = ck.S.get() + (s + 1) * K * V, f.z = a.normalize ? ck.z.get() + (s + 1) * K : nullptr;
    std::copy_n(ck.S.get() + s * K * V, K * V, f.state);
    if (a.normalize) std::copy_n(ck.z.get() + s * K, K, f.z);
    delta_rule_recurrent(f);
  }
  return ck;
}

// Segment [t0, t0 + n): its S̃_t, z̃_t, u_t, r_t (and S̃_tᵀq_t) from the checkpoint, one sweep a token.
void recurrent_recompute(const DeltaRuleArgs& a, const Checkpoints& ck, int64_t j, int64_t s, int64_t t0, int64_t n,
                         RecurrentScratch& w) {
  const int64_t K = a.K, V = a.V, h = qk_head(a, j), ew = gate_width(a);
  if (a.normalize) std::copy_n(ck.z.get() + s * K, K, w.z.data());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = t0 + i;
    const float* src = i == 0 ? ck.S.get() + s * K * V : w.St.data() + (i - 1) * K * V;
    const float* kp = i == 0 ? nullptr : a.k + ((t - 1) * a.H + h) * K;
    const float* up = i == 0 ? w.u.data() : w.u.data() + (i - 1) * V;
    float *e = w.e.data() + i * ew, *qs = a.normalize ? w.qs.data() + i * V : nullptr;
    step_factors(a, t, j, e);
    forward_sweep(K, V, src, kp, up, e, ew, a.k + (t * a.H + h) * K, a.q + (t * a.H + h) * K, w.St.data() + i * K * V,
                  w.ks.data(), qs);
    token_values(a, t, j, e, w.ks.data(), w.u.data() + i * V, w.r.data() + i * V, w.z.data(), w.zt.data() + i * K);
  }
}

void recurrent_backward_head(const DeltaRuleArgs& a, const DeltaRuleGrads& g, int64_t j, const QkGradRows& rows,
                             RecurrentScratch& w) {
  const int64_t T = a.T, K = a.K, V = a.V, C = kRecurrentCheckpoint, ew = gate_width(a), h = qk_head(a, j);
  const Checkpoints ck = recurrent_checkpoints(a, j, w);
  init_state_grads(a, g, j, w.dS.data(), w.dz.data());
  std::fill_n(w.du.data(), V, 0.0f);
  auto scaled_q = [&](int64_t t) {
    scale(a.q + (t * a.H + h) * K, a.scale, w.q_scaled.data(), K);
    return w.q_scaled.data();
  };
  const DecayPart no_decay{};
  const ReadPart no_read{};
  for (int64_t s = (T + C - 1) / C - 1; s >= 0; --s) {
    const int64_t t0 = s * C, n = std::min(C, T - t0);
    recurrent_recompute(a, ck, j, s, t0, n, w);
    read_grads(a, g, t0 + n - 1, j, n - 1, w);
    backward_sweep<false, true>(K, V, ew, w.dS.data(), no_decay,
                                read_part(a, t0 + n - 1, j, n - 1, rows, scaled_q(t0 + n - 1), w));
    for (int64_t i = n - 1; i >= 0; --i) {
      const int64_t t = t0 + i;
      finish_read(a, g, t, j, i, rows, w);
      const DecayPart dec{w.St.data() + i * K * V, a.k + (t * a.H + h) * K, w.da.data(),
                          w.e.data() + i * ew,     rows.dk_row(t),          w.dg.data()};
      if (i > 0) {
        read_grads(a, g, t - 1, j, i - 1, w);
        backward_sweep<true, true>(K, V, ew, w.dS.data(), dec, read_part(a, t - 1, j, i - 1, rows, scaled_q(t - 1), w));
      } else {
        backward_sweep<true, false>(K, V, ew, w.dS.data(), dec, no_read);
      }
      finish_decay(a, g, t, j, i, w);
    }
  }
  store_state_grads(a, g, j, w.dS.data(), w.dz.data());
}

// ---------------------------------------------------------------------------------------------
// Chunked path. One chunk = rows i = 0 .. n-1 (tokens t0 + i) of one value head, entering state S.
// Decay factors are products of per-step factors e_m = exp(g_m) ≤ 1: F_i = e_0 ⊙ … ⊙ e_i,
// L_i = e_{i+1} ⊙ … ⊙ e_{n−1}, D_ij = e_{j+1} ⊙ … ⊙ e_i (i ≥ j). docs/math/delta_rule_backward.md §3.

constexpr int kMaxChunk = 64;
constexpr int64_t kSubBlock = 16;  // rows of a per-channel diagonal sub-block

// What the forward pass over one value head's chunks keeps for the backward pass: each chunk's
// entering state and the intermediates read back (A, Nk, U, rv, P), O(T/C·K·V + T·(2C + 2V)) floats.
// Carved from a grow-only per-thread arena: a training step calls this for every head of every layer,
// and fresh pages each time (~10 µs a first touch) cost more than the arithmetic. Left uninitialized,
// as the forward pass writes every element before the backward pass reads it.
struct ChunkHistory {
  struct Slice {
    float* p = nullptr;
    float* get() const { return p; }
    explicit operator bool() const { return p != nullptr; }
  };
  Slice S, z;      // [chunks, K, V], [chunks, K] state entering each chunk
  Slice A, Nk;     // [chunks, C, C] (Nk only with delta)
  Slice U, rv, P;  // [T, V] (P only with the normalizer)
  ChunkHistory(const DeltaRuleArgs& a, int chunk) {
    const int64_t chunks = (a.T + chunk - 1) / chunk;
    const int64_t sizes[] = {chunks * a.K * a.V, a.normalize ? chunks * a.K : 0, chunks * chunk * chunk,
                             a.delta ? chunks * chunk * chunk : 0, a.T * a.V, a.T * a.V, a.normalize ? a.T * a.V : 0};
    Slice* slices[] = {&S, &z, &A, &Nk, &U, &rv, &P};
    int64_t total = 0;
    for (const int64_t n : sizes) total += (n + 15) / 16 * 16;
    thread_local std::vector<float> arena;
    if (arena.size() < size_t(total)) arena.resize(size_t(total));
    float* at = arena.data();
    for (size_t i = 0; i < std::size(sizes); ++i) {
      slices[i]->p = sizes[i] ? at : nullptr;
      at += (sizes[i] + 15) / 16 * 16;
    }
  }
};

// Per-thread buffers of one value head; row-major, leading dimension = the row length in the comment,
// n = rows of the current chunk, ew = gate_width. Everything but the ChunkHistory slices is rebuilt per
// chunk from the rows in O(n·K) (or is the chunk's own backward arithmetic).
struct ChunkScratch {
  std::vector<float> S, z, dS, dz;  // [K, V], [K]: running state; ∂L/∂(state leaving the chunk)
  std::vector<float> mem;
  // The current chunk's slices of the ChunkHistory.
  float* A;   // [n, n]  A_ij = Σ_d q_i k_j D_ij, j ≤ i (0 above)
  float* Nk;  // [n, n]  Nk_ij = Σ_d k_i k_j D_ij, j < i (0 elsewhere); null without delta
  float* U;   // [n, V]  corrected values
  float* rv;  // [n, V]  v − Kg S (delta) or v
  float* P;   // [n, V]  Qg S + A U (normalize only)
  // Rebuilt per chunk.
  float* qk;     // [2n, K] raw q rows, then raw k rows
  float* beta;   // [n]
  float* e;      // [n, ew] exp(g)
  float* F;      // [n, ew] exp(G_i)
  float* L;      // [n, ew] exp(G_last − G_i)
  float* D;      // [n, n]  scalar gates: D_ij, i ≥ j
  float* raw;    // [2n, n] scalar gates: Q Kᵀ, then K Kᵀ
  float* qkg;    // [2n, K] Qg = Q ⊙ F, then Kg = K ⊙ F
  float* kl;     // [n, K]  Kl = K ⊙ L
  float* Nb;     // [n, n]  diag(β) Nk, the strictly lower part of I + N
  float* dpr;    // [2n, V] dP, then dU → dR (solved) → −β dR
  float* dan;    // [2n, n] dA, then dNk (scalar gates: times D)
  float* dqkg;   // [2n, K] dQg, then dKg
  float* dkl;    // [n, K]  dKl
  float* dqa;    // [2n, K] Σ_j dA_ij k_j ⊙ D_ij, then Σ_j dNk_ij k_j ⊙ D_ij (row side)
  float* dkc;    // [n, K]  Σ_i dA_ij q_i ⊙ D_ij + Σ_i dNk_ij k_i ⊙ D_ij (column side)
  float* dG;     // [n, ew] ∂L/∂G_i, then ∂L/∂g_i
  float* dzq;    // [n]     ∂L/∂(q_i·z_i) (normalize)
  float* dbeta;  // [n]
  float* dF;     // [K]     ∂L/∂F_last
  float* Dv;     // [K]     running decay vector
  // Per channel, one sub-block of rows [r0, r1) (b rows) against the earlier columns j < r0:
  float* Dr;    // [B, K]  D_{i,r0} (rows of the sub-block)
  float* Dc;    // [C, K]  D_{r0,j} (earlier columns)
  float* blk;   // [2B, K] q_i ⊙ D_{i,r0}, then k_i ⊙ D_{i,r0}
  float* kc;    // [C, K]  k_j ⊙ D_{r0,j}
  float* prod;  // [2B, C] their products; in the backward [B, K] rows, then [C, K] columns

  void size_for(const DeltaRuleArgs& a) {
    const int64_t K = a.K, V = a.V, ew = gate_width(a);
    S.resize(K * V), z.resize(K), dS.resize(K * V), dz.resize(K);
    int64_t total = 0;
    for_each_buffer(K, V, ew, [&](float*&, int64_t size) { total += (size + 15) / 16 * 16; });
    mem.resize(total);
    float* p = mem.data();
    for_each_buffer(K, V, ew, [&](float*& buffer, int64_t size) {
      buffer = p;
      p += (size + 15) / 16 * 16;
    });
  }
  // The rebuilt-per-chunk buffers and their sizes, listed once.
  template <class Fn>
  void for_each_buffer(int64_t K, int64_t V, int64_t ew, Fn&& fn) {
    const int64_t C = kMaxChunk;
    fn(qk, 2 * C * K), fn(beta, C), fn(e, C * ew), fn(F, C * ew), fn(L, C * ew), fn(D, C * C), fn(raw, 2 * C * C);
    fn(qkg, 2 * C * K), fn(kl, C * K), fn(Nb, C * C), fn(dpr, 2 * C * V), fn(dan, 2 * C * C), fn(dqkg, 2 * C * K);
    fn(dkl, C * K), fn(dqa, 2 * C * K), fn(dkc, C * K), fn(dG, C * ew), fn(dzq, C), fn(dbeta, C), fn(dF, K);
    fn(Dv, K), fn(Dr, kSubBlock * K), fn(Dc, C * K), fn(blk, 2 * kSubBlock * K), fn(kc, C * K);
    fn(prod, std::max(2 * kSubBlock * C, (kSubBlock + C) * K));
  }
  void select_chunk(ChunkHistory& kept, int64_t c, int chunk, int64_t t0, int64_t V) {
    A = kept.A.get() + c * chunk * chunk, Nk = kept.Nk ? kept.Nk.get() + c * chunk * chunk : nullptr;
    U = kept.U.get() + t0 * V, rv = kept.rv.get() + t0 * V, P = kept.P ? kept.P.get() + t0 * V : nullptr;
  }
};

// Raw rows, β, factors e, F, L, D (scalar gates), Qg, Kg, Kl.
void chunk_prepare(const DeltaRuleArgs& a, int64_t j, int64_t t0, int64_t n, ChunkScratch& w) {
  const int64_t K = a.K, h = qk_head(a, j), ew = gate_width(a);
  float *Q = w.qk, *Kr = w.qk + n * K;
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(a.q + ((t0 + i) * a.H + h) * K, K, Q + i * K);
    std::copy_n(a.k + ((t0 + i) * a.H + h) * K, K, Kr + i * K);
    w.beta[i] = beta_at(a, t0 + i, j);
    step_factors(a, t0 + i, j, w.e + i * ew);
  }
  std::copy_n(w.e, ew, w.F);
  for (int64_t i = 1; i < n; ++i) mul(w.F + (i - 1) * ew, w.e + i * ew, w.F + i * ew, ew);
  std::fill_n(w.L + (n - 1) * ew, ew, 1.0f);
  for (int64_t i = n - 2; i >= 0; --i) mul(w.L + (i + 1) * ew, w.e + (i + 1) * ew, w.L + i * ew, ew);
  if (ew == 1)
    for (int64_t i = 0; i < n; ++i) {
      float decay = 1.0f;
      for (int64_t m = i; m >= 0; --m) {
        w.D[i * n + m] = decay;
        decay *= w.e[m];
      }
    }
  for (int64_t i = 0; i < n; ++i) {
    apply_factors(Q + i * K, w.F + i * ew, ew, w.qkg + i * K, K);
    apply_factors(Kr + i * K, w.F + i * ew, ew, w.qkg + (n + i) * K, K);
    apply_factors(Kr + i * K, w.L + i * ew, ew, w.kl + i * K, K);
  }
}

// Per channel, rows [r0, r1) against the earlier columns j < r0: with the reference row r0,
// D_ij = D_{i,r0} ⊙ D_{r0,j}, both factors ≤ 1, so the decayed products are plain products of
// blk = [q_i ⊙ D_{i,r0}; k_i ⊙ D_{i,r0}] and kc = k_j ⊙ D_{r0,j}. Also keeps the factors Dr, Dc.
void sub_block_factors(int64_t K, int64_t n, int64_t r0, int64_t r1, ChunkScratch& w) {
  const float *Q = w.qk, *Kr = w.qk + n * K;
  const int64_t b = r1 - r0;
  std::fill_n(w.Dr, K, 1.0f);
  for (int64_t i = r0; i < r1; ++i) {
    float* Dr = w.Dr + (i - r0) * K;
    if (i > r0) mul(Dr - K, w.e + i * K, Dr, K);
    mul(Q + i * K, Dr, w.blk + (i - r0) * K, K);
    mul(Kr + i * K, Dr, w.blk + (b + i - r0) * K, K);
  }
  std::copy_n(w.e + r0 * K, K, w.Dc + (r0 - 1) * K);
  for (int64_t j = r0 - 2; j >= 0; --j) mul(w.Dc + (j + 1) * K, w.e + (j + 1) * K, w.Dc + j * K, K);
  for (int64_t j = 0; j < r0; ++j) mul(Kr + j * K, w.Dc + j * K, w.kc + j * K, K);
}

// Per channel, the pairs m ≤ i inside the sub-block [r0, r1), elementwise: k_m ⊙ D_im grows from
// k_m ⊙ D_{i−1,m} by one factor e_i.
void intra_diagonal(const DeltaRuleArgs& a, int64_t n, int64_t r0, int64_t r1, ChunkScratch& w) {
  const int64_t K = a.K;
  const float *Q = w.qk, *Kr = w.qk + n * K;
  float* Dv = w.Dv;
  for (int64_t m = r0; m < r1; ++m) {
    const float* km = Kr + m * K;
    std::fill_n(Dv, K, 1.0f);
    w.A[m * n + m] = dot(Q + m * K, km, K);
    for (int64_t i = m + 1; i < r1; ++i) {
      const float *qi = Q + i * K, *ki = Kr + i * K, *ei = w.e + i * K;
      float sa = 0.0f, sn = 0.0f;
#pragma omp simd reduction(+ : sa, sn)
      for (int64_t d = 0; d < K; ++d) {
        Dv[d] *= ei[d];
        const float kd = km[d] * Dv[d];
        sa += qi[d] * kd;
        sn += ki[d] * kd;
      }
      w.A[i * n + m] = sa;
      if (a.delta) w.Nk[i * n + m] = sn;
    }
  }
}

// A (lower incl) and, with delta, Nk (strictly lower). Scalar gates: one sgemm [Q; K] Kᵀ, then times
// D. Per channel: pair by pair, k_j ⊙ D_ij grown from k_j ⊙ D_{i−1,j} by one factor e_i.
void chunk_intra(const DeltaRuleArgs& a, int64_t n, ChunkScratch& w) {
  const int64_t K = a.K;
  const float* Kr = w.qk + n * K;
  std::fill_n(w.A, n * n, 0.0f);
  if (a.delta) std::fill_n(w.Nk, n * n, 0.0f);
  if (a.gate != Gate::PerChannel) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, a.delta ? 2 * n : n, n, K, 1.0f, w.qk, K, Kr, K, 0.0f, w.raw,
                n);
    for (int64_t i = 0; i < n; ++i) {
      mul(w.raw + i * n, w.D + i * n, w.A + i * n, i + 1);
      if (a.delta) mul(w.raw + (n + i) * n, w.D + i * n, w.Nk + i * n, i);
    }
    return;
  }
  for (int64_t r0 = 0; r0 < n; r0 += kSubBlock) {
    const int64_t r1 = std::min(n, r0 + kSubBlock), b = r1 - r0;
    if (r0 > 0) {
      sub_block_factors(K, n, r0, r1, w);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, a.delta ? 2 * b : b, r0, K, 1.0f, w.blk, K, w.kc, K, 0.0f,
                  w.prod, r0);
      for (int64_t i = 0; i < b; ++i) {
        std::copy_n(w.prod + i * r0, r0, w.A + (r0 + i) * n);
        if (a.delta) std::copy_n(w.prod + (b + i) * r0, r0, w.Nk + (r0 + i) * n);
      }
    }
    intra_diagonal(a, n, r0, r1, w);
  }
}

// Nb = diag(β) Nk.
void chunk_solve_matrix(int64_t n, ChunkScratch& w) {
  for (int64_t i = 0; i < n; ++i) scale(w.Nk + i * n, w.beta[i], w.Nb + i * n, n);
}

// rv = V − Kg S (delta) or V; U = diag(β) rv, then with delta (I + Nb) U = diag(β) rv by forward
// substitution; with the normalizer P = Qg S + A U.
void chunk_values(const DeltaRuleArgs& a, int64_t j, int64_t t0, int64_t n, const float* S, ChunkScratch& w) {
  const int64_t K = a.K, V = a.V;
  if (a.delta)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, V, K, -1.0f, w.qkg + n * K, K, S, V, 0.0f, w.rv, V);
  for (int64_t i = 0; i < n; ++i) {
    const float* v = a.v + ((t0 + i) * a.HV + j) * V;
    float *rv = w.rv + i * V, *u = w.U + i * V;
    const float b = w.beta[i];
    if (a.delta) axpy(1.0f, v, rv, V);
    else std::copy_n(v, V, rv);
    scale(rv, b, u, V);
  }
  if (a.delta) {
    chunk_solve_matrix(n, w);
    cblas_strsm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasUnit, n, V, 1.0f, w.Nb, n, w.U, V);
  }
  if (!a.normalize) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, V, K, 1.0f, w.qkg, K, S, V, 0.0f, w.P, V);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, V, n, 1.0f, w.A, n, w.U, V, 1.0f, w.P, V);
}

// S ← F_last ⊙_rows S + Klᵀ U, z ← F_last ⊙ z + Klᵀ β.
void chunk_advance_state(const DeltaRuleArgs& a, int64_t n, float* S, float* z, ChunkScratch& w) {
  const int64_t K = a.K, V = a.V, ew = gate_width(a);
  const float* F_last = w.F + (n - 1) * ew;
  for (int64_t d = 0; d < K; ++d) scale(S + d * V, F_last[ew == 1 ? 0 : d], S + d * V, V);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, V, n, 1.0f, w.kl, K, w.U, V, 1.0f, S, V);
  if (!a.normalize) return;
  apply_factors(z, F_last, ew, z, K);
  for (int64_t m = 0; m < n; ++m) axpy(w.beta[m], w.kl + m * K, z, K);
}

// dP = scale·dO; with the normalizer, O_i = scale P_i / den_i, den_i = scale (q_i·z_i) + 1e-10, so
// dP_i = scale dO_i / den_i and dzq_i = ∂L/∂(q_i·z_i) = −scale (dO_i·O_i) / den_i.
void chunk_output_grads(const DeltaRuleArgs& a, const DeltaRuleGrads& g, int64_t j, int64_t t0, int64_t n,
                        const float* z, ChunkScratch& w) {
  const int64_t K = a.K, V = a.V;
  for (int64_t i = 0; i < n; ++i) {
    const float* dO = g.dout + ((t0 + i) * a.HV + j) * V;
    if (!a.normalize) {
      scale(dO, a.scale, w.dpr + i * V, V);
      continue;
    }
    float zq = dot(w.qkg + i * K, z, K);
    for (int64_t m = 0; m <= i; ++m) zq += w.A[i * n + m] * w.beta[m];
    const float inv = 1.0f / (a.scale * zq + 1e-10f);
    scale(dO, a.scale * inv, w.dpr + i * V, V);
    w.dzq[i] = -a.scale * (a.scale * inv) * dot(dO, w.P + i * V, V) * inv;
  }
}

// From dP and dS, dz (∂L/∂ the state leaving the chunk) through O = scale (Qg S + A U),
// S_out = F_last ⊙ S + Klᵀ U (z likewise) and the UT solve, to dQg, dKg, dKl, dA, dNk, dF_last, dv,
// dβ; dS, dz leave as ∂L/∂ the state entering the chunk.
void chunk_backward_dense(const DeltaRuleArgs& a, const DeltaRuleGrads& g, int64_t j, int64_t t0, int64_t n,
                          const float* S, const float* z, ChunkScratch& w) {
  const int64_t K = a.K, V = a.V, ew = gate_width(a), rows = a.delta ? 2 * n : n;
  float *dS = w.dS.data(), *dz = w.dz.data(), *dP = w.dpr, *dR = w.dpr + n * V, *dbeta = w.dbeta;
  const float* F_last = w.F + (n - 1) * ew;
  std::fill_n(dbeta, n, 0.0f);
  // dU = Aᵀ dP + Kl dS_out (into the dR rows), dKl = U dS_outᵀ, dF_last = rowsum(dS_out ⊙ S).
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, V, n, 1.0f, w.A, n, dP, V, 0.0f, dR, V);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, V, K, 1.0f, w.kl, K, dS, V, 1.0f, dR, V);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, K, V, 1.0f, w.U, V, dS, V, 0.0f, w.dkl, K);
  for (int64_t d = 0; d < K; ++d) w.dF[d] = dot(dS + d * V, S + d * V, V);
  if (a.normalize) {
    for (int64_t m = 0; m < n; ++m) {
      axpy(w.beta[m], dz, w.dkl + m * K, K);
      dbeta[m] += dot(w.kl + m * K, dz, K);
    }
    for (int64_t d = 0; d < K; ++d) w.dF[d] += dz[d] * z[d];
  }
  // Through U: delta: (I + Nb)ᵀ dR = dU and R = diag(β) rv; else U = diag(β) v (= diag(β) rv).
  if (a.delta) cblas_strsm(CblasRowMajor, CblasLeft, CblasLower, CblasTrans, CblasUnit, n, V, 1.0f, w.Nb, n, dR, V);
  for (int64_t i = 0; i < n; ++i) {
    scale(dR + i * V, w.beta[i], g.dv + ((t0 + i) * a.HV + j) * V, V);
    dbeta[i] += dot(dR + i * V, w.rv + i * V, V);
  }
  // [dA; X] = [dP; dR] Uᵀ: dA masked to j ≤ i; dNk_ij = −β_i X_ij and dβ_i −= Σ_j X_ij Nk_ij (j < i).
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, V, 1.0f, w.dpr, V, w.U, V, 0.0f, w.dan, n);
  float* dNk = w.dan + n * n;
  for (int64_t i = 0; i < n; ++i) {
    std::fill(w.dan + i * n + i + 1, w.dan + (i + 1) * n, 0.0f);
    if (a.normalize) {
      axpy(w.dzq[i], w.beta, w.dan + i * n, i + 1);
      axpy(w.dzq[i], w.A + i * n, dbeta, i + 1);
    }
    if (!a.delta) continue;
    dbeta[i] -= dot(dNk + i * n, w.Nk + i * n, i);
    scale(dNk + i * n, -w.beta[i], dNk + i * n, i);
    std::fill(dNk + i * n + i, dNk + (i + 1) * n, 0.0f);
    scale(dR + i * V, -w.beta[i], dR + i * V, V);
  }
  if (g.dbeta)
    for (int64_t i = 0; i < n; ++i) g.dbeta[(t0 + i) * a.HV + j] = dbeta[i];
  // [dQg; dKg] = [dP; −β dR] Sᵀ; dS ← F_last ⊙ dS + [Qg; Kg]ᵀ [dP; −β dR].
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, K, V, 1.0f, w.dpr, V, S, V, 0.0f, w.dqkg, K);
  for (int64_t d = 0; d < K; ++d) scale(dS + d * V, F_last[ew == 1 ? 0 : d], dS + d * V, V);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, V, rows, 1.0f, w.qkg, K, w.dpr, V, 1.0f, dS, V);
  if (!a.normalize) return;
  apply_factors(dz, F_last, ew, dz, K);
  for (int64_t i = 0; i < n; ++i) {
    axpy(w.dzq[i], z, w.dqkg + i * K, K);
    axpy(w.dzq[i], w.qkg + i * K, dz, K);
  }
}

// Per channel, the pairs inside the sub-block [r0, r1), elementwise with a running D_im.
void intra_diagonal_backward(const DeltaRuleArgs& a, int64_t n, int64_t r0, int64_t r1, ChunkScratch& w) {
  const int64_t K = a.K;
  const float *Q = w.qk, *Kr = w.qk + n * K, *dNk = w.dan + n * n;
  float* Dv = w.Dv;
  for (int64_t m = r0; m < r1; ++m) {
    const float* km = Kr + m * K;
    float* kc = w.dkc + m * K;
    axpy(w.dan[m * n + m], km, w.dqa + m * K, K);
    axpy(w.dan[m * n + m], Q + m * K, kc, K);
    std::fill_n(Dv, K, 1.0f);
    for (int64_t i = m + 1; i < r1; ++i) {
      const float *qi = Q + i * K, *ki = Kr + i * K, *ei = w.e + i * K, da = w.dan[i * n + m];
      const float dn = a.delta ? dNk[i * n + m] : 0.0f;
      float *qa = w.dqa + i * K, *qn = w.dqa + (n + i) * K;
#pragma omp simd
      for (int64_t d = 0; d < K; ++d) {
        Dv[d] *= ei[d];
        const float kd = km[d] * Dv[d];
        qa[d] += da * kd;
        qn[d] += dn * kd;
        kc[d] += (da * qi[d] + dn * ki[d]) * Dv[d];
      }
    }
  }
}

// Per channel, rows [r0, r1) against columns j < r0 (see sub_block_factors): with dA, dNk restricted
// to that block, qa_i += Dr_i ⊙ (dA kc)_i, qn_i += Dr_i ⊙ (dNk kc)_i, and
// kc_j += Dc_j ⊙ (dAᵀ (q ⊙ Dr) + dNkᵀ (k ⊙ Dr))_j.
void intra_off_diagonal_backward(const DeltaRuleArgs& a, int64_t n, int64_t r0, int64_t r1, ChunkScratch& w) {
  const int64_t K = a.K, b = r1 - r0;
  const float *dA = w.dan + r0 * n, *dNk = w.dan + (n + r0) * n;
  sub_block_factors(K, n, r0, r1, w);
  float *rows = w.prod, *cols = w.prod + kSubBlock * K;
  for (int side = 0; side < (a.delta ? 2 : 1); ++side) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, K, r0, 1.0f, side ? dNk : dA, n, w.kc, K, 0.0f, rows, K);
    for (int64_t i = 0; i < b; ++i) {
      float* dst = w.dqa + (side * n + r0 + i) * K;
      const float *x = rows + i * K, *Dr = w.Dr + i * K;
#pragma omp simd
      for (int64_t d = 0; d < K; ++d) dst[d] += x[d] * Dr[d];
    }
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r0, K, b, 1.0f, dA, n, w.blk, K, 0.0f, cols, K);
  if (a.delta)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r0, K, b, 1.0f, dNk, n, w.blk + b * K, K, 1.0f, cols, K);
  for (int64_t j = 0; j < r0; ++j) {
    float* dst = w.dkc + j * K;
    const float *x = cols + j * K, *Dc = w.Dc + j * K;
#pragma omp simd
    for (int64_t d = 0; d < K; ++d) dst[d] += x[d] * Dc[d];
  }
}

// From dA, dNk to the row side (dqa: qa, then qn) and the column side (dkc) and, for a scalar gate,
// the intra-chunk part of dG. Scalar gates: sgemms with dA ⊙ D; per channel: sub-blocks of 16 rows,
// pairs inside a block elementwise, earlier columns by sgemm.
void chunk_backward_intra(const DeltaRuleArgs& a, int64_t n, ChunkScratch& w) {
  const int64_t K = a.K, rows = a.delta ? 2 * n : n;
  const float *Q = w.qk, *Kr = w.qk + n * K;
  float* dNk = w.dan + n * n;
  std::fill_n(w.dG, n * gate_width(a), 0.0f);
  if (a.gate != Gate::PerChannel) {
    // G_i − G_m is the exponent of A_im and Nk_im: dG_i gains Σ_m dA_im A_im, dG_m loses it.
    for (int64_t i = 0; i < n && a.gate == Gate::PerHead; ++i)
      for (int64_t m = 0; m <= i; ++m) {
        const float x = w.dan[i * n + m] * w.A[i * n + m] + (a.delta ? dNk[i * n + m] * w.Nk[i * n + m] : 0.0f);
        w.dG[i] += x;
        w.dG[m] -= x;
      }
    for (int64_t r = 0; r < rows; ++r) mul(w.dan + r * n, w.D + (r % n) * n, w.dan + r * n, n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, K, n, 1.0f, w.dan, n, Kr, K, 0.0f, w.dqa, K);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, K, n, 1.0f, w.dan, n, Q, K, 0.0f, w.dkc, K);
    if (a.delta) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, K, n, 1.0f, dNk, n, Kr, K, 1.0f, w.dkc, K);
    return;
  }
  std::fill_n(w.dqa, 2 * n * K, 0.0f);
  std::fill_n(w.dkc, n * K, 0.0f);
  for (int64_t r0 = 0; r0 < n; r0 += kSubBlock) {
    const int64_t r1 = std::min(n, r0 + kSubBlock);
    intra_diagonal_backward(a, n, r0, r1, w);
    if (r0 > 0) intra_off_diagonal_backward(a, n, r0, r1, w);
  }
}

// Row i's dq, dk and, per channel, dG (kc = ka + kn of the math note):
//   dq = F ⊙ dQg + qa,  dk = F ⊙ dKg + L ⊙ dKl + qn + kc,
//   dG = q ⊙ dq + k ⊙ (F ⊙ dKg − L ⊙ dKl + qn − kc).
template <bool kPerChannel, bool kDelta>
void chunk_row_grads(int64_t K, int64_t n, int64_t i, float* dq, float* dk, float* dG, const ChunkScratch& w) {
  const int64_t ew = kPerChannel ? K : 1;
  const float *q = w.qk + i * K, *k = w.qk + (n + i) * K, *dqg = w.dqkg + i * K, *dkg = w.dqkg + (n + i) * K;
  const float *qa = w.dqa + i * K, *qn = w.dqa + (n + i) * K, *kc = w.dkc + i * K;
  const float *dkl = w.dkl + i * K, *f = w.F + i * ew, *l = w.L + i * ew;
#pragma omp simd
  for (int64_t d = 0; d < K; ++d) {
    const float fd = f[kPerChannel ? d : 0], ld = l[kPerChannel ? d : 0];
    const float dkg_f = kDelta ? fd * dkg[d] : 0.0f, nrow = kDelta ? qn[d] : 0.0f;
    dq[d] = fd * dqg[d] + qa[d];
    dk[d] = dkg_f + ld * dkl[d] + nrow + kc[d];
    if constexpr (kPerChannel) dG[d] = q[d] * dq[d] + k[d] * (dkg_f - ld * dkl[d] + nrow - kc[d]);
  }
}

// dq, dk rows of the chunk and, with a gate, dlog_decay: dG per row (the last row also carries the
// terms of F_last and every L_j), then dg_m = Σ_{i ≥ m} dG_i.
void chunk_backward_rows(const DeltaRuleArgs& a, const DeltaRuleGrads& g, int64_t j, int64_t t0, int64_t n,
                         const QkGradRows& rows, ChunkScratch& w) {
  const int64_t K = a.K, ew = gate_width(a);
  const bool per_channel = a.gate == Gate::PerChannel;
  for (int64_t i = 0; i < n; ++i) {
    float *dq = rows.dq_row(t0 + i), *dk = rows.dk_row(t0 + i), *dG = w.dG + i * ew;
    if (per_channel && a.delta) chunk_row_grads<true, true>(K, n, i, dq, dk, dG, w);
    else if (per_channel) chunk_row_grads<true, false>(K, n, i, dq, dk, dG, w);
    else if (a.delta) chunk_row_grads<false, true>(K, n, i, dq, dk, dG, w);
    else chunk_row_grads<false, false>(K, n, i, dq, dk, dG, w);
  }
  if (a.gate == Gate::None || !g.dlog_decay) return;
  if (!per_channel)
    for (int64_t i = 0; i < n; ++i) {
      // Scalar gate: F_i (q·dQg + k·dKg) − L_i (k·dKl); chunk_backward_intra added the rest.
      const float *q = w.qk + i * K, *k = w.qk + (n + i) * K;
      float s = dot(q, w.dqkg + i * K, K) + (a.delta ? dot(k, w.dqkg + (n + i) * K, K) : 0.0f);
      w.dG[i] += w.F[i] * s - w.L[i] * dot(k, w.dkl + i * K, K);
    }
  float* last = w.dG + (n - 1) * ew;
  const float* F_last = w.F + (n - 1) * ew;
  for (int64_t m = 0; m < n; ++m) {
    const float *km = w.qk + (n + m) * K, *dkl = w.dkl + m * K;
    if (per_channel) {
      const float* l = w.L + m * K;
#pragma omp simd
      for (int64_t d = 0; d < K; ++d) last[d] += km[d] * dkl[d] * l[d];
    } else {
      last[0] += w.L[m] * dot(km, dkl, K);
    }
  }
  if (per_channel) {
#pragma omp simd
    for (int64_t d = 0; d < K; ++d) last[d] += w.dF[d] * F_last[d];
  } else {
    float s = 0.0f;
    for (int64_t d = 0; d < K; ++d) s += w.dF[d];
    last[0] += s * F_last[0];
  }
  for (int64_t i = n - 2; i >= 0; --i) axpy(1.0f, w.dG + (i + 1) * ew, w.dG + i * ew, ew);
  for (int64_t i = 0; i < n; ++i) {
    if (per_channel) std::copy_n(w.dG + i * K, K, g.dlog_decay + ((t0 + i) * a.HV + j) * K);
    else g.dlog_decay[(t0 + i) * a.HV + j] = w.dG[i];
  }
}

void chunked_backward_head(const DeltaRuleArgs& a, const DeltaRuleGrads& g, int64_t j, int chunk,
                           const QkGradRows& rows, ChunkScratch& w) {
  const int64_t T = a.T, K = a.K, V = a.V, chunks = (T + chunk - 1) / chunk;
  ChunkHistory kept(a, chunk);
  std::copy_n(a.state + j * K * V, K * V, w.S.data());
  if (a.normalize) std::copy_n(a.z + j * K, K, w.z.data());
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t t0 = c * chunk, n = std::min<int64_t>(chunk, T - t0);
    std::copy_n(w.S.data(), K * V, kept.S.get() + c * K * V);
    if (a.normalize) std::copy_n(w.z.data(), K, kept.z.get() + c * K);
    w.select_chunk(kept, c, chunk, t0, V);
    chunk_prepare(a, j, t0, n, w);
    chunk_intra(a, n, w);
    chunk_values(a, j, t0, n, w.S.data(), w);
    chunk_advance_state(a, n, w.S.data(), w.z.data(), w);
  }
  init_state_grads(a, g, j, w.dS.data(), w.dz.data());
  for (int64_t c = chunks - 1; c >= 0; --c) {
    const int64_t t0 = c * chunk, n = std::min<int64_t>(chunk, T - t0);
    const float *S = kept.S.get() + c * K * V, *z = a.normalize ? kept.z.get() + c * K : nullptr;
    w.select_chunk(kept, c, chunk, t0, V);
    chunk_prepare(a, j, t0, n, w);
    if (a.delta) chunk_solve_matrix(n, w);
    chunk_output_grads(a, g, j, t0, n, z, w);
    chunk_backward_dense(a, g, j, t0, n, S, z, w);
    chunk_backward_intra(a, n, w);
    chunk_backward_rows(a, g, j, t0, n, rows, w);
  }
  store_state_grads(a, g, j, w.dS.data(), w.dz.data());
}

}  // namespace

void delta_rule_recurrent_backward(const DeltaRuleArgs& a, const DeltaRuleGrads& g) {
  delta_rule_check_grads(a, g);
  for_each_value_head(a, g, a.T * 8 * a.K * a.V, [&](int64_t j, const QkGradRows& rows) {
    thread_local RecurrentScratch w;
    w.size_for(a);
    recurrent_backward_head(a, g, j, rows, w);
  });
}

void delta_rule_chunked_backward(const DeltaRuleArgs& a, const DeltaRuleGrads& g, int chunk) {
  delta_rule_check_grads(a, g);
  LINEAGE_CHECK(chunk >= 1 && chunk <= kMaxChunk, "chunk must be in [1, ", kMaxChunk, "], got ", chunk);
  for_each_value_head(a, g, a.T * (12 * a.K * a.V + 4 * chunk * (a.K + a.V)), [&](int64_t j, const QkGradRows& rows) {
    thread_local ChunkScratch w;
    w.size_for(a);
    chunked_backward_head(a, g, j, chunk, rows, w);
  });
}

}  // namespace lineage::kernels
