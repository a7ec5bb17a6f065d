// Per-sequence state: one state per layer (KV rows, MLA latents, recurrent S and conv tails) and
// the pool that holds many sequences' states by slot. Weights never live here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "lineage/model/model.h"

namespace lineage::model {

using MixerState = std::variant<layers::Attention::State, layers::DeltaRule::State, layers::Mla::State>;

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

}  // namespace lineage::model
