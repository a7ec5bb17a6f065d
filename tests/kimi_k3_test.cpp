// Kimi K3 through the real entry points: `lineage info` on the published configs alone (the full
// model's counts from spec §8–§9, the official tiny 0.40B's, the seeds' 92-layer variant), and
// damaged K3 checkpoints (an MXFP4 weight without its scale, a NaN scale, rows that are not whole
// 32-value blocks, layer lists that disagree with the tensors) rejected with the tensor or field
// named. The golden comparisons against the PyTorch reference are in golden_test.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "lineage/core/error.h"
#include "lineage/io/load_model.h"
#include "lineage/io/safetensors.h"
#include "test_support.h"

namespace lineage {
namespace kimi_k3_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json info(const std::string& args) {
  const auto r = test::run_lineage("info " + args + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out);
}

fs::path data_dir(const char* name) { return test::source_dir() / "tests" / "data" / name; }

TEST(KimiK3, InfoFromThePublishedConfigAlone) {
  ASSERT_FALSE(io::has_weights(data_dir("kimi-k3")));
  const json j = info("--model " + test::shell_quote(data_dir("kimi-k3").string()) + " --context 4096");
  EXPECT_EQ(j["model_type"], "kimi_k3");
  // spec §9.3: A_log counted as stored ([128] per KDA layer); the vision tower and projector apart.
  EXPECT_EQ(j["params_total"], 2779484478208LL);
  EXPECT_EQ(j["params_active"], 105364019968LL);
  EXPECT_EQ(j["params_active_without_embedding"], 104189614848LL);
  EXPECT_EQ(j["params_active_without_embedding_and_head"], 103015209728LL);
  EXPECT_EQ(j["extra_params"], 447358976LL);
  // Weights: everything but the routed experts in bf16 (the config's dtype; 56,743,648,000 of them),
  // the experts as MXFP4 packed bytes + one scale byte per 32 (17/32 of a byte each).
  EXPECT_EQ(j["weight_bytes_by_dtype"]["BF16"], 2 * 56743648000LL);
  EXPECT_EQ(j["weight_bytes_by_dtype"]["U8"], 2722740830208LL / 32 * 17);
  // State: 24 MLA layers cache 576 f32 latents per token; 69 KDA layers hold S [96, 128, 128] and
  // three conv tails of 3 × 12288.
  EXPECT_EQ(j["state_bytes_per_token"], 24 * 576 * 4);
  EXPECT_EQ(j["state_bytes_fixed"], 69LL * (96 * 128 * 128 + 3 * 3 * 12288) * 4);
  int mla = 0, latent = 0;
  for (const auto& l : j["layers"]) {
    mla += l["mixer"].get<std::string>().rfind("MLA", 0) == 0;
    latent += l["ffn"].get<std::string>().rfind("latent MoE (3584)", 0) == 0;
  }
  EXPECT_EQ(mla, 24);
  EXPECT_EQ(latent, 92);
  for (int i : {3, 87, 91, 92}) EXPECT_EQ(j["layers"][i]["mixer"].get<std::string>().rfind("MLA", 0), 0u) << i;
  EXPECT_NE(j["layers"][90]["mixer"].get<std::string>().find("Kimi Delta Attention"), std::string::npos);
  EXPECT_NE(j["layers"][0]["ffn"].get<std::string>().find("SiTU MLP"), std::string::npos);
  // The memory plan against this machine: 1.4 TiB of weights do not fit; what streams per token is
  // at least the k of E experts' bytes not cached.
  const json& plan = j["memory_plan"];
  EXPECT_EQ(plan["fits"], plan["weight_bytes"].get<double>() + plan["state_bytes"].get<double>() <=
                              plan["ram_available_bytes"].get<double>());
  EXPECT_NEAR(plan["routed_expert_bytes_per_token"].get<double>(), 92.0 * 16 * 3 * 3584 * 3072 * 17 / 32, 1e3);
  if (!plan["fits"].get<bool>()) {
    EXPECT_GT(plan["stream_bytes_per_token"].get<double>(), 0);
  }
  EXPECT_EQ(plan["attn_res_prefill_bytes_per_token"], (8 + 2) * 7168 * 4) << "8 finished blocks, the partial, the mix";
  const auto text = test::run_lineage("info --model " + test::shell_quote(data_dir("kimi-k3").string()));
  EXPECT_NE(text.out.find("447358976 parameters: vision tower and projector"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("memory plan"), std::string::npos) << text.out;
}

TEST(KimiK3, InfoFromTheOfficialTinyConfig) {
  const json j = info("--model " + test::shell_quote(data_dir("kimi-k3-0.40b").string()));
  // shared/data/README.md: 388,598,968 with A_log stored [head_dim = 32].
  EXPECT_EQ(j["params_total"], 388598968LL);
  EXPECT_EQ(j["extra_params"], 6968576LL);
  EXPECT_EQ(j["weight_bytes_by_dtype"]["F32"], 4 * 388598968LL);
  EXPECT_EQ(j["layers"][3]["mixer"].get<std::string>().rfind("MLA", 0), 0u);
  EXPECT_EQ(j["layers"][7]["mixer"].get<std::string>().rfind("MLA", 0), 0u);
  EXPECT_NE(j["description"].get<std::string>().find("AttnRes blocks of 4 layers"), std::string::npos);
}

// The seeds' 92-layer K3 (23 × (3 KDA + 1 MLA)): spec §8.4's total by the §9 formulas.
TEST(KimiK3, SeedPresetCounts) {
  const json j = info("--preset kimi-k3-seed");
  EXPECT_EQ(j["params_total"], 2749467302272LL);
  EXPECT_EQ(j["n_layers"], 92);
}

// A golden K3 checkpoint copied with its tensors or config changed.
fs::path golden_case() { return test::testdata() / "kimi_k3" / "mxfp4_routed"; }

std::vector<std::pair<std::string, Tensor>> read_all(const fs::path& dir) {
  const io::Checkpoint ck = io::Checkpoint::open(dir);
  std::vector<std::pair<std::string, Tensor>> v;
  for (const auto& n : ck.names()) v.push_back({n, ck.tensor(n).clone()});
  return v;
}

fs::path rewritten(const std::function<void(std::vector<std::pair<std::string, Tensor>>&, json&)>& edit) {
  const fs::path dir = test::temp_dir();
  auto tensors = read_all(golden_case());
  std::ifstream in(golden_case() / "config.json");
  json cfg = json::parse(in);
  edit(tensors, cfg);
  test::write_safetensors(dir / "model.safetensors", tensors);
  std::ofstream(dir / "config.json") << cfg.dump(1);
  return dir;
}

void expect_load_error(const fs::path& dir, std::initializer_list<std::string> pieces) {
  try {
    io::load_model(dir, false);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    for (const auto& p : pieces) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "lacks \"" << p << "\":\n" << e.what();
  }
  const auto r = test::run_lineage("info --model " + test::shell_quote(dir.string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(*pieces.begin()), std::string::npos) << r.err;
}

const std::string kExpert = "language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight";

TEST(KimiK3, DamagedCheckpointsNameTheTensorOrField) {
  ASSERT_TRUE(fs::exists(golden_case() / "config.json")) << "the reference's K3 cases are missing";
  // A weight_packed without its weight_scale.
  expect_load_error(rewritten([](auto& t, json&) {
                      std::erase_if(t, [](const auto& p) { return p.first == kExpert + "_scale"; });
                    }),
                    {"missing tensors", kExpert + "_scale"});
  // A scale of 255 (E8M0's NaN).
  expect_load_error(rewritten([](auto& t, json&) {
                      for (auto& [n, x] : t)
                        if (n == kExpert + "_scale") static_cast<uint8_t*>(x.raw_mut())[5] = 255;
                    }),
                    {kExpert + "_scale", "is 255"});
  // Experts whose rows are not whole 32-value blocks (a config that says so).
  expect_load_error(rewritten([](auto&, json& c) { c["text_config"]["moe_intermediate_size"] = 40; }),
                    {"weight_packed", "whole 32-value blocks", "40"});
  // Layer lists that disagree with the tensors: layer 3 (one-based) holds KDA, layer 4 MLA.
  expect_load_error(rewritten([](auto&, json& c) {
                      // [1, 2, 3] and [4, 5] become [1, 2, 4] and [3, 5] (elements set in place: replacing
                      // a whole array this way leaks it in nlohmann-json 3.11.2 under LeakSanitizer).
                      c["text_config"]["linear_attn_config"]["kda_layers"][2] = 4;
                      c["text_config"]["linear_attn_config"]["full_attn_layers"][0] = 3;
                    }),
                    {"full_attn_layers", "layer 3 (one-based) has KDA tensors"});
  // A quantization format lineage does not run (compressed-tensors' W8A8 int-quantized).
  expect_load_error(rewritten([](auto&, json& c) {
                      c["text_config"]["quantization_config"]["format"] = "int-quantized";
                      c["text_config"]["quantization_config"]["config_groups"]["group_0"]["format"] = "int-quantized";
                    }),
                    {"quantization_config", "\"int-quantized\" is not supported", "mxfp4-pack-quantized"});
}

}  // namespace
}  // namespace kimi_k3_test
}  // namespace lineage
