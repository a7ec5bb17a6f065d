// AVX-512 pieces shared by the GEMM blocks (gemm_avx512.cpp, gemm_avx512bf16.cpp): the register tile's
// shape, edge masks, the tile's load/store of y, and the walk over a block's panels and tiles.
// Internal linkage on purpose: each includer is compiled with its own ISA flags, and a shared inline
// definition could be merged into the wrong one by the linker.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "lineage/kernels/x86/avx512_util.h"
#include "lineage/kernels/x86/gemm.h"

namespace lineage::kernels::gemm_avx512 {
namespace {

constexpr int kMR = 8;   // rows of y per register tile; each broadcasts one x element per step
constexpr int kNR = 48;  // columns of y per register tile: three zmm, 8 × 3 = 24 accumulators

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
using avx512::transpose16x16;

// Lanes [0, n) set; n may be <= 0 or >= 16.
inline __mmask16 mask16(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1); }
inline __mmask32 mask32(int64_t n) { return n >= 32 ? __mmask32(0xffffffffu) : n <= 0 ? __mmask32(0) : __mmask32((1u << n) - 1); }

// The tile's view of y: M rows of `nv` (<= kNR) valid columns at c, row stride ldc. The accumulators
// start from y when `accumulate` (a later slice of the reduction), so every y element is one FMA
// chain over i in order, independent of the slicing.
template <int M>
inline void load_tile(__m512 acc[M][3], const float* c, int64_t ldc, int64_t nv, bool accumulate) {
  const __mmask16 m0 = mask16(nv), m1 = mask16(nv - 16), m2 = mask16(nv - 32);
  for (int m = 0; m < M; ++m) {
    if (accumulate) {
      acc[m][0] = _mm512_maskz_loadu_ps(m0, c + m * ldc);
      acc[m][1] = _mm512_maskz_loadu_ps(m1, c + m * ldc + 16);
      acc[m][2] = _mm512_maskz_loadu_ps(m2, c + m * ldc + 32);
    } else {
      acc[m][0] = acc[m][1] = acc[m][2] = _mm512_setzero_ps();
    }
  }
}

// What the tile does to y as it stores it after the last slice of the reduction: add `bias` (the
// tile's columns of it, or null), then apply GELU where `gelu`.
struct Store {
  const float* bias = nullptr;
  bool gelu = false;
};

// GELU's tanh form, x·sigmoid(2·√(2/π)·(x + 0.044715·x³)) (= 0.5·x·(1 + tanh(√(2/π)·(…)))), with the
// sigmoid formed from exp(−|z|) as in vmath's: no exponent is ever positive.
inline __m512 gelu_tanh16(__m512 x) {
  const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  const __m512 z = _mm512_mul_ps(_mm512_set1_ps(2.0f * 0.7978845608028654f),
                                 _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), cube, x));
  const __m512 e = avx512::exp_nonpositive16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(z)));
  const __m512 r = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  const __mmask16 negative = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mul_ps(x, _mm512_mask_mul_ps(r, negative, e, r));
}

template <int M>
inline void store_tile(__m512 acc[M][3], float* c, int64_t ldc, int64_t nv, Store st) {
  if (const float* bias = st.bias) {
    const __m512 b0 = _mm512_maskz_loadu_ps(mask16(nv), bias), b1 = _mm512_maskz_loadu_ps(mask16(nv - 16), bias + 16),
                 b2 = _mm512_maskz_loadu_ps(mask16(nv - 32), bias + 32);
    for (int m = 0; m < M; ++m) {
      acc[m][0] = _mm512_add_ps(acc[m][0], b0);
      acc[m][1] = _mm512_add_ps(acc[m][1], b1);
      acc[m][2] = _mm512_add_ps(acc[m][2], b2);
    }
  }
  if (st.gelu)
    for (int m = 0; m < M; ++m)
      for (int v = 0; v < 3; ++v) acc[m][v] = gelu_tanh16(acc[m][v]);
  if (nv == kNR) {
    for (int m = 0; m < M; ++m)
      for (int v = 0; v < 3; ++v) _mm512_storeu_ps(c + m * ldc + 16 * v, acc[m][v]);
    return;
  }
  const __mmask16 m0 = mask16(nv), m1 = mask16(nv - 16), m2 = mask16(nv - 32);
  for (int m = 0; m < M; ++m) {
    _mm512_mask_storeu_ps(c + m * ldc, m0, acc[m][0]);
    _mm512_mask_storeu_ps(c + m * ldc + 16, m1, acc[m][1]);
    _mm512_mask_storeu_ps(c + m * ldc + 32, m2, acc[m][2]);
  }
}

// How a GEMM block walks its rectangle y[t0:t1, o0:o1): column panels of whole 48-column tiles, each
// packed once per slice of the reduction (pack(k0, kc, s0, nc)), then every 8-row tile of x against
// every 48-column tile of the panel (tile(t, k0, kc, s0, j, nv, accumulate, store): the tile at column j
// of the panel, y columns s0 + j, nv of them valid).
//
// Where one tile's panel of the whole reduction takes at most `whole_max` bytes, the reduction is not
// sliced: a panel holds all of it for as many tiles as fit in `panel_max` bytes (at least one), and
// each register tile sums the whole reduction at once, so the panel, the tile's 8 rows of x and the y
// it writes once stay in L2. Cut into slices, a GPT-2 prefill's y block (512 × 288 floats, 576 KiB)
// was stored and reloaded between slices beside x's slice and the panel, more than L2 (1 MiB) holds:
// bf16 pp512 3 % faster unsliced (7 of 8 alternating runs). Otherwise the reduction is cut in slices
// of `kc_max` and the panel spans the whole block.
template <class Pack, class Tile>
void walk_block(const GemmProblem& p, int64_t t0, int64_t t1, int64_t o0, int64_t o1, int64_t tile_bytes,
                int64_t whole_max, int64_t panel_max, int64_t kc_max, Pack pack, Tile tile) {
  const bool whole = tile_bytes <= whole_max;
  const int64_t slice = whole ? p.in : kc_max;
  const int64_t width = whole ? std::max<int64_t>(1, panel_max / tile_bytes) * kNR : o1 - o0;
  for (int64_t s0 = o0; s0 < o1; s0 += width) {
    const int64_t nc = min64(o1, s0 + width) - s0;
    for (int64_t k0 = 0; k0 < p.in; k0 += slice) {
      const int64_t kc = min64(slice, p.in - k0);
      pack(k0, kc, s0, nc);
      const bool last = k0 + slice >= p.in;  // the bias and GELU at the last slice's store only
      const float* bias = p.bias && last ? p.bias + s0 : nullptr;
      for (int64_t t = t0; t < t1; t += kMR)
        for (int64_t j = 0; j < nc; j += kNR)
          tile(t, k0, kc, s0, j, min64(kNR, nc - j), k0 > 0, Store{bias ? bias + j : nullptr, p.gelu && last});
    }
  }
}

}  // namespace
}  // namespace lineage::kernels::gemm_avx512
