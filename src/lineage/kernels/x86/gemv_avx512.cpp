// AVX-512 GEMV (16 lanes): f16 widened with vcvtph2ps, bf16 with a 16-bit shift; MXFP4 in
// gemv_mxfp4_avx512.cpp.

// GCC 12 flags the _mm512_undefined_* placeholders inside its own AVX-512 intrinsics as maybe
// uninitialized once they are inlined (_mm512_reduce_add_ps here; GCC bug 105593, fixed in GCC 13),
// and, inlined into the batched rows' blocks, as uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstring>

#include "lineage/kernels/x86/gemv.h"
#include "lineage/kernels/x86/gemv_quant.h"
#include "lineage/kernels/x86/gemv_simd.h"

namespace lineage::kernels {
namespace {
struct Avx512 {
  using Vec = __m512;
  static constexpr int kWidth = 16;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec broadcast(float v) { return _mm512_set1_ps(v); }
  static Vec load_f32(const float* p) { return _mm512_loadu_ps(p); }
  static Vec load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static Vec load_bf16(const uint16_t* p) {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
  // The first n (0 < n ≤ 16) elements, the other lanes zero; masked, so nothing past them is read.
  static __mmask16 first(int n) { return __mmask16((1u << n) - 1); }
  static Vec load_f32_n(const float* p, int n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static Vec load_f16_n(const uint16_t* p, int n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first(n), p)); }
  static Vec load_bf16_n(const uint16_t* p, int n) {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(first(n), p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static float sum(Vec v) { return _mm512_reduce_add_ps(v); }
  static void prefetch_stream(const char* p) { _mm_prefetch(p, _MM_HINT_NTA); }
  static void prefetch(const char* p) { _mm_prefetch(p, _MM_HINT_T0); }
  // Quantized codes (gemv_quant.h): vpermps reads the low 4 bits of each index, so a nibble indexes
  // the 16-entry table directly.
  using Lut16 = __m512;
  static constexpr int kQuantRows = 4;
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec halves(float a, float b) { return _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(a), _mm512_set1_ps(b)); }
  static Lut16 lut16(const float* values, float scale, float zero) {
    return _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(values), _mm512_set1_ps(zero)), _mm512_set1_ps(scale));
  }
  static void nibbles(const uint8_t* q, Lut16 lut, Vec& even, Vec& odd) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    even = _mm512_permutexvar_ps(v, lut);
    odd = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut);
  }
  // 128 columns from 64 bytes (gemv_quant.h's lines): w[j] lane k is the nibble j of dword k.
  static constexpr bool kLines = true;
  static void line(const uint8_t* q, Lut16 lut, Vec (&w)[8]) {
    const __m512i d = _mm512_loadu_si512(q);
    w[0] = _mm512_permutexvar_ps(d, lut);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), lut);
    w[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 8), lut);
    w[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 12), lut);
    w[4] = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 16), lut);
    w[5] = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 20), lut);
    w[6] = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 24), lut);
    w[7] = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 28), lut);
  }
  static __m512i bytes(const uint8_t* q) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))); }
  // ggml's blocks (gemv_ggml.h).
  // Q4_K's and Q5_K's sub-block factors of the block at b (d, dmin, then 12 bytes of 6-bit scales and
  // mins s[0 .. 11]): f[j] = d·sc(j), f[8 + j] = −(dmin·m(j)). Lanes 0-3 and 8-11 are s[0 .. 3] and
  // s[4 .. 7] masked to 6 bits; lanes 4-7 the low, lanes 12-15 the high nibbles of s[8 .. 11], each with
  // the top 2 bits of s[0 .. 3] / s[4 .. 7] above them.
  static void factors_k4(const uint8_t* b, float* f) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    const __m128i p = _mm_shuffle_epi8(raw, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m128i q = _mm_shuffle_epi8(raw, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m128i low = _mm_and_si128(p, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    const __m128i high = _mm_and_si128(_mm_srli_epi16(p, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    const __m128i top = _mm_and_si128(_mm_srli_epi16(q, 2), _mm_set1_epi8(0x30));
    const __m128i u = _mm_or_si128(_mm_or_si128(low, high), top);
    // d in lanes 0-7, −dmin in 8-15 (the f16 pair widened, spread, the upper half's sign flipped).
    const __m512 dd = _mm512_castps128_ps512(_mm_cvtph_ps(raw));
    const __m512 ab = _mm512_xor_ps(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), dd),
                                    _mm512_castsi512_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, int(0x80000000), int(0x80000000),
                                                                          int(0x80000000), int(0x80000000), int(0x80000000),
                                                                          int(0x80000000), int(0x80000000), int(0x80000000))));
    _mm512_storeu_ps(f, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(u)), ab));
  }
  static Vec combine(const uint8_t* lo, int ls, const uint8_t* hi, int hs, int mask) {
    const __m512i l = _mm512_and_si512(_mm512_srli_epi32(bytes(lo), ls), _mm512_set1_epi32(15));
    const __m512i h = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(bytes(hi), hs), _mm512_set1_epi32(mask)), 4);
    return _mm512_cvtepi32_ps(_mm512_or_si512(l, h));
  }
  static void q4k_chunk(const uint8_t* q, Lut16 lo, Lut16 hi, Vec (&w)[4]) {
    const __m512i d = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
    const __m512i s = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8);
    w[0] = _mm512_permutexvar_ps(_mm512_srlv_epi32(d, s), lo);
    w[1] = _mm512_permutexvar_ps(_mm512_srlv_epi32(d, _mm512_add_epi32(s, _mm512_set1_epi32(16))), lo);
    w[2] = _mm512_permutexvar_ps(_mm512_srlv_epi32(d, _mm512_add_epi32(s, _mm512_set1_epi32(4))), hi);
    w[3] = _mm512_permutexvar_ps(_mm512_srlv_epi32(d, _mm512_add_epi32(s, _mm512_set1_epi32(20))), hi);
  }
  static void scale_bytes16(const uint8_t* p, float a, float b, float* f) {
    const __m512 ab = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(a), _mm512_set1_ps(b));
    _mm512_storeu_ps(f, _mm512_mul_ps(_mm512_cvtepi32_ps(bytes(p)), ab));
  }
  static float half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }
  static Vec look(const uint8_t* q, int shift, Lut16 lut) { return _mm512_permutexvar_ps(_mm512_srli_epi32(bytes(q), shift), lut); }
  static Lut16 lut_muladd(const float* values, float a, float b) {
    return _mm512_fmadd_ps(_mm512_loadu_ps(values), _mm512_set1_ps(a), _mm512_set1_ps(b));
  }
  static Vec field(const uint8_t* q, int shift, int mask) {
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(bytes(q), shift), _mm512_set1_epi32(mask)));
  }
  static Vec sbytes(const uint8_t* q) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)))); }
  static Vec bits(uint32_t word, int first) {
    const __m512i at = _mm512_add_epi32(_mm512_set1_epi32(first), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(int(word)), at), _mm512_set1_epi32(1)));
  }
  static Vec bytes_int8(const uint8_t* q) { return _mm512_sub_ps(_mm512_cvtepi32_ps(bytes(q)), _mm512_set1_ps(128.0f)); }
  // E4M3's exponent and mantissa placed at f32's (bits 20-26) and its sign at f32's, times 2^120 (the
  // bias difference; exact, subnormals included); S.1111.111 is NaN.
  static Vec bytes_fp8(const uint8_t* q) {
    const __m512i u = bytes(q), mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7f));
    const __m512i bits = _mm512_or_si512(_mm512_slli_epi32(mag, 20), _mm512_slli_epi32(_mm512_and_si512(u, _mm512_set1_epi32(0x80)), 24));
    const __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p120f));
    return _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f)), _mm512_set1_ps(__builtin_nanf("")));
  }
};
}  // namespace

const GemvTable& gemv_table_avx512() {
  static const GemvTable table = [] {
    GemvTable t = simd::make_table<Avx512>("avx512");
    t.mxfp4 = gemv_mxfp4_avx512();
    t.quant = simd::make_quant_table<Avx512>();
    return t;
  }();
  return table;
}

}  // namespace lineage::kernels
