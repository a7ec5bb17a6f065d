// AVX-512 build of latent (multi-query) attention: G <= 8 heads of one token against rows shared by
// every head. Register tiles over heads × keys, so a row is loaded once for four heads:
//   scores: 4 heads × 4 keys of 16-lane partial dot products (16 zmm), 8 loads per 16 FMAs, then
//     one transposing reduction of the 16 (avx512::hsum16);
//   values: 4 heads × 64 columns (16 zmm) over the step's keys, 4 loads + 4 broadcasts per 16 FMAs.
// Heads and keys short of a full tile are padded with repeats of the last one and their results
// dropped, so every (head, key) pair runs the same instructions: a head's result does not depend on
// how many heads share its group or where its keys fall in a step.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as in attention_avx512.cpp
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "lineage/kernels/x86/attention.h"
#include "lineage/kernels/x86/avx512_util.h"
#include "lineage/kernels/x86/latent_attention_loops.h"
#include "lineage/kernels/x86/vmath_loops.h"

namespace lineage::kernels {

namespace {

constexpr int64_t kKeys = latent_loops::kKeys, kMaxGroup = latent_loops::kMaxGroup;

inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1); }

// s[h][j] = scale · q_h·k_j for 4 heads (rows q[0..3]) and 4 keys (rows k[0..3]), dk channels.
inline void scores4x4(const float* const q[4], const float* const k[4], int64_t dk, float scale, float out[16]) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < dk; c += 16) {
    const __mmask16 m = lanes(dk - c);
    __m512 qv[4], kv[4];
    for (int i = 0; i < 4; ++i) qv[i] = _mm512_maskz_loadu_ps(m, q[i] + c), kv[i] = _mm512_maskz_loadu_ps(m, k[i] + c);
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[h * 4 + j] = _mm512_fmadd_ps(qv[h], kv[j], acc[h * 4 + j]);
  }
  _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_set1_ps(scale), avx512::hsum16(acc)));
}

// O[h][c0 .. c0 + 64) += Σ_j p[h][j] · v_j[c0 ..] for 4 heads (rows o[0..3], weights p[0..3]) over n keys.
template <bool Full>
inline void values4(float* const o[4], const float* const p[4], const float* v, int64_t ldv, int64_t n, int64_t cols) {
  __mmask16 m[4];
  for (int u = 0; u < 4; ++u) m[u] = lanes(cols - 16 * u);
  __m512 acc[4][4];
  for (int h = 0; h < 4; ++h)
    for (int u = 0; u < 4; ++u) acc[h][u] = Full ? _mm512_loadu_ps(o[h] + 16 * u) : _mm512_maskz_loadu_ps(m[u], o[h] + 16 * u);
  for (int64_t j = 0; j < n; ++j, v += ldv) {
    __m512 vv[4];
    for (int u = 0; u < 4; ++u) vv[u] = Full ? _mm512_loadu_ps(v + 16 * u) : _mm512_maskz_loadu_ps(m[u], v + 16 * u);
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
      const __m512 ph = _mm512_set1_ps(p[h][j]);
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc[h][u] = _mm512_fmadd_ps(ph, vv[u], acc[h][u]);
    }
  }
  for (int h = 0; h < 4; ++h)
    for (int u = 0; u < 4; ++u) {
      if (Full) _mm512_storeu_ps(o[h] + 16 * u, acc[h][u]);
      else _mm512_mask_storeu_ps(o[h] + 16 * u, m[u], acc[h][u]);
    }
}

}  // namespace

void latent_heads_avx512(const float* q, int64_t ldq, int64_t G, int64_t n_keys, const float* kv, int64_t ldkv,
                         int64_t dk, int64_t dv, float scale, float* out, int64_t ldo) {
  // Rows of 8 heads (+ padding to a multiple of 4 with repeats of the last; their sums are dropped).
  alignas(64) float O[kMaxGroup][latent_loops::kMaxValue];
  alignas(64) float s[kMaxGroup][kKeys], p[kMaxGroup][kKeys];
  float m[kMaxGroup], l[kMaxGroup];
  const int64_t Gp = (G + 3) / 4 * 4;
  for (int64_t h = 0; h < Gp; ++h) {
    m[h] = -INFINITY, l[h] = 0.0f;
    std::fill(O[h], O[h] + dv, 0.0f);
  }
  for (int64_t j0 = 0; j0 < n_keys; j0 += kKeys) {
    const int64_t n = std::min(kKeys, n_keys - j0);
    float tile[16];
    for (int64_t h0 = 0; h0 < Gp; h0 += 4)
      for (int64_t jj = 0; jj < n; jj += 4) {
        const float* qs[4];
        const float* ks[4];
        for (int i = 0; i < 4; ++i) {
          qs[i] = q + std::min(h0 + i, G - 1) * ldq;
          ks[i] = kv + (j0 + std::min<int64_t>(jj + i, n - 1)) * ldkv;
        }
        scores4x4(qs, ks, dk, scale, tile);
        for (int h = 0; h < 4; ++h)
          for (int j = 0; j < 4 && jj + j < n; ++j) s[h0 + h][jj + j] = tile[h * 4 + j];
      }
    for (int64_t h = 0; h < Gp; ++h) {  // the online softmax, as the portable loop does it
      const float correction = latent_loops::softmax_step(s[h], p[h], n, m[h], l[h]);
      const __m512 vc = _mm512_set1_ps(correction);
      for (int64_t c = 0; c < dv; c += 16) {
        const __mmask16 k = lanes(dv - c);
        _mm512_mask_storeu_ps(O[h] + c, k, _mm512_mul_ps(vc, _mm512_maskz_loadu_ps(k, O[h] + c)));
      }
    }
    for (int64_t h0 = 0; h0 < Gp; h0 += 4) {
      float* os[4] = {O[h0], O[h0 + 1], O[h0 + 2], O[h0 + 3]};
      const float* ps[4] = {p[h0], p[h0 + 1], p[h0 + 2], p[h0 + 3]};
      for (int64_t c0 = 0; c0 < dv; c0 += 64) {
        float* oc[4] = {os[0] + c0, os[1] + c0, os[2] + c0, os[3] + c0};
        if (dv - c0 >= 64) values4<true>(oc, ps, kv + j0 * ldkv + c0, ldkv, n, 64);
        else values4<false>(oc, ps, kv + j0 * ldkv + c0, ldkv, n, dv - c0);
      }
    }
  }
  for (int64_t h = 0; h < G; ++h) {
    const float inv = 1.0f / l[h];
    for (int64_t c = 0; c < dv; ++c) out[h * ldo + c] = O[h][c] * inv;
  }
}

}  // namespace lineage::kernels
