#include "lineage/core/dtype.h"

#include <algorithm>
#include <cmath>

namespace lineage {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::F64, "F64", 8}, {DType::F32, "F32", 4}, {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2},
    {DType::I64, "I64", 8}, {DType::I32, "I32", 4}, {DType::I16, "I16", 2}, {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},   {DType::Bool, "BOOL", 1}, {DType::F8_E4M3, "F8_E4M3", 1},
};
}  // namespace

size_t dtype_size(DType t) { return kDTypes[int(t)].size; }

namespace {
// The first element whose exponent bits are all set (NaN or Inf); blocks of 256 are OR-reduced
// first so the common all-finite case is one vectorizable pass.
template <class U>
int64_t first_all_ones(const U* x, int64_t n, U exponent) {
  for (int64_t b = 0; b < n; b += 256) {
    const int64_t e = std::min(n, b + 256);
    unsigned any = 0;
#pragma omp simd reduction(| : any)
    for (int64_t i = b; i < e; ++i) any |= unsigned((x[i] & exponent) == exponent);
    if (!any) continue;
    for (int64_t i = b; i < e; ++i)
      if ((x[i] & exponent) == exponent) return i;
  }
  return -1;
}
}  // namespace

int64_t first_non_finite(DType t, const void* data, int64_t n) {
  switch (t) {
    case DType::F64: return first_all_ones(static_cast<const uint64_t*>(data), n, uint64_t(0x7ff0000000000000ull));
    case DType::F32: return first_all_ones(static_cast<const uint32_t*>(data), n, uint32_t(0x7f800000u));
    case DType::F16: return first_all_ones(static_cast<const uint16_t*>(data), n, uint16_t(0x7c00u));
    case DType::BF16: return first_all_ones(static_cast<const uint16_t*>(data), n, uint16_t(0x7f80u));
    default: return -1;
  }
}
std::string_view dtype_name(DType t) { return kDTypes[int(t)].name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.type;
  return std::nullopt;
}

std::optional<DType> dtype_from_user(std::string_view name) {
  if (name == "f32") return DType::F32;
  if (name == "f16") return DType::F16;
  if (name == "bf16") return DType::BF16;
  return std::nullopt;
}

float e4m3_to_f32(uint8_t b) {
  if ((b & 0x7f) == 0x7f) return std::nanf("");
  const int e = (b >> 3) & 15, m = b & 7;
  const float mag = e ? std::ldexp(float(8 + m), e - 10) : std::ldexp(float(m), -9);
  return b & 0x80 ? -mag : mag;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: value = man * 2^-24
      float f = std::ldexp(float(man), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even with overflow to inf and gradual underflow, as IEEE conversion does.
uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (u < 0x38800000u) {                         // below the smallest normal 2^-14
    float a;
    std::memcpy(&a, &u, 4);
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));  // units of 2^-24, ties to even
  }
  const uint32_t round = 0xfffu + ((u >> 13) & 1u);
  return sign | uint16_t((u + round - (112u << 23)) >> 13);
}

}  // namespace lineage
