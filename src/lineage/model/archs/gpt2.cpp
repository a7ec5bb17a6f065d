// GPT-2 (HF GPT2LMHeadModel): config fields, defaults and tensor names.
// Spec: shared/spec/attention-mla-moe-attnres.md §1; reference/gpt2.py.
#include "lineage/core/error.h"
#include "lineage/model/archs/arch.h"
#include "lineage/model/archs/gguf_map.h"

namespace lineage::model {

Model build_gpt2(const ArchInput& in) {
  const ConfigFields& c = in.config;
  Model m;
  // HF GPT2Config's defaults (GPT-2 small) for every field left out.
  const int64_t D = c.integer("n_embd", 768, limits::kWidth), L = c.integer("n_layer", 12, limits::kLayers);
  const int64_t H = c.integer("n_head", 12, limits::kHeads), V = c.integer("vocab_size", 50257, limits::kVocab);
  const int64_t P = c.integer("n_positions", 1024, limits::kPositions);
  const int64_t F = c.integer("n_inner", 4 * D, limits::kWidth);
  if (D % H) c.fail("n_head", cat("a divisor of n_embd = ", D));
  const float eps = float(c.positive("layer_norm_epsilon", 1e-5, 1.0));
  const std::string act_name = c.string("activation_function", "gelu_new");
  kernels::Activation act;
  if (act_name == "gelu_new" || act_name == "gelu_pytorch_tanh" || act_name == "gelu_fast")
    act = kernels::Activation::GeluTanh;
  else if (act_name == "gelu")
    act = kernels::Activation::GeluErf;
  else if (act_name == "relu")
    act = kernels::Activation::Relu;
  else if (act_name == "silu" || act_name == "swish")
    act = kernels::Activation::Silu;
  else
    c.fail("activation_function", "one of gelu_new, gelu_pytorch_tanh, gelu_fast, gelu, relu, silu");
  if (c.boolean("scale_attn_by_inverse_layer_idx", false) || c.boolean("reorder_and_upcast_attn", false))
    c.fail("scale_attn_by_inverse_layer_idx", "false (not supported yet)");

  // openai-community/gpt2 names tensors "wte.weight"; distilgpt2 and exports of GPT2LMHeadModel
  // prefix them with "transformer.".
  const std::string p = in.has_tensor("transformer.wte.weight") ? "transformer." : "";
  m.config.model_type = "gpt2";
  m.config.vocab_size = V;
  m.config.d_model = D;
  m.config.max_positions = P;
  m.config.max_positions_field = "n_positions";
  m.config.layers_field = "n_layer";
  // Tied unless the config says otherwise, as HF does: then a stored lm_head.weight is ignored.
  m.config.tied_lm_head = c.boolean("tie_word_embeddings", true);
  m.config.bos_token_id = c.token_id("bos_token_id", V, 50256);
  m.config.eos_token_id = c.token_id("eos_token_id", V, 50256);
  m.config.description = cat("GPT-2: ", L, " layers, d_model ", D, ", ", H, " heads, softmax attention + KV cache, ",
                             act_name, " MLP ", F);
  m.names = {p + "wte.weight", p + "wpe.weight", p + "h.", p + "ln_f", "lm_head.weight"};
  m.binding.ignore_suffixes = {".attn.bias", ".attn.masked_bias"};  // causal-mask buffers, not parameters
  if (m.config.tied_lm_head) m.binding.ignore_suffixes.push_back("lm_head.weight");

  const layers::Norm ln{layers::Norm::Kind::Layer, D, eps, {}, {}};
  m.final_norm = ln;
  Block b;  // every layer is this block, weights still empty
  b.names = {"ln_1", "attn", "ln_2", "mlp"};
  b.norm1 = b.norm2 = ln;
  layers::Attention a;
  a.config = {D, H, D / H, c.boolean("scale_attn_weights", true), c.count("conv_size", 0, limits::kConvSize)};
  layers::Mlp mlp;
  mlp.config = {D, F, act};
  // GPT-2's Conv1D stores every matrix [in, out] (the only family that does): bound as the file
  // has them, transposed once to [out, in] where the weights are owned (model::prepare).
  for (kernels::Matrix* w : {&a.weights.c_attn, &a.weights.c_proj, &mlp.weights.c_fc, &mlp.weights.c_proj})
    w->layout = kernels::Layout::InOut;
  b.mixer = std::move(a);
  b.ffn = std::move(mlp);
  m.blocks.assign(size_t(L), b);
  return m;
}

// llama.cpp's `gpt2` (convert_hf_to_gguf.py's GPT2Model, llama.cpp's src/models/gpt2.cpp): the
// hyper-parameters in gpt2.* keys, the tensors renamed, the four Conv1D matrices transposed to
// [out, in] (bound so here: no copy), the causal-mask buffers dropped; a tied head has no
// output.weight (llama.cpp then multiplies by token_embd).
GgufMapped gguf_gpt2(const GgufSource& in) {
  GgufMapped m;
  const int64_t D = in.integer("embedding_length", limits::kWidth);
  const int64_t L = in.integer("block_count", limits::kLayers);
  m.config = {{"model_type", "gpt2"},
              {"n_embd", D},
              {"n_layer", L},
              {"n_head", in.integer("attention.head_count", limits::kHeads)},
              {"n_positions", in.integer("context_length", limits::kPositions)},
              {"n_inner", in.integer("feed_forward_length", 4 * D, limits::kWidth)},
              {"layer_norm_epsilon", in.number("attention.layer_norm_epsilon", 1e-5)},
              {"activation_function", "gelu_new"},
              {"tie_word_embeddings", !in.tensors.count("output.weight")}};
  const auto it = in.tensors.find("token_embd.weight");
  if (it != in.tensors.end() && it->second.size() == 2) m.config["vocab_size"] = it->second[0];
  auto& t = m.tensors;
  t.push_back({"wte.weight", "token_embd.weight", {}});
  t.push_back({"wpe.weight", "position_embd.weight", {}});
  for (const char* w : {".weight", ".bias"}) t.push_back({cat("ln_f", w), cat("output_norm", w), {}});
  if (in.tensors.count("output.weight")) t.push_back({"lm_head.weight", "output.weight", {}});
  for (int64_t l = 0; l < L; ++l) {
    const std::string h = cat("h.", l, "."), b = cat("blk.", l, ".");
    for (const char* w : {".weight", ".bias"}) {
      t.push_back({cat(h, "ln_1", w), cat(b, "attn_norm", w), {}});
      t.push_back({cat(h, "ln_2", w), cat(b, "ffn_norm", w), {}});
      t.push_back({cat(h, "attn.c_attn", w), cat(b, "attn_qkv", w), {}});
      t.push_back({cat(h, "attn.c_proj", w), cat(b, "attn_output", w), {}});
      t.push_back({cat(h, "mlp.c_fc", w), cat(b, "ffn_up", w), {}});
      t.push_back({cat(h, "mlp.c_proj", w), cat(b, "ffn_down", w), {}});
    }
  }
  m.adjust = [](Model& model) {
    for (Block& b : model.blocks) {
      auto& a = std::get<layers::Attention>(b.mixer);
      auto& mlp = std::get<layers::Mlp>(b.ffn);
      for (kernels::Matrix* w : {&a.weights.c_attn, &a.weights.c_proj, &mlp.weights.c_fc, &mlp.weights.c_proj})
        w->layout = kernels::Layout::OutIn;
    }
  };
  return m;
}

}  // namespace lineage::model
