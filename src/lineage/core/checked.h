// Size arithmetic on numbers that come from outside (shapes in a file header, config fields):
// every product and sum is checked, so a crafted value cannot wrap onto a small, plausible size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "lineage/core/dtype.h"
#include "lineage/core/tensor.h"

namespace lineage {

// a·b and a + b for non-negative sizes; nothing where a operand is negative or the result leaves int64.
inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The element count of a shape, or nothing when a dim is negative or the product overflows.
std::optional<int64_t> checked_numel(const Shape& s);
// The byte length of a dense tensor, or nothing on overflow.
std::optional<int64_t> checked_nbytes(const Shape& s, DType t);

}  // namespace lineage
