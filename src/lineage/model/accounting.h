// What a model costs and what it is: parameters and weight bytes by dtype, state bytes per token
// and per sequence, and the identity state files carry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "lineage/core/dtype.h"
#include "lineage/core/tensor.h"
#include "lineage/layers/common.h"
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

// Every tensor of Model::for_each_tensor as stored: its parameters (a quantized matrix's codes hold
// all out · in of them, its scales, zero points and shape none) and its dtype (a quantized matrix's
// tensors their layout's, e.g. I32 packed int4 codes, F8_E4M3 NVFP4 scales, U8 MXFP4 pairs, before
// they are bound too; any other tensor not allocated yet: `unallocated_dtype`).
struct StoredTensor {
  const std::string& name;
  Tensor& t;
  const Shape& shape;
  int64_t params;
  DType dtype;
  size_t bytes() const { return size_t(shape_numel(shape)) * dtype_size(dtype); }
};
void for_each_stored(Model& m, DType unallocated_dtype, const std::function<void(const StoredTensor&)>& f);
// The same over what `visit` visits (a block's tensors: visit = [&](auto& v) { block.for_each_tensor("", v); }).
void for_each_stored(const std::function<void(const layers::TensorVisitor&)>& visit, DType unallocated_dtype,
                     const std::function<void(const StoredTensor&)>& f);

// State bytes: per token of context, and fixed per sequence (recurrent state, conv tails).
struct StateCost {
  size_t per_token = 0, fixed = 0;
};
StateCost state_cost(const Model& m);

}  // namespace lineage::model
