// The model: embeddings, a stack of blocks, final norm and LM head; and the per-sequence state
// that one model serves any number of. Weights never live in the state.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "lineage/layers/common.h"
#include "lineage/layers/ffn/gated_mlp.h"
#include "lineage/layers/ffn/mlp.h"
#include "lineage/layers/mixers/attention.h"
#include "lineage/layers/mixers/delta_rule.h"
#include "lineage/layers/norm.h"

namespace lineage::model {

// Adding a mixer is a compile error at every std::visit that does not handle it.
using TokenMixer = std::variant<layers::Attention, layers::DeltaRule>;
using ChannelMixer = std::variant<layers::Mlp, layers::GatedMlp>;
using MixerState = std::variant<layers::Attention::State, layers::DeltaRule::State>;

// Pre-norm residual block: x += mixer(norm1(x)); x += ffn(norm2(x)). The only place that knows
// norm placement and residual wiring.
struct Block {
  struct Names {
    std::string norm1, mixer, norm2, ffn;  // checkpoint sub-prefixes, e.g. "ln_1", "attn", "ln_2", "mlp"
  };
  layers::Norm norm1, norm2;
  TokenMixer mixer;
  ChannelMixer ffn;
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
};

// Per-sequence memory: position plus one state per layer. Copy only through clone().
struct SequenceState {
  int64_t position = 0;
  std::vector<MixerState> layers;

  SequenceState() = default;
  SequenceState(SequenceState&&) = default;
  SequenceState& operator=(SequenceState&&) = default;
  SequenceState clone() const;
  // Copies `from` (a state of the same model) into this one, reusing this state's buffers where
  // they are large enough: restoring a snapshot then touches no new pages.
  void assign(const SequenceState& from);
  void clear();          // back to position 0, keeping every buffer for reuse
  size_t bytes() const;  // state in use (KV rows written, recurrent S, conv tails)

 private:
  SequenceState(const SequenceState&) = default;
};

struct Model {
  struct Names {
    std::string embed, pos_embed, layer_prefix, final_norm, lm_head;  // full checkpoint names/prefixes
  };
  ModelConfig config;
  Names names;
  Tensor embed;      // [V, D] token embedding (and the LM head when tied)
  Tensor pos_embed;  // [P, D] learned positions, or undefined
  std::vector<Block> blocks;
  layers::Norm final_norm;
  Tensor lm_head;    // [V, D] when not tied
  // Checkpoint tensors that are buffers, not parameters (GPT-2's attn.bias): matched by suffix.
  std::vector<std::string> ignored_suffixes;

  // Every parameter once, under its full checkpoint name (the tied head is not listed twice).
  void for_each_tensor(const layers::TensorVisitor& f);
  const Tensor& output_weight() const { return config.tied_lm_head ? embed : lm_head; }
  SequenceState new_state() const;
  int64_t n_layers() const { return int64_t(blocks.size()); }
};

// Which rows of logits forward() writes.
enum class LogitRows : uint8_t { All, Last, None };

// Runs T ≥ 1 tokens through the model from state.position, updating the state as if the tokens had
// been fed one at a time. logits: [T, V] (All), [1, V] (Last) or unused (None). Throws Error when
// the context limit is exceeded or a token id is outside the vocabulary.
void forward(const Model& m, std::span<const int32_t> tokens, SequenceState& state, LogitRows rows,
             float* logits, layers::Scratch& scratch, const layers::Trace& trace = {});

// Owned weights (presets, `--no-mmap`): GPT-2's Conv1D matrices, stored [in, out] in checkpoints,
// are transposed to [out, in], where the decode GEMV reads each output's weights as one contiguous
// run (the [in, out] walk over 16-bit weights reads ~20 % slower per byte on the development CPU).
// Prefill gives the same bits either way (the GEMM packs both layouts into the same panels); one
// decoded token may differ in the last bits (another summation order). Mapped weights stay as the
// files hold them: call this only on weights the model owns.
void store_linear_weights_out_in(Model& m);

// Scans every weight once for NaN or ±Inf (`--check-tensors`); the first tensor that holds one is an
// Error that names it, the element and `where` (the model directory or preset).
void check_tensors_finite(Model& m, const std::string& where);

// Parameters: total (every tensor once) and bytes per dtype. Tensors not allocated yet (a preset's
// skeleton) count as `unallocated_dtype`.
struct ParamCount {
  int64_t total = 0;
  std::vector<std::pair<DType, size_t>> bytes_by_dtype;
};
ParamCount count_params(Model& m, DType unallocated_dtype = DType::F32);

// State bytes: per token of context, and fixed per sequence (recurrent state, conv tails).
struct StateCost {
  size_t per_token = 0, fixed = 0;
};
StateCost state_cost(const Model& m);

}  // namespace lineage::model
