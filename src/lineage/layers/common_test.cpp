#include "lineage/layers/common.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace lineage::layers {
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

// A step lays its sequences out as fla's cu_seqlens, and clear() starts over.
TEST(Step, OffsetsFollowTheSequences) {
  Step st;
  const int32_t a[] = {5, 6, 7}, b[] = {9};
  st.add(3, 0, a);
  st.add(1, 12, b);
  EXPECT_EQ(st.n_tokens(), 4);
  EXPECT_EQ(st.n_seqs(), 2);
  EXPECT_EQ(st.seq_begin, (std::vector<int64_t>{0, 3, 4}));
  EXPECT_EQ(st.begin(1), 3);
  EXPECT_EQ(st.length(0), 3);
  EXPECT_EQ(st.length(1), 1);
  EXPECT_EQ(st.slots, (std::vector<int32_t>{3, 1}));
  EXPECT_EQ(st.starts, (std::vector<int64_t>{0, 12}));
  st.clear();
  EXPECT_EQ(st.n_seqs(), 0);
  EXPECT_EQ(st.seq_begin, (std::vector<int64_t>{0}));
}

}  // namespace
}  // namespace lineage::layers
