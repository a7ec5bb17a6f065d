// AVX2 + FMA GEMV (8 lanes): f16 widened with vcvtph2ps (F16C), bf16 with a 16-bit shift, MXFP4 codes'
// magnitudes looked up in an 8-entry f32 table (vpermps) and their sign bits moved to the f32 sign.
#include <immintrin.h>

#include <cstring>

#include "lineage/kernels/x86/gemv.h"
#include "lineage/kernels/x86/gemv_mxfp4.h"
#include "lineage/kernels/x86/gemv_quant.h"
#include "lineage/kernels/x86/gemv_simd.h"

namespace lineage::kernels {
namespace {
struct Avx2 {
  using Vec = __m256;
  static constexpr int kWidth = 8;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec broadcast(float v) { return _mm256_set1_ps(v); }
  static Vec load_f32(const float* p) { return _mm256_loadu_ps(p); }
  static Vec load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static Vec load_bf16(const uint16_t* p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  // The first n (0 < n ≤ 8) elements, the other lanes zero; nothing past them is read (AVX2 has no
  // masked 16-bit load, so those go through a zeroed copy).
  static __m256i first(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
  static Vec load_f32_n(const float* p, int n) { return _mm256_maskload_ps(p, first(n)); }
  static Vec load_f16_n(const uint16_t* p, int n) {
    alignas(16) uint16_t b[8] = {};
    std::memcpy(b, p, size_t(n) * 2);
    return load_f16(b);
  }
  static Vec load_bf16_n(const uint16_t* p, int n) {
    alignas(16) uint16_t b[8] = {};
    std::memcpy(b, p, size_t(n) * 2);
    return load_bf16(b);
  }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static float sum(Vec v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
  }
  static void prefetch_stream(const char* p) { _mm_prefetch(p, _MM_HINT_NTA); }
  static void prefetch(const char* p) { _mm_prefetch(p, _MM_HINT_T0); }
  // MXFP4: the 8 magnitudes times the block's scale; vpermps reads an index's low 3 bits, and bit 3
  // of each code becomes the f32 sign.
  using Lut = __m256;
  static constexpr int kMxfp4Rows = 2;  // 8 accumulators of the 16 ymm registers
  static Lut mxfp4_lut(float scale) {
    return _mm256_mul_ps(_mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f), _mm256_set1_ps(scale));
  }
  static void mxfp4_decode(const uint8_t* q, Lut lut, Vec& even, Vec& odd) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
    const __m256i sign = _mm256_set1_epi32(int(0x80000000u));
    const __m256i even_sign = _mm256_and_si256(_mm256_slli_epi32(v, 28), sign);
    const __m256i odd_sign = _mm256_and_si256(_mm256_slli_epi32(v, 24), sign);
    even = _mm256_xor_ps(_mm256_permutevar8x32_ps(lut, v), _mm256_castsi256_ps(even_sign));
    odd = _mm256_xor_ps(_mm256_permutevar8x32_ps(lut, _mm256_srli_epi32(v, 4)), _mm256_castsi256_ps(odd_sign));
  }
  // Quantized codes (gemv_quant.h): a 16-entry table as two halves, vpermps on the low 3 bits of each
  // index and bit 3 choosing the half.
  struct Lut16 {
    __m256 lo, hi;
  };
  static constexpr int kQuantRows = 2;
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec halves(float a, float b) { return _mm256_setr_ps(a, a, a, a, b, b, b, b); }
  static Lut16 lut16(const float* values, float scale, float zero) {
    const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps(zero);
    return {_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(values), z), s),
            _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(values + 8), z), s)};
  }
  static Vec lookup(const Lut16& lut, __m256i idx) {
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lut.lo, idx), _mm256_permutevar8x32_ps(lut.hi, idx),
                            _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
  }
  static void nibbles(const uint8_t* q, const Lut16& lut, Vec& even, Vec& odd) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
    even = lookup(lut, v);
    odd = lookup(lut, _mm256_srli_epi32(v, 4));
  }
  static __m256i bytes(const uint8_t* q) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))); }
  // ggml's blocks (gemv_ggml.h).
  static Vec combine(const uint8_t* lo, int ls, const uint8_t* hi, int hs, int mask) {
    const __m256i l = _mm256_and_si256(_mm256_srli_epi32(bytes(lo), ls), _mm256_set1_epi32(15));
    const __m256i h = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(bytes(hi), hs), _mm256_set1_epi32(mask)), 4);
    return _mm256_cvtepi32_ps(_mm256_or_si256(l, h));
  }
  static void scale_bytes16(const uint8_t* p, float a, float b, float* f) {
    _mm256_storeu_ps(f, _mm256_mul_ps(_mm256_cvtepi32_ps(bytes(p)), _mm256_set1_ps(a)));
    _mm256_storeu_ps(f + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(bytes(p + 8)), _mm256_set1_ps(b)));
  }
  static float half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }
  static Vec look(const uint8_t* q, int shift, const Lut16& lut) { return lookup(lut, _mm256_srli_epi32(bytes(q), shift)); }
  static Lut16 lut_muladd(const float* values, float a, float b) {
    const __m256 av = _mm256_set1_ps(a), bv = _mm256_set1_ps(b);
    return {_mm256_fmadd_ps(_mm256_loadu_ps(values), av, bv), _mm256_fmadd_ps(_mm256_loadu_ps(values + 8), av, bv)};
  }
  static Vec field(const uint8_t* q, int shift, int mask) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(bytes(q), shift), _mm256_set1_epi32(mask)));
  }
  static Vec sbytes(const uint8_t* q) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)))); }
  static Vec bits(uint32_t word, int first) {
    const __m256i at = _mm256_add_epi32(_mm256_set1_epi32(first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(word)), at), _mm256_set1_epi32(1)));
  }
  static Vec bytes_int8(const uint8_t* q) {
    return _mm256_sub_ps(_mm256_cvtepi32_ps(bytes(q)), _mm256_set1_ps(128.0f));
  }
  // E4M3's exponent and mantissa placed at f32's (bits 20-26) and its sign at f32's, times 2^120 (the
  // bias difference; exact, subnormals included); S.1111.111 is NaN.
  static Vec bytes_fp8(const uint8_t* q) {
    const __m256i u = bytes(q), mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7f));
    const __m256i bits = _mm256_or_si256(_mm256_slli_epi32(mag, 20), _mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x80)), 24));
    const __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0x1p120f));
    return _mm256_blendv_ps(v, _mm256_set1_ps(__builtin_nanf("")),
                            _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f))));
  }
};
}  // namespace

const GemvTable& gemv_table_avx2() {
  static const GemvTable table = [] {
    GemvTable t = simd::make_table<Avx2>("avx2");
    t.mxfp4 = simd::make_mxfp4_table<Avx2>();
    t.quant = simd::make_quant_table<Avx2>();
    return t;
  }();
  return table;
}

}  // namespace lineage::kernels
