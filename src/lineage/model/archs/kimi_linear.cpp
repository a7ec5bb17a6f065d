// Kimi Linear checkpoints as published (KimiLinearForCausalLM, model_type "kimi_linear",
// moonshotai/Kimi-Linear-48B-A3B): a hybrid stack of KDA layers and MLA layers named by one-based
// lists in linear_attn_config, a dense SwiGLU MLP in the first layers and a Mixture-of-Experts in
// the others, plain pre-norm residuals, untied head. Kimi's own tensor names bind through the
// table here; nothing outside this file knows them.
// Spec: shared/spec/attention-mla-moe-attnres.md §2, §3, §7; linear-attention-family.md §5B;
// reference/kimi_linear.py.
#include <algorithm>
#include <set>

#include "lineage/core/error.h"
#include "lineage/model/archs/arch.h"

namespace lineage::model {

namespace {

using layers::DeltaRule;

// A count that may be 0 (num_shared_experts, first_k_dense_replace): `fallback` when null or absent.
int64_t count(const ConfigFields& c, const std::string& key, int64_t fallback, int64_t max) {
  if (c.has(key) && c.json()[key].is_number() && c.json()[key].get<double>() == 0) return 0;
  return c.integer(key, fallback, max);
}

// A one-based list of layer numbers in [1, L], each once.
std::vector<int64_t> layer_list(const ConfigFields& c, const std::string& key, int64_t L) {
  const std::string want = cat("a list of distinct one-based layer numbers in [1, ", L, "] (num_hidden_layers)");
  if (!c.has(key) || !c.json()[key].is_array()) c.fail(key, want);
  std::vector<int64_t> v;
  for (const auto& x : c.json()[key]) {
    if (!x.is_number_integer() || x.get<int64_t>() < 1 || x.get<int64_t>() > L) c.fail(key, want);
    if (std::find(v.begin(), v.end(), x.get<int64_t>()) != v.end()) c.fail(key, want);
    v.push_back(x.get<int64_t>());
  }
  return v;
}

DeltaRule kda_layer(const ConfigFields& lac, int64_t D, float eps) {
  DeltaRule d;
  DeltaRule::Config& x = d.config;
  x.kind = "Kimi Delta Attention";
  x.d_model = D;
  x.n_heads = x.n_kv_heads = x.n_v_heads = lac.integer("num_heads", limits::kHeads);
  x.head_k = x.head_v = lac.integer("head_dim", limits::kWidth);
  x.conv_size = lac.integer("short_conv_kernel_size", 4, limits::kConvSize);
  x.qk_conv_silu = true;
  x.q_norm = x.k_norm = DeltaRule::QkNorm::L2;
  x.decay = DeltaRule::DecayInput::PerChannelLowRank;
  x.out_gate = DeltaRule::OutGate::SigmoidLowRank;
  x.norm_eps = eps;  // o_norm: FusedRMSNormGated(head_dim, eps=rms_norm_eps)
  d.g_b_has_bias = false;
  return d;
}

layers::Mla mla_layer(const ConfigFields& c, int64_t D) {
  layers::Mla a;
  layers::Mla::Config& x = a.config;
  x.d_model = D;
  x.n_heads = c.integer("num_attention_heads", limits::kHeads);
  if (c.has("num_key_value_heads") && c.integer("num_key_value_heads", limits::kHeads) != x.n_heads)
    c.fail("num_key_value_heads", cat(x.n_heads, " (num_attention_heads: MLA has no grouped keys)"));
  if (c.has("q_lora_rank"))
    c.fail("q_lora_rank", "null (Kimi Linear's MLA has a single q_proj; q-LoRA is K3's)");
  x.kv_lora_rank = c.integer("kv_lora_rank", limits::kWidth);
  x.d_nope = c.integer("qk_nope_head_dim", limits::kWidth);
  x.d_rope = count(c, "qk_rope_head_dim", 0, limits::kWidth);
  x.d_v = c.integer("v_head_dim", limits::kWidth);
  if (x.kv_lora_rank > kernels::kLatentMaxValue)
    c.fail("kv_lora_rank", cat("at most ", kernels::kLatentMaxValue, " (the latent attention kernel's width)"));
  // mla_use_nope false: lineage runs DeepSeek-V3's interleaved rotation on the d_rope slot (Kimi's
  // released code asserts NoPE; this is the textbook MLA as a configuration).
  x.rope = !c.boolean("mla_use_nope", false);
  if (x.rope) {
    if (x.d_rope % 2) c.fail("qk_rope_head_dim", "an even width (RoPE turns pairs)");
    if (c.has("rope_scaling")) c.fail("rope_scaling", "null (YaRN scaling is not supported)");
    x.rope_theta = c.positive("rope_theta", 10000.0, 1e12);
  }
  x.output_gate = c.boolean("mla_use_output_gate", false);
  const layers::Norm a_norm{layers::Norm::Kind::Rms, x.kv_lora_rank, x.a_norm_eps, {}, {}};
  a.weights.kv_a_norm = a_norm;
  return a;
}

}  // namespace

Model build_kimi_linear(const ArchInput& in) {
  const ConfigFields& c = in.config;
  Model m;
  const int64_t V = c.integer("vocab_size", limits::kVocab), D = c.integer("hidden_size", limits::kWidth);
  const int64_t L = c.integer("num_hidden_layers", limits::kLayers);
  const float eps = float(c.positive("rms_norm_eps", 1e-5, 1.0));
  // SwiGLU (Kimi Linear) or K3's SiTU-GLU with its two config scalars (a null linear beta: up uncapped).
  const std::string act = c.string("hidden_act", "silu");
  if (act != "silu" && act != "situ") c.fail("hidden_act", "\"silu\" or \"situ\" (Kimi's MLPs and experts are gated)");
  const layers::GatedMlp::Act mlp_act = act == "situ" ? layers::GatedMlp::Act::Situ : layers::GatedMlp::Act::Silu;
  const float situ_beta = float(c.positive("activation_situ_beta", 4.0, 1e6));
  const float situ_linear_beta = act == "situ" && c.json().contains("activation_situ_linear_beta") &&
                                         c.json()["activation_situ_linear_beta"].is_null()
                                     ? 0.0f
                                     : float(c.positive("activation_situ_linear_beta", 25.0, 1e6));
  if (c.has("attnres_block_size") || c.has("attn_res"))
    c.fail(c.has("attn_res") ? "attn_res" : "attnres_block_size", "null (attention residuals come with Kimi K3)");
  if (c.has("num_nextn_predict_layers") && count(c, "num_nextn_predict_layers", 0, 16) != 0)
    c.fail("num_nextn_predict_layers", "0 (multi-token prediction layers are not supported)");

  // Which layers are KDA and which MLA: one-based lists, every layer in exactly one.
  if (!c.json().contains("linear_attn_config") || !c.json()["linear_attn_config"].is_object())
    c.fail("linear_attn_config", "an object with kda_layers, full_attn_layers, num_heads, head_dim");
  const ConfigFields lac(c.json()["linear_attn_config"], c.file() + ", linear_attn_config");
  const std::vector<int64_t> kda = layer_list(lac, "kda_layers", L), full = layer_list(lac, "full_attn_layers", L);
  std::vector<char> is_kda(size_t(L), 0), is_mla(size_t(L), 0);
  for (const int64_t i : kda) is_kda[size_t(i - 1)] = 1;
  for (const int64_t i : full) {
    if (is_kda[size_t(i - 1)]) lac.fail("full_attn_layers", cat("no layer also in kda_layers (layer ", i, " is in both)"));
    is_mla[size_t(i - 1)] = 1;
  }
  for (int64_t i = 0; i < L; ++i)
    if (!is_kda[size_t(i)] && !is_mla[size_t(i)])
      lac.fail("kda_layers", cat("every layer of 1 .. ", L, " in kda_layers or full_attn_layers (layer ", i + 1,
                                 " is in neither)"));

  // The MLPs: dense below first_k_dense_replace and off the moe_layer_freq beat, else MoE.
  const int64_t dense_width = c.integer("intermediate_size", limits::kWidth);
  const int64_t E = count(c, "num_experts", 0, limits::kWidth);
  layers::Moe::Config moe;
  int64_t first_dense = 0, freq = 1;
  if (E > 0) {
    moe.d_model = D;
    moe.n_experts = E;
    moe.top_k = c.integer("num_experts_per_token", limits::kWidth);
    if (moe.top_k > E) c.fail("num_experts_per_token", cat("at most num_experts = ", E));
    moe.hidden = c.integer("moe_intermediate_size", limits::kWidth);
    moe.shared_hidden = moe.hidden * count(c, "num_shared_experts", 0, 1024);
    if (c.string("moe_router_activation_func", "sigmoid") != "sigmoid")
      c.fail("moe_router_activation_func", "\"sigmoid\" (softmax routing is not supported)");
    moe.renormalize = c.boolean("moe_renormalize", true);
    moe.scaling = c.positive("routed_scaling_factor", 1.0, 1e6);
    moe.bias_in_weights = c.boolean("router_bias_in_weights", false);
    moe.act = mlp_act, moe.situ_beta = situ_beta, moe.situ_linear_beta = situ_linear_beta;
    if (c.boolean("use_grouped_topk", true)) {
      moe.n_group = c.integer("num_expert_group", 1, E);
      moe.topk_group = c.integer("topk_group", 1, moe.n_group);
    }
    if (E % moe.n_group) c.fail("num_expert_group", cat("a divisor of num_experts = ", E));
    if (moe.topk_group * (E / moe.n_group) < moe.top_k)
      c.fail("topk_group", cat("enough groups for num_experts_per_token = ", moe.top_k, " experts"));
    first_dense = count(c, "first_k_dense_replace", 0, L);
    freq = c.integer("moe_layer_freq", 1, L);
  }
  const auto is_moe = [&](int64_t i) { return E > 0 && i >= first_dense && i % freq == 0; };

  m.config.model_type = "kimi_linear";
  m.config.vocab_size = V;
  m.config.d_model = D;
  // NoPE MLA and KDA have no position limit of their own; model_max_length is the trained one.
  m.config.max_positions = c.integer("model_max_length", 0, limits::kPositions);
  m.config.max_positions_field = "model_max_length";
  m.config.layers_field = "num_hidden_layers";
  m.config.tied_lm_head = c.boolean("tie_word_embeddings", false);
  m.config.bos_token_id = c.token_id("bos_token_id", V, std::nullopt);
  m.config.eos_token_id = c.token_id("eos_token_id", V, std::nullopt);
  m.names = {"model.embed_tokens.weight", "", "model.layers.", "model.norm", "lm_head.weight"};
  if (m.config.tied_lm_head) m.binding.ignore_suffixes.push_back("lm_head.weight");
  m.binding.squeeze.push_back(".A_log");  // stored [1, 1, H, 1]
  // KDA's low-rank pairs under Kimi's names (fla's f_proj.0 is Kimi's f_a_proj, ...).
  for (const auto& [fla, kimi] : {std::pair{"f_proj.0", "f_a_proj"}, {"f_proj.1", "f_b_proj"},
                                  {"g_proj.0", "g_a_proj"}, {"g_proj.1", "g_b_proj"}})
    m.binding.renames.push_back({std::string(".") + fla + ".weight", std::string(".") + kimi + ".weight"});
  const layers::Norm rms{layers::Norm::Kind::Rms, D, eps, {}, {}};
  m.final_norm = rms;

  int64_t n_moe = 0;
  for (int64_t i = 0; i < L; ++i) {
    Block b;
    b.norm1 = b.norm2 = rms;
    if (is_kda[size_t(i)]) b.mixer = kda_layer(lac, D, eps);
    else b.mixer = mla_layer(c, D);
    if (is_moe(i)) {
      layers::Moe e;
      e.config = moe;
      e.expert_names = {"w1", "w3", "w2"};  // block_sparse_moe.experts.{e}.w1 (gate) / w3 (up) / w2 (down)
      b.ffn = std::move(e);
      ++n_moe;
    } else {
      layers::GatedMlp mlp;
      mlp.config = {D, dense_width, mlp_act, situ_beta, situ_linear_beta};
      b.ffn = std::move(mlp);
    }
    b.names = {"input_layernorm", "self_attn", "post_attention_layernorm", is_moe(i) ? "block_sparse_moe" : "mlp"};
    m.blocks.push_back(std::move(b));
  }

  // The expert count against the checkpoint's tensors (a preset has none to check).
  for (int64_t i = 0; i < L && in.has_tensor(m.names.embed); ++i) {
    if (!is_moe(i)) continue;
    const std::string p = cat(m.names.layer_prefix, i, ".block_sparse_moe.experts.");
    if (!in.has_tensor(cat(p, E - 1, ".w1.weight")) || in.has_tensor(cat(p, E, ".w1.weight"))) {
      int64_t held = 0;
      while (in.has_tensor(cat(p, held, ".w1.weight"))) ++held;
      c.fail("num_experts", cat(held, " (the checkpoint's layer ", i, " holds experts 0 .. ", held - 1, ")"));
    }
    break;
  }

  m.config.description = cat("Kimi Linear: ", L, " layers (", kda.size(), " KDA, ", full.size(), " MLA), d_model ", D,
                             E ? cat(", MoE ", E, " x ", moe.hidden, " top-", moe.top_k, " in ", n_moe, " layers")
                               : std::string(", dense MLP"));
  return m;
}

}  // namespace lineage::model
