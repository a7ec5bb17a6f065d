// AVX-512 reading of MXFP4 weights in 64-byte lines (128 codes, four blocks of 32 columns), shared by
// the exact kernels (gemv_mxfp4_avx512.cpp) and the bf16 dot ones (gemv_mxfp4_avx512bf16.cpp): a
// line's codes, and its four exponents as f32 factors laid out lane j for block j / 4 (the block of
// the line's dword j). Internal linkage on purpose: each includer is compiled with its own ISA flags.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace lineage::kernels {
namespace {

// A step's codes and exponents: a whole line and four, or the `blocks` (1 to 3) of a row's tail,
// the rest zero (code 0, whose value 0 meets x's zero padding).
inline __m512i codes_line(const uint8_t* q, int blocks) {
  return blocks == 4 ? _mm512_loadu_si512(q) : _mm512_maskz_loadu_epi8(__mmask64((1ull << (16 * blocks)) - 1), q);
}
inline uint32_t exponents4(const uint8_t* s, int blocks) {
  uint32_t four = 0;
  if (blocks == 4) std::memcpy(&four, s, 4);
  else
    for (int b = 0; b < blocks; ++b) four |= uint32_t(s[b]) << (8 * b);
  return four;
}

// Whether a row's n exponents hold a 0 (the subnormal factor 2^-127) or a 255 (NaN): then its steps
// take factors<true>, checked once a row on the vector pipes rather than a step at a time.
inline bool rare_exponents(const uint8_t* s, int64_t n) {
  const __m512i ff = _mm512_set1_epi8(-1);
  for (int64_t i = 0; i < n; i += 64) {
    const __mmask64 m = n - i >= 64 ? ~__mmask64(0) : (__mmask64(1) << (n - i)) - 1;
    const __m512i v = _mm512_maskz_loadu_epi8(m, s + i);
    if ((_mm512_testn_epi8_mask(v, v) & m) || _mm512_cmpeq_epi8_mask(v, ff)) return true;
  }
  return false;
}

// A step's four exponents (byte b for block b) in every dword: read from memory, or given.
inline __m512i exponents_at(const uint8_t* at) { return _mm512_broadcastd_epi32(_mm_loadu_si32(at)); }
inline __m512i exponents_of(uint32_t four) { return _mm512_set1_epi32(int(four)); }

// Those exponents as f32 factors 2^(s - 127), lane j holding block j / 4's: s << 23 is the factor's
// bits for 1 ≤ s ≤ 254 (a byte shuffle and a shift); with Rare, 0 (the subnormal 2^-127) and 255
// (NaN) take two fixes more.
template <bool Rare>
inline __m512 factors(__m512i bytes) {
  const __m512i spread = _mm512_set_epi8(3, -1, -1, -1, 3, -1, -1, -1, 3, -1, -1, -1, 3, -1, -1, -1,  //
                                         2, -1, -1, -1, 2, -1, -1, -1, 2, -1, -1, -1, 2, -1, -1, -1,  //
                                         1, -1, -1, -1, 1, -1, -1, -1, 1, -1, -1, -1, 1, -1, -1, -1,  //
                                         0, -1, -1, -1, 0, -1, -1, -1, 0, -1, -1, -1, 0, -1, -1, -1);
  __m512i bits = _mm512_srli_epi32(_mm512_shuffle_epi8(bytes, spread), 1);
  if constexpr (Rare) {
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(bits, _mm512_setzero_si512()),
                                 _mm512_set1_epi32(0x00400000));
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(bits, _mm512_set1_epi32(0x7f800000)),
                                 _mm512_set1_epi32(0x7fc00000));
  }
  return _mm512_castsi512_ps(bits);
}

}  // namespace
}  // namespace lineage::kernels
