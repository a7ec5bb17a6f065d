#include "lineage/layers/common.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace lineage::layers {
namespace common_test {
namespace {

// A Buffer hands out cache-line aligned memory; growing keeps what it held, zeroes the rest, and
// is counted; asking for no more than it has is free.
TEST(Buffer, AlignedGrowthKeepsContentsAndIsCounted) {
  Buffer s;
  const int64_t before = Buffer::growths();
  float* a = s.get(3);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  a[0] = 1, a[1] = 2, a[2] = 3;
  EXPECT_EQ(s.get(2), a);  // smaller or equal: the same buffer, no growth
  EXPECT_EQ(Buffer::growths(), before + 1);
  float* b = s.get(100000);
  EXPECT_EQ(Buffer::growths(), before + 2);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u);
  EXPECT_EQ(b[0], 1);
  EXPECT_EQ(b[1], 2);
  EXPECT_EQ(b[2], 3);
  for (int i = 3; i < 100000; ++i) ASSERT_EQ(b[i], 0.0f) << i;
  EXPECT_EQ(s.bytes(), 400000u);
}

}  // namespace
}  // namespace common_test
}  // namespace lineage::layers
