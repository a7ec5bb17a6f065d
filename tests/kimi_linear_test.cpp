// Kimi Linear through the real entry points: `lineage info` on the published 48B config alone
// (counts from spec §9.2), and bad configs rejected with the field named.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "lineage/core/error.h"
#include "lineage/io/load_model.h"
#include "test_support.h"

namespace lineage {
namespace kimi_linear_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The published config (moonshotai/Kimi-Linear-48B-A3B-Instruct), no weights beside it.
fs::path published_dir() { return test::source_dir() / "tests" / "data" / "kimi-linear-48b-a3b"; }

TEST(KimiLinear, InfoFromThePublishedConfigAlone) {
  ASSERT_FALSE(io::has_weights(published_dir()));
  const auto r = test::run_lineage("info --model " + test::shell_quote(published_dir().string()) +
                                   " --context 4096 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  // spec §9.2: the sum of the released safetensors headers, and the activated count (k = 8 of 256
  // experts) in its three conventions.
  EXPECT_EQ(j["params_total"], 49122681728LL);
  EXPECT_EQ(j["params_active"], 3484459904LL);
  EXPECT_EQ(j["params_active_without_embedding"], 3106972544LL);
  EXPECT_EQ(j["params_active_without_embedding_and_head"], 2729485184LL);
  EXPECT_EQ(j["weight_bytes_by_dtype"]["BF16"], 2 * 49122681728LL) << "config dtype bfloat16";
  // State: 7 MLA layers cache r + d_rope = 576 f32 values per token; 20 KDA layers hold S [32, 128,
  // 128] and three conv tails of 3 × 4096, f32.
  EXPECT_EQ(j["state_bytes_per_token"], 7 * 576 * 4);
  EXPECT_EQ(j["state_bytes_fixed"], 20 * (32 * 128 * 128 + 3 * 3 * 4096) * 4);
  EXPECT_EQ(j["state_bytes_at_context"], 20 * (32 * 128 * 128 + 3 * 3 * 4096) * 4 + 4096 * 7 * 576 * 4);
  int mla = 0, moe = 0;
  for (const auto& l : j["layers"]) {
    mla += l["mixer"].get<std::string>().rfind("MLA", 0) == 0;
    moe += l["ffn"].get<std::string>().rfind("MoE", 0) == 0;
  }
  EXPECT_EQ(mla, 7);
  EXPECT_EQ(moe, 26);
  for (int i : {3, 7, 11, 15, 19, 23, 26}) EXPECT_EQ(j["layers"][i]["state_bytes_per_token"], 576 * 4) << i;
  const auto text = test::run_lineage("info --model " + test::shell_quote(published_dir().string()));
  EXPECT_NE(text.out.find("3106972544 without the input embedding"), std::string::npos) << text.out;
}

json published() {
  std::ifstream in(published_dir() / "config.json");
  return json::parse(in);
}

TEST(KimiLinear, BadConfigsNameTheField) {
  json j = published();
  j["linear_attn_config"]["full_attn_layers"].push_back(3);  // layer 3 is KDA too
  test::expect_config_error(j, {"full_attn_layers", "layer 3 is in both"});
  j = published();
  j["linear_attn_config"]["full_attn_layers"].erase(j["linear_attn_config"]["full_attn_layers"].size() - 1);
  test::expect_config_error(j, {"kda_layers", "layer 27 is in neither"});
  j = published();
  j["linear_attn_config"]["kda_layers"][0] = 0;  // the lists are one-based
  test::expect_config_error(j, {"kda_layers", "one-based layer numbers in [1, 27]"});
  j = published();
  j["linear_attn_config"]["full_attn_layers"].push_back(28);
  test::expect_config_error(j, {"full_attn_layers", "[1, 27]"});
  j = published();
  j["q_lora_rank"] = -1536;
  test::expect_config_error(j, {"q_lora_rank", "an integer in [1, "});
  j = published();
  j["num_experts_per_token"] = 300;
  test::expect_config_error(j, {"num_experts_per_token", "at most num_experts = 256"});
  j = published();
  j["num_expert_group"] = 3;
  test::expect_config_error(j, {"num_expert_group", "divisor of num_experts"});
  j = published();
  j["moe_router_activation_func"] = "softmax";
  test::expect_config_error(j, {"moe_router_activation_func", "sigmoid"});
  j = published();
  j.erase("linear_attn_config");
  test::expect_config_error(j, {"linear_attn_config", "an object"});
  j = published();
  j["num_key_value_heads"] = 8;
  test::expect_config_error(j, {"num_key_value_heads", "32"});
}

// A config whose expert count disagrees with the tensors: the error names num_experts and what the
// checkpoint holds.
TEST(KimiLinear, ExpertCountMustMatchTheCheckpoint) {
  const fs::path golden = test::testdata() / "kimi_linear" / "f32";
  for (int experts : {4, 12}) {
    const fs::path dir = test::temp_dir();
    fs::copy_file(golden / "model.safetensors", dir / "model.safetensors");
    std::ifstream in(golden / "config.json");
    json j = json::parse(in);
    j["num_experts"] = experts;
    std::ofstream(dir / "config.json") << j.dump();
    try {
      io::load_model(dir, false);
      ADD_FAILURE() << "expected an Error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("\"num_experts\""), std::string::npos) << msg;
      EXPECT_NE(msg.find("holds experts 0 .. 7"), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace kimi_linear_test
}  // namespace lineage
