#include "lineage/core/checked.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace lineage {
namespace checked_test {
namespace {

TEST(Checked, ProductsAndSumsThatLeaveInt64AreRefused) {
  EXPECT_EQ(checked_mul(int64_t(1) << 31, int64_t(1) << 31), int64_t(1) << 62);
  EXPECT_FALSE(checked_mul(int64_t(1) << 32, int64_t(1) << 31));
  EXPECT_FALSE(checked_mul(-1, 4));
  EXPECT_EQ(checked_add(INT64_MAX - 1, 1), INT64_MAX);
  EXPECT_FALSE(checked_add(INT64_MAX, 1));
}

TEST(Checked, ShapesWhoseByteLengthWrapsAreRefused) {
  // (2^58 + 32) · 16 floats are 2^64 + 2048 bytes: unchecked, that wraps onto 2048.
  const Shape wraps = {(int64_t(1) << 58) + 32, 16};
  EXPECT_EQ(checked_numel(wraps), (int64_t(1) << 62) + 512);
  EXPECT_FALSE(checked_nbytes(wraps, DType::F32));
  EXPECT_FALSE(checked_numel({int64_t(1) << 62, 4}));
  EXPECT_FALSE(checked_numel({3, -2}));
  EXPECT_EQ(checked_nbytes({3, 5}, DType::BF16), 30);
  EXPECT_EQ(checked_numel({}), 1);
  EXPECT_EQ(checked_numel({7, 0, int64_t(1) << 62}), 0);
}

TEST(Checked, FirstNonFiniteFindsNaNAndInfInEveryFloatDtype) {
  std::vector<float> f(1000, 2.5f);
  EXPECT_EQ(first_non_finite(DType::F32, f.data(), 1000), -1);
  f[700] = -INFINITY;
  f[900] = NAN;
  EXPECT_EQ(first_non_finite(DType::F32, f.data(), 1000), 700);
  std::vector<uint16_t> h(300, f32_to_bf16(1.0f));
  h[299] = f32_to_bf16(NAN);
  EXPECT_EQ(first_non_finite(DType::BF16, h.data(), 300), 299);
  EXPECT_EQ(first_non_finite(DType::BF16, h.data(), 299), -1);
  std::vector<uint16_t> g(10, f32_to_f16(65504.0f));  // the largest finite half
  EXPECT_EQ(first_non_finite(DType::F16, g.data(), 10), -1);
  g[4] = f32_to_f16(INFINITY);
  EXPECT_EQ(first_non_finite(DType::F16, g.data(), 10), 4);
  std::vector<int32_t> i(10, -1);  // all bits set, but integers are never non-finite
  EXPECT_EQ(first_non_finite(DType::I32, i.data(), 10), -1);
}

}  // namespace
}  // namespace checked_test
}  // namespace lineage
