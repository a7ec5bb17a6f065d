// The training backward against PyTorch autograd: for each gradient golden the engine can train
// (reference/grad_goldens.py GRAD_CASES, README "Gradient goldens"), the engine's loss and every parameter's
// gradient, each held to 6 × PyTorch's own f32 error for tensors of its kind, at least 1e-5 relative RMS
// (2e-4 for per-head vectors; see tolerance_of).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "lineage/io/load_model.h"
#include "lineage/io/npy.h"
#include "lineage/train/backprop.h"
#include "test_support.h"

namespace lineage {
namespace golden_grad_test {
namespace {

namespace fs = std::filesystem;

struct GradCase {
  std::string family, name;
};

class GoldenGrad : public ::testing::TestWithParam<GradCase> {};

// A tensor's kind: its name with the layer and expert indices left out.
std::string kind_of(const std::string& name) {
  std::string k;
  for (size_t i = 0; i < name.size(); ++i) {
    k += name[i];
    if (name[i] != '.' || i + 1 >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i + 1]))) continue;
    size_t j = i + 1;
    while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
    if (j < name.size() && name[j] != '.') continue;
    k += 'N';
    i = j - 1;
  }
  return k;
}

// The tolerance of a tensor's gradient: 10 x the float32 noise it carries, measured as PyTorch's own
// f32 error, the largest over the tensors of its kind (one tensor's error is one draw of that noise:
// OpenBLAS's AVX2 and AVX-512 kernels moved single tensors' errors 2-4x; kda's A_log ranges from 1.2e-6
// to 1.6e-5 across layers), and at least 1e-5. Per-head vectors (at most 64 elements: A_log, dt_bias)
// each sum every token's and channel's contribution with heavy cancellation, so their relative RMS is
// a few such sums' and swings furthest (the engine's own: 2e-5 to 6.4e-5 for kda's A_log between the
// two kernels): at least 2e-4 there. The engine's chunked backward sums in other orders than autograd's
// and through triangular solves: on kda/lower_bound its errors reach 5x PyTorch's with OpenBLAS's AVX2
// kernels and 6.5x with its AVX-512 ones (layer 0, fed by layer 1's k_conv1d at 5e-5). A wrong term in
// a gradient is off by 1e-3 or more.
double tolerance_of(const nlohmann::json& tensors, const nlohmann::json& t, int64_t numel) {
  const std::string kind = kind_of(t["name"]);
  double worst = 0;
  for (const auto& o : tensors)
    if (kind_of(o["name"]) == kind) worst = std::max(worst, o["f32_torch_rel_rms"].get<double>());
  return std::max(numel <= 64 ? 2e-4 : 1e-5, 10 * worst);
}

TEST_P(GoldenGrad, LossAndEveryGradientMatchAutograd) {
  const fs::path dir = test::testdata() / GetParam().family / GetParam().name;
  const nlohmann::json man = nlohmann::json::parse(test::slurp(dir / "grad" / "manifest.json"));
  io::LoadedModel loaded = io::load_model(dir, false);
  model::Model& m = loaded.model;
  train::to_trainable(m);
  train::Backprop bp(m);
  const Tensor tokens = io::load_npy(dir / "grad" / "tokens.npy");
  const int64_t B = man["B"], T = man["T"];
  ASSERT_EQ(tokens.shape(), (Shape{B, T + 1}));
  const double loss = bp.step({tokens.data<int32_t>(), size_t(tokens.numel())}, B, T, 1.0f / float(B * T));
  EXPECT_NEAR(loss, man["loss"].get<double>(), 1e-5 * man["loss"].get<double>());

  std::map<std::string, const float*> grads;
  std::map<std::string, int64_t> sizes;
  // Under the checkpoint's names and in its layout (Kimi's f_a_proj for the engine's f_proj.0; Qwen's
  // in_proj_qkvz joined from the q, k, v and z projections' gradients, its fused experts stacked).
  std::map<std::string, Shape> shapes;
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape&, layers::Init) { shapes[name] = t.shape(); });
  std::vector<std::pair<std::string, Tensor>> params;
  for (const train::ParamRef& p : bp.params())
    params.emplace_back(p.name, Tensor::borrow(DType::F32, shapes.at(p.name), p.grad, nullptr));
  const std::vector<std::pair<std::string, Tensor>> stored = model::stored_tensors(m.binding, params);
  for (const auto& [name, t] : stored) grads[name] = t.data<float>(), sizes[name] = t.numel();
  size_t checked = 0;
  double worst_ratio = 0, worst_err = 0, largest = 0;
  std::string worst_name, largest_name;
  for (const auto& t : man["tensors"]) {
    const std::string name = t["name"];
    ASSERT_TRUE(grads.count(name)) << name << " has a golden gradient but no parameter in the engine";
    const Tensor want = io::load_npy(dir / "grad" / t["file"].get<std::string>());
    ASSERT_EQ(want.numel(), sizes[name]) << name;
    const double tol = tolerance_of(man["tensors"], t, want.numel());
    const double err = test::rel_rms(grads[name], want.data<float>(), want.numel());
    const int64_t worst = test::worst_index(grads[name], want.data<float>(), want.numel());
    EXPECT_LE(err, tol) << name << ": worst element " << worst << " is " << grads[name][worst] << ", autograd gives "
                        << want.data<float>()[worst];
    if (err / tol > worst_ratio) worst_ratio = err / tol, worst_err = err, worst_name = name;
    if (err > largest) largest = err, largest_name = name;
    ++checked;
  }
  std::cout << "[ measured ] " << GetParam().family << "/" << GetParam().name << ": loss " << loss << " (autograd "
            << man["loss"].get<double>() << "), closest to its tolerance: " << worst_name << " at " << worst_err
            << " relative RMS, " << worst_ratio << " of its tolerance; largest error " << largest << " ("
            << largest_name << ")\n";
  // Every parameter the engine trains has a golden, except those the reference lists as taking no
  // gradient (GPT-2's causal-mask buffers are not parameters of the engine at all); those the engine
  // has (the router's e_score_correction_bias) must get exactly zero.
  for (const auto& t : man["no_grad"]) {
    const auto it = grads.find(t["name"].get<std::string>());
    if (it == grads.end()) continue;
    for (int64_t i = 0; i < sizes[it->first]; ++i) EXPECT_EQ(it->second[i], 0.0f) << it->first << "[" << i << "]";
    ++checked;
  }
  EXPECT_EQ(checked, grads.size());
}

INSTANTIATE_TEST_SUITE_P(Families, GoldenGrad,
                         ::testing::Values(GradCase{"gpt2", "f32_tanh"}, GradCase{"gpt2", "f32_conv"},
                                           GradCase{"linear_attn", "f32_elu_normalized"},
                                           GradCase{"linear_attn", "f32_elu_conv"},
                                           GradCase{"delta_net", "f32"}, GradCase{"gated_deltanet", "f32_gva"},
                                           GradCase{"kda", "attnres"}, GradCase{"kda", "lower_bound"},
                                           GradCase{"kimi_linear", "f32"}, GradCase{"kimi_k3", "text_only"},
                                           GradCase{"qwen3_next", "f32_sharded"}, GradCase{"qwen3_5", "f32"},
                                           GradCase{"qwen3_5_moe", "f32"}),
                         [](const auto& info) { return info.param.family + "_" + info.param.name; });

}  // namespace
}  // namespace golden_grad_test
}  // namespace lineage
