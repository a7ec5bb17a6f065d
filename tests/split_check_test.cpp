// The comparison behind `lineage tour`'s "chunked = decode" column (runtime/split_check.h): on inputs
// that differ by known amounts, and on golden models against an independent computation.
#include <gtest/gtest.h>

#include <cmath>

#include "lineage/io/load_model.h"
#include "lineage/io/npy.h"
#include "lineage/runtime/session.h"
#include "lineage/runtime/split_check.h"
#include "batch_check.h"
#include "test_support.h"

namespace lineage {
namespace split_check_test {
namespace {

namespace fs = std::filesystem;

TEST(SplitCheck, RelativeRmsOfInputsThatDiffer) {
  using V = std::vector<float>;
  EXPECT_EQ(runtime::relative_rms(V{1, 2, 3, 4}, V{1, 2, 3, 4}), 0.0);
  EXPECT_DOUBLE_EQ(runtime::relative_rms(V{1, 2, 3, 5}, V{1, 2, 3, 4}), 1 / std::sqrt(30.0));
  EXPECT_DOUBLE_EQ(runtime::relative_rms(V{2, 4}, V{1, 2}), 1.0);  // ‖got − want‖ over ‖want‖, not ‖got‖
  EXPECT_DOUBLE_EQ(runtime::relative_rms(V{0, 0, 0}, V{3, 0, 4}), 1.0);
  EXPECT_DOUBLE_EQ(runtime::relative_rms(V{1, 0}, V{0, 1}), std::sqrt(2.0));  // element by element
  EXPECT_TRUE(runtime::prefill_equals_decode(0.0));
  EXPECT_TRUE(runtime::prefill_equals_decode(9.9e-5));
  EXPECT_FALSE(runtime::prefill_equals_decode(1e-4));
  EXPECT_FALSE(runtime::prefill_equals_decode(0.3));
  const auto t = runtime::split_check_tokens(50, 48, 7);
  EXPECT_EQ(t.size(), 48u);
  for (int32_t id : t) EXPECT_TRUE(id >= 0 && id < 50) << id;
  EXPECT_NE(t, runtime::split_check_tokens(50, 48, 8));
}

// prefill_decode_rel_rms against the same comparison written out here (a whole prefill of all
// positions vs the tokens decoded one by one in a fresh session). The two paths run different kernels
// (GEMM or the chunked kernel vs GEMV and the recurrent step), so their logits differ in the last
// bits: an exact 0 would mean a path was compared with itself. (Should they ever agree bit for bit,
// that expectation, not the engine, must change.)
TEST(SplitCheck, PrefillAgainstDecodeOnGoldenModels) {
  for (const char* c : {"gpt2/f32_tanh", "gpt2/f32_head64", "delta_net/f32", "kda/f32_gva"}) {
    SCOPED_TRACE(c);
    const fs::path dir = test::testdata() / c;
    io::LoadedModel lm = io::load_model(dir, false);
    const Tensor toks = io::load_npy(dir / "golden" / "tokens.npy");
    const std::vector<int32_t> ids(toks.data<int32_t>(), toks.data<int32_t>() + toks.numel());
    const double got = runtime::prefill_decode_rel_rms(lm.model, ids);
    runtime::Session whole(lm.model), step(lm.model);
    const auto all = whole.prefill(ids, true);
    const std::vector<float> prefill(all.begin(), all.end());
    std::vector<float> decoded;
    for (int32_t id : ids) {
      const auto l = step.decode(id);
      decoded.insert(decoded.end(), l.begin(), l.end());
    }
    ASSERT_EQ(decoded.size(), prefill.size());
    const double want = test::rel_rms(decoded.data(), prefill.data(), int64_t(prefill.size()));
    EXPECT_GT(want, 0.0);
    EXPECT_LT(want, 1e-5);
    EXPECT_NEAR(got, want, 1e-9 * want);
    // Logits shifted by one position (decode step t against prefill row t + 1) are far apart.
    const int64_t V = lm.model.config.vocab_size;
    const double shifted = runtime::relative_rms(std::span(decoded).first(decoded.size() - V),
                                                 std::span(prefill).subspan(size_t(V)));
    EXPECT_FALSE(runtime::prefill_equals_decode(shifted)) << shifted;
  }
}

// first_divergence: nothing on golden models whose routing has margins (prefill and decode agree
// everywhere); on seeded K3 presets (MoE with random routers, MXFP4 experts) either nothing or a
// routing flip at a near tie, never another intermediate: a real cache, state or kernel error would
// show there first, before any expert choice.
TEST(SplitCheck, FirstDivergenceIsNothingOrARoutingTie) {
  for (const char* c : {"kda/f32_gva", "kimi_k3/mxfp4_routed", "kimi_linear/f32"}) {
    io::LoadedModel lm = io::load_model(test::testdata() / c, false);
    const Tensor toks = io::load_npy(test::testdata() / c / "golden" / "tokens.npy");
    const std::vector<int32_t> ids(toks.data<int32_t>(), toks.data<int32_t>() + toks.numel());
    EXPECT_EQ(runtime::first_divergence(lm.model, ids).name, "") << c;
  }
  int flips = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const model::Model m = test::tiny_preset("kimi-k3-mxfp4", seed);
    const auto ids = runtime::split_check_tokens(m.config.vocab_size, 48, seed);
    const runtime::Divergence d = runtime::first_divergence(m, ids);
    const double rel = runtime::prefill_decode_rel_rms(m, ids);
    if (d.name.empty()) {
      EXPECT_TRUE(runtime::prefill_equals_decode(rel)) << "seed " << seed << ": logits differ but no intermediate does";
      continue;
    }
    ++flips;
    EXPECT_TRUE(d.routing_flip) << "seed " << seed << ": first differs at " << d.name << " (" << d.rel_rms << ")";
    EXPECT_LE(d.router_rel_rms, runtime::kPrefillDecodeTolerance);
  }
  std::printf("kimi-k3-mxfp4 tiny presets, 12 seeds: %d with a near-tie routing flip\n", flips);
}

}  // namespace
}  // namespace split_check_test
}  // namespace lineage
