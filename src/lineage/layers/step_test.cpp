#include "lineage/layers/step.h"

#include <gtest/gtest.h>

namespace lineage::layers {
namespace step_test {
namespace {

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
}  // namespace step_test
}  // namespace lineage::layers
