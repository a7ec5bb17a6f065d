#include "lineage/model/accounting.h"

#include <map>
#include <variant>

#include "lineage/core/error.h"
#include "lineage/core/hash.h"

namespace lineage::model {

std::string Identity::str() const { return cat("config:", hex64(config_hash), " tensors:", hex64(tensors_hash)); }

Identity identity(const Model& m) {
  Hasher h;
  // for_each_tensor hands out mutable tensors; this visitor reads only names and shapes.
  const_cast<Model&>(m).for_each_tensor([&](const std::string& name, Tensor&, const Shape& shape, layers::Init) {
    h.add(name).add("\0", 1);
    for (int64_t d : shape) h.add(&d, sizeof d);
  });
  return {m.config.config_hash, h.value()};
}

int64_t stored_params(const std::string& name, const Shape& shape) {
  if (name.ends_with(".weight_packed")) return 2 * shape_numel(shape);
  return name.ends_with(".weight_scale") ? 0 : shape_numel(shape);
}

DType stored_dtype(const std::string& name, const Tensor& t, const Shape& shape, DType unallocated_dtype) {
  if (name.ends_with(".weight_packed") || name.ends_with(".weight_scale")) return DType::U8;
  return t.defined() && t.shape() == shape ? t.dtype() : unallocated_dtype;
}

ParamCount count_params(Model& m, DType unallocated_dtype) {
  ParamCount c;
  std::map<DType, size_t> by;
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape& shape, layers::Init) {
    c.total += stored_params(name, shape);
    const DType dt = stored_dtype(name, t, shape, unallocated_dtype);
    by[dt] += size_t(shape_numel(shape)) * dtype_size(dt);
  });
  c.bytes_by_dtype.assign(by.begin(), by.end());
  c.activated = c.total;
  for (const Block& b : m.blocks)
    if (const auto* e = std::get_if<layers::Moe>(&b.ffn)) c.activated -= e->routed_params() - e->active_routed_params();
  c.embedding = m.config.vocab_size * m.config.d_model;
  c.head = m.config.tied_lm_head ? 0 : c.embedding;
  return c;
}

StateCost state_cost(const Model& m) {
  StateCost c;
  for (const auto& b : m.blocks)
    std::visit(
        [&](const auto& mixer) {
          c.per_token += mixer.state_bytes_per_token();
          c.fixed += mixer.state_bytes_fixed();
        },
        b.mixer);
  return c;
}

}  // namespace lineage::model
