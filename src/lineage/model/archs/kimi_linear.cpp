// Kimi Linear and Kimi K3 checkpoints as published: a hybrid stack of KDA layers and MLA layers named
// by one-based lists in linear_attn_config, a dense gated MLP in the first layers and a
// Mixture-of-Experts in the others, untied head.
//   Kimi Linear (KimiLinearForCausalLM, model_type "kimi_linear", moonshotai/Kimi-Linear-48B-A3B):
//   softplus KDA gate with low-rank output gate, MLA with one q_proj and no gate, SwiGLU, plain
//   pre-norm residuals.
//   Kimi K3 (KimiK3ForConditionalGeneration, model_type "kimi_k3", its text model in text_config and
//   its tensors under "language_model."; or the text-only KimiLinearForCausalLM layout carrying K3's
//   fields): the lower-bounded KDA gate with a full-rank output gate, gated MLA with q-LoRA, SiTU,
//   Stable LatentMoE (experts in routed_expert_hidden_size), MXFP4 experts where the checkpoint holds
//   them packed, Block Attention Residuals; the vision tower and projector are skipped (counted by
//   `info`).
// Kimi's own tensor names bind through the table here; nothing outside this file knows them.
// Spec: shared/spec/attention-mla-moe-attnres.md §2–§9; linear-attention-family.md §5;
// reference/kimi_linear.py, reference/kimi_k3.py.
#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/archs/gguf_map.h"

namespace lineage::model {

namespace {

using layers::DeltaRule;

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

// What one build reads besides the text config: the checkpoint's tensors (none for a preset or a
// config alone), the prefix of the text model's tensors, and whether K3's conventions apply.
struct Source {
  const ArchInput& in;
  std::string prefix;  // "language_model." in K3's published layout
  bool k3 = false;     // K3: groups masked with −inf, A_log stored [head_dim]
  bool has(const std::string& name) const { return in.has_tensor(prefix + name); }
  bool checkpoint() const { return has("model.embed_tokens.weight"); }
};

DeltaRule kda_layer(const ConfigFields& lac, const Source& src, int64_t i, int64_t D, float eps) {
  DeltaRule d;
  DeltaRule::Config& x = d.config;
  x.kind = "Kimi Delta Attention";
  x.d_model = D;
  x.n_heads = x.n_kv_heads = x.n_v_heads = lac.integer("num_heads", limits::kHeads);
  x.head_k = x.head_v = lac.integer("head_dim", limits::kWidth);
  x.conv_size = lac.integer("short_conv_kernel_size", 4, limits::kConvSize);
  x.qk_conv_silu = true;
  x.q_norm = x.k_norm = DeltaRule::QkNorm::L2;
  // The decay's input: Kimi's low-rank f_a_proj / f_b_proj pair, or one f_proj where the checkpoint
  // holds it. K3: g = lb·σ(exp(A_log)·(f + dt_bias)) (gate_lower_bound); otherwise the softplus form.
  const std::string p = cat("model.layers.", i, ".self_attn.");
  x.decay = src.has(p + "f_proj.weight") ? DeltaRule::DecayInput::PerChannelProj : DeltaRule::DecayInput::PerChannelLowRank;
  x.gate_lower_bound = float(lac.negative("gate_lower_bound", 0.0, -1e6));
  // use_full_rank_gate: K3's output gate is one g_proj [H·d, D]; Kimi Linear's the g_a / g_b pair.
  x.out_gate = lac.boolean("use_full_rank_gate", false) ? DeltaRule::OutGate::Sigmoid : DeltaRule::OutGate::SigmoidLowRank;
  x.norm_eps = eps;  // o_norm: FusedRMSNormGated(head_dim, eps=rms_norm_eps)
  // A_log as stored: K3 keeps [head_dim] (the first num_heads used), Kimi Linear [1, 1, H, 1].
  const Shape a_log = src.in.tensor_shape(src.prefix + p + "A_log");
  x.a_log_len = !a_log.empty() ? shape_numel(a_log) : src.k3 ? std::max(x.head_k, x.n_heads) : x.n_heads;
  if (x.a_log_len < x.n_heads)
    throw Error(cat(src.prefix, p, "A_log: ", x.a_log_len, " values, expected at least num_heads = ", x.n_heads));
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
  x.q_lora_rank = c.has("q_lora_rank") ? c.integer("q_lora_rank", limits::kWidth) : 0;  // K3: q_a → norm → q_b
  x.kv_lora_rank = c.integer("kv_lora_rank", limits::kWidth);
  x.d_nope = c.integer("qk_nope_head_dim", limits::kWidth);
  x.d_rope = c.count("qk_rope_head_dim", 0, limits::kWidth);
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
  x.output_gate = c.boolean("mla_use_output_gate", false);  // K3's gated MLA: σ(g_proj x) before o_proj
  const layers::Norm a_norm{layers::Norm::Kind::Rms, x.kv_lora_rank, x.a_norm_eps, {}, {}};
  a.weights.kv_a_norm = a_norm;
  a.weights.q_a_norm = {layers::Norm::Kind::Rms, x.q_lora_rank, x.a_norm_eps, {}, {}};
  return a;
}

// Marks `m` (named `name`, "….weight") as an MXFP4 pair where the checkpoint holds it packed, or
// without a checkpoint where `config_packed` says so (layers::visit_matrix checks its rows are
// whole 32-value blocks).
void mark_packed(kernels::Matrix& m, const std::string& name, const Source& src, bool config_packed) {
  m.packed = src.checkpoint() ? src.has(name + "_packed") : config_packed;
}

void mark_mlp(layers::GatedMlp& g, const std::string& name, const Source& src, bool cfg) {
  for (auto [m, part] : {std::pair{&g.weights.gate_proj, &g.names.gate}, {&g.weights.up_proj, &g.names.up},
                         {&g.weights.down_proj, &g.names.down}})
    mark_packed(*m, name + "." + *part + ".weight", src, cfg);
}

// The vision tower and projector of K3's published checkpoint (MoonViT + patchmergerv2), counted
// from vision_config: the patch embedding, a learned position table, the encoder blocks (two
// RMSNorms, wqkv [3Q, D], wo [D, Q], fc0 [I, D], fc1 [D, I]), the final norm; the projector's two
// linears and post-norm. No biases. 447,358,976 for Kimi K3's (spec §8.1).
int64_t vision_params(const ConfigFields& v) {
  const int64_t D = v.integer("vt_hidden_size", limits::kWidth), I = v.integer("vt_intermediate_size", limits::kWidth);
  const int64_t L = v.integer("vt_num_hidden_layers", limits::kLayers), Q = v.integer("qkv_hidden_size", D, limits::kWidth);
  const int64_t p = v.integer("patch_size", 14, 1024);
  const int64_t Hp = v.integer("init_pos_emb_height", 64, 1 << 14), Wp = v.integer("init_pos_emb_width", 64, 1 << 14);
  const int64_t C = v.integer("text_hidden_size", limits::kWidth), mm = v.integer("mm_hidden_size", D, limits::kWidth);
  int64_t merge = 4;  // patches merged into one projector input: kh · kw
  if (v.has("merge_kernel_size")) {
    const auto& k = v.json()["merge_kernel_size"];
    const auto side = [&](size_t i) { return k[i].is_number_integer() && k[i].get<int64_t>() >= 1 && k[i].get<int64_t>() <= 64; };
    if (!k.is_array() || k.size() != 2 || !side(0) || !side(1))
      v.fail("merge_kernel_size", "two integers in [1, 64] (the patches merged per projector input)");
    merge = k[0].get<int64_t>() * k[1].get<int64_t>();
  }
  const int64_t M = mm * merge;
  const int64_t tower = 3 * p * p * D + Hp * Wp * D + L * (2 * D + 4 * Q * D + 2 * I * D) + D;
  return tower + M * M + M * C + C;
}

Model build_kimi(const ConfigFields& c, const Source& src) {
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
  if (c.has("num_nextn_predict_layers") && c.count("num_nextn_predict_layers", 0, 16) != 0)
    c.fail("num_nextn_predict_layers", "0 (multi-token prediction layers are not supported)");
  // MXFP4 as compressed-tensors packs it; which matrices are packed comes from the tensors present
  // (the config's ignore list disagrees with real files), from the config only without them.
  bool config_mxfp4 = false;
  if (c.has("quantization_config")) {
    const ConfigFields q(c.json()["quantization_config"], c.file() + ", quantization_config");
    config_mxfp4 = q.string("format", "") == "mxfp4-pack-quantized";  // any other: model/quantization.h
    m.config.family_packs_mxfp4 = config_mxfp4;
  }

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
  // The lists against the tensors: `self_attn.g_proj` is either kind's gate, so the kinds are told
  // apart by tensors only one of them has.
  for (int64_t i = 0; i < L && src.checkpoint(); ++i) {
    const std::string p = cat("model.layers.", i, ".self_attn.");
    const bool kda_tensors = src.has(p + "A_log"), mla_tensors = src.has(p + "kv_a_proj_with_mqa.weight");
    if (is_kda[size_t(i)] && !kda_tensors && mla_tensors)
      lac.fail("kda_layers", cat("the layers the checkpoint holds as KDA (layer ", i + 1, " (one-based) has MLA tensors: ",
                                 src.prefix, p, "kv_a_proj_with_mqa.weight)"));
    if (is_mla[size_t(i)] && !mla_tensors && kda_tensors)
      lac.fail("full_attn_layers", cat("the layers the checkpoint holds as MLA (layer ", i + 1,
                                       " (one-based) has KDA tensors: ", src.prefix, p, "A_log)"));
  }

  // The MLPs: dense below first_k_dense_replace and off the moe_layer_freq beat, else MoE.
  const int64_t dense_width = c.integer("intermediate_size", limits::kWidth);
  const int64_t E = c.count("num_experts", 0, limits::kWidth);
  layers::Moe::Config moe;
  int64_t first_dense = 0, freq = 1;
  if (E > 0) {
    moe.d_model = D;
    moe.n_experts = E;
    moe.top_k = c.integer("num_experts_per_token", limits::kWidth);
    if (moe.top_k > E) c.fail("num_experts_per_token", cat("at most num_experts = ", E));
    moe.hidden = c.integer("moe_intermediate_size", limits::kWidth);
    moe.shared_hidden = moe.hidden * c.count("num_shared_experts", 0, 1024);
    if (c.string("moe_router_activation_func", "sigmoid") != "sigmoid")
      c.fail("moe_router_activation_func", "\"sigmoid\" (softmax routing is not supported)");
    moe.renormalize = c.boolean("moe_renormalize", true);
    moe.scaling = c.positive("routed_scaling_factor", 1.0, 1e6);
    moe.bias_in_weights = c.boolean("router_bias_in_weights", false);
    moe.mask_neg_inf = src.k3;
    moe.act = mlp_act, moe.situ_beta = situ_beta, moe.situ_linear_beta = situ_linear_beta;
    // K3's Stable LatentMoE: experts in routed_expert_hidden_size, their sum RMSNormed (rms_norm_eps).
    moe.latent = c.has("routed_expert_hidden_size") ? c.integer("routed_expert_hidden_size", limits::kWidth) : 0;
    moe.latent_norm = moe.latent > 0 && c.boolean("latent_moe_use_norm", false);
    moe.latent_eps = eps;
    if (c.boolean("use_grouped_topk", true)) {
      moe.n_group = c.integer("num_expert_group", 1, E);
      moe.topk_group = c.integer("topk_group", 1, moe.n_group);
    }
    if (E % moe.n_group) c.fail("num_expert_group", cat("a divisor of num_experts = ", E));
    if (moe.topk_group * (E / moe.n_group) < moe.top_k)
      c.fail("topk_group", cat("enough groups for num_experts_per_token = ", moe.top_k, " experts"));
    first_dense = c.count("first_k_dense_replace", 0, L);
    freq = c.integer("moe_layer_freq", 1, L);
  }
  const auto is_moe = [&](int64_t i) { return E > 0 && i >= first_dense && i % freq == 0; };

  m.config.model_type = src.k3 && !src.prefix.empty() ? "kimi_k3" : "kimi_linear";
  m.config.vocab_size = V;
  m.config.d_model = D;
  // NoPE MLA and KDA have no position limit of their own; model_max_length (Kimi Linear) or
  // max_position_embeddings (K3) is the trained one.
  m.config.max_positions_field = c.has("model_max_length") ? "model_max_length" : "max_position_embeddings";
  m.config.max_positions = c.integer(m.config.max_positions_field, 0, limits::kPositions);
  m.config.layers_field = src.prefix.empty() ? "num_hidden_layers" : "text_config.num_hidden_layers";
  m.config.tied_lm_head = c.boolean("tie_word_embeddings", false);
  m.config.bos_token_id = c.token_id("bos_token_id", V, std::nullopt);
  m.config.eos_token_id = c.token_id("eos_token_id", V, std::nullopt);
  const std::string& P = src.prefix;
  m.names = {P + "model.embed_tokens.weight", "", P + "model.layers.", P + "model.norm", P + "lm_head.weight"};
  if (m.config.tied_lm_head) m.binding.ignore_suffixes.push_back("lm_head.weight");
  m.binding.squeeze.push_back(".A_log");  // Kimi Linear stores [1, 1, H, 1]
  if (!src.k3) m.binding.unsqueeze_on_save.push_back({".A_log", 2, 1});  // and so do checkpoints lineage writes
  // KDA's low-rank pairs under Kimi's names (fla's f_proj.0 is Kimi's f_a_proj, ...).
  for (const auto& [fla, kimi] : {std::pair{"f_proj.0", "f_a_proj"}, {"f_proj.1", "f_b_proj"},
                                  {"g_proj.0", "g_a_proj"}, {"g_proj.1", "g_b_proj"}})
    m.binding.renames.push_back({std::string(".") + fla + ".weight", std::string(".") + kimi + ".weight"});
  const layers::Norm rms{layers::Norm::Kind::Rms, D, eps, {}, {}};
  m.final_norm = rms;

  // Block Attention Residuals: blocks of attn_res_block_size decoder layers (K3's unit).
  const int64_t attn_res = c.has("attn_res_block_size") ? c.integer("attn_res_block_size", L) : 0;
  const layers::AttnRes mix{D, eps, {}, {}, {}};
  if (attn_res) {
    m.config.residual = ResidualKind::BlockAttention;
    m.config.attn_res_block = 2 * attn_res;  // in sublayers
    m.output_res = mix;
    m.names.output_res_norm = P + "model.output_attn_res_norm";
    m.names.output_res_proj = P + "model.output_attn_res_proj";
  }

  int64_t n_moe = 0;
  for (int64_t i = 0; i < L; ++i) {
    Block b;
    b.norm1 = b.norm2 = rms;
    if (is_kda[size_t(i)]) b.mixer = kda_layer(lac, src, i, D, eps);
    else b.mixer = mla_layer(c, D);
    const std::string ffn = is_moe(i) ? "block_sparse_moe" : "mlp";
    const std::string fp = cat("model.layers.", i, ".", ffn);
    if (is_moe(i)) {
      layers::Moe e;
      e.config = moe;
      e.expert_names = {"w1", "w3", "w2"};  // block_sparse_moe.experts.{e}.w1 (gate) / w3 (up) / w2 (down)
      // MXFP4: the routed experts as the config's quantization says (the published K3); the shared
      // experts and latent projections too where a checkpoint holds them packed.
      e.weights.experts.resize(size_t(E));
      for (int64_t j = 0; j < E; ++j) {
        layers::GatedMlp& g = e.weights.experts[size_t(j)];
        g.names = e.expert_names;
        mark_mlp(g, cat(fp, ".experts.", j), src, config_mxfp4);
      }
      if (moe.shared_hidden > 0) mark_mlp(e.weights.shared, fp + ".shared_experts", src, false);
      if (moe.latent > 0) {
        mark_packed(e.weights.latent_down, fp + ".routed_expert_down_proj.weight", src, false);
        mark_packed(e.weights.latent_up, fp + ".routed_expert_up_proj.weight", src, false);
      }
      b.ffn = std::move(e);
      ++n_moe;
    } else {
      layers::GatedMlp mlp;
      mlp.config = {D, dense_width, mlp_act, situ_beta, situ_linear_beta};
      mark_mlp(mlp, fp, src, false);
      b.ffn = std::move(mlp);
    }
    b.names = {"input_layernorm", "self_attn", "post_attention_layernorm", ffn, "", "", "", ""};
    if (attn_res) {
      b.attn_res = b.mlp_res = mix;
      b.names.attn_res_norm = "self_attention_res_norm", b.names.attn_res_proj = "self_attention_res_proj";
      b.names.mlp_res_norm = "mlp_res_norm", b.names.mlp_res_proj = "mlp_res_proj";
    }
    m.blocks.push_back(std::move(b));
  }

  // The expert count against the checkpoint's tensors (a preset has none to check).
  for (int64_t i = 0; i < L && src.checkpoint(); ++i) {
    if (!is_moe(i)) continue;
    const std::string p = cat("model.layers.", i, ".block_sparse_moe.experts.");
    const auto held_expert = [&](int64_t j) {
      return src.has(cat(p, j, ".w1.weight")) || src.has(cat(p, j, ".w1.weight_packed"));
    };
    if (!held_expert(E - 1) || held_expert(E)) {
      int64_t held = 0;
      while (held_expert(held)) ++held;
      c.fail("num_experts", cat(held, " (the checkpoint's layer ", i, " holds experts 0 .. ", held - 1, ")"));
    }
    break;
  }

  const std::string what = src.k3 ? "Kimi K3" : "Kimi Linear";
  m.config.description =
      cat(what, ": ", L, " layers (", kda.size(), " KDA, ", full.size(), " MLA), d_model ", D,
          E ? cat(moe.latent ? ", latent MoE " : ", MoE ", E, " x ", moe.hidden, " top-", moe.top_k, " in ", n_moe, " layers")
            : std::string(", dense MLP"),
          attn_res ? cat(", AttnRes blocks of ", attn_res, " layers") : std::string());
  return m;
}

// K3's fields in a kimi_linear text config (the text-only layout of a K3 checkpoint).
bool has_k3_fields(const ConfigFields& c) {
  bool k3 = c.has("attn_res_block_size") || c.has("routed_expert_hidden_size") || c.has("q_lora_rank") ||
            c.boolean("mla_use_output_gate", false);
  if (c.json().contains("linear_attn_config") && c.json()["linear_attn_config"].is_object()) {
    const auto& l = c.json()["linear_attn_config"];
    k3 = k3 || (l.contains("gate_lower_bound") && !l["gate_lower_bound"].is_null()) ||
         (l.contains("use_full_rank_gate") && l["use_full_rank_gate"] == true);
  }
  return k3;
}

}  // namespace

Model build_kimi_linear(const ArchInput& in) {
  if (in.config.has("attnres_block_size"))
    in.config.fail("attnres_block_size", "null (Kimi checkpoints name it attn_res_block_size, in decoder layers)");
  return build_kimi(in.config, Source{in, "", has_k3_fields(in.config)});
}

Model build_kimi_k3(const ArchInput& in) {
  const ConfigFields& top = in.config;
  if (!top.json().contains("text_config") || !top.json()["text_config"].is_object())
    top.fail("text_config", "an object holding the text model's config (KimiK3ForConditionalGeneration)");
  const ConfigFields text(top.json()["text_config"], top.file() + ", text_config");
  Model m = build_kimi(text, Source{in, "language_model.", true});
  // The vision tower and projector: skipped, counted apart.
  m.binding.ignore_prefixes.push_back("vision_tower.");
  m.binding.ignore_prefixes.push_back("mm_projector.");
  if (top.json().contains("vision_config") && top.json()["vision_config"].is_object()) {
    m.config.extra_params = vision_params(ConfigFields(top.json()["vision_config"], top.file() + ", vision_config"));
    m.config.extra_params_label = "vision tower and projector (not run)";
  }
  return m;
}

// llama.cpp's `kimi-linear` (conversion/kimi_linear.py, src/models/kimi-linear.cpp). The converter
// writes the MLA as MQA over its latent (num_key_value_heads 1: head_count_kv is 1 on MLA layers, 0 on
// KDA ones, which is how the layer kinds are read back), A_log as −exp(A_log) (A_log = log(−a): −exp of
// it gives a back within an ulp), dt_bias as ssm_dt.bias, each short conv [C, 1, K] as [1, C, 1, K],
// kv_b_proj split per head into k_b (transposed) and v_b (put back together: a copy), and the
// experts stacked (each a view of its slice). llama.cpp sizes the KDA heads from attention.head_count,
// as Kimi-Linear's published config has them; lineage takes them from ssm_beta's rows (the same
// there, and right for a file whose KDA has fewer heads). The MLA takes no RoPE (mla_use_nope).
//
// llama.cpp's `kimi-k3` (conversion/kimi_k3.py, src/models/kimi-k3.cpp) adds to those: the text model only
// (K3's fields at the top level of a KimiLinearForCausalLM config, lineage's text-only K3 layout), q_a /
// q_a_norm / q_b, g_proj stored as ssm_g (KDA's full-rank gate) or attn_gate (MLA's output gate), the
// latent MoE's ffn_routed_down / up / norm, SiTU's two betas, the lower-bound gate, A_log's first
// num_attention_heads entries, and each AttnRes pair fused into one vector, norm ⊙ proj (attn_res_score,
// ffn_res_score, output_res_score): bound as the pseudo-query with a norm of ones, which lineage folds
// into the same vector (layers/attn_res.h). The routed experts of a published K3 are GGUF MXFP4 blocks.
GgufMapped gguf_kimi_linear(const GgufSource& in) {
  const bool k3 = in.arch == "kimi-k3";
  GgufMapped m;
  const std::string& f = in.file;
  const int64_t D = in.integer("embedding_length", limits::kWidth), L = in.integer("block_count", limits::kLayers);
  const int64_t H = in.integer("attention.head_count", limits::kHeads);
  const int64_t rope = in.integer("rope.dimension_count", limits::kWidth);
  const int64_t lora = in.integer("attention.kv_lora_rank", limits::kWidth);
  const int64_t k_mla = in.integer("attention.key_length_mla", limits::kWidth);
  const int64_t v_mla = in.integer("attention.value_length_mla", limits::kWidth);
  if (k_mla <= rope) in.fail(in.arch + ".attention.key_length_mla", cat("more than rope.dimension_count = ", rope));
  const int64_t nope = k_mla - rope;
  const auto has = [&](const std::string& t) { return in.tensors.count(t) > 0; };
  nlohmann::json full = nlohmann::json::array(), kda = nlohmann::json::array();
  int64_t kda_heads = H;  // llama.cpp's: attention.head_count; a file whose ssm_beta says otherwise, that
  for (int64_t l = 0; l < L; ++l) {
    const bool is_kda = has(cat("blk.", l, ".ssm_a"));
    (is_kda ? kda : full).push_back(l + 1);  // one-based
    const auto beta = in.tensors.find(cat("blk.", l, ".ssm_beta.weight"));
    if (is_kda && beta != in.tensors.end() && beta->second.size() == 2) kda_heads = beta->second[0];
  }
  const auto vocab = in.tensors.find("token_embd.weight");
  const int64_t E = in.integer("expert_count", 0, limits::kWidth);
  if (in.integer("expert_gating_func", 2, 3) != 2) in.fail(in.arch + ".expert_gating_func", "2 (sigmoid)");
  const auto weights_norm = in.metadata->find(in.arch + ".expert_weights_norm");
  if (weights_norm != in.metadata->end() && !weights_norm->is_boolean()) in.fail(in.arch + ".expert_weights_norm", "a boolean");
  m.config = {{"model_type", "kimi_linear"},
              {"hidden_size", D},
              {"num_hidden_layers", L},
              {"vocab_size", vocab != in.tensors.end() && vocab->second.size() == 2 ? vocab->second[0]
                                                                                        : in.integer("vocab_size", limits::kVocab)},
              {"model_max_length", in.integer("context_length", 4096, limits::kPositions)},
              {"num_attention_heads", H},
              {"num_key_value_heads", H},
              {"kv_lora_rank", lora},
              {"qk_nope_head_dim", nope},
              {"qk_rope_head_dim", rope},
              {"v_head_dim", v_mla},
              {"mla_use_nope", true},
              {"rope_theta", in.number("rope.freq_base", 1e4)},
              {"rms_norm_eps", in.number("attention.layer_norm_rms_epsilon", 1e-5)},
              {"hidden_act", "silu"},
              {"intermediate_size", in.integer("feed_forward_length", limits::kWidth)},
              {"tie_word_embeddings", !has("output.weight")},
              {"num_nextn_predict_layers", 0},
              {"linear_attn_config",
               {{"full_attn_layers", full},
                {"kda_layers", kda},
                {"num_heads", kda_heads},
                {"head_dim", in.integer("kda.head_dim", limits::kWidth)},
                {"short_conv_kernel_size", in.integer("ssm.conv_kernel", 4, limits::kConvSize)}}}};
  if (k3) {
    const auto any = [&](const char* suffix) {
      for (int64_t l = 0; l < L; ++l)
        if (has(cat("blk.", l, ".", suffix))) return true;
      return false;
    };
    m.config.erase("model_max_length");
    m.config["max_position_embeddings"] = in.integer("context_length", 4096, limits::kPositions);
    m.config["hidden_act"] = "situ";
    m.config["activation_situ_beta"] = in.number("activation.situ_beta", 0.0);
    if (!(m.config["activation_situ_beta"].get<double>() > 0)) in.fail(in.arch + ".activation.situ_beta", "a positive number");
    const double linear_beta = in.number("activation.situ_linear_beta", 0.0);  // llama.cpp: 0 leaves up uncapped
    m.config["activation_situ_linear_beta"] = linear_beta > 0 ? nlohmann::json(linear_beta) : nlohmann::json(nullptr);
    m.config["attn_res_block_size"] = in.integer("attn_res.block_size", limits::kLayers);
    if (in.has(in.arch + ".attention.q_lora_rank")) m.config["q_lora_rank"] = in.integer("attention.q_lora_rank", limits::kWidth);
    m.config["mla_use_output_gate"] = any("attn_gate.weight");
    m.config["linear_attn_config"]["use_full_rank_gate"] = any("ssm_g.weight");
    if (in.has(in.arch + ".kda.gate_lower_bound")) m.config["linear_attn_config"]["gate_lower_bound"] = in.number("kda.gate_lower_bound", 0.0);
    if (in.has(in.arch + ".expert_latent_length")) {
      m.config["routed_expert_hidden_size"] = in.integer("expert_latent_length", limits::kWidth);
      m.config["latent_moe_use_norm"] = any("ffn_routed_norm.weight");
    }
  }
  if (E > 0) {
    m.config["num_experts"] = E;
    m.config["num_experts_per_token"] = in.integer("expert_used_count", limits::kWidth);
    m.config["moe_intermediate_size"] = in.integer("expert_feed_forward_length", limits::kWidth);
    m.config["num_shared_experts"] = in.has(in.arch + ".expert_shared_count") ? in.integer("expert_shared_count", limits::kWidth) : 0;
    m.config["first_k_dense_replace"] = in.has(in.arch + ".leading_dense_block_count")
                                            ? in.integer("leading_dense_block_count", limits::kLayers) : 0;
    m.config["moe_layer_freq"] = 1;
    m.config["routed_scaling_factor"] = in.number("expert_weights_scale", 1.0);
    // Absent: llama.cpp's kimi-linear renormalizes, its kimi-k3 does not.
    m.config["moe_renormalize"] = weights_norm == in.metadata->end() ? !k3 : weights_norm->get<bool>();
    m.config["moe_router_activation_func"] = "sigmoid";
    m.config["use_grouped_topk"] = true;
    m.config["num_expert_group"] = in.integer("expert_group_count", 1, limits::kWidth);
    m.config["topk_group"] = in.integer("expert_group_used_count", 1, limits::kWidth);
  }

  auto& t = m.tensors;
  // A fused AttnRes score [D] as its pair: the norm's weight all ones, the pseudo-query [1, D] the score.
  const auto res = [&](const std::string& hf, const std::string& gguf) {
    t.push_back({hf + "_norm.weight", gguf, [](const Tensor& x) {
                   Tensor ones = Tensor::empty(DType::F32, {x.numel()});
                   for (int64_t i = 0; i < x.numel(); ++i) ones.data<float>()[i] = 1.0f;
                   return ones;
                 }});
    t.push_back({hf + "_proj.weight", gguf, [f, gguf](const Tensor& x) { return gguf_f32(x, f, gguf).reshaped({1, x.numel()}); }});
  };
  t.push_back({"model.embed_tokens.weight", "token_embd.weight", {}});
  t.push_back({"model.norm.weight", "output_norm.weight", {}});
  if (has("output.weight")) t.push_back({"lm_head.weight", "output.weight", {}});
  if (k3) res("model.output_attn_res", "output_res_score.weight");
  for (int64_t l = 0; l < L; ++l) {
    const std::string h = cat("model.layers.", l, "."), b = cat("blk.", l, "."), s = h + "self_attn.";
    t.push_back({h + "input_layernorm.weight", b + "attn_norm.weight", {}});
    t.push_back({h + "post_attention_layernorm.weight", b + "ffn_norm.weight", {}});
    if (k3) {
      res(h + "self_attention_res", b + "attn_res_score.weight");
      res(h + "mlp_res", b + "ffn_res_score.weight");
    }
    if (!has(b + "ssm_a")) {
      if (has(b + "attn_q_a.weight")) {
        t.push_back({s + "q_a_proj.weight", b + "attn_q_a.weight", {}});
        t.push_back({s + "q_a_layernorm.weight", b + "attn_q_a_norm.weight", {}});
        t.push_back({s + "q_b_proj.weight", b + "attn_q_b.weight", {}});
      } else {
        t.push_back({s + "q_proj.weight", b + "attn_q.weight", {}});
      }
      if (has(b + "attn_gate.weight")) t.push_back({s + "g_proj.weight", b + "attn_gate.weight", {}});
      t.push_back({s + "kv_a_proj_with_mqa.weight", b + "attn_kv_a_mqa.weight", {}});
      t.push_back({s + "kv_a_layernorm.weight", b + "attn_kv_a_norm.weight", {}});
      t.push_back({s + "o_proj.weight", b + "attn_output.weight", {}});
      // kv_b_proj [H·(nope + v), lora]: per head its k rows (attn_k_b [H, lora, nope], transposed back)
      // then its v rows (attn_v_b [H, v, lora]).
      const std::string kb = b + "attn_k_b.weight", vb = b + "attn_v_b.weight";
      t.push_back({s + "kv_b_proj.weight", kb, {}, vb, [=](const Tensor& k, const Tensor& v) {
                     if (k.shape() != Shape{H, lora, nope} || v.shape() != Shape{H, v_mla, lora} || k.dtype() != v.dtype())
                       throw Error(cat(f, ": tensors ", kb, " and ", vb, ": expected [", H, ", ", lora, ", ", nope, "] and [",
                                       H, ", ", v_mla, ", ", lora, "] (torch order) of one dtype"));
                     Tensor out = Tensor::empty(k.dtype(), {H * (nope + v_mla), lora});
                     const size_t e = dtype_size(k.dtype());
                     const auto* ks = static_cast<const uint8_t*>(k.raw());
                     const auto* vs = static_cast<const uint8_t*>(v.raw());
                     auto* o = static_cast<uint8_t*>(out.raw_mut());
                     for (int64_t hh = 0; hh < H; ++hh) {
                       uint8_t* head = o + size_t(hh * (nope + v_mla) * lora) * e;
                       for (int64_t i = 0; i < nope; ++i)
                         for (int64_t j = 0; j < lora; ++j)
                           std::memcpy(head + size_t(i * lora + j) * e, ks + size_t((hh * lora + j) * nope + i) * e, e);
                       std::memcpy(head + size_t(nope * lora) * e, vs + size_t(hh * v_mla * lora) * e, size_t(v_mla * lora) * e);
                     }
                     return out;
                   }});
    } else {
      for (const char* c : {"q", "k", "v"}) {
        t.push_back({cat(s, c, "_proj.weight"), cat(b, "attn_", c, ".weight"), {}});
        t.push_back({cat(s, c, "_conv1d.weight"), cat(b, "ssm_conv1d_", c, ".weight"),
                     [](const Tensor& x) { return x.reshaped({x.numel() / x.dim(-1), 1, x.dim(-1)}); }});
      }
      for (const auto& [hf, gg] : std::vector<std::pair<const char*, const char*>>{
               {"f_a_proj", "ssm_f_a"}, {"f_b_proj", "ssm_f_b"}, {"b_proj", "ssm_beta"}, {"o_norm", "ssm_norm"},
               {"o_proj", "attn_output"}})
        t.push_back({cat(s, hf, ".weight"), cat(b, gg, ".weight"), {}});
      if (has(b + "ssm_g.weight")) {  // K3's full-rank gate
        t.push_back({s + "g_proj.weight", b + "ssm_g.weight", {}});
      } else {
        t.push_back({s + "g_a_proj.weight", b + "ssm_g_a.weight", {}});
        t.push_back({s + "g_b_proj.weight", b + "ssm_g_b.weight", {}});
      }
      t.push_back({s + "dt_bias", b + "ssm_dt.bias", {}});
      const std::string name = b + "ssm_a";
      t.push_back({s + "A_log", name, [=](const Tensor& x) { return a_log_from_minus_exp(x, f, name); }});
    }
    if (!has(b + "ffn_gate_inp.weight")) {
      for (const char* p : {"gate", "up", "down"}) t.push_back({cat(h, "mlp.", p, "_proj.weight"), cat(b, "ffn_", p, ".weight"), {}});
      continue;
    }
    const std::string moe = h + "block_sparse_moe.";
    t.push_back({moe + "gate.weight", b + "ffn_gate_inp.weight", {}});
    t.push_back({moe + "gate.e_score_correction_bias", b + "exp_probs_b.bias", {}});
    for (int64_t e = 0; e < E; ++e)
      for (const auto& [w, p] : std::vector<std::pair<const char*, const char*>>{{"w1", "gate"}, {"w3", "up"}, {"w2", "down"}})
        t.push_back(gguf_expert(cat(moe, "experts.", e, ".", w, ".weight"), cat(b, "ffn_", p, "_exps.weight"), e));
    if (has(b + "ffn_gate_shexp.weight"))
      for (const char* p : {"gate", "up", "down"})
        t.push_back({cat(moe, "shared_experts.", p, "_proj.weight"), cat(b, "ffn_", p, "_shexp.weight"), {}});
    if (has(b + "ffn_routed_down.weight")) {  // K3's latent MoE
      t.push_back({moe + "routed_expert_down_proj.weight", b + "ffn_routed_down.weight", {}});
      t.push_back({moe + "routed_expert_up_proj.weight", b + "ffn_routed_up.weight", {}});
      if (has(b + "ffn_routed_norm.weight")) t.push_back({moe + "routed_expert_norm.weight", b + "ffn_routed_norm.weight", {}});
    }
  }
  return m;
}

}  // namespace lineage::model
