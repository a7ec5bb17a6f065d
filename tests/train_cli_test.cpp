// `lineage train` as a user runs it: a checkpoint directory that lineage and the PyTorch reference
// both load, the loss curve files, resume, determinism, and bad input; the model lineage ships as
// the default of generate.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lineage/core/rng.h"
#include "lineage/io/npy.h"
#include "test_support.h"

namespace lineage {
namespace train_cli_test {
namespace {

namespace fs = std::filesystem;
using test::run_lineage;
using test::shell_quote;

// A tokenizer directory with GPT-2's files and a little public-domain text.
struct Corpus {
  fs::path dir, tokenizer, text, config;
};

const Corpus& corpus() {
  static const Corpus c = [] {
    Corpus k;
    k.dir = test::temp_dir();
    k.tokenizer = k.dir / "tok";
    fs::create_directories(k.tokenizer);
    fs::copy_file(test::testdata() / "tokenizer" / "gpt2" / "vocab.json", k.tokenizer / "vocab.json");
    fs::copy_file(test::testdata() / "tokenizer" / "gpt2" / "merges.txt", k.tokenizer / "merges.txt");
    k.text = k.dir / "text.txt";
    std::ofstream(k.text) << test::slurp(test::source_dir() / "tests" / "tokenizer" / "corpus" / "prose.txt");
    k.config = k.dir / "config.json";
    std::ofstream(k.config) << R"({"model_type": "gpt2", "vocab_size": 50257, "n_positions": 64, "n_embd": 32,
                                   "n_layer": 2, "n_head": 2, "eos_token_id": 50256})";
    return k;
  }();
  return c;
}

std::string train_args(const fs::path& out, int steps) {
  const Corpus& c = corpus();
  return "train --config " + shell_quote(c.config.string()) + " --tokenizer " + shell_quote(c.tokenizer.string()) +
         " --data " + shell_quote(c.text.string()) + " --out " + shell_quote(out.string()) + " --steps " +
         std::to_string(steps) + " --warmup 2 --batch 2 --seq-len 32 --eval-every 4 --eval-batches 2 --threads 2";
}

std::vector<std::string> csv_rows(const fs::path& file) {
  std::vector<std::string> rows;
  std::ifstream f(file);
  for (std::string line; std::getline(f, line);) rows.push_back(line);
  return rows;
}

// lineage's logits of a trained checkpoint against the PyTorch reference's (reference/
// checkpoint_logits.py), from the same files: relative RMS ≤ 1e-5.
void expect_reference_logits(const fs::path& model_dir, const std::vector<int32_t>& ids) {
  const fs::path dir = test::temp_dir();
  std::string list;
  for (const int32_t id : ids) list += (list.empty() ? "" : " ") + std::to_string(id);
  const auto lg = run_lineage("logits --model " + shell_quote(model_dir.string()) + " --tokens '" + list + "' --out " +
                              shell_quote((dir / "lineage.npy").string()));
  ASSERT_EQ(lg.exit_code, 0) << lg.err;
  {
    std::vector<float> as_float(ids.begin(), ids.end());
    io::save_npy(dir / "ids_f32.npy", as_float.data(), {int64_t(ids.size())});
  }
  const std::string py = "/usr/bin/python3 -c " + shell_quote(
      "import numpy as np, sys; np.save(sys.argv[2], np.load(sys.argv[1]).astype(np.int32))") + " " +
      shell_quote((dir / "ids_f32.npy").string()) + " " + shell_quote((dir / "ids.npy").string()) + " && /usr/bin/python3 " +
      shell_quote((test::source_dir() / "reference" / "checkpoint_logits.py").string()) + " " + shell_quote(model_dir.string()) +
      " " + shell_quote((dir / "ids.npy").string()) + " " + shell_quote((dir / "reference.npy").string());
  ASSERT_EQ(std::system(py.c_str()), 0) << py;
  const Tensor got = io::load_npy(dir / "lineage.npy"), want = io::load_npy(dir / "reference.npy");
  ASSERT_EQ(got.shape(), want.shape());
  EXPECT_LE(test::rel_rms(got.data<float>(), want.data<float>(), got.numel()), 1e-5);
}

// A .bin corpus of 3,000 seeded token ids below 256 in the test's temporary directory.
fs::path random_tokens(const std::string& name, uint64_t seed) {
  const fs::path data = test::temp_dir() / name;
  Rng rng(seed);
  std::vector<uint16_t> ids(3000);
  for (auto& t : ids) t = uint16_t(rng.next_u64() % 256);
  std::ofstream(data, std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 2));
  return data;
}

TEST(TrainCli, WritesACheckpointThatLineageAndThePyTorchReferenceLoad) {
  const fs::path out = test::temp_dir() / "run";
  const auto r = run_lineage(train_args(out, 6));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("step 6/6"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("held-out loss"), std::string::npos) << r.out;
  for (const char* f : {"config.json", "model.safetensors", "vocab.json", "merges.txt", "optimizer.safetensors",
                        "trainer_state.json", "loss.csv", "loss.svg"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  const auto rows = csv_rows(out / "loss.csv");
  ASSERT_EQ(rows.size(), 7u);
  EXPECT_EQ(rows[0], "step,tokens,lr,train_loss,grad_norm,val_loss");
  EXPECT_EQ(test::slurp(out / "loss.svg").rfind("<svg", 0), 0u);

  expect_reference_logits(out, {464, 3290, 3332, 319, 262});
}

// Kimi K3 trains through Block AttnRes, gated MLA and the latent MoE; its checkpoint, saved under K3's
// names, loads in the PyTorch reference with the same logits.
TEST(TrainCli, KimiK3TrainsAndItsCheckpointLoadsInTheReference) {
  const fs::path data = random_tokens("k3.bin", 5), out = test::temp_dir() / "k3";
  const auto r = run_lineage("train --model " + shell_quote((test::testdata() / "kimi_k3" / "text_only").string()) +
                             " --data " + shell_quote(data.string()) + " --out " + shell_quote(out.string()) +
                             " --steps 3 --warmup 1 --batch 2 --seq-len 24 --eval-every 3 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("step 3/3"), std::string::npos) << r.err;
  expect_reference_logits(out, {5, 17, 99, 3, 200, 7, 0, 255});
}

// Qwen's hybrids train (Gated DeltaNet with GVA, gated attention with partial RoPE and q/k norms, the
// zero-centred norms, the softmax router and the gated shared expert): Qwen3.5 from a config.json
// shaped as published (text_config, layer_types), Qwen3-Next and Qwen3.5-MoE continued from their
// test checkpoints. Each written checkpoint is in the family's own layout (in_proj_qkvz interleaved
// per key-head group, in_proj_qkv, conv1d, fused experts) and loads in the PyTorch reference with
// the same logits.
TEST(TrainCli, QwenHybridsTrainAndTheirCheckpointsLoadInTheReference) {
  const fs::path data = random_tokens("qwen.bin", 7), config = test::temp_dir() / "qwen3_5.json";
  std::ofstream(config) << R"({"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
    "text_config": {"model_type": "qwen3_5_text", "vocab_size": 256, "hidden_size": 48, "num_hidden_layers": 4,
      "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "attn_output_gate": true,
      "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 8,
      "linear_conv_kernel_dim": 4, "intermediate_size": 96, "hidden_act": "silu", "rms_norm_eps": 1e-6,
      "max_position_embeddings": 4096, "tie_word_embeddings": true,
      "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}},
    "tie_word_embeddings": true})";
  struct Run {
    std::string name, from;
  };
  for (const Run& run : {Run{"qwen3_5", "--config " + shell_quote(config.string())},
                         Run{"qwen3_next", "--model " + shell_quote((test::testdata() / "qwen3_next" / "f32_sharded").string())},
                         Run{"qwen3_5_moe", "--model " + shell_quote((test::testdata() / "qwen3_5_moe" / "f32").string())}}) {
    SCOPED_TRACE(run.name);
    const fs::path out = test::temp_dir() / run.name;
    const auto r = run_lineage("train " + run.from + " --data " + shell_quote(data.string()) + " --out " +
                               shell_quote(out.string()) + " --steps 4 --warmup 1 --batch 2 --seq-len 24 --eval-every 4 --threads 2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("step 4/4"), std::string::npos) << r.err;
    const std::string header = test::slurp(out / "model.safetensors").substr(0, 200000);
    for (const char* stored : {"linear_attn.conv1d.weight", run.name == "qwen3_next" ? "in_proj_qkvz.weight" : "in_proj_qkv.weight"})
      EXPECT_NE(header.find(stored), std::string::npos) << stored;
    if (run.name == "qwen3_5_moe") {
      EXPECT_NE(header.find("mlp.experts.gate_up_proj"), std::string::npos);
    }
    expect_reference_logits(out, {5, 17, 99, 3, 200, 7, 0, 255, 31, 64});
  }
}

TEST(TrainCli, ResumingContinuesTheSameCurveAndRerunsAreIdentical) {
  const fs::path a = test::temp_dir() / "a", b = test::temp_dir() / "b", c = test::temp_dir() / "c";
  ASSERT_EQ(run_lineage(train_args(a, 8)).exit_code, 0);
  ASSERT_EQ(run_lineage(train_args(b, 8)).exit_code, 0);
  EXPECT_EQ(test::slurp(a / "model.safetensors"), test::slurp(b / "model.safetensors"));
  EXPECT_EQ(test::slurp(a / "loss.csv"), test::slurp(b / "loss.csv"));

  // Continuing a's checkpoint to step 10: its optimizer state and curve carry on (the library test
  // TrainGpt2.ResumeContinuesTheRunBitForBit holds a cut run to the uncut one bit for bit).
  const auto r = run_lineage("train --model " + shell_quote(a.string()) + " --data " + shell_quote(corpus().text.string()) +
                             " --out " + shell_quote(c.string()) + " --steps 10 --warmup 2 --batch 2 --seq-len 32 --eval-every 4 --eval-batches 2 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("resuming at step 8 of 10"), std::string::npos) << r.err;
  const auto before = csv_rows(a / "loss.csv"), after = csv_rows(c / "loss.csv");
  ASSERT_EQ(after.size(), 11u);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i], before[i]) << i;
}

TEST(TrainCli, BadInputIsNamedAndExitsTwo) {
  const Corpus& c = corpus();
  const fs::path out = test::temp_dir() / "bad";
  const fs::path odd = test::temp_dir() / "odd.bin";
  std::ofstream(odd, std::ios::binary) << "abc";
  const std::string base = "train --config " + shell_quote(c.config.string()) + " --tokenizer " + shell_quote(c.tokenizer.string()) +
                           " --out " + shell_quote(out.string()) + " --steps 2 --warmup 0 --batch 1";
  const struct {
    std::string args, expect;
  } cases[] = {
      {base + " --data /nonexistent.txt --seq-len 8", "/nonexistent.txt"},
      {base + " --data " + shell_quote(odd.string()) + " --seq-len 8", "whole number"},
      {base + " --data " + shell_quote(c.text.string()) + " --seq-len 100", "exceeds the model's context of 64"},
      {base + " --data " + shell_quote(c.text.string()) + " --seq-len 8 --warmup 5", "--warmup"},
      {base + " --data " + shell_quote(c.text.string()) + " --seq-len 8 --lr -1", "--lr"},
      {"train --model " + shell_quote((test::testdata() / "kimi_k3" / "mxfp4_routed").string()) + " --data " +
           shell_quote(c.text.string()) + " --out " + shell_quote(out.string()),
       "MXFP4-packed weights cannot be trained"},
      {"train --data x --out y", "one of --preset, --config or --model"},
  };
  for (const auto& k : cases) {
    const auto r = run_lineage(k.args);
    EXPECT_EQ(r.exit_code, 2) << k.args << "\n" << r.err;
    EXPECT_NE(r.err.find(k.expect), std::string::npos) << k.args << "\n" << r.err;
  }
}

}  // namespace
}  // namespace train_cli_test
}  // namespace lineage
