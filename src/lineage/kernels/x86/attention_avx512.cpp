// AVX-512 build of prefill attention's query tile (attention.cpp keeps the portable one): the scores
// through the f32 GEMM block, the online softmax in 16-lane passes, and the weighted values by a
// register tile that reads V's rows in place (no packing, no 48-column padding of a 64-wide head).

// GCC 12 flags the _mm512_undefined_* placeholders inside its own AVX-512 intrinsics as maybe
// uninitialized once they are inlined (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "lineage/core/scratch.h"
#include "lineage/kernels/x86/attention.h"
#include "lineage/kernels/x86/gemm.h"
#include "lineage/kernels/x86/vmath_loops.h"

namespace lineage::kernels {
namespace {

inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1); }

// o[M rows, 64 columns from c0] += Σ_j p[m, j] · v[j, c0 ..], j < nk; columns past hd masked off.
// Four zmm per row, M × 4 accumulators; v's rows are read where they lie.
template <int M>
void weighted_values(const float* p, int64_t ldp, int64_t nk, const float* v, int64_t hd, int64_t c0, float* o,
                     int64_t ldo) {
  const __mmask16 k0 = lanes(hd - c0), k1 = lanes(hd - c0 - 16), k2 = lanes(hd - c0 - 32), k3 = lanes(hd - c0 - 48);
  __m512 acc[M][4];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) {
    const float* om = o + m * ldo + c0;
    acc[m][0] = _mm512_maskz_loadu_ps(k0, om);
    acc[m][1] = _mm512_maskz_loadu_ps(k1, om + 16);
    acc[m][2] = _mm512_maskz_loadu_ps(k2, om + 32);
    acc[m][3] = _mm512_maskz_loadu_ps(k3, om + 48);
  }
  const float* vj = v + c0;
  for (int64_t j = 0; j < nk; ++j, vj += hd) {
    const __m512 v0 = _mm512_maskz_loadu_ps(k0, vj), v1 = _mm512_maskz_loadu_ps(k1, vj + 16),
                 v2 = _mm512_maskz_loadu_ps(k2, vj + 32), v3 = _mm512_maskz_loadu_ps(k3, vj + 48);
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m512 a = _mm512_set1_ps(p[m * ldp + j]);
      acc[m][0] = _mm512_fmadd_ps(a, v0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(a, v1, acc[m][1]);
      acc[m][2] = _mm512_fmadd_ps(a, v2, acc[m][2]);
      acc[m][3] = _mm512_fmadd_ps(a, v3, acc[m][3]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) {
    float* om = o + m * ldo + c0;
    _mm512_mask_storeu_ps(om, k0, acc[m][0]);
    _mm512_mask_storeu_ps(om + 16, k1, acc[m][1]);
    _mm512_mask_storeu_ps(om + 32, k2, acc[m][2]);
    _mm512_mask_storeu_ps(om + 48, k3, acc[m][3]);
  }
}

using ValuesFn = void (*)(const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*, int64_t);
constexpr int kRows = 6;  // 6 × 4 = 24 accumulators
constexpr ValuesFn kValues[kRows + 1] = {nullptr,           weighted_values<1>, weighted_values<2>, weighted_values<3>,
                                         weighted_values<4>, weighted_values<5>, weighted_values<6>};

float row_max(const float* x, int64_t n, float start) {
  __m512 m = _mm512_set1_ps(start);
  for (int64_t c = 0; c < n; c += 16) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, lanes(n - c), x + c));
  return _mm512_reduce_max_ps(m);
}

}  // namespace

void attend_tile_avx512(const float* q, int64_t ldq, int64_t nq, int64_t first_pos, const float* k, const float* v,
                        int64_t hd, float scale, float* out, int64_t ldo) {
  const GemmPath& gemm = gemm_exact_avx512();
  // Per-thread working space, grown once: the tile's queries (contiguous, pre-scaled), scores,
  // running output, row maxima and sums, one row of shifted scores.
  thread_local std::vector<float> buf;
  thread_local std::vector<char> scratch_buf;
  void* scratch = aligned_scratch(scratch_buf, gemm.scratch_bytes);
  buf.resize(size_t(2 * kAttentionQueryTile * hd + kAttentionQueryTile * kAttentionKeyTile + 2 * kAttentionQueryTile +
                    kAttentionKeyTile));
  float* Q = buf.data();
  float* O = Q + kAttentionQueryTile * hd;
  float* S = O + kAttentionQueryTile * hd;
  float* m = S + kAttentionQueryTile * kAttentionKeyTile;
  float* l = m + kAttentionQueryTile;
  float* tmp = l + kAttentionQueryTile;
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t c = 0; c < hd; c += 16) {
      const __mmask16 km = lanes(hd - c);
      _mm512_mask_storeu_ps(Q + i * hd + c, km, _mm512_mul_ps(vscale, _mm512_maskz_loadu_ps(km, q + i * ldq + c)));
    }
  std::fill(O, O + nq * hd, 0.0f);
  std::fill(m, m + nq, -INFINITY);
  std::fill(l, l + nq, 0.0f);
  const int64_t n_keys = first_pos + nq;  // keys visible to the tile's last query
  for (int64_t j0 = 0; j0 < n_keys; j0 += kAttentionKeyTile) {
    const int64_t nk = std::min(kAttentionKeyTile, n_keys - j0);
    const GemmProblem scores{Q, k + j0 * hd, 0, true, nq, hd, nk, S};
    for (int64_t o0 = 0; o0 < nk; o0 += gemm.nc_max)
      gemm.block(scores, nullptr, 0, nq, o0, std::min(nk, o0 + gemm.nc_max), scratch);
    for (int64_t i = 0; i < nq; ++i) {
      float* row = S + i * nk;
      const int64_t valid = std::clamp<int64_t>(first_pos + i + 1 - j0, 0, nk);  // causal: key ≤ query
      if (valid == 0) {
        std::fill(row, row + nk, 0.0f);
        continue;
      }
      const float mx = row_max(row, valid, m[i]);
      const float correction = std::exp(m[i] - mx);  // exp(-inf) = 0 on the first tile
      const __m512 vmx = _mm512_set1_ps(mx);
      for (int64_t c = 0; c < valid; c += 16)
        _mm512_storeu_ps(tmp + c, _mm512_sub_ps(_mm512_maskz_loadu_ps(lanes(valid - c), row + c), vmx));
      vmath_loops::exp_nonpositive(tmp, row, valid);
      __m512 sum = _mm512_setzero_ps();
      for (int64_t c = 0; c < valid; c += 16) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(lanes(valid - c), row + c));
      std::fill(row + valid, row + nk, 0.0f);
      l[i] = l[i] * correction + _mm512_reduce_add_ps(sum);
      m[i] = mx;
      if (correction != 1.0f) {
        const __m512 vc = _mm512_set1_ps(correction);
        for (int64_t c = 0; c < hd; c += 16) {
          const __mmask16 km = lanes(hd - c);
          _mm512_mask_storeu_ps(O + i * hd + c, km, _mm512_mul_ps(vc, _mm512_maskz_loadu_ps(km, O + i * hd + c)));
        }
      }
    }
    for (int64_t i = 0; i < nq; i += kRows) {
      const ValuesFn f = kValues[std::min<int64_t>(kRows, nq - i)];
      for (int64_t c0 = 0; c0 < hd; c0 += 64) f(S + i * nk, nk, nk, v + j0 * hd, hd, c0, O + i * hd, hd);
    }
  }
  for (int64_t i = 0; i < nq; ++i) {
    const __m512 inv = _mm512_set1_ps(1.0f / l[i]);
    for (int64_t c = 0; c < hd; c += 16) {
      const __mmask16 km = lanes(hd - c);
      _mm512_mask_storeu_ps(out + i * ldo + c, km, _mm512_mul_ps(inv, _mm512_maskz_loadu_ps(km, O + i * hd + c)));
    }
  }
}

}  // namespace lineage::kernels
