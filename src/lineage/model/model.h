// The model: embeddings, a stack of blocks, final norm and LM head; and the per-sequence state
// that one model serves any number of. Weights never live in the state.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "lineage/layers/common.h"
#include "lineage/layers/ffn/gated_mlp.h"
#include "lineage/layers/ffn/mlp.h"
#include "lineage/layers/ffn/moe.h"
#include "lineage/layers/mixers/attention.h"
#include "lineage/layers/mixers/delta_rule.h"
#include "lineage/layers/mixers/mla.h"
#include "lineage/layers/norm.h"
#include "lineage/model/binding.h"

namespace lineage::model {

// Adding a mixer is a compile error at every std::visit that does not handle it.
using TokenMixer = std::variant<layers::Attention, layers::DeltaRule, layers::Mla>;
using ChannelMixer = std::variant<layers::Mlp, layers::GatedMlp, layers::Moe>;
using MixerState = std::variant<layers::Attention::State, layers::DeltaRule::State, layers::Mla::State>;

// Pre-norm block: mixer(norm1(·)) then ffn(norm2(·)), each a sublayer of the model's residual
// stream (ResidualStream below: plain x += f(norm(x)), or Block Attention Residuals with K3).
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

// How the sublayers' outputs are combined into the next sublayer's input.
//   Plain: x += f(norm(x)) (GPT-2, fla, Kimi Linear).
//   BlockAttention: Block Attention Residuals (Kimi K3): each sublayer reads a learned softmax mixture
//   of the block representations so far. Only the seam exists here; a model that asks for it is an
//   Error until the K3 issue implements it.
enum class ResidualKind : uint8_t { Plain, BlockAttention };

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
};

// Per-sequence memory: position plus one state per layer. Copy only through clone(). A StatePool
// holds one per slot.
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
  // Where the checkpoint keeps each parameter when it differs from its name, and what to ignore.
  BindingTable binding;
  // The numerics every forward of this model uses unless the call passes its own.
  layers::Options options;

  // Every parameter once, under its full checkpoint name (the tied head is not listed twice).
  void for_each_tensor(const layers::TensorVisitor& f);
  const Tensor& output_weight() const { return config.tied_lm_head ? embed : lm_head; }
  // Every layer's empty state; `positions` > 0: the growing ones (KV caches, MLA latents) with room
  // for that many positions allocated now.
  SequenceState new_state(int64_t positions = 0) const;
  int64_t n_layers() const { return int64_t(blocks.size()); }
};

// Per-sequence memory of many sequences by slot: every layer's KV rows, recurrent S (+ z) and conv
// tails and MLA latents. Slots are acquired and released without touching the others;
// released slots keep their buffers for the next sequence. Fixed up front (`slots`, `ctx` > 0:
// every slot allocated with room for ctx positions, running out is an Error) or growing on demand
// (0). The pool serves one model and must not outlive it.
struct PoolOptions {
  int64_t slots = 0;  // most sequences at once; 0 = grow on demand
  int64_t ctx = 0;    // most positions per sequence; 0 = the model's limit, KV caches grow on demand
};

class StatePool {
 public:
  explicit StatePool(const Model& m, PoolOptions options = {});

  int32_t acquire();  // an empty sequence; Error when all `slots` are in use
  void release(int32_t slot);
  void clear(int32_t slot);               // back to position 0, keeping the buffers
  void copy(int32_t from, int32_t to);    // snapshot: `to` continues exactly as `from` would
  SequenceState& state(int32_t slot);
  const SequenceState& state(int32_t slot) const;
  int64_t position(int32_t slot) const { return state(slot).position; }
  bool in_use(int32_t slot) const;
  size_t bytes(int32_t slot) const { return state(slot).bytes(); }  // state in use by that sequence
  size_t bytes() const;                                             // all slots in use
  int64_t capacity() const { return int64_t(slots_.size()); }       // slots allocated so far
  int64_t used() const;
  const PoolOptions& options() const { return options_; }
  const Model& model() const { return *model_; }

 private:
  void check(int32_t slot) const;
  void add_slot(bool used);
  const Model* model_;
  PoolOptions options_;
  std::vector<std::unique_ptr<SequenceState>> slots_;
  std::vector<char> used_;
};

// A step's activations, by name, sized from the model and the step as they run: the residual
// stream, the normalized input of a sublayer, a sublayer's output, the rows the LM head reads, each
// layer kind's own buffers (shared by the layers of that kind, which run one after another), and
// the per-sequence state pointers handed to the mixers. Once a workspace has run a step of some
// shape, steps up to that shape allocate nothing.
struct Workspace {
  layers::Buffer x, normed, out, head_rows;
  layers::Attention::Buffers attention;
  layers::DeltaRule::Buffers delta_rule;
  layers::Mla::Buffers mla;
  layers::Mlp::Buffers mlp;
  layers::GatedMlp::Buffers gated_mlp;
  layers::Moe::Buffers moe;
  std::vector<layers::Attention::State*> attention_states;
  std::vector<layers::DeltaRule::State*> delta_rule_states;
  std::vector<layers::Mla::State*> mla_states;
};

// The residual wiring of one forward over N rows of width D (ResidualKind). Plain: the stream is x;
// a sublayer reads x and its output is added to x.
class ResidualStream {
 public:
  ResidualStream(ResidualKind kind, float* x, int64_t N, int64_t D);
  const float* input(int64_t sublayer) const;   // what sublayer i normalizes and reads
  void add(int64_t sublayer, const float* y);   // sublayer i's output [N, D]
  const float* state() const { return x_; }     // the stream after the last sublayer

 private:
  ResidualKind kind_;
  float* x_;
  int64_t n_;
};

// Which rows of logits forward() writes.
enum class LogitRows : uint8_t { All, Last, None };

// Runs one step through the model: the step's sequences continue from their pool slots (each at
// its slot's position, which must equal the step's start for it) and leave them as if each
// sequence's tokens had been fed one at a time, alone. logits: [N, V] (All), [B, V] with the last
// token of each sequence (Last), or unused (None). Throws Error when a sequence would exceed the
// model's context limit or the pool's ctx, a token id is outside the vocabulary, or a slot is not
// acquired, appears twice, or starts elsewhere than its position. `options` defaults to the model's.
void forward(const Model& m, const layers::Step& step, StatePool& pool, LogitRows rows, float* logits, Workspace& ws,
             const layers::Trace& trace = {});
void forward(const Model& m, const layers::Step& step, StatePool& pool, LogitRows rows, float* logits, Workspace& ws,
             const layers::Trace& trace, const layers::Options& options);

// Readies bound weights for forward, once: small parameters widened to f32 (each layer's
// prepare()), and with `owned` (presets, `--no-mmap`) GPT-2's Conv1D matrices, stored [in, out] in
// checkpoints, transposed to [out, in], where the decode GEMV reads each output's weights as one
// contiguous run (the [in, out] walk over 16-bit weights reads ~20 % slower per byte on the
// development CPU). Prefill gives the same bits either way (the GEMM packs both layouts into the
// same panels); one decoded token may differ in the last bits (another summation order). Mapped
// weights stay as the files hold them.
void prepare(Model& m, bool owned);

// Scans every weight once for NaN or ±Inf (`--check-tensors`); the first tensor that holds one is an
// Error that names it, the element and `where` (the model directory or preset).
void check_tensors_finite(Model& m, const std::string& where);

// Parameters: total (every tensor once) and bytes per dtype. Tensors not allocated yet (a preset's
// skeleton) count as `unallocated_dtype`. `activated`: the parameters one token runs, the routed
// experts counted k of E per MoE layer (everything else is active), with the input embedding and
// the LM head; vendors quote it with or without those (embedding, head: their counts; a tied head
// is the embedding and counts once).
struct ParamCount {
  int64_t total = 0, activated = 0, embedding = 0, head = 0;
  std::vector<std::pair<DType, size_t>> bytes_by_dtype;
};
ParamCount count_params(Model& m, DType unallocated_dtype = DType::F32);

// State bytes: per token of context, and fixed per sequence (recurrent state, conv tails).
struct StateCost {
  size_t per_token = 0, fixed = 0;
};
StateCost state_cost(const Model& m);

}  // namespace lineage::model
