// Room model/: a whole network built from layers: Model and Block (this file), the per-sequence
// state and its pool (state_pool.h), the residual stream (residual.h), a step's activations
// (workspace.h), the forward (forward.h) and what a model costs (accounting.h); archs/ maps each
// checkpoint family's config.json and tensor names onto them (one file per family, registry.cpp
// lists them), and the binding table says where each parameter sits in the files. Uses layers,
// kernels and core.
//
// The model: embeddings, a stack of blocks (each a token mixer and a channel mixer behind their
// norms), the final norm and the LM head, and the configuration they were built from. Weights only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "lineage/kernels/matrix.h"
#include "lineage/layers/attn_res.h"
#include "lineage/layers/common.h"
#include "lineage/layers/ffn/gated_mlp.h"
#include "lineage/layers/ffn/mlp.h"
#include "lineage/layers/ffn/moe.h"
#include "lineage/layers/mixers/attention.h"
#include "lineage/layers/mixers/delta_rule.h"
#include "lineage/layers/mixers/gated_attention.h"
#include "lineage/layers/mixers/mla.h"
#include "lineage/layers/norm.h"
#include "lineage/model/binding.h"
#include "lineage/model/residual.h"

namespace lineage::model {

struct SequenceState;  // state_pool.h

// Adding a mixer is a compile error at every std::visit that does not handle it.
using TokenMixer = std::variant<layers::Attention, layers::DeltaRule, layers::Mla, layers::GatedAttention>;
using ChannelMixer = std::variant<layers::Mlp, layers::GatedMlp, layers::Moe>;

// Pre-norm block: mixer(norm1(·)) then ffn(norm2(·)), each a sublayer of the model's residual
// stream (residual.h: plain x += f(norm(x)), or Block Attention Residuals with K3, whose
// two mixes, before the mixer and before the ffn, are the block's attn_res and mlp_res).
struct Block {
  struct Names {
    std::string norm1, mixer, norm2, ffn;  // checkpoint sub-prefixes, e.g. "ln_1", "attn", "ln_2", "mlp"
    // Block Attention Residuals: each mix's norm and pseudo-query (K3: "self_attention_res_norm", ...);
    // empty for the other families, which may leave them out of an initializer list.
    std::string attn_res_norm = {}, attn_res_proj = {}, mlp_res_norm = {}, mlp_res_proj = {};
  };
  layers::Norm norm1, norm2;
  TokenMixer mixer;
  ChannelMixer ffn;
  layers::AttnRes attn_res, mlp_res;  // defined() with ResidualKind::BlockAttention
  Names names;

  void for_each_tensor(const std::string& prefix, const layers::TensorVisitor& f);
};

struct ModelConfig {
  std::string model_type;             // config.json "model_type" ("gpt2", ...)
  std::string description;            // one line for `lineage info`
  int64_t vocab_size = 0, d_model = 0;
  int64_t max_positions = 0;          // context limit; 0 = none (recurrent models)
  std::string max_positions_field;    // the config.json field that sets it, for error messages
  std::string layers_field;           // the config.json field that sets the number of blocks
  bool tied_lm_head = true;
  std::optional<int32_t> bos_token_id, eos_token_id;
  ResidualKind residual = ResidualKind::Plain;
  // BlockAttention: sublayers per block (2 per decoder layer: fla's attnres_block_size; K3's
  // attn_res_block_size counts decoder layers, twice this).
  int64_t attn_res_block = 0;
  // Parameters the checkpoint holds beyond the text model (K3's vision tower and projector): bound
  // nowhere, reported by `info`.
  int64_t extra_params = 0;
  std::string extra_params_label;
  // config.json's quantization_config in one line (model/quantization.h), and what of it the exact
  // path does not use; empty without one. `family_packs_mxfp4`: the family marked its MXFP4 matrices
  // itself (K3's checkpoints; kimi_linear.cpp), so the config's groups are not applied on top.
  std::string quantization;
  std::vector<std::string> quantization_unused;
  bool family_packs_mxfp4 = false;
  // Where the configuration came from, for a state file's model identity (identity() in accounting.h): the
  // hash of config.json's bytes as loaded, or of a preset's name, seed and dtype; 0 for a model
  // built in code.
  uint64_t config_hash = 0;
};

// Set when the trunk streams from the checkpoint's files a sublayer at a time (io/trunk_stream.h).
// forward() calls enter(u, next) before it reads unit u's weights and leave(u) after them: unit 0 is
// the embedding's rows, 1 + 2i block i's token mixer (with its norm and AttnRes mix), 2 + 2i its
// channel mixer (the same), 2L + 1 the final mix and norm, 2L + 2 the LM head (L = n_layers()).
// `next` is the unit forward() reads after u, read ahead while u computes. One step at a time per
// model.
class TrunkSource {
 public:
  virtual ~TrunkSource() = default;
  virtual void enter(int64_t unit, int64_t next) = 0;
  virtual void leave(int64_t unit) = 0;
};

struct Model {
  struct Names {
    std::string embed, pos_embed, layer_prefix, final_norm, lm_head;  // full checkpoint names/prefixes
    std::string output_res_norm = {}, output_res_proj = {};  // K3: the model-level AttnRes mix before final_norm
  };
  ModelConfig config;
  Names names;
  Tensor embed;      // [V, D] token embedding (and the LM head when tied)
  Tensor pos_embed;  // [P, D] learned positions, or undefined
  std::vector<Block> blocks;
  layers::Norm final_norm;
  layers::AttnRes output_res;  // ResidualKind::BlockAttention: the mix before final_norm
  Tensor lm_head;    // [V, D] when not tied
  // The embedding and an untied head as a GGUF file stores them in one of ggml's block formats
  // (kernels::StoredQuant Ggml, set by the GGUF loader before binding): bound in their blocks instead
  // of `embed` / `lm_head` (then left undefined), a token's row decoded as it is looked up and the head
  // multiplied on its blocks.
  kernels::Matrix embed_blocks, head_blocks;
  // Where the checkpoint keeps each parameter when it differs from its name, and what to ignore.
  BindingTable binding;
  // The numerics every forward of this model uses unless the call passes its own.
  layers::Options options;
  // Set when the trunk streams layer by layer (see TrunkSource).
  std::shared_ptr<TrunkSource> trunk;

  // Every parameter once, under its full checkpoint name (the tied head is not listed twice).
  void for_each_tensor(const layers::TensorVisitor& f);
  const Tensor& output_weight() const { return config.tied_lm_head ? embed : lm_head; }
  // The head in blocks (embed_blocks when tied), or null where it is output_weight().
  const kernels::Matrix* output_blocks() const {
    const kernels::Matrix& b = config.tied_lm_head ? embed_blocks : head_blocks;
    return b.quant.defined() ? &b : nullptr;
  }
  // Every layer's empty state; `positions` > 0: the growing ones (KV caches, MLA latents) with room
  // for that many positions allocated now.
  SequenceState new_state(int64_t positions = 0) const;
  int64_t n_layers() const { return int64_t(blocks.size()); }
};

// Scans every weight once for NaN or ±Inf (`--check-tensors`); the first tensor that holds one is an
// Error that names it, the element and `where` (the model directory or preset).
void check_tensors_finite(Model& m, const std::string& where);

}  // namespace lineage::model
