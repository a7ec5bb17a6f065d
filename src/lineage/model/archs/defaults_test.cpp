// A config.json that names only the architecture takes the family's published defaults (HF
// GPT2Config; fla's configuration classes, shared/spec/linear-attention-family.md §6).
#include <gtest/gtest.h>

#include "lineage/model/archs/arch.h"

namespace lineage::model {
namespace defaults_test {
namespace {

Model build(const std::string& type, const nlohmann::json& extra = nlohmann::json::object(),
            bool has_lm_head = false) {
  nlohmann::json cfg = {{"model_type", type}};
  if (extra.is_object()) cfg.update(extra);
  static nlohmann::json keep;  // ConfigFields holds a reference while the builder runs
  keep = cfg;
  return (*find_arch(type))({ConfigFields(keep, "config.json"),
                             [&](const std::string& n) { return has_lm_head && n == "lm_head.weight"; }});
}

TEST(ArchDefaults, Gpt2IsGpt2Small) {
  const Model m = build("gpt2");
  EXPECT_EQ(m.n_layers(), 12);
  EXPECT_EQ(m.config.d_model, 768);
  EXPECT_EQ(m.config.vocab_size, 50257);
  EXPECT_EQ(m.config.max_positions, 1024);
  EXPECT_TRUE(m.config.tied_lm_head);
  EXPECT_EQ(m.config.eos_token_id, 50256);
  EXPECT_EQ(m.config.bos_token_id, 50256);
  const auto& a = std::get<layers::Attention>(m.blocks[0].mixer).config;
  EXPECT_EQ(a.n_heads, 12);
  EXPECT_EQ(a.head_dim, 64);
  EXPECT_EQ(std::get<layers::Mlp>(m.blocks[0].ffn).config.hidden, 3072);
  EXPECT_FLOAT_EQ(m.final_norm.eps, 1e-5f);
}

TEST(ArchDefaults, Gpt2TiesItsHeadUnlessTheConfigSaysNot) {
  // HF ties a GPT-2 head by default even when the file stores lm_head.weight; it is then ignored.
  const Model tied = build("gpt2", {}, true);
  EXPECT_TRUE(tied.config.tied_lm_head);
  const auto& ignored = tied.binding.ignore_suffixes;
  EXPECT_NE(std::find(ignored.begin(), ignored.end(), "lm_head.weight"), ignored.end());
  EXPECT_FALSE(build("gpt2", {{"tie_word_embeddings", false}}, true).config.tied_lm_head);
}

TEST(ArchDefaults, EosOutsideASmallVocabularyIsNotAssumed) {
  EXPECT_FALSE(build("gpt2", {{"vocab_size", 100}}).config.eos_token_id);
  EXPECT_FALSE(build("gpt2", {{"eos_token_id", nullptr}}).config.eos_token_id);
  EXPECT_EQ(build("gpt2", {{"eos_token_id", 7}}).config.eos_token_id, 7);
}

TEST(ArchDefaults, FlaFamilies) {
  const struct {
    const char* type;
    int64_t layers, heads, head_k, head_v, conv;
  } want[] = {{"linear_attn", 24, 4, 512, 512, 0},
              {"delta_net", 24, 16, 128, 128, 4},
              {"gated_deltanet", 21, 6, 256, 512, 4},
              {"kda", 24, 16, 128, 128, 4}};
  for (const auto& w : want) {
    SCOPED_TRACE(w.type);
    const Model m = build(w.type);
    EXPECT_EQ(m.n_layers(), w.layers);
    EXPECT_EQ(m.config.d_model, 2048);
    EXPECT_EQ(m.config.vocab_size, 32000);
    EXPECT_FALSE(m.config.tied_lm_head);
    EXPECT_EQ(m.config.bos_token_id, 1);
    EXPECT_EQ(m.config.eos_token_id, 2);
    EXPECT_FLOAT_EQ(m.final_norm.eps, 1e-6f);
    const auto& d = std::get<layers::DeltaRule>(m.blocks[0].mixer).config;
    EXPECT_EQ(d.n_heads, w.heads);
    EXPECT_EQ(d.head_k, w.head_k);
    EXPECT_EQ(d.head_v, w.head_v);
    EXPECT_EQ(d.conv_size, w.conv);
    // fla GatedMLP: 256 · ceil(int(2048 · 4 · 2/3) / 256) = 5632.
    EXPECT_EQ(std::get<layers::GatedMlp>(m.blocks[0].ffn).config.hidden, 5632);
  }
}

}  // namespace
}  // namespace defaults_test
}  // namespace lineage::model
