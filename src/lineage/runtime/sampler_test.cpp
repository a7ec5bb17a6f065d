#include "lineage/runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace lineage::runtime {
namespace {

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s({0.0f, 0, 1.0f, 1});
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 3.0f, -1.0f, 3.0f}), 1);
}

TEST(Sampler, TopKAndTopPRestrictTheCandidates) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f};
  std::map<int, int> seen_k, seen_p;
  Sampler k({1.0f, 2, 1.0f, 42}), p({1.0f, 0, 0.5f, 42});
  for (int i = 0; i < 2000; ++i) ++seen_k[k.sample(logits)], ++seen_p[p.sample(logits)];
  EXPECT_EQ(seen_k.size(), 2u);  // only ids 0 and 1
  EXPECT_TRUE(seen_k.count(0) && seen_k.count(1));
  // softmax probabilities: p0 ≈ 0.54 ≥ 0.5, so top-p 0.5 keeps id 0 alone.
  EXPECT_EQ(seen_p.size(), 1u);
  EXPECT_TRUE(seen_p.count(0));
}

TEST(Sampler, TemperatureMatchesSoftmaxFrequencies) {
  const std::vector<float> logits = {0.0f, std::log(3.0f)};  // probabilities 1/4, 3/4
  Sampler s({1.0f, 0, 1.0f, 7});
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.sample(logits);
  EXPECT_NEAR(double(ones) / n, 0.75, 0.02);
}

TEST(Sampler, SameSeedSameDraws) {
  const std::vector<float> logits = {0.3f, 0.1f, 0.2f, 0.5f};
  Sampler a({0.9f, 3, 0.95f, 5}), b({0.9f, 3, 0.95f, 5});
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.sample(logits), b.sample(logits));
}

}  // namespace
}  // namespace lineage::runtime
