// transposed(): every element lands at its mirrored place, for element sizes 2 and 4 and shapes that
// do not divide into the 64 × 64 blocks it copies by.
#include <gtest/gtest.h>

#include <cstdint>

#include "lineage/core/tensor.h"

namespace lineage {
namespace tensor_test {
namespace {

template <class E>
void expect_transposed(DType dtype, int64_t rows, int64_t cols) {
  Tensor t = Tensor::empty(dtype, {rows, cols});
  E* s = static_cast<E*>(t.raw_mut());
  for (int64_t i = 0; i < rows * cols; ++i) s[i] = E(i * 2654435761u);  // distinct bit patterns
  const Tensor u = transposed(t);
  ASSERT_EQ(u.dtype(), dtype);
  ASSERT_EQ(u.shape(), (Shape{cols, rows}));
  const E* d = static_cast<const E*>(u.raw());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(d[c * rows + r], s[r * cols + c]) << r << ", " << c;
}

TEST(Tensor, TransposedMirrorsEveryElement) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {1, 100}, {100, 1}, {64, 64}, {65, 130}, {200, 77}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    expect_transposed<uint32_t>(DType::F32, rows, cols);
    expect_transposed<uint16_t>(DType::BF16, rows, cols);
  }
}

TEST(Tensor, TransposedNeedsTwoDims) {
  EXPECT_DEATH(transposed(Tensor::empty(DType::F32, {2, 3, 4})), "expects a 2-D tensor, got 3 dims");
}

}  // namespace
}  // namespace tensor_test
}  // namespace lineage
