// AVX-512 chunked delta rule: the math of docs/math/delta_rule.md §3 for one value head and chunk at a
// time, with the small matmuls done by one register-tiled kernel (no BLAS call overhead for 16 × 64
// shapes) and the per-channel decayed dot products, exponentials and scalings in 16-lane loops.
// Everything except the two entry functions has internal linkage (this file has its own ISA flags).
// GCC 12 reports its own _mm512_undefined_* placeholders inside the shuffle / extract intrinsics as
// maybe-uninitialized (GCC bug 105593, fixed in 13); the pragma has to precede the intrinsics header.
// Over 400 lines, one concept: the AVX-512 delta-rule loops, kept in one file because it alone
// carries this ISA's compile flags.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "lineage/kernels/x86/delta_rule_avx512.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <vector>

#include "lineage/core/scratch.h"
#include "lineage/kernels/x86/avx512_util.h"

namespace lineage::kernels {
namespace {

constexpr int kMaxChunk = 64;
constexpr int64_t kPrefetchAhead = 1;  // work items (head, chunk) between a prefetch and its use

inline int64_t qk_head(const DeltaRuleArgs& a, int64_t j) { return j / (a.HV / a.H); }

// One reduction segment of a small matmul: Σ_k A(r, k) B[k, :], A(r, k) = a[r·rs + k·cs].
struct Seg {
  const float* a;
  int64_t rs, cs;
  const float* b;
  int64_t ldb, kk;
};

enum class Init { Zero, Load, LoadScaled };

// C rows [0, MR) × NZ·16 columns: init, then seg0 and seg1 in order. LoadScaled: C row r times rsc[r].
template <int MR, int NZ>
inline void tile(const Seg& s0, const Seg& s1, float* c, int64_t ldc, Init init, const float* rsc) {
  __m512 acc[MR][NZ];
  for (int m = 0; m < MR; ++m)
    for (int z = 0; z < NZ; ++z) {
      if (init == Init::Zero) acc[m][z] = _mm512_setzero_ps();
      else {
        acc[m][z] = _mm512_loadu_ps(c + m * ldc + 16 * z);
        if (init == Init::LoadScaled) acc[m][z] = _mm512_mul_ps(acc[m][z], _mm512_set1_ps(rsc[m]));
      }
    }
  for (const Seg* s : {&s0, &s1}) {
    const float* a = s->a;
    const float* b = s->b;
    for (int64_t k = 0; k < s->kk; ++k) {
      __m512 bv[NZ];
      for (int z = 0; z < NZ; ++z) bv[z] = _mm512_loadu_ps(b + k * s->ldb + 16 * z);
      for (int m = 0; m < MR; ++m) {
        const __m512 av = _mm512_set1_ps(a[m * s->rs + k * s->cs]);
        for (int z = 0; z < NZ; ++z) acc[m][z] = _mm512_fmadd_ps(av, bv[z], acc[m][z]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int z = 0; z < NZ; ++z) _mm512_storeu_ps(c + m * ldc + 16 * z, acc[m][z]);
}

// Columns [col, ...) of a segment; an empty segment (kk = 0) may have null pointers and stays as it is.
inline Seg from_col(const Seg& s, int64_t col) { return s.kk ? Seg{s.a, s.rs, s.cs, s.b + col, s.ldb, s.kk} : s; }

template <int MR>
inline void tile_cols(const Seg& s0, const Seg& s1, float* c, int64_t ldc, int64_t N, Init init, const float* rsc) {
  int64_t col = 0;
  for (; col + 64 <= N; col += 64) tile<MR, 4>(from_col(s0, col), from_col(s1, col), c + col, ldc, init, rsc);
  if (col == N) return;
  const Seg a = from_col(s0, col), b = from_col(s1, col);
  switch ((N - col) / 16) {
    case 1: tile<MR, 1>(a, b, c + col, ldc, init, rsc); break;
    case 2: tile<MR, 2>(a, b, c + col, ldc, init, rsc); break;
    default: tile<MR, 3>(a, b, c + col, ldc, init, rsc); break;
  }
}

// C[M, N] (N a multiple of 16) = init(C) + seg0 + seg1 (seg1.kk may be 0).
void small_gemm(int64_t M, int64_t N, Seg s0, Seg s1, float* c, int64_t ldc, Init init, const float* rsc) {
  int64_t r = 0;
  for (; r + 4 <= M; r += 4) {
    tile_cols<4>(s0, s1, c + r * ldc, ldc, N, init, rsc ? rsc + r : nullptr);
    s0.a += 4 * s0.rs;
    s1.a += 4 * s1.rs;
  }
  switch (M - r) {
    case 1: tile_cols<1>(s0, s1, c + r * ldc, ldc, N, init, rsc ? rsc + r : nullptr); break;
    case 2: tile_cols<2>(s0, s1, c + r * ldc, ldc, N, init, rsc ? rsc + r : nullptr); break;
    case 3: tile_cols<3>(s0, s1, c + r * ldc, ldc, N, init, rsc ? rsc + r : nullptr); break;
    default: break;
  }
}

// Every array starts on a cache line (a vector load across two lines costs a second access).
struct Scratch {
  std::vector<char> mem;
  float *e, *F, *Bk, *qg, *kg, *kl, *A, *N, *U, *kd, *beta;
  void size_for(int64_t K, int64_t V) {
    const int64_t C = kMaxChunk;
    const int64_t sizes[] = {C * K, K, K, C * K, C * K, C * K, C * C, C * C, C * V, K, C};
    float** ptrs[] = {&e, &F, &Bk, &qg, &kg, &kl, &A, &N, &U, &kd, &beta};
    int64_t total = 0;
    for (int64_t s : sizes) total += (s + 15) / 16 * 16;
    float* p = static_cast<float*>(aligned_scratch(mem, size_t(total) * sizeof(float)));
    for (size_t i = 0; i < std::size(sizes); ++i) {
      *ptrs[i] = p;
      p += (sizes[i] + 15) / 16 * 16;
    }
  }
};

// Aᵀ (column j of A = row j of w.A: scale · decayed q_i·k_j for i ≥ j, else 0) and Nᵀ (β_i · decayed
// k_i·k_j for i > j, else 0). Column j grows k_j ⊙ D_ij one factor e_i at a time (per channel), so every
// factor is a product of steps ≤ 1; a scalar gate multiplies the plain dot products by D_ij instead.
// KB = K / 16 held in registers, or 0 for any K (multiple of 16) through memory.
template <int KB, bool kPC>
void intra(const DeltaRuleArgs& a, const float* q0, const float* k0, int64_t qs, int64_t n, const float* es,
           Scratch& w) {
  const int64_t K = a.K, kb = KB ? KB : K / 16;
  __m512 kdr[KB ? KB : 1];
  float dsc[kMaxChunk];
  for (int64_t jj = 0; jj < n; ++jj) {
    const float* kj = k0 + jj * qs;
    if constexpr (KB) {
      for (int b = 0; b < KB; ++b) kdr[b] = _mm512_loadu_ps(kj + 16 * b);
    } else {
      for (int64_t d = 0; d < K; d += 16) _mm512_storeu_ps(w.kd + d, _mm512_loadu_ps(kj + d));
    }
    if constexpr (!kPC) {
      dsc[jj] = 1.0f;
      for (int64_t i = jj + 1; i < n; ++i) dsc[i] = dsc[i - 1] * es[i];
    }
    const int64_t b0 = jj / 16 * 16;
    for (int64_t i = 0; i < b0; ++i) w.A[jj * n + i] = w.N[jj * n + i] = 0.0f;
    for (int64_t ib = b0; ib < n; ib += 16) {
      __m512 va[16], vn[16];
      for (int64_t l = 0; l < 16; ++l) {
        const int64_t i = ib + l;
        if (i < jj || i >= n) {
          va[l] = vn[l] = _mm512_setzero_ps();
          continue;
        }
        const float *qi = q0 + i * qs, *ki = k0 + i * qs;
        const float* ei = w.e + i * K;
        __m512 sa = _mm512_setzero_ps(), sn = _mm512_setzero_ps();
        for (int64_t b = 0; b < kb; ++b) {
          __m512 kd;
          if constexpr (KB) kd = kdr[b];
          else kd = _mm512_loadu_ps(w.kd + 16 * b);
          if (kPC && i > jj) {
            kd = _mm512_mul_ps(kd, _mm512_loadu_ps(ei + 16 * b));
            if constexpr (KB) kdr[b] = kd;
            else _mm512_storeu_ps(w.kd + 16 * b, kd);
          }
          sa = _mm512_fmadd_ps(_mm512_loadu_ps(qi + 16 * b), kd, sa);
          sn = _mm512_fmadd_ps(_mm512_loadu_ps(ki + 16 * b), kd, sn);
        }
        va[l] = sa;
        vn[l] = i == jj ? _mm512_setzero_ps() : sn;
      }
      const __mmask16 m = static_cast<__mmask16>(n - ib >= 16 ? 0xffff : (1u << (n - ib)) - 1);
      __m512 ra = _mm512_mul_ps(avx512::hsum16(va), _mm512_set1_ps(a.scale));
      __m512 rn = _mm512_mul_ps(avx512::hsum16(vn), _mm512_maskz_loadu_ps(m, w.beta + ib));
      if constexpr (!kPC) {
        const __m512 dv = _mm512_maskz_loadu_ps(m, dsc + ib);
        ra = _mm512_mul_ps(ra, dv);
        rn = _mm512_mul_ps(rn, dv);
      }
      _mm512_mask_storeu_ps(w.A + jj * n + ib, m, ra);
      _mm512_mask_storeu_ps(w.N + jj * n + ib, m, rn);
    }
  }
}

void chunk_step(const DeltaRuleArgs& a, int64_t j, int64_t t0, int64_t n, float* S, Scratch& w) {
  const int64_t K = a.K, V = a.V, h = qk_head(a, j), qs = a.H * K;
  const bool pc = a.gate == Gate::PerChannel;
  const float* q0 = a.q + (t0 * a.H + h) * K;
  const float* k0 = a.k + (t0 * a.H + h) * K;
  const __m512 vscale = _mm512_set1_ps(a.scale);

  // Per-step factors e_i, F_i = e_0 ⊙ … ⊙ e_i; Qg = scale·Q ⊙ F, Kg = K ⊙ F; β.
  float fs = 1.0f, es[kMaxChunk];
  for (int64_t i = 0; i < n; ++i) {
    w.beta[i] = a.beta ? a.beta[(t0 + i) * a.HV + j] : 1.0f;
    const float *qi = q0 + i * qs, *ki = k0 + i * qs;
    if (pc) {
      const float* g = a.log_decay + ((t0 + i) * a.HV + j) * K;
      for (int64_t d = 0; d < K; d += 16) {
        const __m512 e = avx512::exp_nonpositive16(_mm512_loadu_ps(g + d));
        _mm512_storeu_ps(w.e + i * K + d, e);
        const __m512 f = i == 0 ? e : _mm512_mul_ps(_mm512_loadu_ps(w.F + d), e);
        _mm512_storeu_ps(w.F + d, f);
        _mm512_storeu_ps(w.qg + i * K + d, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(qi + d), f), vscale));
        _mm512_storeu_ps(w.kg + i * K + d, _mm512_mul_ps(_mm512_loadu_ps(ki + d), f));
      }
    } else {
      es[i] = a.gate == Gate::PerHead ? std::exp(a.log_decay[(t0 + i) * a.HV + j]) : 1.0f;
      fs = i == 0 ? es[i] : fs * es[i];
      const __m512 f = _mm512_set1_ps(fs), fq = _mm512_set1_ps(fs * a.scale);
      for (int64_t d = 0; d < K; d += 16) {
        _mm512_storeu_ps(w.qg + i * K + d, _mm512_mul_ps(_mm512_loadu_ps(qi + d), fq));
        _mm512_storeu_ps(w.kg + i * K + d, _mm512_mul_ps(_mm512_loadu_ps(ki + d), f));
      }
    }
  }
  // Kl = K ⊙ exp(G_last − G_i), built from the last row backwards.
  if (pc) {
    for (int64_t d = 0; d < K; d += 16) _mm512_storeu_ps(w.Bk + d, _mm512_set1_ps(1.0f));
    for (int64_t i = n - 1; i >= 0; --i)
      for (int64_t d = 0; d < K; d += 16) {
        __m512 b = _mm512_loadu_ps(w.Bk + d);
        if (i < n - 1) b = _mm512_mul_ps(b, _mm512_loadu_ps(w.e + (i + 1) * K + d));
        _mm512_storeu_ps(w.Bk + d, b);
        _mm512_storeu_ps(w.kl + i * K + d, _mm512_mul_ps(_mm512_loadu_ps(k0 + i * qs + d), b));
      }
  } else {
    float b = 1.0f;
    for (int64_t i = n - 1; i >= 0; --i) {
      if (i < n - 1) b *= es[i + 1];
      const __m512 bv = _mm512_set1_ps(b);
      for (int64_t d = 0; d < K; d += 16)
        _mm512_storeu_ps(w.kl + i * K + d, _mm512_mul_ps(_mm512_loadu_ps(k0 + i * qs + d), bv));
    }
  }

  if (pc) {
    switch (K / 16) {
      case 1: intra<1, true>(a, q0, k0, qs, n, es, w); break;
      case 2: intra<2, true>(a, q0, k0, qs, n, es, w); break;
      case 3: intra<3, true>(a, q0, k0, qs, n, es, w); break;
      case 4: intra<4, true>(a, q0, k0, qs, n, es, w); break;
      default: intra<0, true>(a, q0, k0, qs, n, es, w); break;
    }
  } else {
    switch (K / 16) {
      case 1: intra<1, false>(a, q0, k0, qs, n, es, w); break;
      case 2: intra<2, false>(a, q0, k0, qs, n, es, w); break;
      case 3: intra<3, false>(a, q0, k0, qs, n, es, w); break;
      case 4: intra<4, false>(a, q0, k0, qs, n, es, w); break;
      default: intra<0, false>(a, q0, k0, qs, n, es, w); break;
    }
  }

  // U: KS = Kg S (delta), R = β (v − KS) or β v, then (I + N) U = R by forward substitution.
  const float* v0 = a.v + (t0 * a.HV + j) * V;
  const int64_t vs = a.HV * V;
  const Seg none{nullptr, 0, 0, nullptr, 0, 0};
  if (a.delta) small_gemm(n, V, Seg{w.kg, K, 1, S, V, K}, none, w.U, V, Init::Zero, nullptr);
  for (int64_t c = 0; c < V; c += 16) {
    __m512 u[kMaxChunk];
    for (int64_t i = 0; i < n; ++i) {
      const __m512 vi = _mm512_loadu_ps(v0 + i * vs + c);
      __m512 r = a.delta ? _mm512_sub_ps(vi, _mm512_loadu_ps(w.U + i * V + c)) : vi;
      r = _mm512_mul_ps(r, _mm512_set1_ps(w.beta[i]));
      if (a.delta)
        for (int64_t m = 0; m < i; ++m) r = _mm512_fnmadd_ps(_mm512_set1_ps(w.N[m * n + i]), u[m], r);
      u[i] = r;
      _mm512_storeu_ps(w.U + i * V + c, r);
    }
  }

  // O = scale (Qg S + A U), written straight to out; then S ← F_last ⊙_rows S + Klᵀ U.
  small_gemm(n, V, Seg{w.qg, K, 1, S, V, K}, Seg{w.A, 1, n, w.U, V, n}, a.out + (t0 * a.HV + j) * V, vs, Init::Zero,
             nullptr);
  const float* rsc = w.F;
  if (!pc) {
    for (int64_t d = 0; d < K; ++d) w.F[d] = fs;
  }
  small_gemm(K, V, Seg{w.kl, 1, K, w.U, V, n}, none, S, V, Init::LoadScaled, rsc);
}

__attribute__((noinline)) Scratch& thread_scratch() {
  thread_local Scratch w;
  return w;
}

// The input rows of one (head, chunk) work item into cache.
void prefetch_chunk(const DeltaRuleArgs& a, int64_t j, int64_t t0, int64_t n) {
  const int64_t h = qk_head(a, j), K = a.K, V = a.V;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = t0 + i;
    const char* q = reinterpret_cast<const char*>(a.q + (t * a.H + h) * K);
    const char* k = reinterpret_cast<const char*>(a.k + (t * a.H + h) * K);
    const char* v = reinterpret_cast<const char*>(a.v + (t * a.HV + j) * V);
    for (int64_t b = 0; b < K * 4; b += 64) {
      _mm_prefetch(q + b, _MM_HINT_T0);
      _mm_prefetch(k + b, _MM_HINT_T0);
    }
    for (int64_t b = 0; b < V * 4; b += 64) _mm_prefetch(v + b, _MM_HINT_T0);
    if (a.gate == Gate::PerChannel) {
      const char* g = reinterpret_cast<const char*>(a.log_decay + (t * a.HV + j) * K);
      for (int64_t b = 0; b < K * 4; b += 64) _mm_prefetch(g + b, _MM_HINT_T0);
    }
  }
}

// Recurrent path (docs/math/delta_rule.md §2) for the state columns [c0, c0 + 16·VB) of value head j:
// one sweep over those columns per token applies the pending write of token t−1, the decay, and sums
// S̃ᵀk and S̃ᵀq, with the VB column vectors in registers. No column's arithmetic involves another
// column, so a head's columns can be swept as separate blocks, in any order, with equal results.
// Given `packed` (K·16·VB floats; the caller passes it when the block is narrower than the head and
// there is more than one token), the block's rows are first copied next to each other there and back
// at the end: left in place, rows V floats apart fall into a few L1 sets (at V = 512, 2 KiB apart:
// two of 64), so the block misses L1 at every token (K = 256, V = 512: 4096 tokens in 414 ms
// unpacked, 134 packed; the chunked kernel takes 81-96 ms there).
template <int VB>
void recurrent_block(const DeltaRuleArgs& a, int64_t j, int64_t c0, float* e, float* packed) {
  const int64_t K = a.K, V = a.V, h = qk_head(a, j);
  const bool pc = a.gate == Gate::PerChannel;
  float* const home = a.state + j * K * V + c0;  // row d of the block starts at home + d·V
  const bool pack = packed != nullptr;
  const int64_t ld = pack ? 16 * VB : V;
  float* S = pack ? packed : home;
  if (pack)
    for (int64_t d = 0; d < K; ++d) std::copy(home + d * V, home + d * V + 16 * VB, S + d * ld);
  const float* kp = nullptr;  // previous token's k (the pending write is kp upᵀ)
  __m512 up[VB];
  for (int b = 0; b < VB; ++b) up[b] = _mm512_setzero_ps();
  for (int64_t t = 0; t < a.T; ++t) {
    const float *q = a.q + (t * a.H + h) * K, *k = a.k + (t * a.H + h) * K, *v = a.v + (t * a.HV + j) * V + c0;
    if (t + 4 < a.T) {
      const int64_t tn = t + 4;
      for (int64_t b = 0; b < K; b += 16) {
        _mm_prefetch(reinterpret_cast<const char*>(a.q + (tn * a.H + h) * K + b), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(a.k + (tn * a.H + h) * K + b), _MM_HINT_T0);
        if (pc) _mm_prefetch(reinterpret_cast<const char*>(a.log_decay + (tn * a.HV + j) * K + b), _MM_HINT_T0);
      }
      for (int b = 0; b < VB; ++b)
        _mm_prefetch(reinterpret_cast<const char*>(a.v + (tn * a.HV + j) * V + c0 + 16 * b), _MM_HINT_T0);
    }
    float es = 1.0f;
    if (pc) {
      const float* g = a.log_decay + (t * a.HV + j) * K;
      for (int64_t d = 0; d < K; d += 16) _mm512_storeu_ps(e + d, avx512::exp_nonpositive16(_mm512_loadu_ps(g + d)));
    } else if (a.gate == Gate::PerHead) {
      es = std::exp(a.log_decay[t * a.HV + j]);
    }
    __m512 ks[VB], qs[VB];
    for (int b = 0; b < VB; ++b) ks[b] = qs[b] = _mm512_setzero_ps();
    for (int64_t d = 0; d < K; ++d) {
      float* Sd = S + d * ld;
      const __m512 ed = _mm512_set1_ps(pc ? e[d] : es), pk = _mm512_set1_ps(kp ? kp[d] : 0.0f);
      const __m512 kd = _mm512_set1_ps(k[d]), qd = _mm512_set1_ps(q[d]);
      for (int b = 0; b < VB; ++b) {
        const __m512 sv = _mm512_mul_ps(_mm512_fmadd_ps(pk, up[b], _mm512_loadu_ps(Sd + 16 * b)), ed);
        _mm512_storeu_ps(Sd + 16 * b, sv);
        if (a.delta) ks[b] = _mm512_fmadd_ps(kd, sv, ks[b]);
        qs[b] = _mm512_fmadd_ps(qd, sv, qs[b]);
      }
    }
    __m512 qkv = _mm512_setzero_ps();
    for (int64_t d = 0; d < K; d += 16) qkv = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(k + d), qkv);
    const __m512 qk = _mm512_set1_ps(_mm512_reduce_add_ps(qkv));
    const __m512 bv = _mm512_set1_ps(a.beta ? a.beta[t * a.HV + j] : 1.0f), sc = _mm512_set1_ps(a.scale);
    float* o = a.out + (t * a.HV + j) * V + c0;
    for (int b = 0; b < VB; ++b) {
      const __m512 vv = _mm512_loadu_ps(v + 16 * b);
      up[b] = _mm512_mul_ps(bv, a.delta ? _mm512_sub_ps(vv, ks[b]) : vv);
      _mm512_storeu_ps(o + 16 * b, _mm512_mul_ps(sc, _mm512_fmadd_ps(qk, up[b], qs[b])));
    }
    kp = k;
  }
  for (int64_t d = 0; kp && d < K; ++d) {
    const __m512 pk = _mm512_set1_ps(kp[d]);
    for (int b = 0; b < VB; ++b)
      _mm512_storeu_ps(S + d * ld + 16 * b, _mm512_fmadd_ps(pk, up[b], _mm512_loadu_ps(S + d * ld + 16 * b)));
  }
  if (pack)
    for (int64_t d = 0; d < K; ++d) std::copy(S + d * ld, S + d * ld + 16 * VB, home + d * V);
}

// A head's V / 16 column vectors in blocks of at most four (the registers one sweep keeps), split as
// evenly as they go: `count` blocks, the first `extra` of base + 1 vectors, the rest of `base`. Blocks
// as wide as the registers allow, whatever K: narrower blocks that fit L1 (32 KiB: two vectors at
// K = 256) were slower both ways at K = 256, V = 512 (a decode step 226 vs 110 µs, reading 128-byte
// pieces of rows 2 KiB apart; 4096 tokens 147 vs 134 ms with the block packed, in L2).
struct ColumnBlocks {
  int64_t count, base, extra;
};

ColumnBlocks column_blocks(const DeltaRuleArgs& a) {
  const int64_t vectors = a.V / 16, count = (vectors + 3) / 4;
  return {count, vectors / count, vectors % count};
}

}  // namespace

bool delta_rule_recurrent_avx512_supports(const DeltaRuleArgs& a) {
  return a.K % 16 == 0 && a.V % 16 == 0 && !a.normalize;
}

int64_t delta_rule_recurrent_avx512_items(const DeltaRuleArgs& a) { return a.HV * column_blocks(a).count; }

void delta_rule_recurrent_items_avx512(const DeltaRuleArgs& a, int64_t i0, int64_t i1) {
  const ColumnBlocks cb = column_blocks(a);
  // Per thread, kept from call to call: a token's decay factors (K floats), then, when rows get
  // packed, one block's rows side by side (recurrent_block).
  thread_local std::vector<char> mem;
  const int64_t e_floats = (a.K + 15) / 16 * 16;
  const int64_t packed_floats = a.T > 1 && cb.count > 1 ? a.K * 16 * (cb.base + 1) : 0;
  float* const e = static_cast<float*>(aligned_scratch(mem, size_t(e_floats + packed_floats) * sizeof(float)));
  float* const packed = packed_floats ? e + e_floats : nullptr;
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t j = i / cb.count, blk = i % cb.count;
    const int64_t c0 = 16 * (blk * cb.base + std::min(blk, cb.extra));
    switch (cb.base + (blk < cb.extra ? 1 : 0)) {
      case 1: recurrent_block<1>(a, j, c0, e, packed); break;
      case 2: recurrent_block<2>(a, j, c0, e, packed); break;
      case 3: recurrent_block<3>(a, j, c0, e, packed); break;
      default: recurrent_block<4>(a, j, c0, e, packed); break;
    }
  }
}

bool delta_rule_chunked_avx512_supports(const DeltaRuleArgs& a) {
  return a.K % 16 == 0 && a.V % 16 == 0 && !a.normalize;
}

void delta_rule_chunked_heads_avx512(const DeltaRuleArgs& a, int64_t j0, int64_t j1, int chunk) {
  Scratch& w = thread_scratch();
  w.size_for(a.K, a.V);
  // Chunks outer, heads inner: the rows one chunk reads for heads j0 .. j1 are contiguous, and the
  // next work item's rows are prefetched while this one computes. Each head's arithmetic is the same
  // in any order.
  for (int64_t t0 = 0; t0 < a.T; t0 += chunk) {
    const int64_t n = std::min<int64_t>(chunk, a.T - t0);
    for (int64_t j = j0; j < j1; ++j) {
      int64_t jn = j + kPrefetchAhead, tn = t0;
      while (jn >= j1) jn -= j1 - j0, tn += chunk;
      if (tn < a.T) prefetch_chunk(a, jn, tn, std::min<int64_t>(chunk, a.T - tn));
      chunk_step(a, j, t0, n, a.state + j * a.K * a.V, w);
    }
  }
}

}  // namespace lineage::kernels
