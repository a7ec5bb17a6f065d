// AVX512_BF16 GEMV for BF16 weights in the bf16 dot mode: x arrives already rounded to bf16 pairs
// (the GEMM's prepare, so decode and prefill round identically) and each vdpbf16ps adds
// x[2p]·W(2p, o) + x[2p+1]·W(2p+1, o) in f32. One load and one instruction per 32 weights, where the
// exact path widens every weight to f32 first.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "lineage/kernels/x86/avx512_util.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {
namespace {

inline __mmask32 first32(int64_t n) { return n >= 32 ? __mmask32(0xffffffffu) : n <= 0 ? 0 : __mmask32((1u << n) - 1); }
// The pairs holding the first n elements (n <= 0: none).
inline __mmask16 pairs16(int64_t n) { return n >= 32 ? __mmask16(0xffff) : n <= 0 ? 0 : __mmask16((1u << ((n + 1) / 2)) - 1); }

// Row o of W against G rows of pairs (stride ldxp): each row with its own four accumulators in the
// order below, the weights loaded once for all G.
template <int G>
inline void dot_rows(const uint32_t* xp, int64_t ldxp, const uint16_t* w, int64_t in, int64_t o, float* y, int64_t ldy) {
  const uint16_t* row = w + o * in;
  const auto addr = reinterpret_cast<uintptr_t>(row);
  const int64_t head = addr % 4 ? 0 : std::min<int64_t>(in, int64_t((64 - addr % 64) % 64) / 2);
  __m512 a[G][4];
  for (int g = 0; g < G; ++g) a[g][0] = a[g][1] = a[g][2] = a[g][3] = _mm512_setzero_ps();
  if (head) {
    const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(first32(head), row);
    for (int g = 0; g < G; ++g)
      a[g][1] = _mm512_dpbf16_ps(a[g][1], wv, (__m512bh)_mm512_maskz_loadu_epi32(pairs16(head), xp + g * ldxp));
  }
  const int64_t full = head + (in - head) / 128 * 128;
  int64_t i = head;
  // Pointers, not indices: (i + 32 j) / 2 on a signed index cost three scalar instructions a load,
  // 7.5 instructions a line of weights against 4 now, and a stream that leaves fewer instructions
  // per line in flight keeps more lines in flight: GPT-2 bf16 decode at depth 128 went from 194 / 182
  // to 211 / 209 tok/s (medians of two series of 8 alternating runs; 15 of 16 pairs faster).
  const uint16_t* wi = row + head;
  const uint32_t* xi = xp + head / 2;
  // Each line is also requested 2 KiB ahead (kStreamAheadBytes) as non-temporal. An ordinary prefetch
  // there gained nothing (docs/performance.md); this one made GPT-2 bf16 decode at depth 128 faster
  // in 19 of 20 alternating runs (65–88 % → 79–106 % of the paired probe) and `gemv/bf16dot/out_in`
  // 12–16 % faster on cold copies, while the read probe, a plain stream, gains nothing from it.
  for (; i < full; i += 128, wi += 128, xi += 64)
    for (int j = 0; j < 4; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(wi + 32 * j) + kStreamAheadBytes, _MM_HINT_NTA);
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(wi + 32 * j);
      for (int g = 0; g < G; ++g)
        a[g][j] = _mm512_dpbf16_ps(a[g][j], wv, (__m512bh)_mm512_loadu_si512(xi + g * ldxp + 16 * j));
    }
  for (; i < in; i += 32, wi += 32, xi += 16) {  // the weights and x pairs past `in` masked to zero
    const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(first32(in - i), wi);
    for (int g = 0; g < G; ++g)
      a[g][0] = _mm512_dpbf16_ps(a[g][0], wv, (__m512bh)_mm512_maskz_loadu_epi32(pairs16(in - i), xi + g * ldxp));
  }
  for (int g = 0; g < G; ++g)
    y[g * ldy] = avx512::hsum(_mm512_add_ps(_mm512_add_ps(a[g][0], a[g][1]), _mm512_add_ps(a[g][2], a[g][3])));
}

// W [out, in]: a row's bf16 are already pairs along i. One row at a time, front to back (one
// sequential stream per thread, as in the exact path), four accumulators, fixed combine order. Where
// a row does not start on a cache line but on a pair, its weights before the first line boundary go
// in one masked step, so that no 64-byte load of the stream straddles two lines (checkpoint tensors
// lie wherever the safetensors header leaves them; see to_line in gemv_simd.h). The operations of
// dot_rows<1> in its order (a batch's rows get these bits), written out for the one row decode streams.
void out_in(const uint32_t* xp, const uint16_t* w, int64_t in, int64_t o0, int64_t o1, float* y) {
  for (int64_t o = o0; o < o1; ++o) {
    const uint16_t* row = w + o * in;
    const auto addr = reinterpret_cast<uintptr_t>(row);
    const int64_t head = addr % 4 ? 0 : std::min<int64_t>(in, int64_t((64 - addr % 64) % 64) / 2);
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    if (head)
      a[1] = _mm512_dpbf16_ps(a[1], (__m512bh)_mm512_maskz_loadu_epi16(first32(head), row),
                              (__m512bh)_mm512_maskz_loadu_epi32(pairs16(head), xp));
    const int64_t full = head + (in - head) / 128 * 128;
    int64_t i = head;
    // Pointers, not indices: (i + 32 j) / 2 on a signed index cost three scalar instructions a load,
    // 7.5 instructions a line of weights against 4 now, and a stream that leaves fewer instructions
    // per line in flight keeps more lines in flight: GPT-2 bf16 decode at depth 128 went from 194 / 182
    // to 211 / 209 tok/s (medians of two series of 8 alternating runs; 15 of 16 pairs faster).
    const uint16_t* wi = row + head;
    const uint32_t* xi = xp + head / 2;
    // Each line is also requested 2 KiB ahead (kStreamAheadBytes) as non-temporal. An ordinary prefetch
    // there gained nothing (docs/performance.md); this one made GPT-2 bf16 decode at depth 128 faster
    // in 19 of 20 alternating runs (65–88 % → 79–106 % of the paired probe) and `gemv/bf16dot/out_in`
    // 12–16 % faster on cold copies, while the read probe, a plain stream, gains nothing from it.
    for (; i < full; i += 128, wi += 128, xi += 64)
      for (int j = 0; j < 4; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(wi + 32 * j) + kStreamAheadBytes, _MM_HINT_NTA);
        a[j] = _mm512_dpbf16_ps(a[j], (__m512bh)_mm512_loadu_si512(wi + 32 * j),
                                (__m512bh)_mm512_loadu_si512(xi + 16 * j));
      }
    for (; i < in; i += 32, wi += 32, xi += 16)  // the weights and x pairs past `in` masked to zero
      a[0] = _mm512_dpbf16_ps(a[0], (__m512bh)_mm512_maskz_loadu_epi16(first32(in - i), wi),
                              (__m512bh)_mm512_maskz_loadu_epi32(pairs16(in - i), xi));
    y[o] = avx512::hsum(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
  }
}


// out_in over `rows` rows of pairs, in groups of up to four sharing each weight load.
void out_in_rows(const uint32_t* xp, int64_t ldxp, int64_t rows, const uint16_t* w, int64_t in, int64_t o0, int64_t o1,
                 float* y, int64_t ldy) {
  for (int64_t o = o0; o < o1; ++o) {
    int64_t g = 0;
    for (; g + 4 <= rows; g += 4) dot_rows<4>(xp + g * ldxp, ldxp, w, in, o, y + g * ldy + o, ldy);
    switch (rows - g) {
      case 3: dot_rows<3>(xp + g * ldxp, ldxp, w, in, o, y + g * ldy + o, ldy); break;
      case 2: dot_rows<2>(xp + g * ldxp, ldxp, w, in, o, y + g * ldy + o, ldy); break;
      case 1: dot_rows<1>(xp + g * ldxp, ldxp, w, in, o, y + g * ldy + o, ldy); break;
      default: break;
    }
  }
}

}  // namespace

const GemvBf16Dot& gemv_bf16_dot_avx512bf16() {
  static const GemvBf16Dot kernels{out_in, out_in_rows};
  return kernels;
}

}  // namespace lineage::kernels
