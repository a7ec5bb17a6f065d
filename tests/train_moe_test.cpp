// Training the Mixture-of-Experts (Kimi Linear's, Kimi K3's Stable LatentMoE, Qwen's softmax router
// with its gated shared expert) through the library: the layer alone (input and every tensor) and whole
// tiny all-KDA Kimi models (and a Qwen3-Next of a Gated DeltaNet and a gated attention layer) whose
// FFNs are MoE, each
// gradient against directional finite differences of the loss with the top-k choice checked unchanged
// under every perturbation (a flipped choice is a jump, not a derivative); the router bias's gradient
// stays 0; the thread count; and the loss falling on a learnable sequence.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>

#include <nlohmann/json.hpp>

#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/layers/ffn/moe.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/archs/presets.h"
#include "lineage/model/model.h"
#include "lineage/model/forward.h"
#include "lineage/train/backprop.h"
#include "lineage/train/trainer.h"
#include "test_support.h"
#include "train_check.h"

namespace lineage {
namespace train_moe_test {
namespace {

constexpr int64_t kVocab = 40;

// A tiny Kimi config: 2 KDA layers (no MLA), width 16, MoE FFNs from first_k_dense_replace on;
// `extra` overrides fields.
nlohmann::json kimi_moe(const nlohmann::json& extra) {
  nlohmann::json j = {{"model_type", "kimi_linear"},
                      {"vocab_size", kVocab},
                      {"hidden_size", 16},
                      {"num_hidden_layers", 2},
                      {"linear_attn_config",
                       {{"kda_layers", {1, 2}}, {"full_attn_layers", nlohmann::json::array()}, {"num_heads", 2},
                        {"head_dim", 8}, {"short_conv_kernel_size", 4}}},
                      {"hidden_act", "silu"},
                      {"intermediate_size", 24},
                      {"first_k_dense_replace", 1},
                      {"moe_layer_freq", 1},
                      {"num_experts", 6},
                      {"num_experts_per_token", 2},
                      {"moe_intermediate_size", 8},
                      {"num_shared_experts", 1},
                      {"moe_renormalize", true},
                      {"routed_scaling_factor", 2.446},
                      {"use_grouped_topk", true},
                      {"num_expert_group", 1},
                      {"topk_group", 1},
                      {"rms_norm_eps", 1e-5},
                      {"tie_word_embeddings", false}};
  if (extra.is_object()) j.update(extra);
  return j;
}

// The model of `cfg` with random F32 weights, the matrices scaled up (×4, so the router's scores
// spread and every path carries a gradient well above f32 rounding), a random correction bias (it
// then changes the choice), the KDA decay in a strong range, made trainable.
model::Model tiny_kimi(const nlohmann::json& cfg, uint64_t seed) {
  const model::ArchBuilder* build = model::find_arch(cfg["model_type"]);
  model::Model m = (*build)({model::ConfigFields(cfg, "tiny"), [](const std::string&) { return false; }});
  model::init_random(m, seed, DType::F32);
  Rng r(seed + 1);
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    if (!t.defined()) return;
    float* v = t.data<float>();
    if (name.ends_with("A_log") || name.ends_with("dt_bias")) {
      for (int64_t i = 0; i < t.numel(); ++i) v[i] = (name.ends_with("A_log") ? 0.5f : 1.0f) * (2 * r.uniform() - 1);
      return;
    }
    if (name.ends_with("e_score_correction_bias")) {
      for (int64_t i = 0; i < t.numel(); ++i) v[i] = 0.05f * r.normal();
      return;
    }
    if (t.ndim() < 2) return;
    for (int64_t i = 0; i < t.numel(); ++i) v[i] *= 4.0f;
  });
  train::to_trainable(m);
  return m;
}

struct MoeCase {
  std::string name;
  nlohmann::json config;
};

// A tiny Qwen3-Next: a Gated DeltaNet layer (4 value heads reading 2 key heads) and a gated attention
// layer (2 query heads on 1 KV head, half of each head rotated), zero-centred norms, and in each an
// MoE of 6 experts, top-2 of a softmax over all 6, renormalized, with a shared expert gated by σ(W·x).
nlohmann::json qwen_moe() {
  return {{"model_type", "qwen3_next"}, {"vocab_size", kVocab}, {"hidden_size", 16}, {"num_hidden_layers", 2},
          {"layer_types", {"linear_attention", "full_attention"}}, {"linear_num_key_heads", 2},
          {"linear_num_value_heads", 4}, {"linear_key_head_dim", 8}, {"linear_value_head_dim", 4},
          {"linear_conv_kernel_dim", 4}, {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"head_dim", 8},
          {"partial_rotary_factor", 0.5}, {"rope_theta", 10000.0}, {"num_experts", 6}, {"num_experts_per_tok", 2},
          {"moe_intermediate_size", 8}, {"shared_expert_intermediate_size", 8}, {"norm_topk_prob", true},
          {"hidden_act", "silu"}, {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", false}};
}

// Plain top-2 with a shared expert (Kimi Linear's shape); top-3 of 8 in 2 of 4 groups (0.0 mask)
// without shared experts or renormalization, every FFN MoE; K3's Stable LatentMoE (experts at width 8,
// their sum RMSNormed, SiTU, groups masked with −inf) with a shared expert; Qwen3-Next's (qwen_moe).
const MoeCase kCases[] = {
    {"plain_top2_shared", kimi_moe({})},
    {"grouped_top3_noshared",
     kimi_moe({{"num_experts", 8}, {"num_experts_per_token", 3}, {"num_expert_group", 4}, {"topk_group", 2},
               {"num_shared_experts", 0}, {"moe_renormalize", false}, {"first_k_dense_replace", 0},
               {"routed_scaling_factor", 1.0}})},
    {"k3_latent_situ",
     kimi_moe({{"routed_expert_hidden_size", 8}, {"latent_moe_use_norm", true}, {"hidden_act", "situ"},
               {"activation_situ_beta", 4.0}, {"activation_situ_linear_beta", 25.0}, {"num_expert_group", 2},
               {"topk_group", 1}, {"first_k_dense_replace", 0}, {"routed_scaling_factor", 1.0}})},
    {"qwen_softmax_gated_shared", qwen_moe()},
};

// Central differences along d at 2ε and ε, Richardson-combined. `crossed` says whether a step crossed a
// change of the chosen experts (a jump): the difference is then retried at a quarter of the step, up
// to 4 times. Without a way to see the choice, `crossed` may compare the two differences instead
// (smooth: they agree to O(ε²); across a jump: they differ by about jump / ε).
double directional_fd(const std::function<double(double)>& loss_at, double eps,
                      const std::function<bool(double, double)>& crossed) {
  double fd = 0;
  for (int tries = 0; tries < 5; ++tries, eps /= 4) {
    const double fd2 = (loss_at(2 * eps) - loss_at(-2 * eps)) / (4 * eps);
    const double fd1 = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
    fd = (4 * fd1 - fd2) / 3;
    if (!crossed(fd1, fd2)) break;
  }
  return fd;
}

class TrainMoeFd : public ::testing::TestWithParam<MoeCase> {};

// The MoE layer alone: L = Σ r ⊙ y(x) for a random r, so ∂L/∂y = r. The input's and every tensor's
// gradient against a directional difference (within 1 %), with the chosen experts of every token the
// same under each perturbation.
TEST_P(TrainMoeFd, LayerGradientsMatchFiniteDifferences) {
  model::Model m = tiny_kimi(GetParam().config, 21);
  layers::Moe& moe = std::get<layers::Moe>(m.blocks[1].ffn);
  layers::Moe grad = moe;
  grad.for_each_tensor("g", [](const std::string&, Tensor& t, const Shape&, layers::Init) {
    if (t.defined()) t = Tensor::zeros(DType::F32, t.shape());
  });
  const int64_t N = 24, D = moe.config.d_model;
  const layers::TrainShape shape{2, N / 2};
  Rng r(22);
  std::vector<float> x(size_t(N * D)), dy(size_t(N * D)), y(size_t(N * D)), dx(size_t(N * D));
  for (float& v : x) v = r.normal();
  for (float& v : dy) v = r.normal();
  layers::Moe::Saved sv;
  layers::forward_train(moe, shape, x.data(), y.data(), sv);
  const std::vector<int32_t> chosen = sv.ids;
  layers::backward(moe, shape, x.data(), dy.data(), sv, dx.data(), grad);

  int flips = 0, retried = 0;
  const auto loss = [&] {
    moe.prepare();
    layers::Moe::Saved s2;
    layers::forward_train(moe, shape, x.data(), y.data(), s2);
    if (s2.ids != chosen) ++flips;
    double l = 0;
    for (int64_t i = 0; i < N * D; ++i) l += double(dy[size_t(i)]) * double(y[size_t(i)]);
    return l;
  };
  // One tensor (or x): value p[n] with gradient g[n].
  const auto check = [&](const std::string& name, float* p, const float* g, int64_t n, uint64_t seed) {
    Rng rd(seed);
    std::vector<float> d(static_cast<size_t>(n)), keep(p, p + n);
    double gd = 0, dd = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double dj = d[size_t(j)] = rd.normal();
      gd += double(g[j]) * dj, dd += dj * dj;
    }
    const double eps = 1e-3 / std::sqrt(dd / double(n));
    const double fd = directional_fd([&](double s) {
      for (int64_t j = 0; j < n; ++j) p[j] = float(keep[size_t(j)] + s * d[size_t(j)]);
      const double l = loss();
      std::copy(keep.begin(), keep.end(), p);
      return l;
    }, eps, [&](double, double) {
      const bool crossed = flips > 0;
      retried += crossed;
      flips = 0;
      return crossed;
    });
    EXPECT_EQ(flips, 0) << name << ": every step down to ε/256 changed the chosen experts";
    EXPECT_NEAR(fd, gd, 1e-2 * std::fabs(gd) + 1e-3) << name;
    return std::fabs(fd - gd) / (std::fabs(gd) + 1e-3);
  };
  double worst = check("x", x.data(), dx.data(), N * D, 30);
  std::vector<std::pair<std::string, Tensor*>> grads;
  grad.for_each_tensor("moe", [&](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    if (t.defined()) grads.push_back({name, &t});
  });
  size_t i = 0;
  moe.for_each_tensor("moe", [&](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    if (!t.defined()) return;
    ASSERT_LT(i, grads.size());
    const Tensor& g = *grads[i++].second;
    if (name.ends_with("e_score_correction_bias")) {
      for (int64_t j = 0; j < g.numel(); ++j) EXPECT_EQ(g.data<float>()[j], 0.0f) << name;
    }
    worst = std::max(worst, check(name, t.data<float>(), g.data<float>(), t.numel(), 40 + i));
  });
  moe.prepare();
  std::cout << "[ measured ] " << GetParam().name << ": layer gradients vs finite differences, worst relative error "
            << worst << " (" << retried << " differences retried at a smaller step for a changed choice)\n";
}

// The training forward routes and sums as the inference forward does: the same outputs to f32
// rounding (the experts' matrix products are grouped differently).
TEST_P(TrainMoeFd, TrainingForwardMatchesInference) {
  model::Model m = tiny_kimi(GetParam().config, 23);
  const layers::Moe& moe = std::get<layers::Moe>(m.blocks[1].ffn);
  const int64_t N = 19, D = moe.config.d_model;
  Rng r(24);
  std::vector<float> x(size_t(N * D)), y_train(size_t(N * D)), y(size_t(N * D));
  for (float& v : x) v = r.normal();
  layers::Moe::Saved sv;
  layers::forward_train(moe, layers::TrainShape{1, N}, x.data(), y_train.data(), sv);
  layers::Step step;
  step.add(0, 0, std::vector<int32_t>(size_t(N), 0));
  const layers::Options options{.bf16_dot = false};
  layers::Moe::Buffers buf;
  layers::forward(moe, layers::Call{step, options}, x.data(), y.data(), buf, {});
  EXPECT_EQ(sv.ids, buf.ids);
  const double err = test::rel_rms(y_train.data(), y.data(), N * D);
  std::cout << "[ measured ] " << GetParam().name << ": training vs inference forward " << err << " relative RMS\n";
  EXPECT_LE(err, 1e-6);
}

// The whole model: every parameter tensor's gradient against a directional difference of the loss
// (within 3 %, as train_delta_test.cpp), the router bias's difference ≈ 0 and its gradient exactly 0.
TEST_P(TrainMoeFd, ModelGradientsMatchFiniteDifferences) {
  model::Model m = tiny_kimi(GetParam().config, 3);
  EXPECT_EQ(train::untrainable_reason(m), "");
  train::Backprop bp(m);
  const int64_t B = 2, T = 13;
  const std::vector<int32_t> tokens = random_tokens(B * (T + 1), kVocab, 4);
  const float scale = 1.0f / float(B * T);
  bp.step(tokens, B, T, scale);
  std::vector<train::ParamRef> params = bp.params();
  double worst = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const train::ParamRef& p = params[i];
    Rng r(100 + i);
    std::vector<float> d(static_cast<size_t>(p.n)), keep(p.value, p.value + p.n);
    double gd = 0, dd = 0;
    for (int64_t j = 0; j < p.n; ++j) {
      const double dj = d[size_t(j)] = r.normal();
      gd += double(p.grad[j]) * dj, dd += dj * dj;
    }
    const double eps = 3e-4 / std::sqrt(dd / double(p.n));
    const double fd = directional_fd([&](double s) {
      for (int64_t j = 0; j < p.n; ++j) p.value[j] = float(keep[size_t(j)] + s * d[size_t(j)]);
      bp.refresh();
      const double l = bp.step(tokens, B, T, scale, false);
      std::copy(keep.begin(), keep.end(), p.value);
      return l;
    }, eps, [](double fd1, double fd2) { return std::fabs(fd1 - fd2) > 2e-2 * std::fabs(fd1) + 1e-3; });
    if (p.name.ends_with("e_score_correction_bias")) {
      EXPECT_EQ(gd, 0.0) << p.name;
    }
    EXPECT_NEAR(fd, gd, 3e-2 * std::fabs(gd) + 2e-4) << p.name;
    worst = std::max(worst, std::fabs(fd - gd) / (std::fabs(gd) + 2e-4));
  }
  bp.refresh();
  std::cout << "[ measured ] " << GetParam().name << ": model gradients vs finite differences, worst relative error "
            << worst << " over " << params.size() << " tensors\n";
}

INSTANTIATE_TEST_SUITE_P(Moe, TrainMoeFd, ::testing::ValuesIn(kCases), [](const auto& info) { return info.param.name; });

TEST(TrainMoe, GradientsDoNotDependOnTheThreadCount) {
  test::expect_thread_count_invariant([] { return tiny_kimi(kCases[2].config, 7); }, kVocab);
}

// A sequence that repeats with period 7 is learnable by the 2-layer KDA + MoE model: the held-out
// loss (the same cycle at other offsets) must fall far below uniform guessing.
TEST(TrainMoe, LossFallsOnARepeatingSequence) {
  for (const MoeCase& mc : {kCases[0], kCases[2]}) {
    model::Model m = tiny_kimi(mc.config, 9);
    const test::HeldOut h = test::train_on_a_cycle(m, kVocab);
    std::cout << "[ measured ] " << mc.name << ": held-out loss " << h.before << " -> " << h.after << "\n";
    EXPECT_GT(h.before, 2.5) << mc.name;
    EXPECT_LT(h.after, 0.3) << mc.name << ": held-out loss before training " << h.before;
  }
}

}  // namespace
}  // namespace train_moe_test
}  // namespace lineage
