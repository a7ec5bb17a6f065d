// How one checkpoint family's tensors bind to the model's parameters: the one table each
// model/archs/ file fills and io::bind_weights reads. Parameters are listed once by the layers
// (for_each_tensor, under the names this engine uses); the table says where the file keeps each of
// them when that differs. Suffixes match the end of a full name ("…h.3.attn.bias" ends in
// ".attn.bias").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lineage/core/tensor.h"

namespace lineage::model {

struct BindingTable {
  // The parameter ending in `param` is stored under the same name ending in `stored` instead
  // (fla's "f_proj.0" is Kimi's "f_a_proj").
  struct Rename {
    std::string param, stored;
  };
  // One stored tensor (name ending in `stored`) holds several parameters as row blocks along dim 0,
  // in this order, repeated `groups` times: group g holds each part's rows of group g (MLA's
  // kv_b_proj: per head its key rows then its value rows, groups = heads; Qwen3-Next's in_proj_qkvz:
  // per key head its q, k, v and z rows). A part gathers its rows of every group in order. With one
  // group each part binds as a view of its rows, no copy; interleaved ones are gathered once into
  // owned memory.
  struct Split {
    std::string stored;
    std::vector<std::pair<std::string, int64_t>> parts;  // parameter suffix, rows per group
    int64_t groups = 1;
  };
  // One parameter (ending in `param`) stored as several tensors whose rows are concatenated in this
  // order (copied once into owned memory).
  struct Fuse {
    std::string param;
    std::vector<std::string> stored;
  };

  // One stored tensor [E, R, ...] holding one slice per expert (Qwen3.5's fused experts:
  // mlp.experts.gate_up_proj [E, 2I, D], each expert's gate rows then its up rows): the parameter
  // named `<before><e><part>` binds as rows [r0, r0 + rows) of slice e, a view of the file (no copy).
  struct Unstack {
    std::string stored;  // the stored tensor's suffix in place of `before`…: ".mlp.experts.gate_up_proj"
    std::string before;  // what precedes the expert index in the parameter's name: ".mlp.experts."
    std::vector<std::pair<std::string, int64_t>> parts;  // {".gate_proj.weight", I}, {".up_proj.weight", I}
    int64_t slices = 0;  // E: the stored tensor's first dimension
    bool stack_on_save = false;  // the family's files store it so (a writer stacks the experts back)
  };

  std::vector<Rename> renames;
  std::vector<Split> splits;
  std::vector<Unstack> unstacks;
  std::vector<Fuse> fuses;
  // Parameters (by suffix) that may come with extra dimensions of size 1: Kimi stores A_log
  // [1, 1, H, 1] for a parameter of shape [H]. Bound as a reshaped view.
  std::vector<std::string> squeeze;
  // How a writer of this family's checkpoints stores such a parameter: with `leading` and `trailing`
  // dimensions of size 1 around its own shape (Kimi Linear's A_log: 2 and 1, [1, 1, H, 1]).
  struct Unsqueeze {
    std::string suffix;
    int leading = 0, trailing = 0;
  };
  std::vector<Unsqueeze> unsqueeze_on_save;
  // Parameters (by suffix) the checkpoint may leave out: left undefined, the layer does without.
  std::vector<std::string> optional;
  // Stored tensors that are no parameter (GPT-2's attn.bias masks, a tied head's lm_head.weight,
  // vision towers): by suffix, or by prefix.
  std::vector<std::string> ignore_suffixes, ignore_prefixes;
};

// The shape under which a checkpoint of this family stores the parameter `param` of shape `shape`.
inline Shape stored_shape(const BindingTable& b, const std::string& param, const Shape& shape) {
  for (const BindingTable::Unsqueeze& u : b.unsqueeze_on_save)
    if (param.size() >= u.suffix.size() && param.compare(param.size() - u.suffix.size(), u.suffix.size(), u.suffix) == 0) {
      Shape out(static_cast<size_t>(u.leading), 1);
      out.insert(out.end(), shape.begin(), shape.end());
      out.insert(out.end(), static_cast<size_t>(u.trailing), 1);
      return out;
    }
  return shape;
}

// The name under which a checkpoint of this family stores the parameter `param` (its renames
// applied): what a writer of such a checkpoint uses.
inline std::string stored_name(const BindingTable& b, const std::string& param) {
  for (const BindingTable::Rename& r : b.renames)
    if (param.size() >= r.param.size() && param.compare(param.size() - r.param.size(), r.param.size(), r.param) == 0)
      return param.substr(0, param.size() - r.param.size()) + r.stored;
  return param;
}

// The stored tensor that holds the weight matrix `param` ("….weight"): its rename, or the tensor it is
// a split part of. What a quantization config's module names and patterns refer to.
inline std::string stored_matrix(const BindingTable& b, const std::string& param) {
  for (const BindingTable::Split& sp : b.splits)
    for (const auto& part : sp.parts) {
      const std::string& suffix = part.first;
      if (param.size() >= suffix.size() && param.compare(param.size() - suffix.size(), suffix.size(), suffix) == 0)
        return param.substr(0, param.size() - suffix.size()) + sp.stored;
    }
  return stored_name(b, param);
}

// Where the parameter `name` sits in the stacked tensor `us` describes: the stored tensor's full name,
// the expert (slice), the part (index into us.parts) and its first row within the slice; nothing when
// `name` is no slice of it.
struct UnstackSlot {
  std::string stored;
  int64_t expert = 0;
  size_t part = 0;
  int64_t row0 = 0;
};
std::optional<UnstackSlot> unstack_slot(const BindingTable::Unstack& us, const std::string& name);

// The tensors a checkpoint of this family stores for the parameters `params` (name and tensor, in
// the order the model lists them): each renamed and unsqueezed as above, the parts of a split tensor
// joined back group by group, and the experts' slices stacked where the Unstack says the family
// stores them so. A joined tensor comes where its first part came. What a writer of such a
// checkpoint writes (lineage train's model.safetensors), and how a parameter's gradient is named in
// the checkpoint's terms. Throws naming the stored tensor when some of its parts are missing or
// their dtypes differ.
std::vector<std::pair<std::string, Tensor>> stored_tensors(const BindingTable& b,
                                                           const std::vector<std::pair<std::string, Tensor>>& params);

}  // namespace lineage::model
