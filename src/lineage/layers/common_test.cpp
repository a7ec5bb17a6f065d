#include "lineage/layers/common.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace lineage::layers {
namespace {

// Scratch hands out cache-line aligned buffers; growing one keeps what it held and zeroes the rest.
TEST(Scratch, AlignedBuffersKeepTheirContentsAsTheyGrow) {
  Scratch s;
  float* a = s.get(2, 3);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  a[0] = 1, a[1] = 2, a[2] = 3;
  EXPECT_EQ(s.get(2, 2), a);  // smaller or equal: the same buffer
  float* b = s.get(2, 100000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u);
  EXPECT_EQ(b[0], 1);
  EXPECT_EQ(b[1], 2);
  EXPECT_EQ(b[2], 3);
  for (int i = 3; i < 100000; ++i) ASSERT_EQ(b[i], 0.0f) << i;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.get(0, 17)) % 64, 0u);  // a lower slot after a higher one
}

}  // namespace
}  // namespace lineage::layers
