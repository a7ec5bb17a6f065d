#include "lineage/model/archs/presets.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "lineage/core/error.h"
#include "lineage/core/hash.h"
#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/forward.h"

namespace lineage::model {

namespace {

std::string gpt2_config(int layers, int heads, int width) {
  return nlohmann::json{{"model_type", "gpt2"}, {"vocab_size", 50257}, {"n_positions", 1024},
                        {"n_embd", width},      {"n_layer", layers},     {"n_head", heads},
                        {"n_inner", nullptr},   {"activation_function", "gelu_new"},
                        {"layer_norm_epsilon", 1e-5}, {"bos_token_id", 50256}, {"eos_token_id", 50256}}
      .dump();
}

// The seeds' rows of the lineage at one common size (12 layers, width 768, 12 heads of 64, GPT-2's
// vocabulary), each as the fla configuration that computes it.
std::string fla_config(const std::string& type, nlohmann::json extra) {
  nlohmann::json j = {{"model_type", type},      {"vocab_size", 50257},       {"hidden_size", 768},
                      {"num_hidden_layers", 12}, {"num_heads", 12},           {"intermediate_size", 2048},
                      {"norm_eps", 1e-6},        {"tie_word_embeddings", true}, {"bos_token_id", 50256},
                      {"eos_token_id", 50256}};
  if (extra.is_object()) j.update(extra);
  return j.dump();
}

// Kimi Linear (model_type kimi_linear) at a given shape; `extra` overrides fields.
std::string kimi_config(nlohmann::json extra) {
  nlohmann::json j = {{"model_type", "kimi_linear"},
                      {"architectures", {"KimiLinearForCausalLM"}},
                      {"vocab_size", 50257},
                      {"hidden_size", 768},
                      {"num_hidden_layers", 12},
                      {"linear_attn_config",
                       {{"kda_layers", {1, 2, 3, 5, 6, 7, 9, 10, 11}},
                        {"full_attn_layers", {4, 8, 12}},
                        {"num_heads", 12},
                        {"head_dim", 64},
                        {"short_conv_kernel_size", 4}}},
                      {"num_attention_heads", 12},
                      {"num_key_value_heads", 12},
                      {"q_lora_rank", nullptr},
                      {"kv_lora_rank", 256},
                      {"qk_nope_head_dim", 64},
                      {"qk_rope_head_dim", 32},
                      {"v_head_dim", 64},
                      {"mla_use_nope", true},
                      {"hidden_act", "silu"},
                      {"intermediate_size", 2048},
                      {"first_k_dense_replace", 1},
                      {"moe_layer_freq", 1},
                      {"num_experts", 8},
                      {"num_experts_per_token", 2},
                      {"moe_intermediate_size", 256},
                      {"num_shared_experts", 1},
                      {"moe_router_activation_func", "sigmoid"},
                      {"moe_renormalize", true},
                      {"routed_scaling_factor", 2.446},
                      {"use_grouped_topk", true},
                      {"num_expert_group", 1},
                      {"topk_group", 1},
                      {"rms_norm_eps", 1e-5},
                      {"tie_word_embeddings", false},
                      {"bos_token_id", 50256},
                      {"eos_token_id", 50256}};
  if (extra.is_object()) j.update(extra);
  return j.dump();
}

// Qwen3-Next (model_type qwen3_next) at the tour's common size: 3 Gated DeltaNet : 1 gated
// attention, 12 key heads and 12 value heads of 64, attention 12 heads of 64 over 4 KV heads with
// RoPE on a quarter of each head, MoE 8 x 256 top-2 with a gated shared expert; `extra` overrides.
std::string qwen3_next_config(nlohmann::json extra) {
  nlohmann::json j = {{"model_type", "qwen3_next"},
                      {"architectures", {"Qwen3NextForCausalLM"}},
                      {"vocab_size", 50257},
                      {"hidden_size", 768},
                      {"num_hidden_layers", 12},
                      {"full_attention_interval", 4},
                      {"num_attention_heads", 12},
                      {"num_key_value_heads", 4},
                      {"head_dim", 64},
                      {"partial_rotary_factor", 0.25},
                      {"rope_theta", 10000000.0},
                      {"max_position_embeddings", 262144},
                      {"linear_num_key_heads", 12},
                      {"linear_num_value_heads", 12},
                      {"linear_key_head_dim", 64},
                      {"linear_value_head_dim", 64},
                      {"linear_conv_kernel_dim", 4},
                      {"hidden_act", "silu"},
                      {"intermediate_size", 2048},
                      {"num_experts", 8},
                      {"num_experts_per_tok", 2},
                      {"moe_intermediate_size", 256},
                      {"shared_expert_intermediate_size", 256},
                      {"norm_topk_prob", true},
                      {"decoder_sparse_step", 1},
                      {"mlp_only_layers", nlohmann::json::array()},
                      {"rms_norm_eps", 1e-6},
                      {"tie_word_embeddings", false},
                      {"bos_token_id", 50256},
                      {"eos_token_id", 50256}};
  if (extra.is_object()) j.update(extra);
  return j.dump();
}

// Kimi K3 in the text-only layout (model_type kimi_linear with K3's fields) at the tour's common
// size: 3 KDA : 1 MLA ending in two adjacent MLA layers as K3 does, the lower-bounded KDA gate with
// a full-rank output gate, gated MLA with q-LoRA, SiTU, Stable LatentMoE (experts at half the
// width, their sum RMSNormed), Block Attention Residuals in blocks of 4 layers.
std::string k3_config(nlohmann::json extra) {
  nlohmann::json j = nlohmann::json::parse(kimi_config({}));
  j.update({{"linear_attn_config",
             {{"kda_layers", {1, 2, 3, 5, 6, 7, 9, 10}},
              {"full_attn_layers", {4, 8, 11, 12}},
              {"num_heads", 12},
              {"head_dim", 64},
              {"short_conv_kernel_size", 4},
              {"gate_lower_bound", -5.0},
              {"use_full_rank_gate", true}}},
            {"q_lora_rank", 384},
            {"mla_use_output_gate", true},
            {"hidden_act", "situ"},
            {"activation_situ_beta", 4.0},
            {"activation_situ_linear_beta", 25.0},
            {"routed_expert_hidden_size", 384},
            {"latent_moe_use_norm", true},
            {"routed_scaling_factor", 1.0},
            {"attn_res_block_size", 4},
            {"max_position_embeddings", 1048576}});
  if (extra.is_object()) j.update(extra);
  return j.dump();
}

// Kimi K3's published text config (shared/data/kimi-k3/config.json) with the seeds' 92 layers of
// 23 × (3 KDA + 1 MLA) in place of the release's 93 (spec §8.4), MXFP4 routed experts as released.
std::string k3_seed_config() {
  nlohmann::json kda = nlohmann::json::array(), full = nlohmann::json::array();
  for (int i = 1; i <= 92; ++i) (i % 4 ? kda : full).push_back(i);
  return k3_config({{"vocab_size", 163840},
                    {"hidden_size", 7168},
                    {"num_hidden_layers", 92},
                    {"linear_attn_config",
                     {{"kda_layers", kda},
                      {"full_attn_layers", full},
                      {"num_heads", 96},
                      {"head_dim", 128},
                      {"short_conv_kernel_size", 4},
                      {"gate_lower_bound", -5.0},
                      {"use_full_rank_gate", true}}},
                    {"num_attention_heads", 96},
                    {"num_key_value_heads", 96},
                    {"q_lora_rank", 1536},
                    {"kv_lora_rank", 512},
                    {"qk_nope_head_dim", 128},
                    {"qk_rope_head_dim", 64},
                    {"v_head_dim", 128},
                    {"intermediate_size", 33792},
                    {"num_experts", 896},
                    {"num_experts_per_token", 16},
                    {"num_shared_experts", 2},
                    {"moe_intermediate_size", 3072},
                    {"routed_expert_hidden_size", 3584},
                    {"attn_res_block_size", 12},
                    {"dtype", "bfloat16"},
                    {"bos_token_id", 163584},
                    {"eos_token_id", 163586},
                    {"quantization_config", {{"format", "mxfp4-pack-quantized"}, {"quant_method", "compressed-tensors"}}}});
}

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// Decay parameters as fla initializes them: A_log = log U(1, 16); dt_bias = softplus⁻¹(dt) with
// dt log-uniform in [1e-3, 0.1].
float custom_init(const std::string& name, Rng& rng) {
  const auto ends_with = [&](const char* s) {
    const std::string t(s);
    return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
  };
  if (ends_with("A_log")) return float(std::log(1.0 + 15.0 * rng.uniform()));
  if (ends_with("dt_bias")) {
    const double dt = std::exp(std::log(1e-3) + rng.uniform() * (std::log(0.1) - std::log(1e-3)));
    return float(dt + std::log(-std::expm1(-dt)));
  }
  LINEAGE_CHECK(false, "no custom initialization for ", name);
  return 0.0f;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"gpt2-124m", "GPT-2 small shape (12 layers, 768 wide, 12 heads)", gpt2_config(12, 12, 768), true},
      {"gpt2-medium", "GPT-2 medium shape (24 layers, 1024 wide, 16 heads)", gpt2_config(24, 16, 1024)},
      {"gpt2-large", "GPT-2 large shape (36 layers, 1280 wide, 20 heads)", gpt2_config(36, 20, 1280)},
      {"gpt2-xl", "GPT-2 XL shape (48 layers, 1600 wide, 25 heads)", gpt2_config(48, 25, 1600)},
      {"linear-attention", "linear attention: ELU+1 feature map, (S, z) normalizer, additive write",
       fla_config("linear_attn", {{"feature_map", "elu"}, {"norm_feature_map", true}}), true},
      {"mamba2-decay", "scalar decay per head, additive write (Mamba-2 style)",
       fla_config("gated_deltanet", {{"head_dim", 64}, {"expand_v", 1.0}, {"lineage_delta_rule", false}}), true},
      {"deltanet", "DeltaNet: delta-rule overwrite, no decay", fla_config("delta_net", {}), true},
      {"gated-deltanet", "Gated DeltaNet: delta rule + scalar decay per head",
       fla_config("gated_deltanet", {{"head_dim", 64}, {"expand_v", 1.0}}), true},
      {"kda", "Kimi Delta Attention: delta rule + decay per key channel",
       fla_config("kda", {{"head_dim", 64}, {"expand_v", 1.0}}), true},
      {"kimi-linear", "Kimi Linear: 3 KDA : 1 MLA (latent cache), MoE 8 x 256 top-2 + shared, dense first layer",
       kimi_config({}), true},
      {"kimi-k3", "Kimi K3: 3 KDA : 1 MLA + a final MLA, gated MLA, latent MoE 8 x 256 top-2 + shared, SiTU, AttnRes",
       k3_config({}), true},
      {"kimi-k3-mxfp4", "kimi-k3 with MXFP4 routed experts (packed e2m1 + E8M0 scales, as K3 ships them)",
       k3_config({{"quantization_config", {{"format", "mxfp4-pack-quantized"}, {"quant_method", "compressed-tensors"}}}})},
      {"kimi-k3-seed", "the seeds' Kimi K3: 92 layers of 23 x (3 KDA + 1 MLA) at K3's widths (for info; 2.7T parameters)",
       k3_seed_config()},
      // The bench shape of the Kimi-Linear comparison with llama.cpp (scripts/bench-peers.sh kimi-linear,
      // whose GGUF of the same shape bench/peers/make_peer_gguf.cpp writes).
      {"kimi-linear-bench", "Kimi Linear bench shape: KDA, KDA, KDA, MLA at width 1024, MoE 2 x 1024 top-1 + shared",
       kimi_config({{"vocab_size", 1024},
                    {"hidden_size", 1024},
                    {"num_hidden_layers", 4},
                    {"linear_attn_config",
                     {{"kda_layers", {1, 2, 3}}, {"full_attn_layers", {4}}, {"num_heads", 8}, {"head_dim", 128},
                      {"short_conv_kernel_size", 4}}},
                    {"num_attention_heads", 8},
                    {"num_key_value_heads", 8},
                    {"kv_lora_rank", 512},
                    {"qk_nope_head_dim", 128},
                    {"qk_rope_head_dim", 64},
                    {"v_head_dim", 128},
                    {"intermediate_size", 1024},
                    {"num_experts", 2},
                    {"num_experts_per_token", 1},
                    {"moe_intermediate_size", 1024},
                    {"bos_token_id", 1},
                    {"eos_token_id", 2}})},
      {"qwen3-next", "Qwen3-Next: 3 Gated DeltaNet : 1 gated attention (GQA, partial RoPE), MoE 8 x 256 top-2 + gated shared",
       qwen3_next_config({}), true},
      // The bench shape of issue #36, run against llama.cpp by scripts/bench-peers.sh (whose GGUF of
      // the same shape bench/peers/make_peer_gguf.cpp writes).
      {"qwen3-next-bench", "Qwen3-Next bench shape: GDN, GDN, GDN, attention at width 1024, MoE 2 x 1024 top-1 + gated shared 512",
       qwen3_next_config({{"vocab_size", 1024},
                          {"hidden_size", 1024},
                          {"num_hidden_layers", 4},
                          {"num_attention_heads", 8},
                          {"num_key_value_heads", 8},
                          {"head_dim", 128},
                          {"partial_rotary_factor", 1.0},
                          {"rope_theta", 10000.0},
                          {"linear_num_key_heads", 8},
                          {"linear_num_value_heads", 8},
                          {"linear_key_head_dim", 128},
                          {"linear_value_head_dim", 128},
                          {"num_experts", 2},
                          {"num_experts_per_tok", 1},
                          {"moe_intermediate_size", 1024},
                          {"shared_expert_intermediate_size", 512},
                          {"rms_norm_eps", 1e-5},
                          {"bos_token_id", 1},
                          {"eos_token_id", 2}})},
  };
  return p;
}

std::string preset_names() {
  std::string s;
  for (const auto& p : presets()) s += (s.empty() ? "" : ", ") + p.name;
  return s;
}

void init_random(Model& m, uint64_t seed, DType dtype) {
  // Each block of a tensor has its own stream, so the values do not depend on the thread count.
  constexpr int64_t kBlock = 1 << 16;
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape& shape, layers::Init init) {
    // An MXFP4 pair: random e2m1 codes, and block scales 2^-8 or 2^-7 (values of about the 0.02
    // scale of the float weights).
    const bool packed = name.ends_with(".weight_packed"), scale = name.ends_with(".weight_scale");
    if (packed || scale) {
      t = Tensor::empty(DType::U8, shape);
      uint8_t* b = static_cast<uint8_t*>(t.raw_mut());
      Rng rng(seed ^ hash_name(name));
      for (int64_t i = 0; i < t.numel(); ++i) {
        const uint32_t r = uint32_t(rng.uniform() * 256.0) & 255u;
        b[i] = uint8_t(packed ? r : 119u + (r & 1u));
      }
      return;
    }
    Tensor f = Tensor::empty(DType::F32, shape);
    float* d = f.data<float>();
    const uint64_t stream = seed ^ hash_name(name);
    const int64_t n = f.numel();
    parallel_for((n + kBlock - 1) / kBlock, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        Rng rng(stream + uint64_t(b) * 0x9e3779b97f4a7c15ull);
        for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i)
          d[i] = init == layers::Init::Ones    ? 1.0f
                 : init == layers::Init::Zeros ? 0.0f
                 : init == layers::Init::Normal ? 0.02f * rng.normal()
                                                : custom_init(name, rng);
      }
    });
    t = dtype == DType::F32 ? std::move(f) : convert(f, dtype);
  });
  prepare(m, false);
}

Model preset_skeleton(const std::string& name) {
  for (const auto& p : presets()) {
    if (p.name != name) continue;
    const nlohmann::json j = nlohmann::json::parse(p.config_json);
    const std::string type = j["model_type"];
    const ArchBuilder* build = find_arch(type);
    LINEAGE_CHECK(build, "preset ", name, " names unknown model_type ", type);
    return (*build)(ArchInput{ConfigFields(j, "preset " + name), [](const std::string&) { return false; }});
  }
  throw Error(cat("unknown preset \"", name, "\"; expected one of: ", preset_names()));
}

Model make_preset(const std::string& name, uint64_t seed, DType dtype) {
  Model m = preset_skeleton(name);
  init_random(m, seed, dtype);
  m.config.config_hash = hash64(cat("preset ", name, " seed ", seed, " dtype ", dtype_name(dtype)));
  prepare(m, true);  // owned, as --no-mmap's
  return m;
}

}  // namespace lineage::model
