// AVX-512 f32 GEMM block (the exact path): weight panels widened from F32/F16/BF16 (or decoded from
// MXFP4) while packing, an 8 × 48 register tile of f32 FMA accumulators. Must match ref::linear to f32
// rounding.

// GCC 12 flags the _mm512_undefined_* placeholders inside its own AVX-512 intrinsics as maybe
// uninitialized once they are inlined into the transposes (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "lineage/kernels/x86/gemm.h"
#include "lineage/kernels/x86/gemm_avx512_tile.h"
#include "lineage/kernels/x86/gemv_mxfp4.h"

namespace lineage::kernels {
namespace gemm_avx512 {
namespace {

// An f32 panel stays in the 1 MiB L2 while every 8-row slice of x streams past it, reused across the
// panel's 48-column tiles (walk_block): up to in = 2048 the whole reduction (one tile's panel at most
// kWholeTileMax, 384 KiB; as many tiles as fit in kPanelMax, 432 KiB, or one), above that slices of
// KC × NC (432 KiB, x's 8 × KC slice 12 KiB in L1).
constexpr int64_t kKC = 384;
constexpr int64_t kNC = 288;
constexpr int64_t kPrefetchRows = 8;
constexpr int64_t kWholeTileMax = 384 << 10, kPanelMax = kKC * kNC * 4;

// Masked loads stream worse than plain ones on the development CPU (Zen 5): all 16 lanes load plainly.
template <int DT>
inline __m512 load16(const void* w, int64_t i, __mmask16 m) {
  if constexpr (DT == 0) {
    const float* p = static_cast<const float*>(w) + i;
    return m == 0xffff ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(w) + i;
    const __m256i h = m == 0xffff ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(m, p);
    if constexpr (DT == 1) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// bp[q][k][48] = W(k0 + k, o0 + 48q + j), zero past nc. Panels are kc × 48 floats each. Row by row,
// prefetching a few rows ahead: the rows are `out` apart, too far for the hardware prefetcher
// (packing took 7% of the GEMM's time; the prefetch saves about 3%).
template <int DT>
void pack_in_out(const void* w, int64_t out, int64_t k0, int64_t kc, int64_t o0, int64_t nc, float* bp) {
  constexpr int64_t kElem = DT == 0 ? 4 : 2;
  const char* base = static_cast<const char*>(w) + (k0 * out + o0) * kElem;
  for (int64_t k = 0; k < kc; ++k) {
    if (k + kPrefetchRows < kc)
      for (int64_t b = 0; b < nc * kElem; b += 64) _mm_prefetch(base + (k + kPrefetchRows) * out * kElem + b, _MM_HINT_T0);
    const int64_t src = (k0 + k) * out + o0;
    for (int64_t j = 0; j < nc; j += kNR) {
      const int64_t nv = nc - j;
      float* dst = bp + j * kc + k * kNR;
      _mm512_store_ps(dst, load16<DT>(w, src + j, mask16(nv)));
      _mm512_store_ps(dst + 16, load16<DT>(w, src + j + 16, mask16(nv - 16)));
      _mm512_store_ps(dst + 32, load16<DT>(w, src + j + 32, mask16(nv - 32)));
    }
  }
}

// Same panels from W stored [out, in]: 16 columns × 16 k at a time through a register transpose.
template <int DT>
void pack_out_in(const void* w, int64_t in, int64_t k0, int64_t kc, int64_t o0, int64_t nc, float* bp) {
  const int64_t width = (nc + kNR - 1) / kNR * kNR;
  for (int64_t j = 0; j < width; j += 16) {
    float* dst = bp + j / kNR * kc * kNR + j % kNR;
    const int64_t nv = nc - j;
    for (int64_t k = 0; k < kc; k += 16) {
      const int64_t kv = min64(16, kc - k);
      __m512i r[16];
      for (int c = 0; c < 16; ++c)
        r[c] = c < nv ? _mm512_castps_si512(load16<DT>(w, (o0 + j + c) * in + k0 + k, mask16(kv))) : _mm512_setzero_si512();
      transpose16x16(r);
      for (int64_t kk = 0; kk < kv; ++kk) _mm512_store_si512(dst + (k + kk) * kNR, r[kk]);
    }
  }
}

// MXFP4: the 16 code values (bit 3 the sign) times a block's scale: a power of two, so each entry is exact.
inline __m512 mxfp4_lut(float scale) {
  const __m512 codes = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                      -2.0f, -3.0f, -4.0f, -6.0f);
  return _mm512_mul_ps(codes, _mm512_set1_ps(scale));
}

// MXFP4: 16 bytes of codes (32 columns) into the values of their even columns (lane j: column 2j) and odd
// ones (lane j: 2j + 1). vpermps reads the low 4 bits of each index (AVX512F; vpermb would need VBMI),
// so the even codes need no mask.
inline void mxfp4_decode(const uint8_t* q, __m512 table, __m512& even, __m512& odd) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  even = _mm512_permutexvar_ps(v, table);
  odd = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
}

// The same panels from MXFP4 codes, the reduction permuted within each 32-column block (its even
// columns, then its odd ones; x prepared to match, prepare_mxfp4): for 16 weight rows at a time, each 32-column block decoded and scaled in registers
// (its even columns, then its odd ones) and transposed into 16 panel rows k. k0 and kc are whole blocks.
void pack_mxfp4(const GemmProblem& p, int64_t k0, int64_t kc, int64_t o0, int64_t nc, float* bp) {
  const auto* w = static_cast<const uint8_t*>(p.w);
  const int64_t width = (nc + kNR - 1) / kNR * kNR, row_bytes = p.in / 2, row_blocks = p.in / 32;
  for (int64_t j = 0; j < width; j += 16) {
    float* dst = bp + j / kNR * kc * kNR + j % kNR;
    const int64_t nv = nc - j;
    for (int64_t k = 0; k < kc; k += 32)
      for (int half = 0; half < 2; ++half) {  // even columns, then odd: 16 registers each
        const int64_t b = (k0 + k) / 32;
        __m512i r[16];
        for (int c = 0; c < 16; ++c) {
          if (c >= nv) {
            r[c] = _mm512_setzero_si512();
            continue;
          }
          const int64_t o = o0 + j + c;
          const __m512 table = mxfp4_lut(simd::kMxfp4Scales.v[p.scales[o * row_blocks + b]]);
          __m512 even, odd;
          mxfp4_decode(w + o * row_bytes + b * 16, table, even, odd);
          r[c] = _mm512_castps_si512(half ? odd : even);
        }
        transpose16x16(r);
        for (int kk = 0; kk < 16; ++kk) _mm512_store_si512(dst + (k + 16 * half + kk) * kNR, r[kk]);
      }
  }
}

// y[M rows at c, 48 columns] (+)= Σ_k x(m, k) · b[k][48] over k < kc, x(m, k) = a[m*lda + k], or
// a[k*lda + m] when Trans (x stored transposed: the M values of one k lie side by side).
template <int M, bool Trans = false>
void tile(int64_t kc, const float* a, int64_t lda, const float* b, float* c, int64_t ldc, int64_t nv, bool accumulate,
          Store st) {
  __m512 acc[M][3];
  load_tile<M>(acc, c, ldc, nv, accumulate);
  for (int64_t k = 0; k < kc; ++k, b += kNR) {
    const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16), b2 = _mm512_load_ps(b + 32);
    for (int m = 0; m < M; ++m) {
      const __m512 av = _mm512_set1_ps(Trans ? a[k * lda + m] : a[m * lda + k]);
      acc[m][0] = _mm512_fmadd_ps(av, b0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(av, b1, acc[m][1]);
      acc[m][2] = _mm512_fmadd_ps(av, b2, acc[m][2]);
    }
  }
  store_tile<M>(acc, c, ldc, nv, st);
}

using TileFn = void (*)(int64_t, const float*, int64_t, const float*, float*, int64_t, int64_t, bool, Store);
constexpr TileFn kTiles[kMR + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>, tile<7>, tile<8>};
constexpr TileFn kTilesTrans[kMR + 1] = {nullptr,       tile<1, true>, tile<2, true>, tile<3, true>, tile<4, true>,
                                         tile<5, true>, tile<6, true>, tile<7, true>, tile<8, true>};

// Strips of x for the tiles: without `strips`, x[t, i] read in place (row stride ldx); with it, the
// prepared strips of a transposed x (prepare_strips), 8 rows of x side by side per step of i.
template <int DT>
void block(const GemmProblem& p, const float* strips, int64_t t0, int64_t t1, int64_t o0, int64_t o1, void* scratch) {
  float* bp = static_cast<float*>(scratch);
  const int64_t ldx = p.ldx ? p.ldx : p.in, ldy = p.ldy ? p.ldy : p.out;
  walk_block(
      p, t0, t1, o0, o1, p.in * kNR * int64_t(sizeof(float)), kWholeTileMax, kPanelMax, kKC,
      [&](int64_t k0, int64_t kc, int64_t s0, int64_t nc) {
        if (p.out_in) pack_out_in<DT>(p.w, p.in, k0, kc, s0, nc, bp);
        else pack_in_out<DT>(p.w, p.out, k0, kc, s0, nc, bp);
      },
      [&](int64_t t, int64_t k0, int64_t kc, int64_t s0, int64_t j, int64_t nv, bool accumulate, Store st) {
        const int64_t rows = min64(kMR, t1 - t);
        float* y = p.y + t * ldy + s0 + j;
        if (strips)  // t is a multiple of 8: blocks start at whole register tiles
          kTilesTrans[rows](kc, strips + (t / kMR * p.in + k0) * kMR, kMR, bp + j * kc, y, ldy, nv,
                            accumulate || p.accumulate, st);
        else
          kTiles[rows](kc, p.x + t * ldx + k0, ldx, bp + j * kc, y, ldy, nv, accumulate || p.accumulate, st);
      });
}

// x stored transposed ([in, T], row stride ldx) rearranged for the tiles: strip s = t / 8 holds
// x[t, i] at [s][i][t % 8]. Read in place instead, every step of i of every column tile would touch
// another row of x's storage (another page); here each row's 64 bytes are read once, and a pass over
// kPassRows rows keeps their pages in the TLB while t moves along them.
void prepare_strips(const GemmProblem& p, int64_t t0, int64_t t1, void* prepared) {
  constexpr int64_t kPassRows = 256;
  float* out = static_cast<float*>(prepared);
  const int64_t ldx = p.ldx ? p.ldx : p.T;
  const auto one = [&](int64_t t, int64_t i0, int64_t i1) {
    float* dst = out + (t / kMR * p.in) * kMR + t % kMR;
    for (int64_t i = i0; i < i1; ++i) dst[i * kMR] = p.x[i * ldx + t];
  };
  for (int64_t i0 = 0; i0 < p.in; i0 += kPassRows) {
    const int64_t i1 = min64(p.in, i0 + kPassRows);
    int64_t t = t0;
    for (; t < t1 && t % (2 * kMR); ++t) one(t, i0, i1);
    for (; t + 2 * kMR <= t1; t += 2 * kMR) {  // two whole strips from each row's 64 bytes
      float* lo = out + t / kMR * p.in * kMR;
      float* hi = lo + p.in * kMR;
      for (int64_t i = i0; i < i1; ++i) {
        const float* src = p.x + i * ldx + t;
        _mm256_storeu_ps(lo + i * kMR, _mm256_loadu_ps(src));
        _mm256_storeu_ps(hi + i * kMR, _mm256_loadu_ps(src + kMR));
      }
    }
    for (; t < t1; ++t) one(t, i0, i1);
  }
}
size_t prepared_strips_bytes(int64_t T, int64_t in) { return size_t((T + kMR - 1) / kMR * kMR * in) * sizeof(float); }

void block_strips(const GemmProblem& p, const void* prepared, int64_t t0, int64_t t1, int64_t o0, int64_t o1,
                  void* scratch) {
  block<0>(p, static_cast<const float*>(prepared), t0, t1, o0, o1, scratch);
}

void block_any(const GemmProblem& p, const void*, int64_t t0, int64_t t1, int64_t o0, int64_t o1, void* scratch) {
  if (p.dtype == 0) block<0>(p, nullptr, t0, t1, o0, o1, scratch);
  else if (p.dtype == 1) block<1>(p, nullptr, t0, t1, o0, o1, scratch);
  else block<2>(p, nullptr, t0, t1, o0, o1, scratch);
}

// Rows [t0, t1) of x in pack_mxfp4's order (per 32 columns the even ones, then the odd), [T, in] f32.
void prepare_mxfp4(const GemmProblem& p, int64_t t0, int64_t t1, void* prepared) {
  for (int64_t t = t0; t < t1; ++t) simd::mxfp4_prepare<16>(p.x + t * p.in, p.in, static_cast<float*>(prepared) + t * p.in);
}
size_t prepared_mxfp4_bytes(int64_t T, int64_t in) { return size_t(T * in) * sizeof(float); }

void block_mxfp4(const GemmProblem& p, const void* prepared, int64_t t0, int64_t t1, int64_t o0, int64_t o1,
                 void* scratch) {
  float* bp = static_cast<float*>(scratch);
  const float* xp = static_cast<const float*>(prepared);
  walk_block(
      p, t0, t1, o0, o1, p.in * kNR * int64_t(sizeof(float)), kWholeTileMax, kPanelMax, kKC,
      [&](int64_t k0, int64_t kc, int64_t s0, int64_t nc) { pack_mxfp4(p, k0, kc, s0, nc, bp); },
      [&](int64_t t, int64_t k0, int64_t kc, int64_t s0, int64_t j, int64_t nv, bool accumulate, Store st) {
        kTiles[min64(kMR, t1 - t)](kc, xp + t * p.in + k0, p.in, bp + j * kc, p.y + t * p.out + s0 + j, p.out, nv,
                                   accumulate, st);
      });
}

}  // namespace
}  // namespace gemm_avx512

const GemmPath& gemm_exact_avx512() {
  using namespace gemm_avx512;
  static const GemmPath path{nullptr, nullptr, block_any, kNR, kNC, size_t(std::max(kWholeTileMax, kPanelMax))};
  return path;
}

const GemmPath& gemm_exact_strips_avx512() {
  using namespace gemm_avx512;
  static const GemmPath path{prepare_strips, prepared_strips_bytes, block_strips, kNR, kNC,
                             size_t(std::max(kWholeTileMax, kPanelMax))};
  return path;
}

const GemmPath& gemm_mxfp4_avx512() {
  using namespace gemm_avx512;
  static const GemmPath path{prepare_mxfp4, prepared_mxfp4_bytes, block_mxfp4, kNR, kNC,
                             size_t(std::max(kWholeTileMax, kPanelMax))};
  return path;
}

}  // namespace lineage::kernels
