// The memory study's claims as measured numbers, one capacity cell recomputed in double straight from
// the write rules' definitions (no kernel), and the SVG writer.
#include "lineage/study/memory.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "lineage/core/parallel.h"
#include "lineage/plot/svg_plot.h"

namespace lineage::study {
namespace study_memory_test {
namespace {

const CapacityResult& cell(const MemoryStudy& s, WriteRule r, int64_t D, double ratio) {
  for (const auto& c : s.capacity)
    if (c.rule == r && c.D == D && c.ratio == ratio) return c;
  throw std::runtime_error("no capacity cell");
}

const ForgettingCurve& curve(const MemoryStudy& s, WriteRule r, FactKey k) {
  for (const auto& c : s.forgetting)
    if (c.rule == r && c.key == k) return c;
  throw std::runtime_error("no forgetting curve");
}

double cosine_at(const ForgettingCurve& c, int64_t t) {
  for (size_t i = 0; i < c.steps.size(); ++i)
    if (c.steps[i] == t) return c.cosine[i];
  throw std::runtime_error("step not measured");
}

TEST(StudyMemory, CapacityAdditiveCorruptsDeltaKeepsTheNewest) {
  MemoryStudyConfig c;
  c.dims = {64}, c.ratios = {1, 2, 8}, c.trials = 4, c.between = {}, c.horizon = 0.25;
  const MemoryStudy s = run_memory_study(c);
  for (double ratio : c.ratios) {
    const auto& add = cell(s, WriteRule::Additive, 64, ratio);
    // Every read is its value plus the other N - 1 values with weights k_i·k_j ~ N(0, 1/D): the
    // expected cosine is about 1/sqrt(1 + (N - 1)/D), for old and new pairs alike.
    EXPECT_NEAR(add.cosine, 1 / std::sqrt(1 + double(add.N - 1) / 64), 0.02) << "N/D " << ratio;
    EXPECT_NEAR(add.recent_cosine, 1 / std::sqrt(1 + double(add.N - 1) / 64), 0.05) << "N/D " << ratio;
    // The delta rule's newest pairs come back whatever was written before them.
    const auto& delta = cell(s, WriteRule::Delta, 64, ratio);
    EXPECT_GE(delta.recent_accuracy, add.recent_accuracy) << "N/D " << ratio;
    EXPECT_GT(delta.recent_cosine, 0.85) << "N/D " << ratio;
  }
  EXPECT_LT(cell(s, WriteRule::Additive, 64, 8).accuracy, 0.5);         // collapsed: 0.33 measured
  EXPECT_LT(cell(s, WriteRule::Additive, 64, 8).recent_accuracy, 0.5);  // the newest pairs too
  EXPECT_GT(cell(s, WriteRule::Delta, 64, 8).recent_accuracy, 0.95);
  // The price of erasing as it writes: with keys that never repeat, the delta rule keeps about the
  // newest D pairs, so over the whole store it recalls less than the additive rule.
  EXPECT_LT(cell(s, WriteRule::Delta, 64, 8).accuracy, 0.25);
  EXPECT_GT(cell(s, WriteRule::Additive, 64, 2).accuracy, cell(s, WriteRule::Delta, 64, 2).accuracy + 0.2);
  // The same total decay spread per channel keeps more of a full store than one scalar.
  EXPECT_GT(cell(s, WriteRule::PerChannel, 64, 1).accuracy, cell(s, WriteRule::GatedDelta, 64, 1).accuracy + 0.1);
}

TEST(StudyMemory, RepeatedKeyDeltaReplacesAdditiveBlends) {
  MemoryStudyConfig c;
  c.dims = {64}, c.ratios = {0.25}, c.trials = 8, c.between = {0.25}, c.horizon = 0.25;
  const MemoryStudy s = run_memory_study(c);
  ASSERT_EQ(s.repeated.size(), 4u);
  for (const auto& r : s.repeated) {
    EXPECT_EQ(r.between, 16);
    if (r.rule == WriteRule::Additive) {
      EXPECT_LT(r.cos_new, 0.8) << "additive blends v1 and v2";
      EXPECT_GT(r.cos_old, 0.4) << "additive keeps v1";
    } else {
      EXPECT_GT(r.cos_new, 0.99) << rule_name(r.rule) << " replaces v1 by v2";
      EXPECT_LT(std::abs(r.cos_old), 0.3) << rule_name(r.rule);
    }
  }
}

TEST(StudyMemory, PerChannelDecayKeepsSlowFactsAndClearsFastOnes) {
  MemoryStudyConfig c;
  c.dims = {64}, c.ratios = {0.25}, c.trials = 8, c.between = {}, c.horizon = 2;
  const MemoryStudy s = run_memory_study(c);
  const auto& kda_slow = curve(s, WriteRule::PerChannel, FactKey::Slow);
  const auto& kda_fast = curve(s, WriteRule::PerChannel, FactKey::Fast);
  const auto& scalar_slow = curve(s, WriteRule::GatedDelta, FactKey::Slow);
  const auto& scalar_fast = curve(s, WriteRule::GatedDelta, FactKey::Fast);
  const auto& delta = curve(s, WriteRule::Delta, FactKey::Slow);
  ASSERT_GT(scalar_slow.steps_to_half, 0);
  // Same mean log-decay: the slow fact outlives the scalar decay's by far, and lives about as long
  // as with no decay at all (the random writes' own erasure is what ends it).
  EXPECT_TRUE(kda_slow.steps_to_half < 0 || kda_slow.steps_to_half >= 3 * scalar_slow.steps_to_half / 2)
      << kda_slow.steps_to_half << " vs " << scalar_slow.steps_to_half;
  EXPECT_GT(cosine_at(kda_slow, 64), cosine_at(scalar_slow, 64) + 0.15);
  EXPECT_NEAR(cosine_at(kda_slow, 64), cosine_at(delta, 64), 0.1);
  // And the price: a fact in the fast channels goes sooner than under the scalar decay.
  EXPECT_LT(cosine_at(kda_fast, 32), cosine_at(scalar_fast, 32) - 0.1);
}

// S [D, D] in double, written straight from the rules' definitions.
struct DirectState {
  int64_t D;
  std::vector<double> S;  // [K, V]
  explicit DirectState(int64_t d) : D(d), S(size_t(d * d), 0.0) {}
  void write(WriteRule r, const float* k, const float* v, const DecaySetup& d) {
    for (int64_t c = 0; c < D; ++c) {
      double a = 1;
      if (r == WriteRule::GatedDelta) a = std::exp(-1 / (d.scalar_lifetime() * double(D)));
      if (r == WriteRule::PerChannel) a = std::exp(-1 / ((c < D / 2 ? d.fast_lifetime : d.slow_lifetime) * double(D)));
      for (int64_t j = 0; j < D; ++j) S[size_t(c * D + j)] *= a;
    }
    const std::vector<double> old = read(k);
    for (int64_t c = 0; c < D; ++c)
      for (int64_t j = 0; j < D; ++j)
        S[size_t(c * D + j)] += k[c] * (v[j] - (r == WriteRule::Additive ? 0.0 : old[size_t(j)]));
  }
  std::vector<double> read(const float* q) const {
    std::vector<double> o(size_t(D), 0.0);
    for (int64_t c = 0; c < D; ++c)
      for (int64_t j = 0; j < D; ++j) o[size_t(j)] += S[size_t(c * D + j)] * q[c];
    return o;
  }
};

double cos_d(const std::vector<double>& a, const float* b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += double(b[i]) * b[i];
  return ab / std::sqrt(aa * bb);
}

TEST(StudyMemory, CapacityCellMatchesADirectDoubleComputation) {
  MemoryStudyConfig c;
  c.dims = {32}, c.ratios = {1.5}, c.trials = 1, c.seed = 7, c.between = {}, c.horizon = 0.25;
  const MemoryStudy s = run_memory_study(c);
  const int64_t D = 32, N = 48, recent = 8;
  const Associations as = random_associations(capacity_seed(7, D, N, 0), N, D);
  for (WriteRule rule : kWriteRules) {
    DirectState st(D);
    for (int64_t i = 0; i < N; ++i) st.write(rule, &as.keys[size_t(i * D)], &as.values[size_t(i * D)], c.decay);
    double hits = 0, cos = 0, recent_hits = 0, recent_cos = 0;
    for (int64_t i = 0; i < N; ++i) {
      const std::vector<double> r = st.read(&as.keys[size_t(i * D)]);
      int64_t best = 0;
      for (int64_t j = 1; j < N; ++j)
        if (cos_d(r, &as.values[size_t(j * D)]) > cos_d(r, &as.values[size_t(best * D)])) best = j;
      const double ci = cos_d(r, &as.values[size_t(i * D)]);
      hits += best == i, cos += ci;
      if (i >= N - recent) recent_hits += best == i, recent_cos += ci;
    }
    const CapacityResult& got = cell(s, rule, D, 1.5);
    ASSERT_EQ(got.N, N);
    ASSERT_EQ(got.recent, recent);
    EXPECT_NEAR(got.cosine, cos / double(N), 1e-5) << rule_name(rule);
    EXPECT_NEAR(got.recent_cosine, recent_cos / double(recent), 1e-5) << rule_name(rule);
    EXPECT_DOUBLE_EQ(got.accuracy, hits / double(N)) << rule_name(rule);
    EXPECT_DOUBLE_EQ(got.recent_accuracy, recent_hits / double(recent)) << rule_name(rule);
  }
}

TEST(StudyMemory, SameResultsForAnyThreadCount) {
  MemoryStudyConfig c;
  c.dims = {16, 32}, c.ratios = {0.5, 4}, c.trials = 3, c.seed = 11, c.horizon = 1;
  nlohmann::json a, b;
  {
    ScopedThreads t(1);
    a = memory_study_json(run_memory_study(c));
  }
  {
    ScopedThreads t(2);
    b = memory_study_json(run_memory_study(c));
  }
  a.erase("seconds"), b.erase("seconds");
  EXPECT_EQ(a, b);
  c.seed = 12;  // and the seed does reach the numbers
  nlohmann::json other = memory_study_json(run_memory_study(c));
  EXPECT_NE(a["capacity"], other["capacity"]);
}

TEST(StudyMemory, SvgPlotDrawsSeriesTicksAndLegend) {
  std::vector<plot::PlotSeries> series = {
      {"a <&> b", {{1, 0.5}, {2, 0.7}, {4, NAN}, {8, 0.9}, {16, 1.0}}, false, ""},
      {"dashed", {{1, 0.1}, {16, 0.2}}, true, "#123456"},
  };
  plot::PlotSpec spec{"Title", "x", "y", true, 2};
  spec.id = "t";
  const std::string svg = plot::svg_line_plot(spec, series);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("a &lt;&amp;&gt; b"), std::string::npos);
  // The NaN breaks the first series into a polyline of two points and one of two.
  const auto count = [&](const std::string& pat) {
    int n = 0;
    for (size_t at = svg.find(pat); at != std::string::npos; at = svg.find(pat, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("<polyline"), 3);
  EXPECT_EQ(count("stroke-dasharray"), 2);  // the dashed line and its legend sample
  EXPECT_NE(svg.find("stroke=\"#123456\""), std::string::npos);
  for (const char* tick : {">1<", ">2<", ">4<", ">8<", ">16<"}) EXPECT_NE(svg.find(tick), std::string::npos) << tick;
  EXPECT_NE(svg.find("clipPath id=\"t-frame\""), std::string::npos);
  // A linear axis gets round ticks.
  spec.log_x = false;
  const std::string lin = plot::svg_line_plot(spec, series);
  for (const char* tick : {">6<", ">10<", ">14<"}) EXPECT_NE(lin.find(tick), std::string::npos) << tick;
}

}  // namespace
}  // namespace study_memory_test
}  // namespace lineage::study
