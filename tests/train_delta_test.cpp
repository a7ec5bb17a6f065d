// Training the delta-rule family through the library: every parameter's gradient against finite
// differences of the loss for each switch of the layer (feature maps, q/k norms, β with and without
// negative eigenvalues, no β, decay inputs and both gate forms, output gates, GVA and linear
// attention's GQA, no short conv) and for the SiTU gated MLP; the chunked and recurrent backward paths
// against each other; the thread count; and the loss falling on a learnable sequence. The PyTorch
// goldens (golden_grad_test.cpp) hold the fla families' gradients to autograd.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>

#include <nlohmann/json.hpp>

#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/archs/presets.h"
#include "lineage/train/backprop.h"
#include "lineage/train/trainer.h"
#include "batch_check.h"
#include "test_support.h"
#include "train_check.h"

namespace lineage {
namespace train_delta_test {
namespace {

using layers::DeltaRule;

constexpr int64_t kVocab = 40;

// A tiny fla model of `cfg`'s family (2 layers, width 16, tied head), `mutate` applied to the skeleton
// before its weights exist (switches no fla config.json reaches: Kimi K3's), random weights with the
// matrices scaled up (×4) and a strong decay so every path carries a gradient well above f32 rounding,
// made trainable.
model::Model tiny_fla(const nlohmann::json& cfg, uint64_t seed, const std::function<void(model::Model&)>& mutate = {}) {
  nlohmann::json j = {{"vocab_size", kVocab}, {"hidden_size", 16},        {"num_hidden_layers", 2},
                      {"num_heads", 2},       {"intermediate_size", 24}, {"norm_eps", 1e-5},
                      {"tie_word_embeddings", true}};
  j.update(cfg);
  const model::ArchBuilder* build = model::find_arch(j["model_type"]);
  model::Model m = (*build)({model::ConfigFields(j, "tiny"), [](const std::string&) { return false; }});
  if (mutate) mutate(m);
  model::init_random(m, seed, DType::F32);
  Rng r(seed + 1);
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    float* v = t.data<float>();
    // The decay's parameters where its gradient is well above the difference's f32 noise: A = e^A_log
    // in [0.6, 1.6], dt_bias in [-1, 1] (a decay of about e^-1 a step, not fla's near-1 initial one).
    if (name.ends_with("A_log") || name.ends_with("dt_bias")) {
      for (int64_t i = 0; i < t.numel(); ++i) v[i] = (name.ends_with("A_log") ? 0.5f : 1.0f) * (2 * r.uniform() - 1);
      return;
    }
    if (t.ndim() < 2) return;
    for (int64_t i = 0; i < t.numel(); ++i) v[i] *= 4.0f;
  });
  train::to_trainable(m);
  return m;
}

// Kimi K3's KDA and MLP on a kda skeleton: full-rank decay input f_proj with the lower-bound gate,
// A_log stored longer than the heads, full-rank sigmoid output gate, SiTU-GLU (beta_lin 0: u uncapped).
void k3_switches(model::Model& m, float situ_linear_beta) {
  for (model::Block& b : m.blocks) {
    DeltaRule& d = std::get<DeltaRule>(b.mixer);
    d.config.decay = DeltaRule::DecayInput::PerChannelProj;
    d.config.out_gate = DeltaRule::OutGate::Sigmoid;
    d.config.gate_lower_bound = -5.0f;
    d.config.a_log_len = d.config.n_v_heads + 3;
    auto& f = std::get<layers::GatedMlp>(b.ffn);
    f.config.act = layers::GatedMlp::Act::Situ;
    f.config.situ_beta = 2.0f, f.config.situ_linear_beta = situ_linear_beta;
  }
}

struct FdCase {
  std::string name;
  nlohmann::json config;
  std::function<void(model::Model&)> mutate = {};
};

class TrainDeltaFd : public ::testing::TestWithParam<FdCase> {};

// For each parameter tensor p with gradient g, a random direction d on p alone: the central
// difference of the loss along d (Richardson-combined at 2ε and ε) against ⟨g, d⟩, within 3 %. The
// forward is f32, so this catches a missing term, a wrong sign or a misplaced index in any one
// tensor, not rounding; every map here is smooth (ReLU's kinks would make the difference itself
// wrong: its backward is activation_backward's, tested with the kernels). T = 21 spans a full
// 16-token chunk and a partial one.
TEST_P(TrainDeltaFd, GradientOfEveryTensorMatchesFiniteDifferences) {
  model::Model m = tiny_fla(GetParam().config, 3, GetParam().mutate);
  train::Backprop bp(m);
  const int64_t B = 2, T = 21;
  const std::vector<int32_t> tokens = random_tokens(B * (T + 1), kVocab, 4);
  const float scale = 1.0f / float(B * T);
  bp.step(tokens, B, T, scale);
  std::vector<train::ParamRef> params = bp.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const train::ParamRef& p = params[i];
    const auto [fd, gd] = test::directional_derivative(bp, p, 100 + i, 3e-4, [&] { return bp.step(tokens, B, T, scale, false); });
    EXPECT_NEAR(fd, gd, 3e-2 * std::fabs(gd) + 2e-4) << p.name;
  }
  bp.refresh();
}

INSTANTIATE_TEST_SUITE_P(
    Switches, TrainDeltaFd,
    ::testing::Values(
        // Linear attention: the product feature map with GQA (k/v heads repeated); ELU + 1 with the
        // sum norms (positive features: Σx stays away from 0) and no output-norm weight; ELU + 1 with the
        // normalizer.
        FdCase{"linear_attn_product_gqa", {{"model_type", "linear_attn"}, {"num_heads", 4}, {"num_kv_heads", 2}}},
        FdCase{"linear_attn_elu_sumnorm",
               {{"model_type", "linear_attn"}, {"feature_map", "elu"}, {"norm_q", true}, {"norm_k", true},
                {"elementwise_affine", false}}},
        FdCase{"linear_attn_elu_normalized",
               {{"model_type", "linear_attn"}, {"feature_map", "elu"}, {"norm_feature_map", true}}},
        // DeltaNet: ELU + 1 and the sum norm without β; identity q/k activation (no SiLU on their conv),
        // β × 2, the swish output gate, a 3-tap conv; no short conv at all.
        FdCase{"delta_net_elu_sum_nobeta",
               {{"model_type", "delta_net"}, {"qk_activation", "elu"}, {"qk_norm", "sum"}, {"use_beta", false}}},
        FdCase{"delta_net_identity_negeig_gate",
               {{"model_type", "delta_net"}, {"qk_activation", "identity"}, {"allow_neg_eigval", true}, {"use_gate", true},
                {"conv_size", 3}}},
        FdCase{"delta_net_noconv", {{"model_type", "delta_net"}, {"use_short_conv", false}}},
        // Gated DeltaNet with GVA; the Mamba-2-style additive write with a per-head decay.
        FdCase{"gated_deltanet_gva",
               {{"model_type", "gated_deltanet"}, {"num_heads", 1}, {"num_v_heads", 2}, {"head_dim", 8}}},
        FdCase{"scalar_decay_additive",
               {{"model_type", "gated_deltanet"}, {"head_dim", 8}, {"lineage_delta_rule", false}, {"use_short_conv", false}}},
        // KDA: softplus gate with GVA and the low-rank sigmoid gate; the lower-bound gate; no short conv
        // and Kimi's bias-free low-rank gate.
        FdCase{"kda_gva", {{"model_type", "kda"}, {"num_heads", 1}, {"num_v_heads", 2}, {"head_dim", 8}}},
        FdCase{"kda_lower_bound", {{"model_type", "kda"}, {"head_dim", 8}, {"lower_bound", -5.0}}},
        FdCase{"kda_noconv_nogatebias",
               {{"model_type", "kda"}, {"head_dim", 8}, {"use_short_conv", false}},
               [](model::Model& m) {
                 for (model::Block& b : m.blocks) std::get<DeltaRule>(b.mixer).g_b_has_bias = false;
               }},
        // Block Attention Residuals (fla's attnres_block_size, in sublayers): every sublayer's output its
        // own block; blocks of one layer (two sublayers), so the channel mixer mixes in a partial block.
        FdCase{"kda_attnres_every_sublayer", {{"model_type", "kda"}, {"head_dim", 8}, {"attnres_block_size", 1}}},
        FdCase{"kda_attnres_per_layer", {{"model_type", "kda"}, {"head_dim", 8}, {"attnres_block_size", 2}}},
        // Kimi K3's switches (full-rank decay input with the lower-bound gate, long A_log, full-rank
        // sigmoid gate, SiTU with u capped and uncapped).
        FdCase{"k3_kda_situ", {{"model_type", "kda"}, {"head_dim", 8}}, [](model::Model& m) { k3_switches(m, 25.0f); }},
        FdCase{"k3_kda_situ_uncapped", {{"model_type", "kda"}, {"head_dim", 8}},
               [](model::Model& m) { k3_switches(m, 0.0f); }}),
    [](const auto& info) { return info.param.name; });

// Every row of the lineage trains: the delta-rule family, Kimi Linear (KDA + dense MLP, MLA + MoE,
// KDA + MoE) and Kimi K3 (Block AttnRes, latent MoE, gated MLA).
TEST(TrainDelta, EveryPresetFamilyIsTrainable) {
  for (const char* name : {"linear-attention", "mamba2-decay", "deltanet", "gated-deltanet", "kda", "kimi-linear", "kimi-k3"})
    EXPECT_EQ(train::untrainable_reason(test::tiny_preset(name)), "") << name;
}

// The chunked kernels (forward and backward) and the token-by-token ones give the same gradients over
// lengths that are not whole chunks, strong decay included (KDA's lower-bound gate reaches e^-5 a step).
TEST(TrainDelta, ChunkedAndRecurrentPathsGiveTheSameGradients) {
  const nlohmann::json configs[] = {
      {{"model_type", "gated_deltanet"}, {"head_dim", 8}},
      {{"model_type", "kda"}, {"head_dim", 8}, {"lower_bound", -5.0}},
      {{"model_type", "linear_attn"}, {"feature_map", "elu"}, {"norm_feature_map", true}}};
  for (const nlohmann::json& cfg : configs) {
    std::vector<std::vector<float>> grads;
    std::vector<double> losses;
    for (const layers::DeltaRulePath path : {layers::DeltaRulePath::Chunked, layers::DeltaRulePath::Recurrent}) {
      model::Model m = tiny_fla(cfg, 5);
      m.options.delta_rule_path = path;
      train::Backprop bp(m);
      losses.push_back(bp.step(random_tokens(3 * 38, kVocab, 6), 3, 37, 1.0f / 111));
      grads.push_back(test::all_grads(bp));
    }
    const double err = test::rel_rms(grads[0].data(), grads[1].data(), int64_t(grads[1].size()));
    std::cout << "[ measured ] " << cfg["model_type"].get<std::string>() << ": chunked vs recurrent gradients " << err
              << " relative RMS\n";
    EXPECT_NEAR(losses[0], losses[1], 1e-6 * losses[1]) << cfg.dump();
    EXPECT_LE(err, 1e-5) << cfg.dump();
  }
}

TEST(TrainDelta, GradientsDoNotDependOnTheThreadCount) {
  test::expect_thread_count_invariant(
      [] { return tiny_fla({{"model_type", "kda"}, {"num_heads", 1}, {"num_v_heads", 2}, {"head_dim", 8}}, 7); }, kVocab);
}

// A sequence that repeats with period 7 is learnable by a 2-layer Gated DeltaNet: the held-out loss
// (the same cycle at other offsets) must fall far below uniform guessing.
TEST(TrainDelta, LossFallsOnARepeatingSequence) {
  model::Model m = tiny_fla({{"model_type", "gated_deltanet"}, {"head_dim", 8}}, 9);
  const test::HeldOut h = test::train_on_a_cycle(m, kVocab);
  EXPECT_GT(h.before, 2.5);
  EXPECT_LT(h.after, 0.3) << "held-out loss before training " << h.before;
}

}  // namespace
}  // namespace train_delta_test
}  // namespace lineage
