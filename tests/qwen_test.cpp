// Qwen3-Next and Qwen3.5 through the real entry points: `lineage info` on the published configs
// alone (tests/data/qwen*/, transcribed from the spec's tables; the expected counts are the spec's
// §6 facts and tests/data/qwen-expected-counts.md, computed there by a script of its own from the
// spec's formulas), and bad configs rejected with the field named.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

#include "lineage/core/error.h"
#include "lineage/io/load_model.h"
#include "lineage/io/safetensors.h"
#include "test_support.h"

namespace lineage {
namespace qwen_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path data_dir(const std::string& name) { return test::source_dir() / "tests" / "data" / name; }

json read_config(const std::string& name) {
  std::ifstream in(data_dir(name) / "config.json");
  return json::parse(in);
}

struct Expected {
  const char* dir;
  int64_t total, active, active_without_embedding_and_head;
  int64_t kv_bytes_per_token_f32, state_bytes_fixed;
  int64_t full_attention_layers;
};

// Qwen3-Next-80B-A3B: spec §6 (79,674,391,296; 3,874,929,408 and 3,252,599,552 active; 24,576 KV
// bytes per token in bf16, which lineage's f32 cache holds twice; 79,036,416 bytes of recurrent
// state and conv tails per sequence). Qwen3.5: qwen-expected-counts.md (27B and 35B-A3B's KV and
// state bytes are the spec's too).
constexpr Expected kModels[] = {
    {"qwen3-next-80b-a3b", 79674391296LL, 3874929408LL, 3252599552LL, 2 * 24576, 79036416, 12},
    {"qwen3.5-0.8b", 752393024LL, 752393024LL, 498113344LL, 2 * 12288, 20201472, 6},
    {"qwen3.5-9b", 8953803264LL, 8953803264LL, 6919565824LL, 2 * 32768, 52690944, 8},
    {"qwen3.5-27b", 26895998464LL, 26895998464LL, 24353201664LL, 2 * 65536, 156893184, 16},
    {"qwen3.5-35b-a3b", 34660610688LL, 3454988928LL, 2437870208LL, 2 * 20480, 65863680, 10},
};

TEST(Qwen, InfoFromThePublishedConfigsAlone) {
  for (const Expected& want : kModels) {
    SCOPED_TRACE(want.dir);
    ASSERT_FALSE(io::has_weights(data_dir(want.dir)));
    const auto r = test::run_lineage("info --model " + test::shell_quote(data_dir(want.dir).string()) +
                                     " --context 4096 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["params_total"], want.total);
    EXPECT_EQ(j["params_active"], want.active);
    EXPECT_EQ(j["params_active_without_embedding_and_head"], want.active_without_embedding_and_head);
    EXPECT_EQ(j["weight_bytes_by_dtype"]["BF16"], 2 * want.total) << "config dtype bfloat16";
    EXPECT_EQ(j["state_bytes_per_token"], want.kv_bytes_per_token_f32);
    EXPECT_EQ(j["state_bytes_fixed"], want.state_bytes_fixed);
    int64_t attention = 0;
    for (const auto& layer : j["layers"]) attention += layer["state_bytes_per_token"].get<int64_t>() > 0;
    EXPECT_EQ(attention, want.full_attention_layers);
  }
  // The multi-token-prediction head the Qwen3.5 configs declare is counted apart, not in the total.
  const auto text = test::run_lineage("info --model " + test::shell_quote(data_dir("qwen3.5-9b").string()));
  EXPECT_NE(text.out.find("multi-token-prediction head"), std::string::npos) << text.out;
  // Qwen3-Next's config declares none, its checkpoint ships one layer: spec §6's ≈1.65 B (one
  // attention layer 27,263,488 + one MoE block 1,614,809,088 + its two norms, fc [H, 2H] and three
  // norms), ≈81.3 B on disk with the text model.
  const auto next = test::run_lineage("info --model " + test::shell_quote(data_dir("qwen3-next-80b-a3b").string()) + " --json");
  ASSERT_EQ(next.exit_code, 0) << next.err;
  EXPECT_EQ(json::parse(next.out)["extra_params"], 27263488LL + 1614809088LL + 2 * 2048 + 2 * 2048 * 2048 + 3 * 2048);
}

// What `info` counts apart from config.json alone (the MTP head and Qwen3.5's vision tower, by their
// formulas) against what a checkpoint holding them stores: the elements of its mtp.* and
// model.visual.* tensors (reference/qwen_goldens.py writes them at the shapes transformers gives).
TEST(Qwen, SkippedHeadAndVisionTowerCountedAsStored) {
  const fs::path dir = test::testdata() / "qwen3_5_moe" / "bf16_mtp_visual";
  const io::Checkpoint ckpt = io::Checkpoint::open(dir);
  int64_t stored = 0, visual = 0;
  for (const std::string& name : ckpt.names()) {
    const bool is_visual = name.rfind("model.visual.", 0) == 0;
    if (!is_visual && name.rfind("mtp.", 0) != 0) continue;
    int64_t n = 1;
    for (const int64_t d : ckpt.entry(name).shape) n *= d;
    stored += n, visual += is_visual ? n : 0;
  }
  ASSERT_GT(visual, 0);
  ASSERT_GT(stored, visual);
  const auto r = test::run_lineage("info --model " + test::shell_quote(dir.string()) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["extra_params"], stored);
  EXPECT_NE(j["extra_params_label"].get<std::string>().find("vision tower"), std::string::npos);
}

TEST(Qwen, BadConfigsNameTheField) {
  json j = read_config("qwen3-next-80b-a3b");
  j["linear_num_value_heads"] = 24;  // not a multiple of 16 key heads
  test::expect_config_error(j, {"linear_num_value_heads", "a multiple of linear_num_key_heads = 16"});
  j = read_config("qwen3-next-80b-a3b");
  j["partial_rotary_factor"] = 0.2;  // 256 x 0.2 = 51 rotary dims
  test::expect_config_error(j, {"partial_rotary_factor", "even rotary width", "= 51"});
  j = read_config("qwen3-next-80b-a3b");
  j["num_key_value_heads"] = 3;
  test::expect_config_error(j, {"num_key_value_heads", "a divisor of num_attention_heads = 16"});
  j = read_config("qwen3-next-80b-a3b");
  j["mlp_only_layers"] = {48};
  test::expect_config_error(j, {"mlp_only_layers", "[0, 48)"});
  j = read_config("qwen3-next-80b-a3b");
  j["hidden_act"] = "gelu";
  test::expect_config_error(j, {"hidden_act", "silu"});
  j = read_config("qwen3.5-9b");
  j["text_config"]["layer_types"].erase(0);
  test::expect_config_error(j, {"text_config", "layer_types", "a list of 32"});
  j = read_config("qwen3.5-9b");
  j["text_config"]["layer_types"][3] = "sliding_attention";
  test::expect_config_error(j, {"layer_types", "\"linear_attention\" or \"full_attention\""});
  j = read_config("qwen3.5-9b");
  j["text_config"]["rope_parameters"]["rope_type"] = "yarn";
  test::expect_config_error(j, {"rope_type", "\"default\""});
  j = read_config("qwen3.5-35b-a3b");
  j["text_config"]["num_experts"] = 0;
  test::expect_config_error(j, {"num_experts", "at least 1"});
}


// A copy of one of the reference's checkpoints (build/testdata, reference/qwen_goldens.py) with its
// config.json edited.
fs::path edited_checkpoint(const std::string& c, const std::function<void(json&)>& edit) {
  const fs::path from = test::testdata() / c, dir = test::temp_dir();
  for (const auto& e : fs::directory_iterator(from))
    if (e.is_regular_file()) fs::copy_file(e.path(), dir / e.path().filename());
  std::ifstream in(from / "config.json");
  json j = json::parse(in);
  edit(j);
  std::ofstream(dir / "config.json") << j.dump();
  return dir;
}

void expect_load_error(const fs::path& dir, std::initializer_list<std::string> pieces) {
  try {
    (void)io::load_model(dir, false);
    ADD_FAILURE() << "expected an Error loading " << dir;
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "message lacks \"" << p << "\":\n" << msg;
  }
  const auto r = test::run_lineage("info --model " + test::shell_quote(dir.string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(*pieces.begin()), std::string::npos) << r.err;
}

TEST(Qwen, DamagedCheckpointsNameTheFieldOrTensor) {
  // A layer type that disagrees with the tensors: layer 3 holds attention, layer 0 the delta rule.
  expect_load_error(edited_checkpoint("qwen3_next/f32_sharded", [](json& j) {
    j["layer_types"] = {"full_attention", "linear_attention", "linear_attention", "full_attention"};
  }), {"layer_types", "layer 0 is a linear_attention layer", "linear_attn.A_log"});
  expect_load_error(edited_checkpoint("qwen3_5/f32", [](json& j) {
    j["text_config"]["layer_types"][3] = "linear_attention";
  }), {"layer_types", "layer 3 is a full_attention layer"});
  // An interleave that does not match the key-head groups: 4 groups of q, k, v, z asked of a tensor
  // that holds 2 groups of a wider v and z.
  expect_load_error(edited_checkpoint("qwen3_next/f32_sharded", [](json& j) { j["linear_num_key_heads"] = 4; }),
                    {"in_proj_qkvz.weight", "4 x "});
  // Value heads that are not a multiple of the key heads, an odd rotary width.
  expect_load_error(edited_checkpoint("qwen3_5_moe/f32", [](json& j) { j["text_config"]["linear_num_value_heads"] = 3; }),
                    {"linear_num_value_heads", "a multiple of linear_num_key_heads"});
  expect_load_error(edited_checkpoint("qwen3_next/f32_sharded", [](json& j) { j["partial_rotary_factor"] = 0.3125; }),
                    {"partial_rotary_factor", "even rotary width"});
  // Experts fused for another expert count.
  expect_load_error(edited_checkpoint("qwen3_5_moe/f32", [](json& j) { j["text_config"]["num_experts"] = 6; }),
                    {"mlp.experts.gate_up_proj", "expected [6, 32, 48]"});
}

}  // namespace
}  // namespace qwen_test
}  // namespace lineage
