// Portable GEMV (one lane): the fallback on CPUs without AVX2.
#include "lineage/core/dtype.h"
#include "lineage/kernels/x86/gemv.h"
#include "lineage/kernels/x86/gemv_simd.h"

namespace lineage::kernels {
namespace simd {
template <> inline float load_scalar<0>(const void* w, int64_t i) { return static_cast<const float*>(w)[i]; }
template <> inline float load_scalar<1>(const void* w, int64_t i) { return f16_to_f32(static_cast<const uint16_t*>(w)[i]); }
template <> inline float load_scalar<2>(const void* w, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(w)[i]); }
}  // namespace simd

namespace {
struct Scalar {
  using Vec = float;
  static constexpr int kWidth = 1;
  static Vec zero() { return 0.0f; }
  static Vec broadcast(float v) { return v; }
  static Vec load_f32(const float* p) { return *p; }
  static Vec load_f16(const uint16_t* p) { return f16_to_f32(*p); }
  static Vec load_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
  static Vec fma(Vec a, Vec b, Vec c) { return a * b + c; }
  static void store(float* p, Vec v) { *p = v; }
  static float sum(Vec v) { return v; }
};
}  // namespace

const GemvTable& gemv_table_scalar() {
  static const GemvTable table = simd::make_table<Scalar>("scalar");
  return table;
}

}  // namespace lineage::kernels
