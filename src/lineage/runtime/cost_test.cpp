// The roofline arithmetic against counts made by hand from the architectures' shapes.
#include "lineage/model/accounting.h"
#include "lineage/runtime/cost.h"

#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "lineage/model/archs/arch.h"
#include "lineage/model/archs/presets.h"

namespace lineage::runtime {
namespace cost_test {
namespace {

// GPT-2 small: L = 12, D = 768, V = 50257, 1024 positions; a block holds 12·D² + 13·D parameters
// (c_attn D·3D + 3D, attn c_proj D·D + D, c_fc D·4D + 4D, mlp c_proj 4D·D + D, two LayerNorms 2·2D).
constexpr double kL = 12, kD = 768, kV = 50257, kP = 1024;
constexpr double kGpt2Params = 124439808;
constexpr double kGpt2Block = 12 * kD * kD + 13 * kD;

TEST(Cost, Gpt2DecodeBytesAreEveryWeightOnceTheHeadWholeAndOneEmbeddingRow) {
  model::Model m = model::preset_skeleton("gpt2-124m");
  ASSERT_DOUBLE_EQ(kV * kD + kP * kD + kL * kGpt2Block + 2 * kD, kGpt2Params);
  // Decode reads the token's embedding row and position row, every block, ln_f, and the tied head
  // (the whole embedding matrix) for the logits.
  const double read = kD + kD + kL * kGpt2Block + 2 * kD + kV * kD;
  ASSERT_DOUBLE_EQ(read, kGpt2Params - kP * kD + kD + kD);
  const DecodeBytes f32 = decode_bytes_per_token(m, 0, DType::F32);
  EXPECT_DOUBLE_EQ(f32.weights, 4 * (kGpt2Params - kP * kD + kD + kD));
  EXPECT_DOUBLE_EQ(f32.state, 0);
  EXPECT_DOUBLE_EQ(decode_bytes_per_token(m, 0, DType::BF16).weights, 2 * read);
  EXPECT_DOUBLE_EQ(decode_bytes_per_token(m, 0, DType::F16).weights, 2 * read);
}

TEST(Cost, Gpt2DecodeStateIsTheKvRowsAttended) {
  model::Model m = model::preset_skeleton("gpt2-124m");
  // K and V, every layer, D floats each, for each of the 128 positions attended.
  EXPECT_DOUBLE_EQ(decode_bytes_per_token(m, 128, DType::F32).state, 2 * kL * kD * 4 * 128);
  // tg32 at depth 128: steps attend 129 .. 160 positions.
  EXPECT_DOUBLE_EQ(mean_decode_context(128, 32), (129 + 160) / 2.0);
  EXPECT_DOUBLE_EQ(mean_decode_context(0, 1), 1.0);
}

TEST(Cost, Gpt2PrefillFlopsAreTwoPerBlockWeightPlusAttention) {
  model::Model m = model::preset_skeleton("gpt2-124m");
  const PrefillFlops p = prefill_flops_per_token(m, 512, 0);
  // Blocks and ln_f every token; the head once per prefill; no embedding work.
  EXPECT_DOUBLE_EQ(p.weights, 2 * (kL * kGpt2Block + 2 * kD) + 2 * kV * kD / 512);
  // q·k and p·v over a mean context of (512 + 1) / 2 positions, every layer.
  EXPECT_DOUBLE_EQ(p.mixers, 4 * kL * kD * 256.5);
  EXPECT_DOUBLE_EQ(prefill_flops_per_token(m, 8, 100).mixers, 4 * kL * kD * (100 + 4.5));
}

TEST(Cost, DeltaNetStateIsReadAndWrittenWhateverTheContext) {
  model::Model m = model::preset_skeleton("deltanet");
  // Per layer: q/k/v/o projections 4·D², short convs 3·D·4, b_proj H·D, o_norm K, two RMSNorms 2·D,
  // SwiGLU 3·D·2048. Tied head.
  const double H = 12, K = 64, F = 2048;
  const double block = 4 * kD * kD + 3 * kD * 4 + H * kD + K + 2 * kD + 3 * kD * F;
  ASSERT_DOUBLE_EQ(block, 7097920);
  const double params = kV * kD + kL * block + kD;
  const DecodeBytes b0 = decode_bytes_per_token(m, 0, DType::F32);
  EXPECT_DOUBLE_EQ(b0.weights, 4 * (params + kD));
  // S [H, K, K] and the conv tail [3, 3·D] per layer, f32, read and written back.
  const double state = kL * 4 * (H * K * K + 3 * 3 * kD);
  EXPECT_DOUBLE_EQ(b0.state, 2 * state);
  EXPECT_DOUBLE_EQ(decode_bytes_per_token(m, 4096, DType::F32).state, 2 * state);
  // Read, write and the delta rule's prediction: 6·K·V per head; no decay.
  EXPECT_DOUBLE_EQ(mixer_flops_per_token(m, 4096), kL * H * K * K * 6);
}

TEST(Cost, ProductFeatureMapRunsOncePerHead) {
  nlohmann::json j = {{"model_type", "linear_attn"}, {"vocab_size", 100},   {"hidden_size", 64},
                      {"num_hidden_layers", 2},      {"num_heads", 4},      {"intermediate_size", 128},
                      {"feature_map", "elementwise_product"}};
  const model::Model m = (*model::find_arch("linear_attn"))(
      model::ArchInput{model::ConfigFields(j, "test"), [](const std::string&) { return false; }});
  // K = 16 per head: the state term 4·H·K·K, plus q's and k's two [K, K] + [K] layers run on the
  // 3 heads beyond the one the weights term counts, 2 FLOP per parameter.
  const double K = 16, H = 4;
  EXPECT_DOUBLE_EQ(mixer_flops_per_token(m, 0), 2 * (4 * H * K * K + 2 * (H - 1) * 2 * (2 * K * K + 2 * K)));
}

TEST(Cost, KdaCountsItsPerChannelDecay) {
  const model::Model m = model::preset_skeleton("kda");
  EXPECT_DOUBLE_EQ(mixer_flops_per_token(m, 0), kL * 12 * 64 * 64 * 7);
  const model::Model la = model::preset_skeleton("linear-attention");
  EXPECT_DOUBLE_EQ(mixer_flops_per_token(la, 0), kL * 12 * 64 * 64 * 4);
}

// A MoE layer's routed experts count as far as a step reads them: k of E at one token; at B tokens
// E·(1 − (1 − k/E)^B) of them. MLA's state: r + d_rope floats per attended position.
TEST(Cost, MoeCountsTheChosenExpertsAndMlaItsLatents) {
  model::Model m = model::preset_skeleton("kimi-linear-bench");  // 3 MoE layers of 2 experts, 1 chosen
  const double D = 1024, I = 1024, expert = 3 * D * I * 4;
  const double all = double(model::count_params(m).total) * 4, embed = 1024 * D * 4;
  const DecodeBytes one = decode_bytes_per_token(m, 0, DType::F32);
  EXPECT_DOUBLE_EQ(one.weights, all - embed + D * 4 - 3 * expert);  // one expert of two unread, three layers
  const DecodeBytes four = decode_bytes_per_token(m, 0, DType::F32, 4);
  EXPECT_NEAR(four.weights, all - embed + D * 4 - 3 * 2 * expert * std::pow(0.5, 4), 1e-3);
  EXPECT_DOUBLE_EQ(decode_bytes_per_token(m, 100, DType::F32).state - one.state, 100 * (512 + 64) * 4);
  // Prefill: a token runs one of the two experts.
  const double active = double(model::count_params(m).activated);
  EXPECT_NEAR(prefill_flops_per_token(m, 1, 0).weights, 2 * (active - 1024 * D), 1e-3);
}

}  // namespace
}  // namespace cost_test
}  // namespace lineage::runtime
