// flash-linear-attention checkpoints (model types linear_attn, delta_net, gated_deltanet, kda): the
// fla model skeleton (embeddings, attn_norm → attn → mlp_norm → SwiGLU mlp, final norm, tied or
// separate lm_head) with one DeltaRule mixer per layer, configured from fla's config fields and
// their defaults. Spec: shared/spec/linear-attention-family.md §2–§6; reference/delta_family.py.
#include <cmath>

#include "lineage/core/error.h"
#include "lineage/model/archs/arch.h"

namespace lineage::model {

namespace {

using layers::DeltaRule;

void refuse_unsupported(const ConfigFields& c) {
  if (c.has("attn"))
    c.fail("attn", "null (fla's hybrid softmax-attention layers are not supported yet)");
  if (c.string("hidden_act", "swish") != "swish") c.fail("hidden_act", "\"swish\" (fla's GatedMLP accepts nothing else)");
}

int64_t mlp_width(const ConfigFields& c, int64_t D) {
  if (c.has("intermediate_size")) return c.integer("intermediate_size", limits::kWidth);
  const double ratio = c.positive("hidden_ratio", 4, 64);
  const int64_t f = int64_t(double(D) * ratio * 2.0 / 3.0);
  if (f < 1 || f > limits::kWidth) c.fail("hidden_ratio", cat("a ratio giving an MLP width in [1, ", limits::kWidth, "] at hidden_size ", D));
  return 256 * ((f + 255) / 256);  // fla GatedMLP rounds up to a multiple of 256
}

DeltaRule::FeatureMap parse_map(const ConfigFields& c, const std::string& key, const std::string& fallback,
                                bool allow_product) {
  const std::string v = c.string(key, fallback);
  if (v == "identity") return DeltaRule::FeatureMap::Identity;
  if (v == "silu" || v == "swish") return DeltaRule::FeatureMap::Silu;
  if (v == "relu") return DeltaRule::FeatureMap::Relu;
  if (v == "elu") return DeltaRule::FeatureMap::Elu1;
  if (allow_product && v == "elementwise_product") return DeltaRule::FeatureMap::ElementwiseProduct;
  c.fail(key, allow_product ? "one of elementwise_product, elu, relu, identity (hedgehog, t2r, dpfp are not supported)"
                            : "one of silu, relu, elu, identity");
}

void check_divides(const ConfigFields& c, const std::string& field, int64_t dim, int64_t heads, const char* what) {
  if (heads <= 0 || dim % heads) c.fail(field, cat("a value giving a ", what, " (", dim, ") divisible by ", heads, " heads"));
}

// hidden_size · expand_k (or expand_v), truncated as fla's int() does: a width in [1, kWidth].
int64_t expanded(const ConfigFields& c, const std::string& key, int64_t d_model) {
  const double w = double(d_model) * c.positive(key, 1.0, 64);
  if (w < 1 || w > double(limits::kWidth))
    c.fail(key, cat("a factor giving a width in [1, ", limits::kWidth, "] at hidden_size ", d_model));
  return int64_t(w);
}

// linear_attn and delta_net size their heads from the width: key_dim = hidden·expand_k,
// value_dim = hidden·expand_v, split over n_heads.
void expanded_heads(const ConfigFields& c, DeltaRule::Config& x) {
  const int64_t key_dim = expanded(c, "expand_k", x.d_model), value_dim = expanded(c, "expand_v", x.d_model);
  check_divides(c, "expand_k", key_dim, x.n_heads, "key dim");
  check_divides(c, "expand_v", value_dim, x.n_heads, "value dim");
  x.head_k = key_dim / x.n_heads;
  x.head_v = value_dim / x.n_heads;
}

// The fla skeleton around one mixer config per layer.
Model build_fla(const ArchInput& in, const std::string& type, const DeltaRule::Config& mixer, const std::string& summary) {
  const ConfigFields& c = in.config;
  Model m;
  // fla's configuration classes: 32000 tokens, 21 Gated DeltaNet layers, 24 of the others.
  const int64_t D = mixer.d_model, L = c.integer("num_hidden_layers", type == "gated_deltanet" ? 21 : 24, limits::kLayers);
  const int64_t V = c.integer("vocab_size", 32000, limits::kVocab);
  const float eps = float(c.positive("norm_eps", 1e-6, 1.0));
  m.config.model_type = type;
  m.config.vocab_size = V;
  m.config.d_model = D;
  m.config.max_positions = 0;  // a recurrent state has no context limit
  m.config.layers_field = "num_hidden_layers";
  m.config.tied_lm_head = c.boolean("tie_word_embeddings", false);
  m.config.bos_token_id = c.token_id("bos_token_id", V, 1);
  m.config.eos_token_id = c.token_id("eos_token_id", V, 2);
  if (m.config.tied_lm_head) m.binding.ignore_suffixes.push_back("lm_head.weight");
  const int64_t F = mlp_width(c, D);
  m.config.description = cat(summary, ": ", L, " layers, d_model ", D, ", SwiGLU MLP ", F);
  m.names = {"model.embeddings.weight", "", "model.layers.", "model.norm", "lm_head.weight"};
  const layers::Norm rms{layers::Norm::Kind::Rms, D, eps, {}, {}};
  m.final_norm = rms;
  Block b;  // every layer is this block, weights still empty
  b.names = {"attn_norm", "attn", "mlp_norm", "mlp"};
  b.norm1 = b.norm2 = rms;
  DeltaRule d;
  d.config = mixer;
  d.config.norm_eps = eps;
  b.mixer = std::move(d);
  layers::GatedMlp mlp;
  mlp.config = {D, F};
  b.ffn = std::move(mlp);
  // Block Attention Residuals (fla's attnres_block_size, in sublayers: 1 makes every sublayer's
  // output its own source, an even B blocks of B / 2 layers); pseudo-queries and their norms at
  // norm_eps, and the model-level mix before model.norm.
  if (c.has("attnres_block_size")) {
    const auto& v = c.json()["attnres_block_size"];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || (v.get<int64_t>() > 1 && v.get<int64_t>() % 2) ||
        v.get<int64_t>() > 2 * L)
      c.fail("attnres_block_size", cat("null, 1, or an even number of sublayers in [2, ", 2 * L, "] (2 per layer)"));
    m.config.residual = ResidualKind::BlockAttention;
    m.config.attn_res_block = v.get<int64_t>();
    const layers::AttnRes mix{D, eps, {}, {}, {}};
    m.output_res = b.attn_res = b.mlp_res = mix;
    m.names.output_res_norm = "model.res_norm", m.names.output_res_proj = "model.res_proj";
    b.names.attn_res_norm = "attn_res_norm", b.names.attn_res_proj = "attn_res_proj";
    b.names.mlp_res_norm = "mlp_res_norm", b.names.mlp_res_proj = "mlp_res_proj";
    m.config.description += cat(", AttnRes blocks of ", m.config.attn_res_block, " sublayers");
  }
  m.blocks.assign(size_t(L), b);
  return m;
}

}  // namespace

Model build_linear_attn(const ArchInput& in) {
  const ConfigFields& c = in.config;
  refuse_unsupported(c);
  DeltaRule::Config x;
  x.kind = "linear attention";
  x.d_model = c.integer("hidden_size", 2048, limits::kWidth);
  x.n_heads = c.integer("num_heads", 4, limits::kHeads);
  x.n_kv_heads = c.integer("num_kv_heads", x.n_heads, limits::kHeads);
  x.n_v_heads = x.n_heads;
  expanded_heads(c, x);
  if (x.n_heads % x.n_kv_heads) c.fail("num_kv_heads", cat("a divisor of num_heads = ", x.n_heads));
  x.qk_map = parse_map(c, "feature_map", "elementwise_product", true);
  if (x.qk_map == DeltaRule::FeatureMap::ElementwiseProduct && c.boolean("tie_feature_map_qk", false))
    c.fail("tie_feature_map_qk", "false (a shared elementwise_product feature map is not supported yet)");
  x.q_norm = c.boolean("norm_q", false) ? DeltaRule::QkNorm::SumEps : DeltaRule::QkNorm::None;
  x.k_norm = c.boolean("norm_k", false) ? DeltaRule::QkNorm::SumEps : DeltaRule::QkNorm::None;
  // Not in fla's LinearAttention: lineage's use_short_conv (default off, as fla has none), the
  // delta-rule rows' short conv on q, k and v with no activation after it (the feature map follows).
  x.conv_size = c.boolean("use_short_conv", false) ? c.integer("conv_size", 4, limits::kConvSize) : 0;
  if (x.conv_size && x.n_kv_heads != x.n_heads) c.fail("use_short_conv", "false with num_kv_heads < num_heads");
  x.qk_conv_silu = false;
  x.has_beta = false;
  x.delta = false;
  x.normalize = c.boolean("norm_feature_map", false);
  x.out_norm_weight = c.boolean("elementwise_affine", true);
  x.names.o_norm = "norm";
  return build_fla(in, "linear_attn", x, "Linear attention (fla)");
}

Model build_delta_net(const ArchInput& in) {
  const ConfigFields& c = in.config;
  refuse_unsupported(c);
  DeltaRule::Config x;
  x.kind = "DeltaNet";
  x.d_model = c.integer("hidden_size", 2048, limits::kWidth);
  x.n_heads = x.n_kv_heads = x.n_v_heads = c.integer("num_heads", 16, limits::kHeads);
  expanded_heads(c, x);
  x.conv_size = c.boolean("use_short_conv", true) ? c.integer("conv_size", 4, limits::kConvSize) : 0;
  const DeltaRule::FeatureMap act = parse_map(c, "qk_activation", "silu", false);
  x.qk_conv_silu = act == DeltaRule::FeatureMap::Silu;
  x.qk_map = act == DeltaRule::FeatureMap::Silu ? DeltaRule::FeatureMap::Identity : act;
  const std::string norm = c.string("qk_norm", "l2");
  if (norm != "l2" && norm != "sum") c.fail("qk_norm", "\"l2\" or \"sum\"");
  x.q_norm = x.k_norm = norm == "l2" ? DeltaRule::QkNorm::L2 : DeltaRule::QkNorm::Sum;
  x.has_beta = c.boolean("use_beta", true);
  x.neg_eigval = c.boolean("allow_neg_eigval", false);
  x.out_gate = c.boolean("use_gate", false) ? DeltaRule::OutGate::Swish : DeltaRule::OutGate::None;
  return build_fla(in, "delta_net", x, "DeltaNet (fla)");
}

namespace {
// Gated DeltaNet and KDA share their head arithmetic: K = head_dim, V = head_dim·expand_v.
DeltaRule::Config gated_heads(const ConfigFields& c, int64_t def_heads, int64_t def_head_dim, double def_expand_v) {
  DeltaRule::Config x;
  x.d_model = c.integer("hidden_size", 2048, limits::kWidth);
  x.n_heads = x.n_kv_heads = c.integer("num_heads", def_heads, limits::kHeads);
  x.n_v_heads = c.integer("num_v_heads", x.n_heads, limits::kHeads);
  if (x.n_v_heads % x.n_heads) c.fail("num_v_heads", cat("a multiple of num_heads = ", x.n_heads));
  x.head_k = c.integer("head_dim", def_head_dim, limits::kWidth);
  const double ev = c.positive("expand_v", def_expand_v, 64);
  x.head_v = int64_t(double(x.head_k) * ev);
  if (x.head_v <= 0 || x.head_v > limits::kWidth || std::abs(double(x.head_v) - double(x.head_k) * ev) > 1e-9)
    c.fail("expand_v", cat("a factor giving a whole value head dim from head_dim = ", x.head_k));
  x.conv_size = c.boolean("use_short_conv", true) ? c.integer("conv_size", 4, limits::kConvSize) : 0;
  x.neg_eigval = c.boolean("allow_neg_eigval", false);
  return x;
}
}  // namespace

Model build_gated_deltanet(const ArchInput& in) {
  const ConfigFields& c = in.config;
  refuse_unsupported(c);
  DeltaRule::Config x = gated_heads(c, 6, 256, 2.0);
  x.kind = "Gated DeltaNet";
  x.decay = DeltaRule::DecayInput::PerHeadProj;
  x.out_gate = c.boolean("use_gate", true) ? DeltaRule::OutGate::Swish : DeltaRule::OutGate::None;
  // lineage extension (not an fla field): the same layer with the additive write S ← a·S + k vᵀ,
  // i.e. the seeds' Mamba-2-style scalar decay row of the lineage. No b_proj then.
  if (!c.boolean("lineage_delta_rule", true)) {
    x.kind = "scalar-decay linear attention";
    x.delta = false;
    x.has_beta = false;
    return build_fla(in, "gated_deltanet", x, "Scalar-decay linear attention, Mamba-2 style (lineage)");
  }
  return build_fla(in, "gated_deltanet", x, "Gated DeltaNet (fla)");
}

Model build_kda(const ArchInput& in) {
  const ConfigFields& c = in.config;
  refuse_unsupported(c);
  DeltaRule::Config x = gated_heads(c, 16, 128, 1.0);
  // lower_bound: the gate lb·σ(exp(A_log)·(f + dt_bias)); safe_gate only picks a faster intra-chunk
  // path in fla's Triton kernels for −5 ≤ lb < 0, the same function.
  x.gate_lower_bound = float(c.negative("lower_bound", 0.0, -1e6));
  if (c.boolean("safe_gate", false) && !(x.gate_lower_bound >= -5.0f && x.gate_lower_bound < 0))
    c.fail("safe_gate", "false, or a lower_bound in [-5, 0) (fla's safe gate requires one)");
  x.kind = "Kimi Delta Attention";
  x.decay = DeltaRule::DecayInput::PerChannelLowRank;
  x.out_gate = DeltaRule::OutGate::SigmoidLowRank;
  Model m = build_fla(in, "kda", x, "Kimi Delta Attention (fla)");
  m.binding.squeeze.push_back(".A_log");  // [HV] in fla, [1, 1, HV, 1] in Kimi's checkpoints
  return m;
}

}  // namespace lineage::model
