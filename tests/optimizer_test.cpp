// The optimizer against torch.optim.AdamW itself (reference/adamw_goldens.py: three steps of the same
// parameters and gradients, bias corrections and decoupled weight decay included, the learning rate
// changing each step), and its parameter groups as nanoGPT makes them, for every trainable family.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/tensor.h"
#include "lineage/io/load_model.h"
#include "lineage/io/npy.h"
#include "lineage/train/adamw.h"
#include "lineage/train/backprop.h"
#include "test_support.h"

namespace lineage {
namespace optimizer_test {
namespace {

namespace fs = std::filesystem;

std::vector<float> load(const fs::path& p) {
  const Tensor t = io::load_npy(p);
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

// Decaying every tensor moves the 1-D ones by lr·wd = 1e-3..3e-3 of their size per step, dropping the
// second moment's bias correction changes the first step by √(1 − β2) / (1 − β1) = 2.2×: both far
// outside the f32-against-f64 rounding this allows.
TEST(AdamW, ThreeStepsEqualTorchOptimAdamW) {
  const fs::path dir = test::testdata() / "adamw" / "three_steps";
  std::ifstream in(dir / "manifest.json");
  const nlohmann::json man = nlohmann::json::parse(in);
  const size_t n = man["shapes"].size();
  std::vector<std::vector<float>> values(n), grads(n);
  std::vector<train::ParamRef> params(n);
  for (size_t i = 0; i < n; ++i) {
    values[i] = load(dir / ("init_" + std::to_string(i) + ".npy"));
    params[i] = {"p" + std::to_string(i), values[i].data(), nullptr, int64_t(values[i].size()), man["decay"][i].get<bool>()};
  }
  train::AdamW opt(params);
  const train::AdamWConfig cfg{0.0, man["beta1"], man["beta2"], man["eps"], man["weight_decay"]};
  for (size_t s = 0; s < man["lrs"].size(); ++s) {
    for (size_t i = 0; i < n; ++i) {
      grads[i] = load(dir / ("grad_" + std::to_string(s) + "_" + std::to_string(i) + ".npy"));
      params[i].grad = grads[i].data();
    }
    opt.step(params, cfg, man["lrs"][s].get<double>(), 1.0f);
    for (size_t i = 0; i < n; ++i) {
      const std::vector<float> want = load(dir / ("after_" + std::to_string(s) + "_" + std::to_string(i) + ".npy"));
      ASSERT_EQ(want.size(), values[i].size());
      const double err = test::rel_rms(values[i].data(), want.data(), int64_t(want.size()));
      EXPECT_LE(err, 1e-6) << "step " << s + 1 << ", parameter " << i << " (decay " << params[i].decay << ")";
    }
  }
  EXPECT_EQ(opt.steps(), int64_t(man["lrs"].size()));
}

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// nanoGPT's groups, by what each tensor is: matrices (the AttnRes pseudo-queries too, stored as
// Linear(D, 1) weights, and Qwen's shared-expert gate, a Linear(D, 1)), embeddings and convolution
// kernels decay; norms (GPT-2's ln_*, the zero-centred ones), biases, the decay parameters A_log and
// dt_bias and the router's correction bias do not.
bool decays(const std::string& name) {
  const bool norm = name.find("norm") != std::string::npos || name.find("ln_") != std::string::npos;
  const bool bias = ends_with(name, ".bias") || ends_with(name, "_bias");
  return !(norm || bias || ends_with(name, ".A_log"));
}

TEST(AdamW, ParameterGroupsAsNanoGPTForEveryFamily) {
  for (const char* family : {"gpt2", "linear_attn", "delta_net", "gated_deltanet", "kda", "kimi_linear", "kimi_k3",
                             "qwen3_next", "qwen3_5", "qwen3_5_moe"}) {
    int trained = 0, decayed = 0, kept = 0;
    for (const auto& e : fs::directory_iterator(test::testdata() / family)) {
      if (!fs::exists(e.path() / "config.json")) continue;
      io::LoadedModel lm = io::load_model(e.path(), false);
      if (!train::untrainable_reason(lm.model).empty()) continue;
      try {
        train::to_trainable(lm.model);
      } catch (const Error&) {  // MXFP4-packed experts: refused for training, as they should be
        continue;
      }
      train::Backprop bp(lm.model);
      for (const train::ParamRef& p : bp.params()) {
        EXPECT_EQ(p.decay, decays(p.name)) << e.path().filename() << ": " << p.name;
        (p.decay ? decayed : kept) += 1;
      }
      ++trained;
    }
    EXPECT_GT(trained, 0) << family;
    EXPECT_GT(decayed, 0) << family;
    EXPECT_GT(kept, 0) << family;
  }
}

}  // namespace
}  // namespace optimizer_test
}  // namespace lineage
