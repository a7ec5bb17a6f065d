// Writes a GGUF of one of llama.cpp's architectures with seeded random weights, in the shape of one
// of lineage's bench presets, for the side-by-side benchmark (scripts/bench-peers.sh):
//
//   qwen3next     lineage's `qwen3-next-bench`
//   kimi-linear   lineage's `kimi-linear-bench`
//   gpt2          lineage's `gpt2-124m` (GPT-2 small, its 50,257-token vocabulary; with `--vocab DIR`
//                 (encoder.json / vocab.json and vocab.bpe / merges.txt, GPT-2's own files) the file
//                 carries GPT-2's tokenizer as convert_hf_to_gguf.py writes it, so that llama-server
//                 can answer in text; without, `no_vocab`: llama-bench feeds token ids)
//
// Not part of lineage's build: scripts/install-llama-cpp.sh compiles it against the llama.cpp
// reference in ~/.cache/lineage (ggml's public gguf.h / ggml.h, linked with libggml-base.a).
//
// Why a program of our own: llama.cpp's tests/test-llama-archs.cpp builds its random models in
// memory (a gguf_context of hyperparameters -> llama_model_init_from_user, every tensor F32 and
// filled with N(0, 0.01) from std::mt19937(seed ^ std::hash<std::string>(name))), and with `-o DIR`
// saves them (llama_model_save_to_file), but only in its own fixed shape (qwen3next: width 256,
// 2 layers, 2 heads, SSM inner 256; kimi-linear: width 128, 1 head). This writes the bench shapes
// instead, with the tensor sets llama.cpp's converters write for the published checkpoints and the
// values drawn as test-llama-archs draws them, with two changes that make the model a healthy one
// (lineage reads the same file, and refuses what no converter writes): every norm weight is
// 1 + N(0, 0.01) (the converters store RMSNorm and LayerNorm multipliers, near 1, not near 0), and
// ssm_a is −exp(N(0, 0.01)) (stored as −exp(A_log): negative). llama.cpp's loader checks every name,
// shape and the tensor count when llama-bench loads the file.
//
// qwen3next (src/lineage/model/archs/presets.cpp, "qwen3-next-bench"): 4 layers of width 1024,
// layers 0-2 Gated DeltaNet (8 key and 8 value heads of 128, conv 4), layer 3 gated full attention
// (8 heads, 8 KV heads of 128, RoPE on all 128 dims, theta 1e4); every layer a MoE of 2 experts of
// 1024, 1 active, + a gated shared expert of 512; vocab 1024; RMS eps 1e-5. Tensors as
// convert_hf_to_gguf.py writes a Qwen3-Next checkpoint (GDN: attn_qkv + attn_gate, attention: q
// (query + gate rows) / k / v / output, experts: gate / up / down separately).
//
// kimi-linear ("kimi-linear-bench"): 4 layers of width 1024, layers 0-2 KDA (8 heads of 128, short
// convolutions of 4 on q, k and v), layer 3 MLA (8 heads, kv_lora_rank 512, q·k heads 128 + 64 RoPE,
// v heads 128, no q LoRA); layer 0 a dense SwiGLU of 1024, layers 1-3 a MoE of 2 experts of 1024, 1
// active, sigmoid router with a score-correction bias, + one shared expert of 1024; vocab 1024; RMS
// eps 1e-5. Tensors and keys as conversion/kimi_linear.py writes them: the MLA converted to MQA for
// the latent KV cache (head_count_kv 1 on the MLA layer, 0 on the KDA ones; key_length 576,
// value_length 512), kv_b split into attn_k_b (transposed) and attn_v_b, the conv kernels
// [d_conv, 1, d_inner, 1], ssm_a [1, heads, 1, 1] (the stored -exp(A_log): random values as the
// test draws them).
//
// gpt2 ("gpt2-124m"): 12 layers of width 768, 12 heads, MLP 3072, learned positions of 1024, LM
// head tied to the embedding (no output.weight, as the converter writes GPT-2), LayerNorm eps 1e-5.
//
// usage: make-peer-gguf qwen3next|kimi-linear|gpt2 OUT.gguf [--type f32|f16|bf16] [--seed N]
//   --type: the matrices' type (default f32, as test-llama-archs); 1-D tensors, the conv kernels,
//   ssm_a and the routers stay f32, as the converters keep them.
#include "ggml.h"
#include "gguf.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace {

struct Spec {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] = the input (contiguous) dimension
  bool keep_f32;
};

// An architecture: its name, its tensors and its metadata keys.
struct Arch {
  const char* name;
  const char* preset;
  std::vector<Spec> (*specs)();
  void (*keys)(gguf_context* g);
};

std::string key(const char* arch, const char* suffix) { return std::string(arch) + "." + suffix; }
void set_u32(gguf_context* g, const char* arch, const char* k, uint32_t v) { gguf_set_val_u32(g, key(arch, k).c_str(), v); }
void set_f32(gguf_context* g, const char* arch, const char* k, float v) { gguf_set_val_f32(g, key(arch, k).c_str(), v); }

// The keys every architecture has: vocabulary, context, width, depth and the (dense) MLP's width.
void size_keys(gguf_context* g, const char* arch, uint32_t vocab, uint32_t ctx, uint32_t embd, uint32_t layers,
               uint32_t ff) {
  set_u32(g, arch, "vocab_size", vocab);
  set_u32(g, arch, "context_length", ctx);
  set_u32(g, arch, "embedding_length", embd);
  set_u32(g, arch, "block_count", layers);
  set_u32(g, arch, "feed_forward_length", ff);
}

// The embedding, the final norm and the LM head, untied.
std::vector<Spec> io_specs(int64_t embd, int64_t vocab) {
  return {{"token_embd.weight", {embd, vocab}, false}, {"output_norm.weight", {embd}, true},
          {"output.weight", {embd, vocab}, false}};
}

// --- qwen3next ----------------------------------------------------------------------------------

namespace qwen {
constexpr const char* kArch = "qwen3next";
constexpr uint32_t kVocab = 1024, kEmbd = 1024, kLayers = 4, kFullAttnInterval = 4;
constexpr uint32_t kHeads = 8, kHeadsKv = 8, kHeadDim = 128, kRot = 128;
constexpr float kRopeTheta = 10000.0f, kRmsEps = 1e-5f;
constexpr uint32_t kGdnKHeads = 8, kGdnVHeads = 8, kGdnHeadDim = 128, kConv = 4;
constexpr uint32_t kExperts = 2, kExpertsUsed = 1, kFfExp = 1024, kFfShexp = 512;

std::vector<Spec> specs() {
  const int64_t key_dim = int64_t(kGdnHeadDim) * kGdnKHeads, value_dim = int64_t(kGdnHeadDim) * kGdnVHeads;
  const int64_t conv_dim = 2 * key_dim + value_dim;
  std::vector<Spec> s = io_specs(kEmbd, kVocab);
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

void keys(gguf_context* g) {
  const char* a = kArch;
  size_keys(g, a, kVocab, 32768, kEmbd, kLayers, kFfExp);
  set_u32(g, a, "expert_feed_forward_length", kFfExp);
  set_u32(g, a, "expert_shared_feed_forward_length", kFfShexp);
  set_u32(g, a, "expert_count", kExperts);
  set_u32(g, a, "expert_used_count", kExpertsUsed);
  set_u32(g, a, "attention.head_count", kHeads);
  set_u32(g, a, "attention.head_count_kv", kHeadsKv);
  set_u32(g, a, "attention.key_length", kHeadDim);
  set_u32(g, a, "attention.value_length", kHeadDim);
  set_f32(g, a, "attention.layer_norm_rms_epsilon", kRmsEps);
  set_u32(g, a, "rope.dimension_count", kRot);
  set_f32(g, a, "rope.freq_base", kRopeTheta);
  set_u32(g, a, "ssm.conv_kernel", kConv);
  set_u32(g, a, "ssm.state_size", kGdnHeadDim);
  set_u32(g, a, "ssm.group_count", kGdnKHeads);
  set_u32(g, a, "ssm.time_step_rank", kGdnVHeads);
  set_u32(g, a, "ssm.inner_size", kGdnHeadDim * kGdnVHeads);
  set_u32(g, a, "full_attention_interval", kFullAttnInterval);
}
}  // namespace qwen

// --- kimi-linear --------------------------------------------------------------------------------

namespace kimi {
constexpr const char* kArch = "kimi-linear";
constexpr uint32_t kVocab = 1024, kEmbd = 1024, kLayers = 4, kMlaLayer = 3;  // 0-based: layers 0-2 KDA
constexpr uint32_t kHeads = 8, kKdaHeadDim = 128, kConv = 4;
constexpr uint32_t kKvLora = 512, kNope = 128, kRope = 64, kV = 128;
constexpr uint32_t kFf = 1024, kExperts = 2, kExpertsUsed = 1, kFfExp = 1024, kShared = 1;
constexpr float kRopeTheta = 10000.0f, kRmsEps = 1e-5f, kRoutedScale = 2.446f;

std::vector<Spec> specs() {
  const int64_t d_inner = int64_t(kKdaHeadDim) * kHeads;
  std::vector<Spec> s = io_specs(kEmbd, kVocab);
  for (uint32_t il = 0; il < kLayers; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    s.push_back({b + "attn_norm.weight", {kEmbd}, true});
    s.push_back({b + "ffn_norm.weight", {kEmbd}, true});
    if (il != kMlaLayer) {
      for (const char* c : {"q", "k", "v"}) s.push_back({b + "ssm_conv1d_" + c + ".weight", {kConv, 1, d_inner, 1}, true});
      for (const char* c : {"q", "k", "v"}) s.push_back({b + "attn_" + c + ".weight", {kEmbd, d_inner}, false});
      s.push_back({b + "ssm_f_a.weight", {kEmbd, kKdaHeadDim}, false});
      s.push_back({b + "ssm_f_b.weight", {kKdaHeadDim, d_inner}, false});
      s.push_back({b + "ssm_beta.weight", {kEmbd, kHeads}, false});
      s.push_back({b + "ssm_a", {1, kHeads, 1, 1}, true});
      s.push_back({b + "ssm_dt.bias", {d_inner}, true});
      s.push_back({b + "ssm_g_a.weight", {kEmbd, kKdaHeadDim}, false});
      s.push_back({b + "ssm_g_b.weight", {kKdaHeadDim, d_inner}, false});
      s.push_back({b + "ssm_norm.weight", {kKdaHeadDim}, true});
      s.push_back({b + "attn_output.weight", {d_inner, kEmbd}, false});
    } else {
      s.push_back({b + "attn_kv_a_norm.weight", {kKvLora}, true});
      s.push_back({b + "attn_q.weight", {kEmbd, int64_t(kHeads) * (kNope + kRope)}, false});
      s.push_back({b + "attn_kv_a_mqa.weight", {kEmbd, kKvLora + kRope}, false});
      s.push_back({b + "attn_k_b.weight", {kNope, kKvLora, kHeads}, false});
      s.push_back({b + "attn_v_b.weight", {kKvLora, kV, kHeads}, false});
      s.push_back({b + "attn_output.weight", {int64_t(kHeads) * kV, kEmbd}, false});
    }
    if (il == 0) {  // leading_dense_block_count 1
      s.push_back({b + "ffn_gate.weight", {kEmbd, kFf}, false});
      s.push_back({b + "ffn_up.weight", {kEmbd, kFf}, false});
      s.push_back({b + "ffn_down.weight", {kFf, kEmbd}, false});
    } else {
      s.push_back({b + "ffn_gate_inp.weight", {kEmbd, kExperts}, true});
      s.push_back({b + "exp_probs_b.bias", {kExperts}, true});
      s.push_back({b + "ffn_gate_exps.weight", {kEmbd, kFfExp, kExperts}, false});
      s.push_back({b + "ffn_up_exps.weight", {kEmbd, kFfExp, kExperts}, false});
      s.push_back({b + "ffn_down_exps.weight", {kFfExp, kEmbd, kExperts}, false});
      s.push_back({b + "ffn_gate_shexp.weight", {kEmbd, int64_t(kFfExp) * kShared}, false});
      s.push_back({b + "ffn_up_shexp.weight", {kEmbd, int64_t(kFfExp) * kShared}, false});
      s.push_back({b + "ffn_down_shexp.weight", {int64_t(kFfExp) * kShared, kEmbd}, false});
    }
  }
  return s;
}

void keys(gguf_context* g) {
  const char* a = kArch;
  size_keys(g, a, kVocab, 32768, kEmbd, kLayers, kFf);
  set_u32(g, a, "attention.head_count", kHeads);
  std::vector<uint32_t> kv(kLayers, 0);  // 0: a KDA layer; the MLA layer is MQA over its latent
  kv[kMlaLayer] = 1;
  gguf_set_arr_data(g, key(a, "attention.head_count_kv").c_str(), GGUF_TYPE_UINT32, kv.data(), kv.size());
  set_f32(g, a, "attention.layer_norm_rms_epsilon", kRmsEps);
  set_f32(g, a, "rope.freq_base", kRopeTheta);
  set_u32(g, a, "rope.dimension_count", kRope);
  set_u32(g, a, "attention.kv_lora_rank", kKvLora);
  set_u32(g, a, "attention.key_length", kKvLora + kRope);
  set_u32(g, a, "attention.value_length", kKvLora);
  set_u32(g, a, "attention.key_length_mla", kNope + kRope);
  set_u32(g, a, "attention.value_length_mla", kV);
  set_u32(g, a, "ssm.conv_kernel", kConv);
  set_u32(g, a, "kda.head_dim", kKdaHeadDim);
  set_u32(g, a, "expert_count", kExperts);
  set_u32(g, a, "expert_used_count", kExpertsUsed);
  set_u32(g, a, "expert_group_count", 1);
  set_u32(g, a, "expert_group_used_count", 1);
  set_u32(g, a, "expert_gating_func", 2);  // sigmoid
  set_u32(g, a, "expert_feed_forward_length", kFfExp);
  set_u32(g, a, "expert_shared_count", kShared);
  set_u32(g, a, "leading_dense_block_count", 1);
  set_f32(g, a, "expert_weights_scale", kRoutedScale);
  gguf_set_val_bool(g, key(a, "expert_weights_norm").c_str(), true);  // moe_renormalize
}
}  // namespace kimi

// --- gpt2 ---------------------------------------------------------------------------------------

namespace gpt2 {
constexpr const char* kArch = "gpt2";
constexpr uint32_t kVocab = 50257, kCtx = 1024, kEmbd = 768, kLayers = 12, kHeads = 12, kFf = 3072;
constexpr float kNormEps = 1e-5f;

std::vector<Spec> specs() {
  // Tied: no output.weight (llama.cpp then multiplies by token_embd), as the converter writes GPT-2.
  std::vector<Spec> s = {{"token_embd.weight", {kEmbd, kVocab}, false},
                         {"position_embd.weight", {kEmbd, kCtx}, false},
                         {"output_norm.weight", {kEmbd}, true},
                         {"output_norm.bias", {kEmbd}, true}};
  for (uint32_t il = 0; il < kLayers; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    for (const char* n : {"attn_norm", "ffn_norm"}) {
      s.push_back({b + n + ".weight", {kEmbd}, true});
      s.push_back({b + n + ".bias", {kEmbd}, true});
    }
    s.push_back({b + "attn_qkv.weight", {kEmbd, 3 * int64_t(kEmbd)}, false});
    s.push_back({b + "attn_qkv.bias", {3 * int64_t(kEmbd)}, true});
    s.push_back({b + "attn_output.weight", {kEmbd, kEmbd}, false});
    s.push_back({b + "attn_output.bias", {kEmbd}, true});
    s.push_back({b + "ffn_up.weight", {kEmbd, kFf}, false});
    s.push_back({b + "ffn_up.bias", {kFf}, true});
    s.push_back({b + "ffn_down.weight", {kFf, kEmbd}, false});
    s.push_back({b + "ffn_down.bias", {kEmbd}, true});
  }
  return s;
}

void keys(gguf_context* g) {
  const char* a = kArch;
  size_keys(g, a, kVocab, kCtx, kEmbd, kLayers, kFf);
  set_u32(g, a, "attention.head_count", kHeads);
  set_f32(g, a, "attention.layer_norm_epsilon", kNormEps);
}
}  // namespace gpt2

const Arch kArchs[] = {{qwen::kArch, "qwen3-next-bench", qwen::specs, qwen::keys},
                       {kimi::kArch, "kimi-linear-bench", kimi::specs, kimi::keys},
                       {gpt2::kArch, "gpt2-124m", gpt2::specs, gpt2::keys}};

// test-llama-archs.cpp's set_tensor_data: N(0, 0.01) from mt19937(seed ^ hash(name)); then norm weights
// moved to 1 + that and ssm_a to −exp of it (a healthy model: see the top of the file).
void fill(ggml_tensor* t, size_t seed) {
  seed ^= std::hash<std::string>{}(t->name);
  std::mt19937 gen(seed);
  std::normal_distribution<float> dis(0.0f, 1.0e-2f);
  const int64_t n = ggml_nelements(t);
  std::vector<float> tmp(n);
  for (int64_t i = 0; i < n; ++i) tmp[i] = dis(gen);
  const std::string name = t->name;
  const auto ends = [&](const char* s) { return name.size() >= std::strlen(s) && name.compare(name.size() - std::strlen(s), std::string::npos, s) == 0; };
  if (ends("norm.weight"))
    for (float& v : tmp) v += 1.0f;
  else if (ends("ssm_a"))
    for (float& v : tmp) v = -std::exp(v);
  switch (t->type) {
    case GGML_TYPE_F32: std::memcpy(t->data, tmp.data(), n * sizeof(float)); break;
    case GGML_TYPE_F16: ggml_fp32_to_fp16_row(tmp.data(), static_cast<ggml_fp16_t*>(t->data), n); break;
    case GGML_TYPE_BF16: ggml_fp32_to_bf16_row_ref(tmp.data(), static_cast<ggml_bf16_t*>(t->data), n); break;
    default: std::fprintf(stderr, "unsupported type\n"); std::exit(1);
  }
}

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s qwen3next|kimi-linear|gpt2 OUT.gguf [--type f32|f16|bf16] [--seed N] [--vocab DIR]\n",
               argv0);
  return 2;
}

std::string first_file(const std::string& dir, const char* a, const char* b) {
  for (const char* name : {a, b}) {
    const std::string p = dir + "/" + name;
    if (std::ifstream(p).good()) return p;
  }
  std::fprintf(stderr, "%s: neither %s nor %s\n", dir.c_str(), a, b);
  std::exit(1);
}

// GPT-2's byte-level BPE as convert_hf_to_gguf.py writes it (model "gpt2", pre-tokenizer "gpt-2"):
// the tokens by id, their types (<|endoftext|> a control token, the rest normal), the merges as
// "a b" strings, and <|endoftext|> as BOS, EOS and EOT.
bool write_gpt2_vocab(gguf_context* g, const std::string& dir, uint32_t vocab_size) {
  const nlohmann::json enc = nlohmann::json::parse(std::ifstream(first_file(dir, "encoder.json", "vocab.json")));
  std::vector<std::string> tokens(enc.size());
  for (const auto& [piece, id] : enc.items()) {
    const size_t i = id.get<size_t>();
    if (i >= tokens.size() || !tokens[i].empty()) return std::fprintf(stderr, "bad id %zu in the vocabulary\n", i), false;
    tokens[i] = piece;
  }
  if (tokens.size() != vocab_size)
    return std::fprintf(stderr, "the vocabulary has %zu tokens, the model %u\n", tokens.size(), vocab_size), false;
  std::vector<std::string> merges;
  std::ifstream bpe(first_file(dir, "vocab.bpe", "merges.txt"));
  for (std::string line; std::getline(bpe, line);)
    if (!line.empty() && line.rfind("#version", 0) != 0) merges.push_back(line);
  std::vector<const char*> tp, mp;
  for (const auto& t : tokens) tp.push_back(t.c_str());
  for (const auto& m : merges) mp.push_back(m.c_str());
  std::vector<int32_t> types(tokens.size(), 1);  // LLAMA_TOKEN_TYPE_NORMAL
  const uint32_t eot = uint32_t(tokens.size() - 1);
  if (tokens[eot] != "<|endoftext|>") return std::fprintf(stderr, "the last token is not <|endoftext|>\n"), false;
  types[eot] = 3;  // LLAMA_TOKEN_TYPE_CONTROL
  gguf_set_val_str(g, "tokenizer.ggml.model", "gpt2");
  gguf_set_val_str(g, "tokenizer.ggml.pre", "gpt-2");
  gguf_set_arr_str(g, "tokenizer.ggml.tokens", tp.data(), tp.size());
  gguf_set_arr_data(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types.data(), types.size());
  gguf_set_arr_str(g, "tokenizer.ggml.merges", mp.data(), mp.size());
  gguf_set_val_u32(g, "tokenizer.ggml.bos_token_id", eot);
  gguf_set_val_u32(g, "tokenizer.ggml.eos_token_id", eot);
  gguf_set_val_u32(g, "tokenizer.ggml.eot_token_id", eot);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string arch_name, out, type_name = "f32", vocab_dir;
  size_t seed = 42;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--type" || a == "-t") && i + 1 < argc) type_name = argv[++i];
    else if ((a == "--seed" || a == "-s") && i + 1 < argc) seed = std::stoull(argv[++i]);
    else if (a == "--vocab" && i + 1 < argc) vocab_dir = argv[++i];
    else if (a == "-h" || a == "--help") return usage(argv[0]), 0;
    else if (!a.empty() && a[0] != '-' && arch_name.empty()) arch_name = a;
    else if (!a.empty() && a[0] != '-' && out.empty()) out = a;
    else return usage(argv[0]);
  }
  if (out.empty()) return usage(argv[0]);
  const Arch* arch = nullptr;
  for (const Arch& a : kArchs)
    if (arch_name == a.name) arch = &a;
  if (!arch) return std::fprintf(stderr, "unknown architecture '%s'\n", arch_name.c_str()), usage(argv[0]);
  ggml_type wtype;
  uint32_t file_type;  // llama_ftype: ALL_F32 = 0, MOSTLY_F16 = 1, MOSTLY_BF16 = 32
  if (type_name == "f32") wtype = GGML_TYPE_F32, file_type = 0;
  else if (type_name == "f16") wtype = GGML_TYPE_F16, file_type = 1;
  else if (type_name == "bf16") wtype = GGML_TYPE_BF16, file_type = 32;
  else return usage(argv[0]);

  const std::vector<Spec> specs = arch->specs();
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
  gguf_set_val_str(g, "general.architecture", arch->name);
  gguf_set_val_str(g, "general.name", (std::string("lineage ") + arch->preset + " (random weights)").c_str());
  gguf_set_val_u32(g, "general.file_type", file_type);
  arch->keys(g);
  if (vocab_dir.empty()) {
    gguf_set_val_str(g, "tokenizer.ggml.model", "no_vocab");  // as test-llama-archs: vocab_size dummy tokens
  } else {
    if (arch->name != std::string(gpt2::kArch))
      return std::fprintf(stderr, "--vocab: only gpt2 has a tokenizer here\n"), 2;
    if (!write_gpt2_vocab(g, vocab_dir, gpt2::kVocab)) return 1;
  }

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
  std::printf("wrote %s: %s, %zu tensors, %.1f MiB, matrices %s, seed %zu\n", out.c_str(), arch->name, specs.size(),
              bytes / 1048576.0, type_name.c_str(), seed);
  gguf_free(g);
  ggml_free(ctx);
  return 0;
}
