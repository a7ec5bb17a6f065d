// Writes a GGUF of llama.cpp's `qwen3next` architecture with seeded random weights, in the shape of
// lineage's `qwen3-next-bench` preset, for the side-by-side benchmark (scripts/bench-peers.sh).
//
// Not part of lineage's build: scripts/install-llama-cpp.sh compiles it against the llama.cpp
// reference in ~/.cache/lineage (ggml's public gguf.h / ggml.h, linked with libggml-base.a).
//
// Why a program of our own: llama.cpp's tests/test-llama-archs.cpp builds its random models in
// memory (a gguf_context of hyperparameters -> llama_model_init_from_user, every tensor F32 and
// filled with N(0, 0.01) from std::mt19937(seed ^ std::hash<std::string>(name))), and with `-o DIR`
// saves them (llama_model_save_to_file), but only in its own fixed shape (qwen3next: width 256,
// 2 layers, 2 heads, SSM inner 256). This writes the bench shape instead, with the tensor set
// convert_hf_to_gguf.py writes for a Qwen3-Next checkpoint (GDN: attn_qkv + attn_gate, attention:
// q (query + gate rows) / k / v / output, experts: gate / up / down separately) and the values drawn
// exactly as test-llama-archs draws them. llama.cpp's loader checks every name, shape and the
// tensor count when llama-bench loads the file.
//
// Shape (src/lineage/model/archs/presets.cpp, "qwen3-next-bench"): 4 layers of width 1024, layers
// 0-2 Gated DeltaNet (8 key and 8 value heads of 128, conv 4), layer 3 gated full attention (8 heads,
// 8 KV heads of 128, RoPE on all 128 dims, theta 1e4); every layer a MoE of 2 experts of 1024, 1
// active, + a gated shared expert of 512; vocab 1024; RMS eps 1e-5.
//
// usage: make-qwen3next-gguf OUT.gguf [--type f32|f16|bf16] [--seed N]
//   --type: the matrices' type (default f32, as test-llama-archs); 1-D tensors, the conv kernel
//   and the router stay f32, as the converter keeps them.
#include "ggml.h"
#include "gguf.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr const char* kArch = "qwen3next";
constexpr uint32_t kVocab = 1024, kEmbd = 1024, kLayers = 4, kFullAttnInterval = 4;
constexpr uint32_t kHeads = 8, kHeadsKv = 8, kHeadDim = 128, kRot = 128;
constexpr float kRopeTheta = 10000.0f, kRmsEps = 1e-5f;
constexpr uint32_t kGdnKHeads = 8, kGdnVHeads = 8, kGdnHeadDim = 128, kConv = 4;
constexpr uint32_t kExperts = 2, kExpertsUsed = 1, kFfExp = 1024, kFfShexp = 512;

std::string key(const char* suffix) { return std::string(kArch) + "." + suffix; }

struct Spec {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] = the input (contiguous) dimension
  bool keep_f32;
};

std::vector<Spec> tensor_specs() {
  const int64_t key_dim = int64_t(kGdnHeadDim) * kGdnKHeads, value_dim = int64_t(kGdnHeadDim) * kGdnVHeads;
  const int64_t conv_dim = 2 * key_dim + value_dim;
  std::vector<Spec> s;
  s.push_back({"token_embd.weight", {kEmbd, kVocab}, false});
  s.push_back({"output_norm.weight", {kEmbd}, true});
  s.push_back({"output.weight", {kEmbd, kVocab}, false});
  for (uint32_t il = 0; il < kLayers; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    s.push_back({b + "attn_norm.weight", {kEmbd}, true});
    s.push_back({b + "post_attention_norm.weight", {kEmbd}, true});
    const bool recurrent = (il + 1) % kFullAttnInterval != 0;
    if (recurrent) {
      s.push_back({b + "attn_qkv.weight", {kEmbd, conv_dim}, false});
      s.push_back({b + "attn_gate.weight", {kEmbd, value_dim}, false});
      s.push_back({b + "ssm_conv1d.weight", {kConv, conv_dim}, true});
      s.push_back({b + "ssm_dt.bias", {kGdnVHeads}, true});
      s.push_back({b + "ssm_a", {kGdnVHeads}, true});
      s.push_back({b + "ssm_ba.weight", {kEmbd, 2 * int64_t(kGdnVHeads)}, false});
      s.push_back({b + "ssm_norm.weight", {kGdnHeadDim}, true});
      s.push_back({b + "ssm_out.weight", {value_dim, kEmbd}, false});
    } else {
      s.push_back({b + "attn_q.weight", {kEmbd, 2 * int64_t(kHeadDim) * kHeads}, false});  // query + gate
      s.push_back({b + "attn_k.weight", {kEmbd, int64_t(kHeadDim) * kHeadsKv}, false});
      s.push_back({b + "attn_v.weight", {kEmbd, int64_t(kHeadDim) * kHeadsKv}, false});
      s.push_back({b + "attn_output.weight", {int64_t(kHeadDim) * kHeads, kEmbd}, false});
      s.push_back({b + "attn_q_norm.weight", {kHeadDim}, true});
      s.push_back({b + "attn_k_norm.weight", {kHeadDim}, true});
    }
    s.push_back({b + "ffn_gate_inp.weight", {kEmbd, kExperts}, true});
    s.push_back({b + "ffn_gate_exps.weight", {kEmbd, kFfExp, kExperts}, false});
    s.push_back({b + "ffn_up_exps.weight", {kEmbd, kFfExp, kExperts}, false});
    s.push_back({b + "ffn_down_exps.weight", {kFfExp, kEmbd, kExperts}, false});
    s.push_back({b + "ffn_gate_inp_shexp.weight", {kEmbd}, true});
    s.push_back({b + "ffn_gate_shexp.weight", {kEmbd, kFfShexp}, false});
    s.push_back({b + "ffn_up_shexp.weight", {kEmbd, kFfShexp}, false});
    s.push_back({b + "ffn_down_shexp.weight", {kFfShexp, kEmbd}, false});
  }
  return s;
}

// test-llama-archs.cpp's set_tensor_data: N(0, 0.01) from mt19937(seed ^ hash(name)).
void fill(ggml_tensor* t, size_t seed) {
  seed ^= std::hash<std::string>{}(t->name);
  std::mt19937 gen(seed);
  std::normal_distribution<float> dis(0.0f, 1.0e-2f);
  const int64_t n = ggml_nelements(t);
  std::vector<float> tmp(n);
  for (int64_t i = 0; i < n; ++i) tmp[i] = dis(gen);
  switch (t->type) {
    case GGML_TYPE_F32: std::memcpy(t->data, tmp.data(), n * sizeof(float)); break;
    case GGML_TYPE_F16: ggml_fp32_to_fp16_row(tmp.data(), static_cast<ggml_fp16_t*>(t->data), n); break;
    case GGML_TYPE_BF16: ggml_fp32_to_bf16_row_ref(tmp.data(), static_cast<ggml_bf16_t*>(t->data), n); break;
    default: std::fprintf(stderr, "unsupported type\n"); std::exit(1);
  }
}

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s OUT.gguf [--type f32|f16|bf16] [--seed N]\n", argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, type_name = "f32";
  size_t seed = 42;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--type" || a == "-t") && i + 1 < argc) type_name = argv[++i];
    else if ((a == "--seed" || a == "-s") && i + 1 < argc) seed = std::stoull(argv[++i]);
    else if (a == "-h" || a == "--help") return usage(argv[0]), 0;
    else if (!a.empty() && a[0] != '-' && out.empty()) out = a;
    else return usage(argv[0]);
  }
  if (out.empty()) return usage(argv[0]);
  ggml_type wtype;
  uint32_t file_type;  // llama_ftype: ALL_F32 = 0, MOSTLY_F16 = 1, MOSTLY_BF16 = 32
  if (type_name == "f32") wtype = GGML_TYPE_F32, file_type = 0;
  else if (type_name == "f16") wtype = GGML_TYPE_F16, file_type = 1;
  else if (type_name == "bf16") wtype = GGML_TYPE_BF16, file_type = 32;
  else return usage(argv[0]);

  const std::vector<Spec> specs = tensor_specs();
  size_t bytes = 0;
  for (const Spec& s : specs) {
    int64_t n = 1;
    for (int64_t d : s.ne) n *= d;
    bytes += ggml_row_size(s.keep_f32 ? GGML_TYPE_F32 : wtype, n) + 64;
  }
  ggml_init_params params{bytes + specs.size() * ggml_tensor_overhead() + (1 << 20), nullptr, false};
  ggml_context* ctx = ggml_init(params);
  if (ctx == nullptr) return std::fprintf(stderr, "ggml_init failed\n"), 1;

  gguf_context* g = gguf_init_empty();
  gguf_set_val_str(g, "general.architecture", kArch);
  gguf_set_val_str(g, "general.name", "lineage qwen3-next-bench (random weights)");
  gguf_set_val_u32(g, "general.file_type", file_type);
  gguf_set_val_u32(g, key("vocab_size").c_str(), kVocab);
  gguf_set_val_u32(g, key("context_length").c_str(), 32768);
  gguf_set_val_u32(g, key("embedding_length").c_str(), kEmbd);
  gguf_set_val_u32(g, key("block_count").c_str(), kLayers);
  gguf_set_val_u32(g, key("feed_forward_length").c_str(), kFfExp);
  gguf_set_val_u32(g, key("expert_feed_forward_length").c_str(), kFfExp);
  gguf_set_val_u32(g, key("expert_shared_feed_forward_length").c_str(), kFfShexp);
  gguf_set_val_u32(g, key("expert_count").c_str(), kExperts);
  gguf_set_val_u32(g, key("expert_used_count").c_str(), kExpertsUsed);
  gguf_set_val_u32(g, key("attention.head_count").c_str(), kHeads);
  gguf_set_val_u32(g, key("attention.head_count_kv").c_str(), kHeadsKv);
  gguf_set_val_u32(g, key("attention.key_length").c_str(), kHeadDim);
  gguf_set_val_u32(g, key("attention.value_length").c_str(), kHeadDim);
  gguf_set_val_f32(g, key("attention.layer_norm_rms_epsilon").c_str(), kRmsEps);
  gguf_set_val_u32(g, key("rope.dimension_count").c_str(), kRot);
  gguf_set_val_f32(g, key("rope.freq_base").c_str(), kRopeTheta);
  gguf_set_val_u32(g, key("ssm.conv_kernel").c_str(), kConv);
  gguf_set_val_u32(g, key("ssm.state_size").c_str(), kGdnHeadDim);
  gguf_set_val_u32(g, key("ssm.group_count").c_str(), kGdnKHeads);
  gguf_set_val_u32(g, key("ssm.time_step_rank").c_str(), kGdnVHeads);
  gguf_set_val_u32(g, key("ssm.inner_size").c_str(), kGdnHeadDim * kGdnVHeads);
  gguf_set_val_u32(g, key("full_attention_interval").c_str(), kFullAttnInterval);
  gguf_set_val_str(g, "tokenizer.ggml.model", "no_vocab");  // as test-llama-archs: vocab_size dummy tokens

  for (const Spec& s : specs) {
    const ggml_type t = s.keep_f32 ? GGML_TYPE_F32 : wtype;
    ggml_tensor* x = ggml_new_tensor(ctx, t, int(s.ne.size()), s.ne.data());
    ggml_set_name(x, s.name.c_str());
    fill(x, seed);
    gguf_add_tensor(g, x);
  }
  if (!gguf_write_to_file(g, out.c_str(), false)) {
    std::fprintf(stderr, "could not write %s\n", out.c_str());
    return 1;
  }
  std::printf("wrote %s: qwen3next, %zu tensors, %.1f MiB, matrices %s, seed %zu\n", out.c_str(), specs.size(),
              bytes / 1048576.0, type_name.c_str(), seed);
  gguf_free(g);
  ggml_free(ctx);
  return 0;
}
