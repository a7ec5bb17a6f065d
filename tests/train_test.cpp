// Training through the library: the model-level backward against finite differences of the loss
// along each parameter tensor, the loss falling on learnable data, determinism, and resume.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/io/load_model.h"
#include "lineage/io/safetensors.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/archs/presets.h"
#include "lineage/train/backprop.h"
#include "lineage/train/trainer.h"
#include "test_support.h"
#include "train_check.h"

namespace lineage {
namespace train_test {
namespace {

namespace fs = std::filesystem;

// conv_size > 0: lineage's study extension, q | k | v plus a short conv over them.
model::Model tiny_gpt2(uint64_t seed, int64_t vocab = 50, int64_t conv_size = 0) {
  const nlohmann::json cfg = {{"model_type", "gpt2"}, {"vocab_size", vocab}, {"n_positions", 32}, {"n_embd", 16},
                              {"n_layer", 2},         {"n_head", 2},         {"layer_norm_epsilon", 1e-5},
                              {"conv_size", conv_size}};
  model::Model m = model::build_gpt2({model::ConfigFields(cfg, "tiny"), [](const std::string&) { return false; }});
  model::init_random(m, seed, DType::F32);
  // Larger weights than the preset's 0.02 so every path carries a gradient well above rounding.
  m.for_each_tensor([](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    if (t.ndim() < 2) return;
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] *= 10.0f;
  });
  train::to_trainable(m);
  return m;
}

// For each parameter tensor p with gradient g, a random direction d on p alone: the central
// difference of the loss along d against ⟨g, d⟩. The forward is f32, so ε is large and the tolerance
// loose (1 %); a missing term, a wrong sign or a transposed gradient in any one tensor still fails
// it. The PyTorch goldens (golden_grad_test.cpp) hold the same gradients to 1e-5.
TEST(TrainGpt2, GradientOfEveryTensorMatchesFiniteDifferences) {
  for (const int64_t conv : {0, 3}) {
    SCOPED_TRACE(conv ? "with a short conv" : "GPT-2");
    model::Model m = tiny_gpt2(3, 50, conv);
    train::Backprop bp(m);
    const int64_t B = 2, T = 9;
    const std::vector<int32_t> tokens = random_tokens(B * (T + 1), 50, 4);
    const float scale = 1.0f / float(B * T);
    bp.step(tokens, B, T, scale);
    std::vector<train::ParamRef> params = bp.params();
    ASSERT_EQ(params.size(), 2u + 2u * (conv ? 13u : 12u) + 2u);  // wte, wpe, 12 (13) per block, ln_f
    for (size_t i = 0; i < params.size(); ++i) {
      const train::ParamRef& p = params[i];
      const auto [fd, gd] =
          test::directional_derivative(bp, p, 100 + i, 2e-3, [&] { return bp.step(tokens, B, T, scale, false); });
      EXPECT_NEAR(fd, gd, 1e-2 * std::fabs(gd) + 1e-4) << p.name;
    }
  }
}

TEST(TrainGpt2, GradientsDoNotDependOnTheThreadCount) {
  std::vector<std::vector<float>> grads;
  for (const int threads : {1, 2}) {
    ScopedThreads st(threads);
    model::Model m = tiny_gpt2(5);
    train::Backprop bp(m);
    const std::vector<int32_t> tokens = random_tokens(3 * 31, 50, 6);
    bp.step(tokens, 3, 30, 1.0f / 90);
    std::vector<float> all;
    for (const train::ParamRef& p : bp.params()) all.insert(all.end(), p.grad, p.grad + p.n);
    grads.push_back(all);
  }
  // Each reduction has a fixed order within a thread's range; across thread counts the values
  // agree to rounding.
  EXPECT_LE(test::rel_rms(grads[1].data(), grads[0].data(), int64_t(grads[0].size())), 1e-5);
}

train::TokenData periodic_data(int64_t n, int64_t period, int64_t vocab) {
  const std::vector<int32_t> cycle = random_tokens(period, vocab, 9);
  train::TokenData d;
  for (int64_t i = 0; i < n; ++i) d.train.push_back(cycle[size_t(i % period)]);
  for (int64_t i = 0; i < n / 4; ++i) d.val.push_back(cycle[size_t((i + 3) % period)]);
  return d;
}

train::TrainConfig small_run() {
  train::TrainConfig c;
  c.batch = 4, c.seq_len = 24, c.steps = 60, c.warmup = 5, c.lr = 1e-2, c.min_lr = 1e-3;
  c.eval_every = 20, c.eval_batches = 2;
  return c;
}

// A sequence that repeats with period 7 is learnable to near-zero loss by a 2-layer transformer:
// the held-out loss (the same cycle at other offsets) must fall far below uniform guessing.
TEST(TrainGpt2, LossFallsOnARepeatingSequence) {
  model::Model m = tiny_gpt2(7);
  train::Trainer tr(m, small_run(), periodic_data(2000, 7, 50));
  const double before = tr.evaluate();
  train::LogRow last;
  while (tr.steps_done() < 60) last = tr.step();
  ASSERT_TRUE(last.val_loss.has_value());
  EXPECT_GT(before, 2.5);
  EXPECT_LT(*last.val_loss, 0.3) << "held-out loss before training " << before;
}

std::vector<float> weights_of(model::Model& m) {
  std::vector<float> all;
  m.for_each_tensor([&](const std::string&, Tensor& t, const Shape&, layers::Init) {
    all.insert(all.end(), t.data<float>(), t.data<float>() + t.numel());
  });
  return all;
}

// 8 steps in one run = 4 steps, a checkpoint, and 4 more from it (weights, moments, schedule and
// batches all restored): bit for bit. And the same seed gives the same bits.
TEST(TrainGpt2, ResumeContinuesTheRunBitForBit) {
  train::TrainConfig c = small_run();
  c.steps = 8, c.warmup = 2, c.eval_every = 0;
  model::Model straight = tiny_gpt2(11);
  {
    train::Trainer tr(straight, c, periodic_data(500, 5, 50));
    while (tr.steps_done() < 8) tr.step();
  }
  model::Model again = tiny_gpt2(11);
  {
    train::Trainer tr(again, c, periodic_data(500, 5, 50));
    while (tr.steps_done() < 8) tr.step();
  }
  EXPECT_EQ(weights_of(straight), weights_of(again));

  const fs::path dir = test::temp_dir() / "ckpt";
  const std::string config = R"({"model_type": "gpt2", "vocab_size": 50, "n_positions": 32, "n_embd": 16, "n_layer": 2, "n_head": 2})";
  model::Model first = tiny_gpt2(11);
  {
    train::Trainer tr(first, c, periodic_data(500, 5, 50));
    while (tr.steps_done() < 4) tr.step();
    tr.save(dir, config, std::nullopt);
  }
  // The saved weights as a fresh model would load them.
  model::Model resumed = tiny_gpt2(99);
  const io::SafetensorsFile saved(dir / "model.safetensors");
  resumed.for_each_tensor([&](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    const Tensor s = saved.tensor(name);
    ASSERT_EQ(s.shape(), t.shape()) << name;
    std::memcpy(t.raw_mut(), s.raw(), t.nbytes());
  });
  train::Trainer tr(resumed, c, periodic_data(500, 5, 50));
  tr.resume(dir);
  EXPECT_EQ(tr.steps_done(), 4);
  EXPECT_EQ(tr.log().size(), 4u);
  while (tr.steps_done() < 8) tr.step();
  EXPECT_EQ(weights_of(resumed), weights_of(straight));
}

// A checkpoint lineage trains from a Hugging Face one is written as that family's checkpoints are:
// every stored tensor under its own name and in its own shape (Kimi Linear's A_log [1, 1, H, 1],
// KDA's f_a_proj, GPT-2's Conv1D [in, out]), so the family's own code loads it.
TEST(Train, SavedCheckpointKeepsTheSourceNamesAndShapes) {
  for (const char* source : {"gpt2/f32_tanh", "delta_net/f32", "kda/attnres", "kimi_linear/f32", "kimi_k3/text_only"}) {
    const fs::path src = test::testdata() / source, out = test::temp_dir() / "saved";
    io::LoadedModel loaded = io::load_model(src, false);
    train::to_trainable(loaded.model);
    train::TrainConfig c;
    c.batch = 1, c.seq_len = 8, c.steps = 1, c.warmup = 0, c.eval_every = 0;
    train::Trainer tr(loaded.model, c, periodic_data(100, 5, loaded.model.config.vocab_size));
    tr.step();
    tr.save(out, test::slurp(src / "config.json"), std::nullopt);
    const io::Checkpoint before = io::Checkpoint::open(src), after = io::Checkpoint::open(out);
    std::set<std::string> written;
    for (const std::string& name : after.names()) written.insert(name);
    for (const std::string& name : before.names()) {
      const bool parameter = written.count(name) > 0;
      // Not parameters: GPT-2's mask buffers.
      if (!parameter && name.find(".attn.bias") == std::string::npos && name.find(".attn.masked_bias") == std::string::npos)
        ADD_FAILURE() << source << ": " << name << " is not in the trained checkpoint";
      if (parameter) {
        EXPECT_EQ(after.tensor(name).shape(), before.tensor(name).shape()) << source << ": " << name;
      }
    }
    EXPECT_LE(written.size(), before.names().size()) << source;
  }
}

}  // namespace
}  // namespace train_test
}  // namespace lineage
