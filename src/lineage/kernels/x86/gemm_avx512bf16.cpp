// AVX512_BF16 GEMM block for BF16 weights: x rounded to bf16 pairs (nearest even, vcvtne2ps2bf16)
// once per call, weights packed as bf16 pairs along the reduction, an 8 × 48 tile of vdpbf16ps f32
// accumulators. Each step adds x[2p]·W(2p, o) + x[2p+1]·W(2p+1, o); ref::linear on the rounded x is
// its exact-arithmetic twin.

// GCC 12 flags the _mm512_undefined_* placeholders inside its own AVX-512 intrinsics as maybe
// uninitialized once they are inlined into the transposes (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "lineage/kernels/x86/gemm.h"
#include "lineage/kernels/x86/gemm_avx512_tile.h"

namespace lineage::kernels {
namespace gemm_avx512 {
namespace {

// A panel of bf16 pairs stays in L2 while 8 rows of x stay in L1 (walk_block): up to in = 4096 the
// whole reduction (one tile's panel at most kWholeTileMax, 384 KiB; as many tiles as fit in
// kPanelMax, 216 KiB, or one), above that slices of KC × NC (216 KiB). NC = 288 rather than 576: twice
// the column blocks, so the threads' shares end closer together (GPT-2 pp512 with --bf16-dot 2 %
// faster in alternating runs; 192 was no better).
constexpr int64_t kKC = 384;  // even: pairs never straddle two slices
constexpr int64_t kNC = 288;
constexpr int64_t kPrefetchRows = 8;
constexpr int64_t kWholeTileMax = 384 << 10, kPanelMax = kKC / 2 * kNC * 4;

// Row stride of the prepared x in bf16 pairs: whole 64-byte lines, so rows convert in whole vectors.
int64_t x_pairs_stride(int64_t in) { return ((in + 1) / 2 + 15) / 16 * 16; }

// xp[t][p] = bf16 pair (x[t, 2p], x[t, 2p+1]) for t in [t0, t1), zero past `in`. Converting x once
// per call, not once per column block, saved 5% of the GEMM's time.
void prepare_x(const GemmProblem& pr, int64_t t0, int64_t t1, void* prepared) {
  const int64_t ld = x_pairs_stride(pr.in);
  for (int64_t t = t0; t < t1; ++t) {
    const float* src = pr.x + t * pr.in;
    uint32_t* dst = static_cast<uint32_t*>(prepared) + t * ld;
    for (int64_t k = 0; k < pr.in; k += 32) {
      const __m512 lo = _mm512_maskz_loadu_ps(mask16(pr.in - k), src + k);
      const __m512 hi = _mm512_maskz_loadu_ps(mask16(pr.in - k - 16), src + k + 16);
      _mm512_store_si512(dst + k / 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
}

size_t prepared_bytes(int64_t T, int64_t in) { return size_t(T) * x_pairs_stride(in) * sizeof(uint32_t); }

// 16 bf16 pairs (W(k, o), W(k+1, o)) for o in [o, o+16) of an [in, out] matrix; `second` = k+1 < kc.
// (Masked loads stream worse than plain ones on the development CPU, Zen 5: full ones load plainly.)
inline __m256i load16_bf16(const uint16_t* p, __mmask16 m) {
  return m == 0xffff ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(m, p);
}

inline __m512i pairs_in_out(const uint16_t* w, int64_t src, int64_t out, __mmask16 m, bool second) {
  const __m512i lo = _mm512_cvtepu16_epi32(load16_bf16(w + src, m));
  if (!second) return lo;
  const __m512i hi = _mm512_cvtepu16_epi32(load16_bf16(w + src + out, m));
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

// bp[q][p][48] = bf16 pair (W(k0+2p, o), W(k0+2p+1, o)), o = o0 + 48q + j; zero past nc and kc. Row
// pair by row pair, prefetching ahead: the rows are `out` apart, too far for the hardware prefetcher
// (packing took 7% of the GEMM's time; the prefetch saves about 3%).
void pack_in_out(const uint16_t* w, int64_t out, int64_t k0, int64_t kc, int64_t o0, int64_t nc, uint32_t* bp) {
  const int64_t kp = (kc + 1) / 2;
  for (int64_t p = 0; p < kp; ++p) {
    for (int64_t r = 2 * p + kPrefetchRows; r < 2 * p + kPrefetchRows + 2 && r < kc; ++r)
      for (int64_t b = 0; b < nc * 2; b += 64) _mm_prefetch(reinterpret_cast<const char*>(w + (k0 + r) * out + o0) + b, _MM_HINT_T0);
    const int64_t src = (k0 + 2 * p) * out + o0;
    const bool second = 2 * p + 1 < kc;
    for (int64_t j = 0; j < nc; j += kNR) {
      const int64_t nv = nc - j;
      uint32_t* dst = bp + j * kp + p * kNR;
      _mm512_store_si512(dst, pairs_in_out(w, src + j, out, mask16(nv), second));
      _mm512_store_si512(dst + 16, pairs_in_out(w, src + j + 16, out, mask16(nv - 16), second));
      _mm512_store_si512(dst + 32, pairs_in_out(w, src + j + 32, out, mask16(nv - 32), second));
    }
  }
}

// Same panels from W stored [out, in], where a pair is already one 32-bit word: a 16 × 16 word
// transpose per 16 columns × 16 pairs.
void pack_out_in(const uint16_t* w, int64_t in, int64_t k0, int64_t kc, int64_t o0, int64_t nc, uint32_t* bp) {
  const int64_t kp = (kc + 1) / 2, width = (nc + kNR - 1) / kNR * kNR;
  for (int64_t j = 0; j < width; j += 16) {
    uint32_t* dst = bp + j / kNR * kp * kNR + j % kNR;
    const int64_t nv = nc - j;
    for (int64_t p = 0; p < kp; p += 16) {
      const int64_t pv = min64(16, kp - p);
      const __mmask32 m = mask32(kc - 2 * p);
      __m512i r[16];
      for (int c = 0; c < 16; ++c)
        r[c] = c >= nv                ? _mm512_setzero_si512()
               : m == 0xffffffffu ? _mm512_loadu_si512(w + (o0 + j + c) * in + k0 + 2 * p)
                                  : _mm512_maskz_loadu_epi16(m, w + (o0 + j + c) * in + k0 + 2 * p);
      transpose16x16(r);
      for (int64_t pp = 0; pp < pv; ++pp) _mm512_store_si512(dst + (p + pp) * kNR, r[pp]);
    }
  }
}

// y[M rows at c, 48 columns] (+)= Σ_p dot(a[m*lda + p], b[p][48]) over p < kp.
template <int M>
void tile(int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, float* c, int64_t ldc, int64_t nv, bool accumulate,
          Store st) {
  __m512 acc[M][3];
  load_tile<M>(acc, c, ldc, nv, accumulate);
  for (int64_t p = 0; p < kp; ++p, b += kNR) {
    const __m512bh b0 = (__m512bh)_mm512_load_si512(b), b1 = (__m512bh)_mm512_load_si512(b + 16),
                   b2 = (__m512bh)_mm512_load_si512(b + 32);
    for (int m = 0; m < M; ++m) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[m * lda + p]));
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], av, b0);
      acc[m][1] = _mm512_dpbf16_ps(acc[m][1], av, b1);
      acc[m][2] = _mm512_dpbf16_ps(acc[m][2], av, b2);
    }
  }
  store_tile<M>(acc, c, ldc, nv, st);
}

using TileFn = void (*)(int64_t, const uint32_t*, int64_t, const uint32_t*, float*, int64_t, int64_t, bool, Store);
constexpr TileFn kTiles[kMR + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>, tile<7>, tile<8>};

void block(const GemmProblem& p, const void* prepared, int64_t t0, int64_t t1, int64_t o0, int64_t o1, void* scratch) {
  uint32_t* bp = static_cast<uint32_t*>(scratch);
  const auto* w = static_cast<const uint16_t*>(p.w);
  const auto* xp = static_cast<const uint32_t*>(prepared);
  const int64_t ld = x_pairs_stride(p.in), tile_bytes = (p.in + 1) / 2 * kNR * int64_t(sizeof(uint32_t));
  walk_block(
      p, t0, t1, o0, o1, tile_bytes, kWholeTileMax, kPanelMax, kKC,
      [&](int64_t k0, int64_t kc, int64_t s0, int64_t nc) {
        if (p.out_in) pack_out_in(w, p.in, k0, kc, s0, nc, bp);
        else pack_in_out(w, p.out, k0, kc, s0, nc, bp);
      },
      [&](int64_t t, int64_t k0, int64_t kc, int64_t s0, int64_t j, int64_t nv, bool accumulate, Store st) {
        const int64_t kp = (kc + 1) / 2;
        kTiles[min64(kMR, t1 - t)](kp, xp + t * ld + k0 / 2, ld, bp + j * kp, p.y + t * p.out + s0 + j, p.out, nv,
                                   accumulate, st);
      });
}

}  // namespace
}  // namespace gemm_avx512

const GemmPath& gemm_bf16_dot_avx512bf16() {
  using namespace gemm_avx512;
  static const GemmPath path{prepare_x, prepared_bytes, block, kNR, kNC, size_t(std::max(kWholeTileMax, kPanelMax))};
  return path;
}

}  // namespace lineage::kernels
