// The presets at their real size (12 layers, width 768, 12 heads), on two threads: one prefill of a
// prompt long enough for every parallel path of prefill (chunked delta rule, tiled attention, row-
// split norms, gates and convolutions, GEMM blocks) gives the logits that token-by-token decode
// (the serial per-token paths and the GEMVs) and a prefill in two uneven pieces give. The golden
// checkpoints are too small to reach most of those paths.
#include <gtest/gtest.h>

#include <vector>

#include "lineage/core/rng.h"
#include "lineage/kernels/threads.h"
#include "lineage/model/archs/presets.h"
#include "lineage/runtime/session.h"
#include "test_support.h"

namespace lineage {
namespace preset_split_test {
namespace {

class PresetSplit : public testing::TestWithParam<const char*> {};

TEST_P(PresetSplit, WholePrefillEqualsPiecesAndTokenByToken) {
  kernels::set_threads(2);
  const model::Model m = model::make_preset(GetParam(), 3, DType::F32);
  const int64_t T = 160, V = m.config.vocab_size;
  const std::vector<int32_t> tokens = random_tokens(T, V, 11);

  runtime::Session whole(m), pieces(m), step(m);
  const auto all = whole.prefill(tokens, true);
  const std::vector<float> want(all.begin(), all.end());

  std::vector<float> got;
  for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 97}, {97, T}}) {
    const auto l = pieces.prefill(std::span<const int32_t>(tokens.data() + b, size_t(e - b)), true);
    got.insert(got.end(), l.begin(), l.end());
  }
  EXPECT_LE(test::rel_rms(got.data(), want.data(), int64_t(want.size())), 1e-5) << "prefill in pieces 97 + 63";

  got.clear();
  for (int32_t t : tokens) {
    const auto l = step.decode(t);
    got.insert(got.end(), l.begin(), l.end());
  }
  EXPECT_LE(test::rel_rms(got.data(), want.data(), int64_t(want.size())), 1e-5) << "token-by-token decode";
  kernels::set_threads(0);
}

INSTANTIATE_TEST_SUITE_P(Presets, PresetSplit, testing::Values("gpt2-124m", "linear-attention", "gated-deltanet", "kda"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace preset_split_test
}  // namespace lineage
