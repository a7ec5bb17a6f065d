// Element types as stored in checkpoints, and the scalar conversions the kernels widen with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace lineage {

// F8_E4M3: OCP FP8 (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities, S.1111.111
// NaN, largest 448), the element type of FP8 checkpoints' weights and NVFP4's block scales.
enum class DType : uint8_t { F64, F32, F16, BF16, I64, I32, I16, I8, U8, Bool, F8_E4M3 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);                              // "F32", "BF16", ... (safetensors spelling)
std::optional<DType> dtype_from_name(std::string_view name);       // accepts the safetensors spelling
std::optional<DType> dtype_from_user(std::string_view name);       // "f32" | "f16" | "bf16" (CLI spelling)
inline bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64; }

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as PyTorch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Index of the first NaN or ±Inf among n elements of a floating-point dtype, or -1 when all are
// finite (and for integer dtypes). Reads the bits only, so it runs at memory speed.
int64_t first_non_finite(DType t, const void* data, int64_t n);

float f16_to_f32(uint16_t h);
// The value of an F8_E4M3 byte (exact in f32; NaN for 0x7f and 0xff).
float e4m3_to_f32(uint8_t b);
uint16_t f32_to_f16(float f);

}  // namespace lineage
