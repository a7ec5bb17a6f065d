// The inner loop of kernels::latent_attention, written once: included by attention.cpp (the portable
// build) and by latent_attention_avx512.cpp (compiled with AVX-512 flags, so the same simd loops
// become 16-lane code). Internal linkage, like vmath_loops.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "lineage/kernels/x86/vmath_loops.h"

namespace lineage::kernels::latent_loops {
namespace {

constexpr int64_t kKeys = 64;       // keys per step of the online softmax
constexpr int64_t kMaxGroup = 8;    // heads that share one pass over the rows
constexpr int64_t kMaxValue = 1024; // = kLatentMaxValue: the accumulators live on the stack

// One step of one head's online softmax over n scores s (shifted in place): p = exp(s − m_new), the
// running maximum m and sum l updated; returns the factor the running output is rescaled by
// (exp(−inf) = 0 on the first step). Shared by the portable loop and the AVX-512 tiles.
inline float softmax_step(float* s, float* p, int64_t n, float& m, float& l) {
  float mx = m;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, s[j]);
  for (int64_t j = 0; j < n; ++j) s[j] -= mx;
  vmath_loops::exp_nonpositive(s, p, n);
  const float correction = std::exp(m - mx);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += p[j];
  l = l * correction + sum;
  m = mx;
  return correction;
}

// Heads [0, G) of one query (q + h·ldq) against n_keys shared rows (kv + j·ldkv; key = the first dk
// elements, value = the first dv), G <= kMaxGroup: each row is read once for the G heads while it
// is in L1. Per head the operations and their order do not depend on G.
inline void heads(const float* q, int64_t ldq, int64_t G, int64_t n_keys, const float* kv, int64_t ldkv, int64_t dk,
                  int64_t dv, float scale, float* out, int64_t ldo) {
  alignas(64) float acc[kMaxGroup][kMaxValue];
  alignas(64) float s[kMaxGroup][kKeys], p[kMaxGroup][kKeys];
  float m[kMaxGroup], l[kMaxGroup];
  for (int64_t h = 0; h < G; ++h) {
    m[h] = -INFINITY, l[h] = 0.0f;
    std::fill(acc[h], acc[h] + dv, 0.0f);
  }
  for (int64_t j0 = 0; j0 < n_keys; j0 += kKeys) {
    const int64_t n = std::min(kKeys, n_keys - j0);
    for (int64_t j = 0; j < n; ++j) {
      const float* k = kv + (j0 + j) * ldkv;
      for (int64_t h = 0; h < G; ++h) {
        const float* qh = q + h * ldq;
        float d = 0.0f;
#pragma omp simd reduction(+ : d)
        for (int64_t c = 0; c < dk; ++c) d += qh[c] * k[c];
        s[h][j] = d * scale;
      }
    }
    for (int64_t h = 0; h < G; ++h) {
      const float correction = softmax_step(s[h], p[h], n, m[h], l[h]);
      float* a = acc[h];
#pragma omp simd
      for (int64_t c = 0; c < dv; ++c) a[c] *= correction;
    }
    for (int64_t j = 0; j < n; ++j) {
      const float* v = kv + (j0 + j) * ldkv;
      for (int64_t h = 0; h < G; ++h) {
        const float pj = p[h][j];
        float* a = acc[h];
#pragma omp simd
        for (int64_t c = 0; c < dv; ++c) a[c] += pj * v[c];
      }
    }
  }
  for (int64_t h = 0; h < G; ++h) {
    const float inv = 1.0f / l[h];
    for (int64_t c = 0; c < dv; ++c) out[h * ldo + c] = acc[h][c] * inv;
  }
}

}  // namespace
}  // namespace lineage::kernels::latent_loops
