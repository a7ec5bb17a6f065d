#include "lineage/runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

namespace lineage::runtime {
namespace sampler_test {
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

// The scalar definition, in double: p_i ∝ exp(l_i / T) over the k largest logits (ties to the lower
// id; k = 0: all), cut to the smallest most-likely prefix whose renormalized mass reaches top_p.
std::vector<double> expected_probabilities(const std::vector<float>& logits, const SamplingParams& sp) {
  const size_t V = logits.size();
  std::vector<size_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  if (sp.top_k > 0 && size_t(sp.top_k) < V) order.resize(size_t(sp.top_k));
  std::vector<double> p(V, 0.0);
  double z = 0;
  for (size_t i : order) z += (p[i] = std::exp(double(logits[i]) / sp.temperature));
  size_t keep = order.size();
  if (sp.top_p < 1.0f) {
    double mass = 0;
    for (keep = 0; keep < order.size();)
      if ((mass += p[order[keep++]] / z) >= sp.top_p) break;
    // Far from the cut, so float-level differences in the mass cannot move it.
    EXPECT_GT(mass - p[order[keep - 1]] / z, 0.0) << "test design";
    EXPECT_GT(std::min(sp.top_p - (mass - p[order[keep - 1]] / z), mass - sp.top_p), 0.02) << "top_p at a cut";
  }
  double kept = 0;
  for (size_t j = 0; j < keep; ++j) kept += p[order[j]];
  std::vector<double> out(V, 0.0);
  for (size_t j = 0; j < keep; ++j) out[order[j]] = p[order[j]] / kept;
  return out;
}

// Empirical frequencies of 100k draws against the definition, for temperatures below, at and above 1
// and top-k / top-p cuts alone and together: no draw outside the set, every kept id within 5 standard
// deviations (±0.008 at most), and Pearson's chi-square within its 1e-6 tail. Chosen so that each
// wrong reading fails: the logits multiplied by T (maximum probability error 0.08 to 0.29), the nucleus
// taken from the untempered probabilities (1.5 / 0.7: a different set) or over all ids instead of the
// top k (1.5 / 4 / 0.6: a different set).
TEST(Sampler, FrequenciesMatchTheDefinition) {
  const std::vector<float> logits = {0.3f, 2.0f, -1.0f, 1.1f, -2.5f, 0.9f, 1.6f, -0.4f, 0.0f, -1.7f};
  const SamplingParams cases[] = {{0.7f, 0, 1.0f, 11},  {1.5f, 0, 1.0f, 12},  {1.0f, 0, 1.0f, 13},
                                  {0.7f, 4, 1.0f, 14},  {1.5f, 6, 1.0f, 15},  {1.0f, 0, 0.8f, 16},
                                  {1.5f, 0, 0.7f, 17},  {0.7f, 5, 0.9f, 18},  {1.5f, 4, 0.6f, 19},
                                  {0.7f, 0, 0.5f, 20}};
  constexpr int kDraws = 100000;
  for (const SamplingParams& sp : cases) {
    SCOPED_TRACE(::testing::Message() << "temperature " << sp.temperature << ", top-k " << sp.top_k << ", top-p "
                                      << sp.top_p);
    const std::vector<double> want = expected_probabilities(logits, sp);
    std::vector<int> count(logits.size(), 0);
    Sampler s(sp);
    for (int i = 0; i < kDraws; ++i) ++count[size_t(s.sample(logits))];
    double chi2 = 0;
    int kept = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      if (want[i] == 0) {
        EXPECT_EQ(count[i], 0) << "id " << i << " is outside the top-k / top-p set";
        continue;
      }
      ++kept;
      const double n = kDraws * want[i], sd = std::sqrt(n * (1 - want[i]));
      EXPECT_LE(std::fabs(count[i] - n), 5 * sd) << "id " << i << ": " << count[i] << " draws, expected " << n;
      chi2 += (count[i] - n) * (count[i] - n) / n;
    }
    // The chi-square 1e-6 upper tail for kept − 1 ≤ 9 degrees of freedom is below 4 · (kept − 1) + 24.
    EXPECT_LE(chi2, 4.0 * (kept - 1) + 24) << kept << " ids kept";
  }
}

TEST(Sampler, SameSeedSameDraws) {
  const std::vector<float> logits = {0.3f, 0.1f, 0.2f, 0.5f};
  Sampler a({0.9f, 3, 0.95f, 5}), b({0.9f, 3, 0.95f, 5});
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.sample(logits), b.sample(logits));
}

}  // namespace
}  // namespace sampler_test
}  // namespace lineage::runtime
