#include "lineage/kernels/delta_rule.h"
#include "lineage/kernels/vmath.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>
#include <string>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/blas_threads.h"
#include "lineage/kernels/delta_rule_loops.h"
#include "lineage/kernels/x86/delta_rule_avx512.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {

void delta_rule_check_args(const DeltaRuleArgs& a) {
  LINEAGE_CHECK(a.T >= 0 && a.H > 0 && a.HV > 0 && a.K > 0 && a.V > 0, "delta rule shapes T=", a.T, " H=", a.H,
                " HV=", a.HV, " K=", a.K, " V=", a.V);
  LINEAGE_CHECK(a.HV % a.H == 0, "value heads HV=", a.HV, " must be a multiple of q/k heads H=", a.H);
  LINEAGE_CHECK(a.state, "delta rule needs a state");
  LINEAGE_CHECK(a.T == 0 || (a.q && a.k && a.v && a.out), "delta rule needs q, k, v and out");
  LINEAGE_CHECK(a.gate == Gate::None ? !a.log_decay : (a.T == 0 || a.log_decay),
                "log_decay must be given exactly when there is a gate");
  LINEAGE_CHECK(!a.normalize || (!a.delta && a.z), "the normalizer needs delta off and a z buffer");
}

namespace {

// ---------------------------------------------------------------------------------------------
// Shared by both paths.

using namespace delta_rule_loops;  // delta_rule_loops.h

// ---------------------------------------------------------------------------------------------
// Recurrent path.

// One sweep over S ([K, V]) for token t: applies the pending write S += kp upᵀ of token t-1, then the
// decay, and accumulates ks = S̃ᵀk and qs = S̃ᵀq. Fusing the write of t-1 into the sweep of t keeps it
// to one pass over the state per token, which is what bounds decode speed.
template <bool kDelta>
void sweep_state(float* S, int64_t K, int64_t V, const float* e, int64_t ew, const float* kp, const float* up,
                 const float* k, const float* q, float* ks, float* qs) {
  std::fill(ks, ks + V, 0.0f);
  std::fill(qs, qs + V, 0.0f);
  for (int64_t d = 0; d < K; ++d) {
    float* Sd = S + d * V;
    const float ed = e[ew == 1 ? 0 : d], pk = kp[d], kd = k[d], qd = q[d];
#pragma omp simd
    for (int64_t c = 0; c < V; ++c) {
      const float s = (Sd[c] + pk * up[c]) * ed;
      Sd[c] = s;
      if constexpr (kDelta) ks[c] += kd * s;
      qs[c] += qd * s;
    }
  }
}

void recurrent_head(const DeltaRuleArgs& a, int64_t j, std::vector<float>& buf) {
  const int64_t K = a.K, V = a.V, h = qk_head(a, j), ew = gate_width(a);
  buf.assign(ew + 2 * K + 3 * V, 0.0f);
  float *e = buf.data(), *kp = e + ew, *up = kp + K, *ks = up + V, *qs = ks + V, *zt = qs + V;
  float* S = a.state + j * K * V;
  float* z = a.normalize ? a.z + j * K : zt;  // zt: K unused floats when there is no normalizer
  for (int64_t t = 0; t < a.T; ++t) {
    const float *q = a.q + (t * a.H + h) * K, *k = a.k + (t * a.H + h) * K, *v = a.v + (t * a.HV + j) * V;
    float* o = a.out + (t * a.HV + j) * V;
    step_factors(a, t, j, e);
    if (a.delta) sweep_state<true>(S, K, V, e, ew, kp, up, k, q, ks, qs);
    else sweep_state<false>(S, K, V, e, ew, kp, up, k, q, ks, qs);
    const float b = beta_at(a, t, j), qk = dot(q, k, K);
    for (int64_t c = 0; c < V; ++c) {
      up[c] = a.delta ? b * (v[c] - ks[c]) : b * v[c];
      o[c] = a.scale * (qs[c] + qk * up[c]);  // Sᵀq after the write: S̃ᵀq + (q·k) u
    }
    if (a.normalize) {
      for (int64_t d = 0; d < K; ++d) z[d] = e[ew == 1 ? 0 : d] * z[d] + b * k[d];
      const float inv = 1.0f / (a.scale * dot(q, z, K) + 1e-10f);
      for (int64_t c = 0; c < V; ++c) o[c] *= inv;
    }
    std::copy(k, k + K, kp);
  }
  for (int64_t d = 0; d < K; ++d)
    for (int64_t c = 0; c < V; ++c) S[d * V + c] += kp[d] * up[c];
}

}  // namespace

void delta_rule_recurrent(const DeltaRuleArgs& a) { delta_rule_recurrent(std::span<const DeltaRuleArgs>(&a, 1)); }

void delta_rule_recurrent(std::span<const DeltaRuleArgs> seqs) {
  if (seqs.empty()) return;
  const DeltaRuleArgs& a0 = seqs[0];
  int64_t tokens = 0;
  for (const DeltaRuleArgs& a : seqs) {
    delta_rule_check_args(a);
    LINEAGE_CHECK(a.H == a0.H && a.HV == a0.HV && a.K == a0.K && a.V == a0.V && a.gate == a0.gate &&
                      a.delta == a0.delta && a.normalize == a0.normalize,
                  "delta_rule_recurrent: the sequences of one call must share shapes and switches");
    tokens += a.T;
  }
  if (tokens == 0) return;
  static const bool avx512 = std::string(gemv_table().isa) == "avx512";
  const bool fast = avx512 && delta_rule_recurrent_avx512_supports(a0);
  // Items of one sequence: blocks of state columns (AVX-512) or whole value heads.
  const int64_t per = fast ? delta_rule_recurrent_avx512_items(a0) : a0.HV;
  const int64_t n = per * int64_t(seqs.size());
  const int64_t work = (tokens + int64_t(seqs.size()) - 1) / int64_t(seqs.size()) * 3 * a0.K * a0.V * a0.HV / per;
  parallel_for(
      n,
      [&](int64_t i0, int64_t i1) {
        thread_local std::vector<float> buf;
        for (int64_t i = i0; i < i1;) {  // the run of items [i, e) inside one sequence
          const int64_t b = i / per, e = std::min(i1, (b + 1) * per);
          const DeltaRuleArgs& a = seqs[size_t(b)];
          if (a.T == 0) {
          } else if (fast) {
            delta_rule_recurrent_items_avx512(a, i - b * per, e - b * per);
          } else {
            for (int64_t j = i - b * per; j < e - b * per; ++j) recurrent_head(a, j, buf);
          }
          i = e;
        }
      },
      grain_for(work));
}

namespace {

// ---------------------------------------------------------------------------------------------
// Chunked path. One chunk = rows i = 0 .. n-1 (tokens t0 + i) of one value head. Decay factors are
// kept as products of per-step factors e_m = exp(g_m) ≤ 1, so exp(G_i − G_j) for i ≥ j is
// Π_{m=j+1..i} e_m: the chunk-local cumulative log decay difference, never a positive exponent.

constexpr int kMaxChunk = 64;
constexpr int64_t kSubBlock = 16;  // rows of a per-channel diagonal sub-block

// Per-thread scratch for one chunk, sized for kMaxChunk rows. ew = gate_width (K or 1). Row-major,
// leading dimension = the row length named in the comment, n = rows of the current chunk.
struct ChunkScratch {
  std::vector<float> mem;
  float* qk_raw;   // [2n, K]: raw q rows, then raw k rows
  float* beta;     // [n]
  float* e;        // [n, ew] per-step factors exp(g)
  float* F;        // [n, ew] exp(G_i)
  float* Bk;       // [n, ew] exp(G_last − G_i)
  float* qk_g;     // [2n, K]: Qg = Q ⊙ F, then Kg = K ⊙ F
  float* k_l;      // [n, K]  Kl = K ⊙ Bk
  float* A;        // [2n, n]: A (decayed q·k, lower incl), then Nk (decayed k·k, strictly lower)
  float* qks;      // [2n, V]: Qg S (then + A Vn), then Kg S
  float* R;        // [n, V]  β (v − Kg S), solved in place into Vn
  float* blk;      // [2B, K] per-channel off-diagonal: q and k rows of a query sub-block
  float* kb;       // [n, K]  per-channel off-diagonal: earlier k rows against its reference row
  float* blk_out;  // [2B, n]
  float* E;        // [K] running decay vector
  void size_for(int64_t K, int64_t V, int64_t ew) {
    const int64_t C = kMaxChunk, B = kSubBlock;
    const int64_t sizes[] = {2 * C * K, C, C * ew, C * ew, C * ew, 2 * C * K, C * K, 2 * C * C,
                             2 * C * V, C * V, 2 * B * K, C * K, 2 * B * C, K};
    float** ptrs[] = {&qk_raw, &beta, &e, &F, &Bk, &qk_g, &k_l, &A, &qks, &R, &blk, &kb, &blk_out, &E};
    int64_t total = 0;
    for (int64_t s : sizes) total += (s + 15) / 16 * 16;
    mem.resize(total);
    float* p = mem.data();
    for (size_t i = 0; i < std::size(sizes); ++i) {
      *ptrs[i] = p;
      p += (sizes[i] + 15) / 16 * 16;
    }
  }
};

// Raw q and k rows stacked as [Q; K] (2n × K), β, per-step factors e, cumulative F_i = exp(G_i),
// and reverse cumulative Bk_i = exp(G_last − G_i); then Qg = Q ⊙ F, Kg = K ⊙ F ([Qg; Kg] stacked)
// and Kl = K ⊙ Bk.
void chunk_prepare(const DeltaRuleArgs& a, int64_t j, int64_t t0, int64_t n, ChunkScratch& w) {
  const int64_t K = a.K, h = qk_head(a, j), ew = gate_width(a);
  float *Q = w.qk_raw, *Kr = w.qk_raw + n * K;
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(a.q + ((t0 + i) * a.H + h) * K, K, Q + i * K);
    std::copy_n(a.k + ((t0 + i) * a.H + h) * K, K, Kr + i * K);
    w.beta[i] = beta_at(a, t0 + i, j);
    step_factors(a, t0 + i, j, w.e + i * ew);
  }
  std::copy_n(w.e, ew, w.F);
  for (int64_t i = 1; i < n; ++i) mul(w.F + (i - 1) * ew, w.e + i * ew, w.F + i * ew, ew);
  std::fill_n(w.Bk + (n - 1) * ew, ew, 1.0f);
  for (int64_t i = n - 2; i >= 0; --i) mul(w.Bk + (i + 1) * ew, w.e + (i + 1) * ew, w.Bk + i * ew, ew);
  float *Qg = w.qk_g, *Kg = w.qk_g + n * K;
  for (int64_t i = 0; i < n; ++i) {
    apply_factors(Q + i * K, w.F + i * ew, ew, Qg + i * K, K);
    apply_factors(Kr + i * K, w.F + i * ew, ew, Kg + i * K, K);
    apply_factors(Kr + i * K, w.Bk + i * ew, ew, w.k_l + i * K, K);
  }
}

// Scalar gate: A = Q Kᵀ and Nk = K Kᵀ in one sgemm ([Q; K] Kᵀ; Nk only with delta), then entry
// (i, j ≤ i) times Π_{m=j+1..i} e_m, built right to left along the row. Upper parts are zeroed.
void intra_scalar_gate(int64_t n, int64_t K, bool delta, ChunkScratch& w) {
  const float* Kr = w.qk_raw + n * K;
  // A and Nk are adjacent n × n blocks of one 2n × n matrix.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, delta ? 2 * n : n, n, K, 1.0f, w.qk_raw, K, Kr, K, 0.0f,
              w.A, n);
  float* Nk = w.A + n * n;
  for (int64_t i = 0; i < n; ++i) {
    float decay = 1.0f;
    for (int64_t jj = i; jj >= 0; --jj) {
      w.A[i * n + jj] *= decay;
      if (delta) Nk[i * n + jj] *= decay;
      decay *= w.e[jj];
    }
    std::fill(w.A + i * n + i + 1, w.A + (i + 1) * n, 0.0f);
    if (delta) std::fill(Nk + i * n + i, Nk + (i + 1) * n, 0.0f);
  }
}

// Per-channel gate, query sub-block rows [r0, r1) against all earlier columns [0, r0): reference
// row r0, so both q_i ⊙ exp(G_i − G_r0) (i ≥ r0) and k_j ⊙ exp(G_r0 − G_j) (j < r0) carry factors ≤ 1
// and their product is exactly the decayed dot product.
void intra_off_diagonal(int64_t n, int64_t K, int64_t r0, int64_t r1, ChunkScratch& w) {
  const float *Q = w.qk_raw, *Kr = w.qk_raw + n * K;
  const int64_t b = r1 - r0;
  std::fill(w.E, w.E + K, 1.0f);
  for (int64_t i = r0; i < r1; ++i) {
    if (i > r0) mul(w.E, w.e + i * K, w.E, K);
    mul(Q + i * K, w.E, w.blk + (i - r0) * K, K);
    mul(Kr + i * K, w.E, w.blk + (b + i - r0) * K, K);
  }
  std::fill(w.E, w.E + K, 1.0f);
  for (int64_t jj = r0 - 1; jj >= 0; --jj) {
    mul(w.E, w.e + (jj + 1) * K, w.E, K);
    mul(Kr + jj * K, w.E, w.kb + jj * K, K);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 2 * b, r0, K, 1.0f, w.blk, K, w.kb, K, 0.0f, w.blk_out, r0);
  for (int64_t i = 0; i < b; ++i) {
    std::copy_n(w.blk_out + i * r0, r0, w.A + (r0 + i) * n);
    std::copy_n(w.blk_out + (b + i) * r0, r0, w.A + (n + r0 + i) * n);
  }
}

// Per-channel gate, pairs inside one diagonal sub-block, elementwise: the decayed key
// k_j ⊙ exp(G_i − G_j) of pair (i, j) is that of (i-1, j) times one factor e_i.
void intra_diagonal(int64_t n, int64_t K, int64_t r0, int64_t r1, ChunkScratch& w) {
  const float *Q = w.qk_raw, *Kr = w.qk_raw + n * K;
  float* kd = w.E;
  for (int64_t jj = r0; jj < r1; ++jj) {
    std::copy_n(Kr + jj * K, K, kd);
    w.A[jj * n + jj] = dot(Q + jj * K, kd, K);
    for (int64_t i = jj + 1; i < r1; ++i) {
      const float *qi = Q + i * K, *ki = Kr + i * K, *ei = w.e + i * K;
      float sa = 0.0f, sn = 0.0f;
#pragma omp simd reduction(+ : sa, sn)
      for (int64_t d = 0; d < K; ++d) {
        kd[d] *= ei[d];
        sa += qi[d] * kd[d];
        sn += ki[d] * kd[d];
      }
      w.A[i * n + jj] = sa;
      w.A[(n + i) * n + jj] = sn;
    }
  }
}

void intra_per_channel(int64_t n, int64_t K, ChunkScratch& w) {
  for (int64_t i = 0; i < n; ++i) {
    std::fill(w.A + i * n + i + 1, w.A + (i + 1) * n, 0.0f);
    std::fill(w.A + (n + i) * n + i, w.A + (n + i + 1) * n, 0.0f);
  }
  for (int64_t r0 = 0; r0 < n; r0 += kSubBlock) {
    const int64_t r1 = std::min(n, r0 + kSubBlock);
    if (r0 > 0) intra_off_diagonal(n, K, r0, r1, w);
    intra_diagonal(n, K, r0, r1, w);
  }
}

// Corrected values Vn (into w.R) and QS = Qg S (first n rows of w.qks).
// delta: [QS; KS] = [Qg; Kg] S, R = diag(β)(V − KS), then (I + N) Vn = R by forward substitution
// (strsm, unit lower triangular) with N = diag(β) Nk strictly lower. Without delta, Vn = diag(β) V.
void chunk_values(const DeltaRuleArgs& a, int64_t j, int64_t t0, int64_t n, const float* S, ChunkScratch& w) {
  const int64_t K = a.K, V = a.V;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, a.delta ? 2 * n : n, V, K, 1.0f, w.qk_g, K, S, V, 0.0f,
              w.qks, V);
  const float* KS = w.qks + n * V;
  for (int64_t i = 0; i < n; ++i) {
    const float *v = a.v + ((t0 + i) * a.HV + j) * V, *ks = KS + i * V;
    float* r = w.R + i * V;
    const float b = w.beta[i];
    if (!a.delta) {
      scale(v, b, r, V);
      continue;
    }
#pragma omp simd
    for (int64_t c = 0; c < V; ++c) r[c] = b * (v[c] - ks[c]);
  }
  if (!a.delta) return;
  float* N = w.A + n * n;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t m = 0; m < i; ++m) N[i * n + m] *= w.beta[i];
  cblas_strsm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasUnit, n, V, 1.0f, N, n, w.R, V);
}

// O = scale (Qg S + A Vn), the normalizer, then S ← F_last ⊙_rows S + Klᵀ Vn and z likewise.
void chunk_output_and_state(const DeltaRuleArgs& a, int64_t j, int64_t t0, int64_t n, float* S, float* z,
                            ChunkScratch& w) {
  const int64_t K = a.K, V = a.V, ew = gate_width(a);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, V, n, 1.0f, w.A, n, w.R, V, 1.0f, w.qks, V);
  for (int64_t i = 0; i < n; ++i) {
    float* o = a.out + ((t0 + i) * a.HV + j) * V;
    float f = a.scale;
    if (a.normalize) {
      float zq = dot(w.qk_g + i * K, z, K);
      for (int64_t m = 0; m <= i; ++m) zq += w.A[i * n + m] * w.beta[m];
      f = a.scale / (a.scale * zq + 1e-10f);
    }
    scale(w.qks + i * V, f, o, V);
  }
  const float* F_last = w.F + (n - 1) * ew;
  for (int64_t d = 0; d < K; ++d) scale(S + d * V, F_last[ew == 1 ? 0 : d], S + d * V, V);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, V, n, 1.0f, w.k_l, K, w.R, V, 1.0f, S, V);
  if (!a.normalize) return;
  for (int64_t d = 0; d < K; ++d) {
    float s = F_last[ew == 1 ? 0 : d] * z[d];
    for (int64_t m = 0; m < n; ++m) s += w.k_l[m * K + d] * w.beta[m];
    z[d] = s;
  }
}

void chunked_head(const DeltaRuleArgs& a, int64_t j, int chunk, ChunkScratch& w) {
  float* S = a.state + j * a.K * a.V;
  float* z = a.normalize ? a.z + j * a.K : nullptr;
  for (int64_t t0 = 0; t0 < a.T; t0 += chunk) {
    const int64_t n = std::min<int64_t>(chunk, a.T - t0);
    chunk_prepare(a, j, t0, n, w);
    if (a.gate == Gate::PerChannel) intra_per_channel(n, a.K, w);
    else intra_scalar_gate(n, a.K, a.delta, w);
    chunk_values(a, j, t0, n, S, w);
    chunk_output_and_state(a, j, t0, n, S, z, w);
  }
}

}  // namespace

void delta_rule_chunked(const DeltaRuleArgs& a, int chunk) {
  delta_rule_check_args(a);
  LINEAGE_CHECK(chunk >= 1 && chunk <= kMaxChunk, "chunk must be in [1, ", kMaxChunk, "], got ", chunk);
  if (a.T == 0) return;
  static const bool avx512 = std::string(gemv_table().isa) == "avx512";
  if (avx512 && delta_rule_chunked_avx512_supports(a)) {
    parallel_for(
        a.HV, [&](int64_t j0, int64_t j1) { delta_rule_chunked_heads_avx512(a, j0, j1, chunk); },
        grain_for(a.T * (3 * a.K * a.V + chunk * (a.K + a.V))));
    return;
  }
  parallel_for(
      a.HV,
      [&](int64_t j0, int64_t j1) {
        single_threaded_blas();
        thread_local ChunkScratch w;
        w.size_for(a.K, a.V, gate_width(a));
        for (int64_t j = j0; j < j1; ++j) chunked_head(a, j, chunk, w);
      },
      grain_for(a.T * (3 * a.K * a.V + chunk * (a.K + a.V))));
}

}  // namespace lineage::kernels
