// Training Multi-head Latent Attention (DeepSeek-V2/V3 → Kimi Linear → Kimi K3) through the library:
// every parameter's gradient against finite differences of the loss on tiny all-MLA kimi_linear
// models (RoPE and NoPE, one q_proj and q-LoRA, with and without K3's sigmoid output gate); the
// training forward against the inference forward; the thread count; and the loss falling.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include <nlohmann/json.hpp>

#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/archs/presets.h"
#include "lineage/model/model.h"
#include "lineage/model/state_pool.h"
#include "lineage/model/workspace.h"
#include "lineage/model/forward.h"
#include "lineage/train/backprop.h"
#include "lineage/train/trainer.h"
#include "test_support.h"
#include "train_check.h"

namespace lineage {
namespace train_mla_test {
namespace {

constexpr int64_t kVocab = 40;

// A tiny kimi_linear model whose 2 layers are both MLA with dense MLPs (first_k_dense_replace 2: no
// MoE), width 16, 2 heads of d_nope 4 + d_rope 4 and d_v 6, latent 8, tied head; `extra` overrides
// fields. Random weights with the matrices scaled up (×4) so attention is far from uniform and
// every path carries a gradient well above f32 rounding; made trainable.
model::Model tiny_mla(const nlohmann::json& extra, uint64_t seed) {
  nlohmann::json j = {{"model_type", "kimi_linear"},
                      {"vocab_size", kVocab},
                      {"hidden_size", 16},
                      {"num_hidden_layers", 2},
                      {"linear_attn_config",
                       {{"kda_layers", nlohmann::json::array()},
                        {"full_attn_layers", {1, 2}},
                        {"num_heads", 2},
                        {"head_dim", 8},
                        {"short_conv_kernel_size", 4}}},
                      {"num_attention_heads", 2},
                      {"num_key_value_heads", 2},
                      {"kv_lora_rank", 8},
                      {"qk_nope_head_dim", 4},
                      {"qk_rope_head_dim", 4},
                      {"v_head_dim", 6},
                      {"mla_use_nope", false},
                      {"rope_theta", 100.0},
                      {"hidden_act", "silu"},
                      {"intermediate_size", 24},
                      {"first_k_dense_replace", 2},
                      {"moe_layer_freq", 1},
                      {"num_experts", 4},
                      {"num_experts_per_token", 2},
                      {"moe_intermediate_size", 8},
                      {"num_shared_experts", 1},
                      {"moe_router_activation_func", "sigmoid"},
                      {"moe_renormalize", true},
                      {"routed_scaling_factor", 1.0},
                      {"use_grouped_topk", true},
                      {"num_expert_group", 1},
                      {"topk_group", 1},
                      {"rms_norm_eps", 1e-5},
                      {"tie_word_embeddings", true}};
  j.update(extra);
  const model::ArchBuilder* build = model::find_arch(j["model_type"]);
  model::Model m = (*build)({model::ConfigFields(j, "tiny"), [](const std::string&) { return false; }});
  model::init_random(m, seed, DType::F32);
  m.for_each_tensor([&](const std::string&, Tensor& t, const Shape&, layers::Init) {
    if (t.ndim() < 2) return;
    float* v = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) v[i] *= 4.0f;
  });
  train::to_trainable(m);
  return m;
}

// Mean next-token NLL of tokens[0..n-2] → tokens[1..n-1] by the inference forward: the whole prompt
// as one step (the explicit form), or one token a step (the absorbed form, latent cache).
double inference_nll(const model::Model& m, const std::vector<int32_t>& tokens, bool one_step) {
  const int64_t V = m.config.vocab_size, T = int64_t(tokens.size()) - 1;
  model::StatePool pool(m);
  model::Workspace ws;
  layers::Step step;
  const int32_t slot = pool.acquire();
  std::vector<float> logits(size_t(T * V));
  if (one_step) {
    step.add(slot, 0, std::span<const int32_t>(tokens.data(), size_t(T)));
    model::forward(m, step, pool, model::LogitRows::All, logits.data(), ws);
  } else {
    for (int64_t t = 0; t < T; ++t) {
      step.clear();
      step.add(slot, pool.position(slot), std::span<const int32_t>(tokens.data() + t, 1));
      model::forward(m, step, pool, model::LogitRows::All, logits.data() + t * V, ws);
    }
  }
  double nll = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits.data() + t * V;
    double mx = z[0], sum = 0;
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(z[v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(z[v]) - mx);
    nll += mx + std::log(sum) - double(z[tokens[size_t(t + 1)]]);
  }
  return nll / double(T);
}

struct FdCase {
  std::string name;
  nlohmann::json config;
};

class TrainMlaFd : public ::testing::TestWithParam<FdCase> {};

// For each parameter tensor p with gradient g, a random direction d on p alone: the central
// difference of the loss along d (Richardson-combined at 2ε and ε) against ⟨g, d⟩, within 3 %
// (the forward is f32: this catches a missing term, a wrong sign or a misplaced index, not rounding).
TEST_P(TrainMlaFd, GradientOfEveryTensorMatchesFiniteDifferences) {
  model::Model m = tiny_mla(GetParam().config, 3);
  for (const model::Block& b : m.blocks) ASSERT_TRUE(std::holds_alternative<layers::Mla>(b.mixer));
  ASSERT_EQ(train::untrainable_reason(m), "");
  train::Backprop bp(m);
  const int64_t B = 2, T = 13;
  const std::vector<int32_t> tokens = random_tokens(B * (T + 1), kVocab, 4);
  const float scale = 1.0f / float(B * T);
  bp.step(tokens, B, T, scale);
  std::vector<train::ParamRef> params = bp.params();
  double worst = 0;  // |fd − ⟨g, d⟩| as a fraction of the tolerance
  std::string worst_name;
  for (size_t i = 0; i < params.size(); ++i) {
    const train::ParamRef& p = params[i];
    const auto [fd, gd] = test::directional_derivative(bp, p, 100 + i, 3e-4, [&] { return bp.step(tokens, B, T, scale, false); });
    const double tol = 3e-2 * std::fabs(gd) + 2e-4;
    if (std::fabs(fd - gd) / tol > worst) worst = std::fabs(fd - gd) / tol, worst_name = p.name;
    EXPECT_NEAR(fd, gd, tol) << p.name << " (directional derivative " << gd << ")";
  }
  std::cout << "[ measured ] " << GetParam().name << ": worst |fd − ⟨g, d⟩| over " << params.size() << " tensors "
            << worst << " of the tolerance (" << worst_name << ")\n";
  bp.refresh();
}

INSTANTIATE_TEST_SUITE_P(
    Switches, TrainMlaFd,
    ::testing::Values(
        // DeepSeek-V3's interleaved RoPE on the d_rope slot, one q_proj.
        FdCase{"rope", nlohmann::json::object()},
        // Kimi Linear's NoPE (the d_rope slot scored unrotated).
        FdCase{"nope", {{"mla_use_nope", true}}},
        // Kimi K3's gated MLA with q-LoRA (q_a → q_a_layernorm → q_b), RoPE on.
        FdCase{"k3_qlora_gate", {{"q_lora_rank", 6}, {"mla_use_output_gate", true}}},
        // q-LoRA alone and the gate alone, NoPE as K3 ships.
        FdCase{"qlora_nope", {{"q_lora_rank", 6}, {"mla_use_nope", true}}},
        FdCase{"gate_nope", {{"mla_use_output_gate", true}, {"mla_use_nope", true}}}),
    [](const auto& info) { return info.param.name; });

// The training forward's loss equals the inference forward's (explicit and absorbed forms both) on
// the same tokens: the training path computes the same function.
TEST(TrainMla, TrainingLossMatchesInferenceForward) {
  for (const nlohmann::json& cfg : {nlohmann::json::object(), nlohmann::json{{"q_lora_rank", 6}, {"mla_use_output_gate", true}}}) {
    model::Model m = tiny_mla(cfg, 11);
    train::Backprop bp(m);
    const int64_t T = 20;
    const std::vector<int32_t> tokens = random_tokens(T + 1, kVocab, 12);
    std::vector<int32_t> in(tokens.begin(), tokens.end() - 1), tgt(tokens.begin() + 1, tokens.end());
    const double train_loss = bp.step(in, tgt, 1, T, 1.0f / float(T), false);
    const double explicit_form = inference_nll(m, tokens, true), absorbed = inference_nll(m, tokens, false);
    std::cout << "[ measured ] " << cfg.dump() << ": training loss " << train_loss << ", inference " << explicit_form
              << " (explicit) " << absorbed << " (absorbed)\n";
    EXPECT_NEAR(train_loss, explicit_form, 1e-5 * explicit_form) << cfg.dump();
    EXPECT_NEAR(train_loss, absorbed, 1e-4 * absorbed) << cfg.dump();
  }
}

TEST(TrainMla, GradientsDoNotDependOnTheThreadCount) {
  test::expect_thread_count_invariant([] { return tiny_mla({{"q_lora_rank", 6}, {"mla_use_output_gate", true}}, 7); },
                                      kVocab);
}

// A sequence that repeats with period 7 is learnable by 2 MLA layers: the held-out loss (the same
// cycle at other offsets) must fall far below uniform guessing (ln 40 ≈ 3.7).
TEST(TrainMla, LossFallsOnARepeatingSequence) {
  for (const nlohmann::json& cfg : {nlohmann::json::object(), nlohmann::json{{"q_lora_rank", 6}, {"mla_use_output_gate", true}}}) {
    model::Model m = tiny_mla(cfg, 9);
    const test::HeldOut h = test::train_on_a_cycle(m, kVocab);
    std::cout << "[ measured ] " << cfg.dump() << ": held-out loss " << h.before << " → " << h.after << "\n";
    EXPECT_GT(h.before, 2.5);
    EXPECT_LT(h.after, 0.3) << cfg.dump() << ": held-out loss before training " << h.before;
  }
}

}  // namespace
}  // namespace train_mla_test
}  // namespace lineage
