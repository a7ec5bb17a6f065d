// AVX512_BF16 GEMV for BF16 weights in the bf16 dot mode: x arrives already rounded to bf16 pairs
// (the GEMM's prepare, so decode and prefill round identically) and each vdpbf16ps adds
// x[2p]·W(2p, o) + x[2p+1]·W(2p+1, o) in f32. One load and one instruction per 32 weights, where the
// exact path widens every weight to f32 first.
#include <immintrin.h>

#include <cstdint>

#include "lineage/kernels/x86/avx512_util.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {
namespace {

inline __mmask32 first32(int64_t n) { return n >= 32 ? __mmask32(0xffffffffu) : n <= 0 ? 0 : __mmask32((1u << n) - 1); }

// W [out, in]: a row's bf16 are already pairs along i. One row at a time, front to back (one
// sequential stream per thread, as in the exact path), four accumulators, fixed combine order.
void out_in(const uint32_t* xp, const uint16_t* w, int64_t in, int64_t o0, int64_t o1, float* y) {
  const int64_t full = in / 128 * 128;
  for (int64_t o = o0; o < o1; ++o) {
    const uint16_t* row = w + o * in;
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i < full; i += 128)
      for (int j = 0; j < 4; ++j)
        a[j] = _mm512_dpbf16_ps(a[j], (__m512bh)_mm512_loadu_si512(row + i + 32 * j),
                                (__m512bh)_mm512_load_si512(xp + (i + 32 * j) / 2));
    for (; i < in; i += 32)  // x pairs past `in` are zero, and so are the masked weights
      a[0] = _mm512_dpbf16_ps(a[0], (__m512bh)_mm512_maskz_loadu_epi16(first32(in - i), row + i),
                              (__m512bh)_mm512_load_si512(xp + i / 2));
    y[o] = avx512::hsum(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
  }
}

// W [in, out]: pairs along i are two rows apart, so rows i and i+1 are interleaved in registers
// (vpunpck{l,h}wd): per 128-bit lane of 8 columns the low unpack holds columns 0-3 and the high one
// columns 4-7 as pairs. Blocks of 128 columns (8 accumulators) walk down the rows, the next 4 KiB of
// the block prefetched as in the exact kernel; the columns are put back in order at the store.
constexpr int64_t kBlock = 128;

// A masked load streams worse than a plain one on the development CPU (Zen 5), so whole blocks
// (Full) load plainly and only the right edge is masked.
template <bool Full>
inline __m512i row32(const uint16_t* p, __mmask32 m) {
  return Full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(m, p);
}

// Columns [o, o + n) with n <= kBlock (n < kBlock only at the right edge; Full: n = kBlock).
template <bool Full>
void in_out_block(const uint32_t* xp, const uint16_t* w, int64_t in, int64_t out, int64_t o, int64_t n, float* y) {
  constexpr int kVecs = int(kBlock / 32);
  constexpr int64_t kPrefetchPairs = 4096 / (2 * kBlock * 2);  // the block's next 4 KiB
  const __mmask32 m[kVecs] = {first32(n), first32(n - 32), first32(n - 64), first32(n - 96)};
  __m512 lo[kVecs], hi[kVecs];
  for (int v = 0; v < kVecs; ++v) lo[v] = hi[v] = _mm512_setzero_ps();
  const int64_t pairs = in / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    const uint16_t* r0 = w + 2 * p * out + o;
    if (p + kPrefetchPairs < pairs) {
      const char* ahead = reinterpret_cast<const char*>(r0 + 2 * kPrefetchPairs * out);
      for (int64_t b = 0; b < kBlock * 2; b += 64) {
        _mm_prefetch(ahead + b, _MM_HINT_T1);  // into L2: L1 has too few miss buffers for this many lines
        _mm_prefetch(ahead + out * 2 + b, _MM_HINT_T1);
      }
    }
    const __m512bh xv = (__m512bh)_mm512_set1_epi32(int(xp[p]));
    for (int v = 0; v < kVecs; ++v) {
      if (!m[v]) break;
      const __m512i a = row32<Full>(r0 + 32 * v, m[v]), b = row32<Full>(r0 + out + 32 * v, m[v]);
      lo[v] = _mm512_dpbf16_ps(lo[v], (__m512bh)_mm512_unpacklo_epi16(a, b), xv);
      hi[v] = _mm512_dpbf16_ps(hi[v], (__m512bh)_mm512_unpackhi_epi16(a, b), xv);
    }
  }
  if (in % 2) {  // the last row pairs with zeros (and x's pair holds a zero there too)
    const uint16_t* r0 = w + (in - 1) * out + o;
    const __m512bh xv = (__m512bh)_mm512_set1_epi32(int(xp[pairs]));
    for (int v = 0; v < kVecs; ++v) {
      if (!m[v]) break;
      const __m512i a = row32<Full>(r0 + 32 * v, m[v]), z = _mm512_setzero_si512();
      lo[v] = _mm512_dpbf16_ps(lo[v], (__m512bh)_mm512_unpacklo_epi16(a, z), xv);
      hi[v] = _mm512_dpbf16_ps(hi[v], (__m512bh)_mm512_unpackhi_epi16(a, z), xv);
    }
  }
  // Lane 4L + j of lo is column 8L + j, of hi column 8L + 4 + j (L = 128-bit lane, j < 4).
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int v = 0; v < kVecs; ++v) {
    if (!m[v]) break;
    const int64_t left = n - 32 * v;
    const __mmask16 m0 = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    const __mmask16 m1 = left >= 32 ? __mmask16(0xffff) : left <= 16 ? 0 : __mmask16((1u << (left - 16)) - 1);
    _mm512_mask_storeu_ps(y + o + 32 * v, m0, _mm512_permutex2var_ps(lo[v], first, hi[v]));
    _mm512_mask_storeu_ps(y + o + 32 * v + 16, m1, _mm512_permutex2var_ps(lo[v], second, hi[v]));
  }
}

void in_out(const uint32_t* xp, const uint16_t* w, int64_t in, int64_t out, int64_t o0, int64_t o1, float* y) {
  for (int64_t o = o0; o < o1; o += kBlock)
    if (o1 - o >= kBlock) in_out_block<true>(xp, w, in, out, o, kBlock, y);
    else in_out_block<false>(xp, w, in, out, o, o1 - o, y);
}

}  // namespace

const GemvBf16Dot& gemv_bf16_dot_avx512bf16() {
  static const GemvBf16Dot kernels{out_in, in_out};
  return kernels;
}

}  // namespace lineage::kernels
