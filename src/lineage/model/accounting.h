// What a model costs and what it is: parameters and weight bytes by dtype, state bytes per token
// and per sequence, and the identity state files carry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lineage/core/dtype.h"
#include "lineage/core/tensor.h"
#include "lineage/model/model.h"

namespace lineage::model {

// The model's identity for state files: its config_hash and the hash of every tensor's name and
// shape, "config:<16 hex> tensors:<16 hex>". Two models with the same identity hold states of the
// same layout and meaning.
struct Identity {
  uint64_t config_hash = 0, tensors_hash = 0;
  std::string str() const;
  bool operator==(const Identity&) const = default;
};
Identity identity(const Model& m);

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
