// Qwen3-Next and Qwen3.5 checkpoints as published: hybrids of Gated DeltaNet layers and gated
// softmax-attention layers (layer_types, or every full_attention_interval-th layer attention),
// zero-centred RMSNorms (1 + w) everywhere but the delta rule's gated output norm, a dense SwiGLU
// MLP or Qwen's MoE (softmax router, gated shared expert) per layer.
//   Qwen3-Next (Qwen3NextForCausalLM, model_type "qwen3_next"): flat model.* names, in_proj_qkvz and
//   in_proj_ba interleaved per key-head group, one tensor per expert.
//   Qwen3.5 (Qwen3_5ForConditionalGeneration "qwen3_5", dense; Qwen3_5MoeForConditionalGeneration
//   "qwen3_5_moe"): the text model's fields in text_config and its tensors under
//   model.language_model., flat in_proj_qkv / in_proj_z / in_proj_b / in_proj_a, experts fused into
//   [E, 2I, D] and [E, D, I] tensors (bound per expert as views; per-expert files bind too).
// The vision tower (model.visual.*) and the multi-token-prediction head (mtp.*) are skipped; `info`
// counts the MTP head apart. Qwen's own names bind through the table here: the delta rule's
// projections are gathered into the layout the other delta-rule rows use, so nothing outside this
// file knows either naming. Spec: shared/spec/qwen3-next-and-qwen3.5.md; reference/qwen.py.
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/archs/gguf_map.h"

namespace lineage::model {

namespace {

using layers::DeltaRule;

enum class Flavour : uint8_t { Next, Dense35, Moe35 };

struct Source {
  const ArchInput& in;
  std::string prefix;  // of the text model's tensors: "model." or "model.language_model."
  Flavour flavour;
  std::optional<ConfigFields> vision = std::nullopt;  // Qwen3.5's vision_config, when the config has one
  bool has(const std::string& name) const { return in.has_tensor(name); }
  bool checkpoint() const { return has(prefix + "embed_tokens.weight"); }
};

// A field of the RoPE parameters: top-level (older configs) or in rope_parameters (transformers v5).
double rope_field(const ConfigFields& c, const std::string& key, double fallback, double max) {
  if (c.has("rope_parameters")) {
    if (!c.json()["rope_parameters"].is_object()) c.fail("rope_parameters", "an object (rope_type, rope_theta, ...)");
    const ConfigFields r(c.json()["rope_parameters"], c.file() + ", rope_parameters");
    if (r.has(key)) {
      const std::string type = r.string("rope_type", "default");
      if (type != "default") r.fail("rope_type", "\"default\" (no RoPE scaling is supported)");
      return r.positive(key, fallback, max);
    }
  }
  return c.positive(key, fallback, max);
}

// layer_types as given, or every full_attention_interval-th layer full attention.
std::vector<char> attention_layers(const ConfigFields& c, int64_t L) {
  std::vector<char> full(size_t(L), 0);
  if (c.has("layer_types")) {
    const auto& t = c.json()["layer_types"];
    const std::string want = cat("a list of ", L, " (num_hidden_layers) entries, each \"linear_attention\" or \"full_attention\"");
    if (!t.is_array() || int64_t(t.size()) != L) c.fail("layer_types", want);
    for (int64_t i = 0; i < L; ++i) {
      const auto& v = t[size_t(i)];
      if (!v.is_string() || (v != "linear_attention" && v != "full_attention")) c.fail("layer_types", want);
      full[size_t(i)] = v == "full_attention";
    }
    return full;
  }
  const int64_t every = c.integer("full_attention_interval", 4, limits::kLayers);
  for (int64_t i = 0; i < L; ++i) full[size_t(i)] = (i + 1) % every == 0;
  return full;
}

layers::GatedAttention attention_layer(const ConfigFields& c, int64_t D, float eps) {
  layers::GatedAttention a;
  layers::GatedAttention::Config& x = a.config;
  x.d_model = D;
  x.n_heads = c.integer("num_attention_heads", limits::kHeads);
  x.n_kv_heads = c.integer("num_key_value_heads", x.n_heads, limits::kHeads);
  if (x.n_heads % x.n_kv_heads) c.fail("num_key_value_heads", cat("a divisor of num_attention_heads = ", x.n_heads));
  x.head_dim = c.integer("head_dim", D / x.n_heads, limits::kWidth);
  if (c.boolean("attention_bias", false)) c.fail("attention_bias", "false (Qwen's attention has no biases)");
  if (c.has("rope_scaling")) c.fail("rope_scaling", "null (no RoPE scaling is supported)");
  x.rope_theta = rope_field(c, "rope_theta", 10000.0, 1e12);
  const double factor = rope_field(c, "partial_rotary_factor", 0.25, 1.0);
  x.rope_dims = int64_t(double(x.head_dim) * factor);
  if (x.rope_dims < 2 || x.rope_dims % 2)
    c.fail("partial_rotary_factor", cat("a factor giving an even rotary width of at least 2 (head_dim ", x.head_dim, " x ",
                                        factor, " = ", x.rope_dims, ")"));
  x.output_gate = c.boolean("attn_output_gate", true);
  x.qk_norm = true;
  x.norm_eps = eps;
  return a;
}

DeltaRule delta_layer(const ConfigFields& c, int64_t D, float eps) {
  DeltaRule d;
  DeltaRule::Config& x = d.config;
  x.kind = "Gated DeltaNet";
  x.d_model = D;
  x.n_heads = x.n_kv_heads = c.integer("linear_num_key_heads", limits::kHeads);
  x.n_v_heads = c.integer("linear_num_value_heads", limits::kHeads);
  if (x.n_v_heads % x.n_heads) c.fail("linear_num_value_heads", cat("a multiple of linear_num_key_heads = ", x.n_heads));
  x.head_k = c.integer("linear_key_head_dim", limits::kWidth);
  x.head_v = c.integer("linear_value_head_dim", limits::kWidth);
  x.conv_size = c.integer("linear_conv_kernel_dim", 4, limits::kConvSize);
  x.qk_conv_silu = true;
  x.q_norm = x.k_norm = DeltaRule::QkNorm::L2;
  x.decay = DeltaRule::DecayInput::PerHeadProj;
  x.out_gate = DeltaRule::OutGate::Swish;  // RMSNorm(o)·w·SiLU(z), the plain weight (no 1 + w)
  x.norm_eps = eps;
  x.names.o_norm = "norm";
  return d;
}

// Where Qwen keeps the delta rule's parameters: one conv over q | k | v, out_proj, and the input
// projections interleaved per key-head group (Qwen3-Next) or flat (Qwen3.5), gathered at load into
// the layout of the other delta-rule rows.
void bind_delta_rule(BindingTable& b, const DeltaRule::Config& x, Flavour f) {
  const int64_t Hk = x.n_heads, Hv = x.n_v_heads, dk = x.head_k, dv = x.head_v, r = Hv / Hk;
  const std::string p = ".linear_attn.";
  b.splits.push_back({p + "conv1d.weight", {{p + "q_conv1d.weight", Hk * dk}, {p + "k_conv1d.weight", Hk * dk},
                                            {p + "v_conv1d.weight", Hv * dv}}, 1});
  b.renames.push_back({p + "o_proj.weight", p + "out_proj.weight"});
  if (f == Flavour::Next) {
    b.splits.push_back({p + "in_proj_qkvz.weight", {{p + "q_proj.weight", dk}, {p + "k_proj.weight", dk},
                                                    {p + "v_proj.weight", r * dv}, {p + "g_proj.weight", r * dv}}, Hk});
    b.splits.push_back({p + "in_proj_ba.weight", {{p + "b_proj.weight", r}, {p + "a_proj.weight", r}}, Hk});
  } else {
    b.splits.push_back({p + "in_proj_qkv.weight", {{p + "q_proj.weight", Hk * dk}, {p + "k_proj.weight", Hk * dk},
                                                   {p + "v_proj.weight", Hv * dv}}, 1});
    b.renames.push_back({p + "g_proj.weight", p + "in_proj_z.weight"});
    b.renames.push_back({p + "b_proj.weight", p + "in_proj_b.weight"});
    b.renames.push_back({p + "a_proj.weight", p + "in_proj_a.weight"});
  }
}

// Parameters of the multi-token-prediction head the config declares (skipped; `info` counts them
// apart): per MTP layer one full-attention decoder layer (`layer`, its norms, mixer and FFN), then
// fc [D, 2D] and three norms (spec §2.1).
int64_t mtp_params(int64_t layers, int64_t D, Block& layer) {
  int64_t per_layer = 0;
  layer.for_each_tensor("", [&](const std::string&, Tensor&, const Shape& s, layers::Init) { per_layer += shape_numel(s); });
  return layers * per_layer + 2 * D * D + 3 * D;
}

// Qwen3.5's vision tower (model.visual.*, Qwen3-VL's without the deepstack mergers), counted from
// vision_config: the Conv3d patch embedding with its bias, the learned position table, `depth`
// blocks (two LayerNorms, qkv [3W, W] and proj [W, W], linear_fc1 [I, W] and linear_fc2 [W, I], all
// with biases), and the merger (a LayerNorm over W, then over the 2×2 merged patches M = W·s²:
// linear_fc1 [M, M] and linear_fc2 [out, M] with biases).
int64_t vision_params(const ConfigFields& v) {
  const int64_t W = v.integer("hidden_size", 1152, limits::kWidth), I = v.integer("intermediate_size", 4304, limits::kWidth);
  const int64_t depth = v.integer("depth", 27, limits::kLayers), C = v.integer("in_channels", 3, 64);
  const int64_t p = v.integer("patch_size", 16, 1024), tp = v.integer("temporal_patch_size", 2, 64);
  const int64_t s = v.integer("spatial_merge_size", 2, 64), out = v.integer("out_hidden_size", 3584, limits::kWidth);
  const int64_t pos = v.integer("num_position_embeddings", 2304, limits::kPositions), M = W * s * s;
  const int64_t block = 4 * W + (3 * W * W + 3 * W) + (W * W + W) + (I * W + I) + (W * I + W);
  return (W * C * tp * p * p + W) + pos * W + depth * block + 2 * W + (M * M + M) + (out * M + out);
}

Model build_qwen(const ConfigFields& c, const Source& src, const std::string& layers_field) {
  Model m;
  const int64_t V = c.integer("vocab_size", limits::kVocab), D = c.integer("hidden_size", limits::kWidth);
  const int64_t L = c.integer("num_hidden_layers", limits::kLayers);
  const float eps = float(c.positive("rms_norm_eps", 1e-6, 1.0));
  if (c.string("hidden_act", "silu") != "silu") c.fail("hidden_act", "\"silu\" (Qwen's MLPs, convs and gates)");
  const std::vector<char> full = attention_layers(c, L);

  // Qwen's MoE where the config has experts: every decoder_sparse_step-th layer not in mlp_only_layers.
  const bool moe35 = src.flavour == Flavour::Moe35;
  const int64_t E = src.flavour == Flavour::Dense35 ? 0 : c.count("num_experts", 0, limits::kWidth);
  if (moe35 && E == 0) c.fail("num_experts", "at least 1 (Qwen3.5-MoE)");
  layers::Moe::Config moe;
  std::vector<char> dense_only(size_t(L), 0);
  int64_t sparse_step = 1;
  if (E > 0) {
    moe.d_model = D;
    moe.n_experts = E;
    moe.top_k = c.integer("num_experts_per_tok", E);
    moe.hidden = c.integer("moe_intermediate_size", limits::kWidth);
    moe.shared_hidden = c.count("shared_expert_intermediate_size", 0, limits::kWidth);
    moe.router = layers::Moe::Router::Softmax;
    moe.renormalize = moe35 || c.boolean("norm_topk_prob", true);  // Qwen3.5-MoE always renormalizes
    moe.shared_gate = moe.shared_hidden > 0;
    if (!moe35) {
      sparse_step = c.integer("decoder_sparse_step", 1, limits::kLayers);
      if (c.has("mlp_only_layers")) {
        const auto& v = c.json()["mlp_only_layers"];
        const std::string want = cat("a list of zero-based layer numbers in [0, ", L, ")");
        if (!v.is_array()) c.fail("mlp_only_layers", want);
        for (const auto& i : v) {
          if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= L) c.fail("mlp_only_layers", want);
          dense_only[size_t(i.get<int64_t>())] = 1;
        }
      }
    }
  }
  const auto is_moe = [&](int64_t i) { return E > 0 && !dense_only[size_t(i)] && (i + 1) % sparse_step == 0; };
  bool any_dense = false;
  for (int64_t i = 0; i < L; ++i) any_dense = any_dense || !is_moe(i);
  const int64_t dense_width = any_dense ? c.integer("intermediate_size", limits::kWidth) : 0;

  m.config.model_type = src.flavour == Flavour::Next ? "qwen3_next" : moe35 ? "qwen3_5_moe" : "qwen3_5";
  m.config.vocab_size = V;
  m.config.d_model = D;
  m.config.max_positions_field = "max_position_embeddings";
  m.config.max_positions = c.count("max_position_embeddings", 0, limits::kPositions);
  m.config.layers_field = layers_field;
  m.config.tied_lm_head = c.boolean("tie_word_embeddings", false);
  m.config.bos_token_id = c.token_id("bos_token_id", V, std::nullopt);
  m.config.eos_token_id = c.token_id("eos_token_id", V, std::nullopt);
  const std::string& P = src.prefix;
  m.names = {P + "embed_tokens.weight", "", P + "layers.", P + "norm", "lm_head.weight"};
  if (m.config.tied_lm_head) m.binding.ignore_suffixes.push_back("lm_head.weight");
  m.binding.ignore_prefixes = {"mtp.", "model.visual."};
  layers::Norm rms{layers::Norm::Kind::Rms, D, eps, {}, {}};
  rms.unit_offset = true;
  m.final_norm = rms;

  int64_t n_full = 0, n_moe = 0;
  for (int64_t i = 0; i < L; ++i) {
    Block b;
    b.norm1 = b.norm2 = rms;
    const std::string lp = cat(P, "layers.", i, ".");
    if (src.checkpoint()) {  // layer_types against the tensors
      const bool gdn = src.has(lp + "linear_attn.A_log"), attn = src.has(lp + "self_attn.q_proj.weight");
      if (full[size_t(i)] && gdn && !attn)
        c.fail("layer_types", cat("the layers the checkpoint holds: layer ", i, " is a linear_attention layer (",
                                  lp, "linear_attn.A_log), not full_attention"));
      if (!full[size_t(i)] && attn && !gdn)
        c.fail("layer_types", cat("the layers the checkpoint holds: layer ", i, " is a full_attention layer (",
                                  lp, "self_attn.q_proj.weight), not linear_attention"));
    }
    if (full[size_t(i)]) {
      b.mixer = attention_layer(c, D, eps);
      ++n_full;
    } else {
      DeltaRule d = delta_layer(c, D, eps);
      if (m.binding.splits.empty()) bind_delta_rule(m.binding, d.config, src.flavour);
      b.mixer = std::move(d);
    }
    if (is_moe(i)) {
      layers::Moe e;
      e.config = moe;
      e.shared_name = "shared_expert";
      b.ffn = std::move(e);
      ++n_moe;
    } else {
      layers::GatedMlp mlp;
      mlp.config = {D, dense_width};
      b.ffn = std::move(mlp);
    }
    b.names = {"input_layernorm", full[size_t(i)] ? "self_attn" : "linear_attn", "post_attention_layernorm", "mlp"};
    m.blocks.push_back(std::move(b));
  }
  if (E > 0) {  // Qwen3.5's fused experts, where the files hold them so (and written so for Qwen3.5-MoE)
    const std::string p = ".mlp.experts.";
    m.binding.unstacks.push_back(
        {p + "gate_up_proj", p, {{".gate_proj.weight", moe.hidden}, {".up_proj.weight", moe.hidden}}, E, moe35});
    m.binding.unstacks.push_back({p + "down_proj", p, {{".down_proj.weight", D}}, E, moe35});
  }

  // The multi-token-prediction head: skipped, counted apart. Qwen3.5's configs declare it; Qwen3-Next's
  // does not, yet its checkpoints ship one layer (vLLM's qwen3_next_mtp reads num_nextn_predict_layers,
  // default 1): counted from the config alone, or where a checkpoint holds mtp.fc.weight.
  const int64_t next_default = src.checkpoint() && !src.has("mtp.fc.weight") ? 0 : 1;
  const int64_t mtp = src.flavour == Flavour::Next ? c.count("num_nextn_predict_layers", next_default, 16)
                                                   : c.count("mtp_num_hidden_layers", 0, 16);
  if (mtp > 0 && n_full > 0) {
    for (int64_t i = L - 1; i >= 0; --i)
      if (full[size_t(i)]) {
        m.config.extra_params = mtp_params(mtp, D, m.blocks[size_t(i)]);
        break;
      }
    m.config.extra_params_label = "multi-token-prediction head (mtp.*, not run)";
  }
  // Qwen3.5's vision tower, where its top-level config (src.vision) describes one: likewise.
  if (src.vision) {
    m.config.extra_params += vision_params(*src.vision);
    m.config.extra_params_label = m.config.extra_params_label.empty()
                                      ? "vision tower (model.visual.*, not run)"
                                      : "multi-token-prediction head (mtp.*) and vision tower (model.visual.*; neither run)";
  }

  const char* what = src.flavour == Flavour::Next ? "Qwen3-Next" : moe35 ? "Qwen3.5-MoE" : "Qwen3.5";
  m.config.description =
      cat(what, ": ", L, " layers (", L - n_full, " Gated DeltaNet, ", n_full, " gated attention), d_model ", D,
          E ? cat(", MoE ", E, " x ", moe.hidden, " top-", moe.top_k, " in ", n_moe, " layers") : std::string(),
          n_moe < L ? cat(", SwiGLU MLP ", dense_width) : std::string());
  return m;
}

// The text model's config of a Qwen3.5 checkpoint: text_config (published) or the top level (a
// text-only config).
Model build_qwen35(const ArchInput& in, Flavour f) {
  const ConfigFields& top = in.config;
  if (top.has("text_config")) {
    if (!top.json()["text_config"].is_object()) top.fail("text_config", "an object holding the text model's config");
    const ConfigFields text(top.json()["text_config"], top.file() + ", text_config");
    Source src{in, "model.language_model.", f};
    if (top.has("vision_config")) {
      if (!top.json()["vision_config"].is_object()) top.fail("vision_config", "an object describing the vision tower");
      src.vision.emplace(top.json()["vision_config"], top.file() + ", vision_config");
    }
    // tie_word_embeddings lives at either level (transformers defines it in both classes).
    Model m = build_qwen(text, src, "text_config.num_hidden_layers");
    if (!text.has("tie_word_embeddings") && top.boolean("tie_word_embeddings", false)) {
      m.config.tied_lm_head = true;
      m.binding.ignore_suffixes.push_back("lm_head.weight");
    }
    return m;
  }
  return build_qwen(top, Source{in, "model.language_model.", f}, "num_hidden_layers");
}

}  // namespace

Model build_qwen3_next(const ArchInput& in) { return build_qwen(in.config, Source{in, "model.", Flavour::Next}, "num_hidden_layers"); }
Model build_qwen3_5(const ArchInput& in) { return build_qwen35(in, Flavour::Dense35); }
Model build_qwen3_5_moe(const ArchInput& in) { return build_qwen35(in, Flavour::Moe35); }

namespace {

// Qwen's zero-centred RMSNorm weight w from the multiplier 1 + w the converter stores: exact, as
// x − 1 is for every x in [0.5, 2], and 1 + (x − 1) gives back x.
Tensor zero_centred(const Tensor& t) {
  Tensor out = t.clone();
  float* w = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) w[i] -= 1.0f;
  return out;
}

// Qwen3.5's converter reorders every value-head-indexed tensor from grouped by key head [G0_v0 ..
// G0_v(r-1), G1_v0 ..] to tiled [G0_v0, G1_v0, .., G0_v1, ..] (for ggml's broadcast): back to grouped,
// `width` values a head, along dim 0 from row `from` (the v part of attn_qkv and of the conv) or
// along dim 1 (ssm_out's columns). A copy.
Tensor grouped_v_heads(const Tensor& x, int dim, int64_t from, int64_t hk, int64_t r, int64_t width) {
  Tensor out = x.clone();
  if (r == 1) return out;
  const size_t elem = dtype_size(x.dtype());
  const int64_t rows = x.dim(0), cols = x.numel() / rows;
  const auto* src = static_cast<const uint8_t*>(x.raw());
  auto* dst = static_cast<uint8_t*>(out.raw_mut());
  for (int64_t k = 0; k < hk; ++k)
    for (int64_t j = 0; j < r; ++j) {
      const int64_t to = (k * r + j) * width, at = (j * hk + k) * width;  // grouped head k·r + j, tiled j·hk + k
      if (dim == 0) {
        std::memcpy(dst + size_t((from + to) * cols) * elem, src + size_t((from + at) * cols) * elem,
                    size_t(width * cols) * elem);
      } else {
        for (int64_t row = 0; row < rows; ++row)
          std::memcpy(dst + size_t(row * cols + to) * elem, src + size_t(row * cols + at) * elem, size_t(width) * elem);
      }
    }
  return out;
}

// llama.cpp's `qwen3next`, `qwen35` and `qwen35moe` (conversion/qwen.py's Qwen3NextModel and its
// Qwen3.5 subclasses; src/models/qwen3next.cpp, qwen35.cpp, qwen35moe.cpp). What the converter
// changed, undone: A_log stored as −exp(A_log) (A_log = log(−a): −exp of it is a within an ulp);
// dt_bias as ssm_dt.bias; the conv [C, 1, K] squeezed; every RMSNorm weight but the delta rule's
// output norm stored as 1 + w; experts stacked [E, out, in] (each expert a view of its slice; Qwen3.5's
// fused gate_up split into gate and up). Qwen3-Next: in_proj_qkvz's per-key-head [q, k, v, z] groups
// regrouped into attn_qkv ([q | k | v]) and attn_gate (z), bound here as Qwen3.5's flat in_proj_qkv and
// in_proj_z (views, no copy). Qwen3.5: in_proj_qkv / z / b / a as attn_qkv / attn_gate / ssm_beta /
// ssm_alpha with the value heads tiled (grouped_v_heads undoes it: copies). No MTP layers. Dense layers
// (ffn_gate / ffn_up / ffn_down) are read as mlp_only_layers (Qwen3-Next) or the dense model's MLP.
GgufMapped gguf_qwen(const GgufSource& in, Flavour flavour) {
  GgufMapped m;
  const bool next = flavour == Flavour::Next, moe = flavour != Flavour::Dense35;
  const std::string& f = in.file;
  const std::string P = next ? "model." : "model.language_model.";
  const int64_t D = in.integer("embedding_length", limits::kWidth), L = in.integer("block_count", limits::kLayers);
  const int64_t H = in.integer("attention.head_count", limits::kHeads);
  const int64_t hd = in.integer("attention.key_length", D / H, limits::kWidth);
  const int64_t Hk = in.integer("ssm.group_count", limits::kHeads), Hv = in.integer("ssm.time_step_rank", limits::kHeads);
  const int64_t dk = in.integer("ssm.state_size", limits::kWidth), inner = in.integer("ssm.inner_size", limits::kWidth);
  if (inner % Hv) in.fail(in.arch + ".ssm.inner_size", cat("a multiple of ssm.time_step_rank = ", Hv));
  if (Hv % Hk) in.fail(in.arch + ".ssm.time_step_rank", cat("a multiple of ssm.group_count = ", Hk));
  const int64_t dv = inner / Hv, r = Hv / Hk;
  const int64_t rope = in.integer("rope.dimension_count", hd, limits::kWidth);
  const auto has = [&](const std::string& t) { return in.tensors.count(t) > 0; };
  nlohmann::json types = nlohmann::json::array(), dense = nlohmann::json::array();
  for (int64_t l = 0; l < L; ++l) {
    types.push_back(has(cat("blk.", l, ".ssm_a")) ? "linear_attention" : "full_attention");
    if (!has(cat("blk.", l, ".ffn_gate_inp.weight"))) dense.push_back(l);
  }
  const auto vocab = in.tensors.find("token_embd.weight");
  m.config = {{"model_type", next ? "qwen3_next" : moe ? "qwen3_5_moe" : "qwen3_5"},
              {"hidden_size", D},
              {"num_hidden_layers", L},
              {"vocab_size", vocab != in.tensors.end() && vocab->second.size() == 2 ? vocab->second[0]
                                                                                        : in.integer("vocab_size", limits::kVocab)},
              {"max_position_embeddings", in.integer("context_length", 4096, limits::kPositions)},
              {"num_attention_heads", H},
              {"num_key_value_heads", in.integer("attention.head_count_kv", H, limits::kHeads)},
              {"head_dim", hd},
              {"rms_norm_eps", in.number("attention.layer_norm_rms_epsilon", 1e-6)},
              {"rope_theta", in.number("rope.freq_base", 1e4)},
              {"partial_rotary_factor", double(rope) / double(hd)},
              {"linear_conv_kernel_dim", in.integer("ssm.conv_kernel", limits::kConvSize)},
              {"linear_key_head_dim", dk},
              {"linear_value_head_dim", dv},
              {"linear_num_key_heads", Hk},
              {"linear_num_value_heads", Hv},
              {"layer_types", types},
              {"hidden_act", "silu"},
              {"tie_word_embeddings", !has("output.weight")},
              {next ? "num_nextn_predict_layers" : "mtp_num_hidden_layers", 0}};
  const int64_t E = moe ? in.integer("expert_count", next ? 0 : 1, limits::kWidth) : 0;
  if (E > 0) {
    m.config["num_experts"] = E;
    m.config["num_experts_per_tok"] = in.integer("expert_used_count", limits::kWidth);
    m.config["moe_intermediate_size"] = in.integer("expert_feed_forward_length", limits::kWidth);
    m.config["shared_expert_intermediate_size"] = in.integer("expert_shared_feed_forward_length", 0, limits::kWidth);
  }
  if (next) {
    m.config["norm_topk_prob"] = true;
    m.config["decoder_sparse_step"] = 1;
    m.config["mlp_only_layers"] = dense;
  }
  if (!moe || !dense.empty() || E == 0) m.config["intermediate_size"] = in.integer("feed_forward_length", limits::kWidth);

  auto& t = m.tensors;
  const auto norm = [&](const std::string& hf, const std::string& gguf) {
    t.push_back({hf, gguf, [f, gguf](const Tensor& x) { return zero_centred(gguf_f32(x, f, gguf)); }});
  };
  // A Qwen3.5 tensor whose value heads the converter tiled (see grouped_v_heads).
  const auto grouped = [&](const std::string& hf, const std::string& gguf, int dim, int64_t from, int64_t width) {
    if (next || r == 1) t.push_back({hf, gguf, {}});
    else t.push_back({hf, gguf, [=](const Tensor& x) { return grouped_v_heads(x, dim, from, Hk, r, width); }, {}, {}, dim == 0});
  };
  t.push_back({P + "embed_tokens.weight", "token_embd.weight", {}});
  norm(P + "norm.weight", "output_norm.weight");
  if (has("output.weight")) t.push_back({"lm_head.weight", "output.weight", {}});
  for (int64_t l = 0; l < L; ++l) {
    const std::string h = cat(P, "layers.", l, "."), b = cat("blk.", l, ".");
    norm(h + "input_layernorm.weight", b + "attn_norm.weight");
    norm(h + "post_attention_layernorm.weight", b + "post_attention_norm.weight");
    if (types[size_t(l)] == "linear_attention") {
      const std::string a = h + "linear_attn.";
      grouped(a + "in_proj_qkv.weight", b + "attn_qkv.weight", 0, 2 * Hk * dk, dv);
      grouped(a + "in_proj_z.weight", b + "attn_gate.weight", 0, 0, dv);
      if (next) {
        t.push_back({a + "in_proj_ba.weight", b + "ssm_ba.weight", {}});
      } else {
        grouped(a + "in_proj_b.weight", b + "ssm_beta.weight", 0, 0, 1);
        grouped(a + "in_proj_a.weight", b + "ssm_alpha.weight", 0, 0, 1);
      }
      const std::string conv = b + "ssm_conv1d.weight";
      t.push_back({a + "conv1d.weight", conv, [=](const Tensor& x) {
                     const Tensor c = next || r == 1 ? x : grouped_v_heads(x, 0, 2 * Hk * dk, Hk, r, dv);
                     return c.reshaped({c.dim(0), 1, c.dim(c.ndim() - 1)});
                   }});
      grouped(a + "dt_bias", b + "ssm_dt.bias", 0, 0, 1);
      const std::string name = b + "ssm_a";
      t.push_back({a + "A_log", name, [=](const Tensor& x) {
                     const Tensor out = a_log_from_minus_exp(x, f, name);
                     return next || r == 1 ? out : grouped_v_heads(out, 0, 0, Hk, r, 1);
                   }});
      t.push_back({a + "norm.weight", b + "ssm_norm.weight", {}});
      grouped(a + "out_proj.weight", b + "ssm_out.weight", 1, 0, dv);
    } else {
      const std::string a = h + "self_attn.";
      for (const char* p : {"q", "k", "v"}) t.push_back({cat(a, p, "_proj.weight"), cat(b, "attn_", p, ".weight"), {}});
      t.push_back({a + "o_proj.weight", b + "attn_output.weight", {}});
      norm(a + "q_norm.weight", b + "attn_q_norm.weight");
      norm(a + "k_norm.weight", b + "attn_k_norm.weight");
    }
    const std::string mlp = h + "mlp.";
    if (!has(b + "ffn_gate_inp.weight")) {
      for (const char* p : {"gate", "up", "down"}) t.push_back({cat(mlp, p, "_proj.weight"), cat(b, "ffn_", p, ".weight"), {}});
      continue;
    }
    t.push_back({mlp + "gate.weight", b + "ffn_gate_inp.weight", {}});
    for (int64_t e = 0; e < E; ++e)
      for (const char* p : {"gate", "up", "down"})
        t.push_back(gguf_expert(cat(mlp, "experts.", e, ".", p, "_proj.weight"), cat(b, "ffn_", p, "_exps.weight"), e));
    if (has(b + "ffn_gate_inp_shexp.weight")) {
      t.push_back({mlp + "shared_expert_gate.weight", b + "ffn_gate_inp_shexp.weight",
                   [](const Tensor& x) { return x.reshaped({1, x.numel()}); }});
      for (const char* p : {"gate", "up", "down"})
        t.push_back({cat(mlp, "shared_expert.", p, "_proj.weight"), cat(b, "ffn_", p, "_shexp.weight"), {}});
    }
  }
  if (!next) return m;
  // Qwen3-Next's attn_qkv and attn_gate are Qwen3.5's flat in_proj_qkv and in_proj_z: bind them so.
  m.adjust = [Hk, Hv, dk, dv](Model& model) {
    const std::string p = ".linear_attn.";
    auto& splits = model.binding.splits;
    std::erase_if(splits, [&](const BindingTable::Split& s) { return s.stored == p + "in_proj_qkvz.weight"; });
    splits.push_back({p + "in_proj_qkv.weight",
                      {{p + "q_proj.weight", Hk * dk}, {p + "k_proj.weight", Hk * dk}, {p + "v_proj.weight", Hv * dv}}, 1});
    model.binding.renames.push_back({p + "g_proj.weight", p + "in_proj_z.weight"});
  };
  return m;
}

}  // namespace

GgufMapped gguf_qwen3_next(const GgufSource& in) { return gguf_qwen(in, Flavour::Next); }
GgufMapped gguf_qwen35(const GgufSource& in) { return gguf_qwen(in, Flavour::Dense35); }
GgufMapped gguf_qwen35moe(const GgufSource& in) { return gguf_qwen(in, Flavour::Moe35); }

}  // namespace lineage::model
