// Portable GEMV (one lane): the fallback on CPUs without AVX2. MXFP4 codes index a 16-entry table.
#include <cstring>

#include "lineage/core/dtype.h"
#include "lineage/kernels/x86/gemv.h"
#include "lineage/kernels/x86/gemv_mxfp4.h"
#include "lineage/kernels/x86/gemv_quant.h"
#include "lineage/kernels/x86/gemv_simd.h"

namespace lineage::kernels {
namespace {
struct Scalar {
  using Vec = float;
  static constexpr int kWidth = 1;
  static Vec zero() { return 0.0f; }
  static Vec broadcast(float v) { return v; }
  static Vec load_f32(const float* p) { return *p; }
  static Vec load_f16(const uint16_t* p) { return simd::load_scalar<1>(p, 0); }
  static Vec load_bf16(const uint16_t* p) { return simd::load_scalar<2>(p, 0); }
  static Vec load_f32_n(const float* p, int n) { return n ? *p : 0.0f; }
  static Vec load_f16_n(const uint16_t* p, int n) { return n ? load_f16(p) : 0.0f; }
  static Vec load_bf16_n(const uint16_t* p, int n) { return n ? load_bf16(p) : 0.0f; }
  static Vec add(Vec a, Vec b) { return a + b; }
  static Vec fma(Vec a, Vec b, Vec c) { return a * b + c; }
  static void store(float* p, Vec v) { *p = v; }
  static float sum(Vec v) { return v; }
  static void prefetch_stream(const char*) {}
  static void prefetch(const char*) {}
  struct Lut {
    float v[16];
  };
  static constexpr int kMxfp4Rows = 4;
  static Lut mxfp4_lut(float scale) {
    Lut l;
    for (int c = 0; c < 16; ++c) l.v[c] = simd::kMxfp4Codes[c] * scale;
    return l;
  }
  static void mxfp4_decode(const uint8_t* q, const Lut& lut, Vec& even, Vec& odd) {
    even = lut.v[*q & 15];
    odd = lut.v[*q >> 4];
  }
  // Quantized codes (gemv_quant.h).
  using Lut16 = Lut;
  static constexpr int kQuantRows = 4;
  static Vec mul(Vec a, Vec b) { return a * b; }
  static Vec sub(Vec a, Vec b) { return a - b; }
  static Vec halves(float a, float) { return a; }
  static Lut16 lut16(const float* values, float scale, float zero) {
    Lut16 l;
    for (int c = 0; c < 16; ++c) l.v[c] = (values[c] - zero) * scale;
    return l;
  }
  static void nibbles(const uint8_t* q, const Lut16& lut, Vec& even, Vec& odd) { mxfp4_decode(q, lut, even, odd); }
  static Vec bytes_int8(const uint8_t* q) { return float(int(*q) - 128); }
  static Vec bytes_fp8(const uint8_t* q) { return e4m3_to_f32(*q); }
  // ggml's blocks (gemv_ggml.h).
  static Vec combine(const uint8_t* lo, int ls, const uint8_t* hi, int hs, int mask) {
    return float(((*lo >> ls) & 15) | (((*hi >> hs) & mask) << 4));
  }
  static void scale_bytes16(const uint8_t* p, float a, float b, float* f) {
    for (int i = 0; i < 16; ++i) f[i] = float(p[i]) * (i < 8 ? a : b);
  }
  static float half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return f16_to_f32(h);
  }
  static Vec look(const uint8_t* q, int shift, const Lut16& lut) { return lut.v[(*q >> shift) & 15]; }
  static Lut16 lut_muladd(const float* values, float a, float b) {
    Lut16 l;
    for (int c = 0; c < 16; ++c) l.v[c] = values[c] * a + b;
    return l;
  }
  static Vec field(const uint8_t* q, int shift, int mask) { return float((*q >> shift) & mask); }
  static Vec sbytes(const uint8_t* q) { return float(int8_t(*q)); }
  static Vec bits(uint32_t word, int first) { return float((word >> first) & 1); }
};
}  // namespace

const GemvTable& gemv_table_scalar() {
  static const GemvTable table = [] {
    GemvTable t = simd::make_table<Scalar>("scalar");
    t.mxfp4 = simd::make_mxfp4_table<Scalar>();
    t.quant = simd::make_quant_table<Scalar>();
    return t;
  }();
  return table;
}

}  // namespace lineage::kernels
