// The model: embeddings, a stack of blocks, final norm and LM head; and the per-sequence state
// that one model serves any number of. Weights never live in the state.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "lineage/layers/attn_res.h"
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
// stream (ResidualStream below: plain x += f(norm(x)), or Block Attention Residuals with K3, whose
// two mixes, before the mixer and before the ffn, are the block's attn_res and mlp_res).
struct Block {
  struct Names {
    std::string norm1, mixer, norm2, ffn;  // checkpoint sub-prefixes, e.g. "ln_1", "attn", "ln_2", "mlp"
    // Block Attention Residuals: each mix's norm and pseudo-query (K3: "self_attention_res_norm", ...).
    std::string attn_res_norm, attn_res_proj, mlp_res_norm, mlp_res_proj;
  };
  layers::Norm norm1, norm2;
  TokenMixer mixer;
  ChannelMixer ffn;
  layers::AttnRes attn_res, mlp_res;  // defined() with ResidualKind::BlockAttention
  Names names;

  void for_each_tensor(const std::string& prefix, const layers::TensorVisitor& f);
};

// How the sublayers' outputs are combined into the next sublayer's input.
//   Plain: x += f(norm(x)) (GPT-2, fla, Kimi Linear).
//   BlockAttention: Block Attention Residuals (Kimi K3): each sublayer reads a learned softmax mixture
//   of the block representations so far (ResidualStream below, spec §6.3).
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
  // BlockAttention: sublayers per block (2 per decoder layer: fla's attnres_block_size; K3's
  // attn_res_block_size counts decoder layers, twice this).
  int64_t attn_res_block = 0;
  // Parameters the checkpoint holds beyond the text model (K3's vision tower and projector): bound
  // nowhere, reported by `info`.
  int64_t extra_params = 0;
  std::string extra_params_label;
  // Where the configuration came from, for a state file's model identity (identity() below): the
  // hash of config.json's bytes as loaded, or of a preset's name, seed and dtype; 0 for a model
  // built in code.
  uint64_t config_hash = 0;
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

// One array of a layer's state: a strided f32 view into the state's own buffers (row-major
// `shape`, `strides` in elements), for state files and for study.
struct StateArray {
  std::string name;
  std::vector<int64_t> shape, strides;
  float* data = nullptr;  // null when the array is empty (a cache that holds no position yet)
  int64_t elements() const;
};

struct Model {
  struct Names {
    std::string embed, pos_embed, layer_prefix, final_norm, lm_head;  // full checkpoint names/prefixes
    std::string output_res_norm, output_res_proj;  // the model-level AttnRes mix before final_norm
  };
  ModelConfig config;
  Names names;
  Tensor embed;      // [V, D] token embedding (and the LM head when tied)
  Tensor pos_embed;  // [P, D] learned positions, or undefined
  std::vector<Block> blocks;
  layers::Norm final_norm;
  layers::AttnRes output_res;  // ResidualKind::BlockAttention: the mix before final_norm
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

// Layer `layer`'s arrays in s, views into its buffers: softmax attention "k", "v" [H, length, hd]
// (and "conv_tail" [W − 1, 3D] with lineage's short conv);
// MLA "kv" [length, kv_lora_rank + rope dims] (the latents ĉ | k_r); delta rule "S" [HV, K, V], "z"
// [HV, K] (normalized linear attention only) and "conv_tail" [W − 1, C] (with a short conv).
std::vector<StateArray> state_arrays(const Model& m, SequenceState& s, size_t layer);
// Sets s to `length` positions: every growing layer (KV caches, MLA latents) holds that many rows,
// room reserved where it had less (the new rows uninitialized, for a state file's to fill), the rows
// past `length` dropped where it had more. Recurrent layers are left as they are, so shortening a
// state is exact only for a model without them (the prefix cache's use).
void set_length(const Model& m, SequenceState& s, int64_t length);
// Whether every layer's state can be cut back to an earlier position (only KV caches and latents;
// not a recurrent state or a short conv's tail).
bool truncatable(const Model& m);
// The model's identity for state files: its config_hash and the hash of every tensor's name and
// shape, "config:<16 hex> tensors:<16 hex>". Two models with the same identity hold states of the
// same layout and meaning.
struct Identity {
  uint64_t config_hash = 0, tensors_hash = 0;
  std::string str() const;
  bool operator==(const Identity&) const = default;
};
Identity identity(const Model& m);

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
  // Block Attention Residuals: the finished blocks (the embedding first), the mixed input of a
  // sublayer, the softmax weights [N, sources].
  struct AttnRes {
    std::vector<layers::Buffer> blocks;
    layers::Buffer mixed, weights;
    std::vector<const float*> sources;
  } attn_res;
};

// The residual wiring of one forward over N rows of width D (ResidualKind). x holds the embedding
// to begin with and is the stream (plain) or the current partial block (BlockAttention) after.
//   Plain: a sublayer reads x and its output is added to x.
//   BlockAttention (spec §6.3, block size B sublayers): sublayer s (2i: layer i's attention, 2i + 1
//   its ffn) reads the mix of [finished blocks, partial] (the partial alone while no block is
//   finished); at s % B == 0 the partial is then pushed as a finished block (sublayer 0 pushes the
//   embedding) and s's output starts the next; outputs add to the partial; the model's output is
//   the mix of [finished blocks, partial] under the model-level query. K3's blocks of n decoder
//   layers are B = 2n; fla's attnres_block_size is B (1: every sublayer's output its own source). Traces attn_res.weights, mlp_res.weights and
//   output_res.weights, [N, sources].
class ResidualStream {
 public:
  ResidualStream(const Model& m, float* x, int64_t N, Workspace& ws);
  const float* input(int64_t sublayer, const layers::Trace& trace);  // what sublayer i normalizes and reads
  void add(int64_t sublayer, const float* y);                         // sublayer i's output [N, D]
  const float* state() const { return x_; }  // the stream (or partial block) after the last add
  const float* output(const layers::Trace& trace);  // what the final norm reads

 private:
  const float* mixed(const layers::AttnRes& q, const char* name, const layers::Trace& trace);
  const Model& m_;
  float* x_;
  int64_t n_, d_;
  Workspace::AttnRes* ar_;
  int64_t blocks_ = 0;   // finished blocks so far
  bool empty_ = false;   // the partial was just pushed: the next output starts a new one
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

// One tensor of Model::for_each_tensor as stored: its parameters (an MXFP4 pair's weight_packed
// holds two per byte, its weight_scale none) and dtype (the pair: U8; a tensor not allocated yet:
// `unallocated_dtype`).
int64_t stored_params(const std::string& name, const Shape& shape);
DType stored_dtype(const std::string& name, const Tensor& t, const Shape& shape, DType unallocated_dtype);

// State bytes: per token of context, and fixed per sequence (recurrent state, conv tails).
struct StateCost {
  size_t per_token = 0, fixed = 0;
};
StateCost state_cost(const Model& m);

}  // namespace lineage::model
