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

namespace {

// The dtype of a quantized matrix's stored tensor `t` (one of its members) as its layout stores it;
// a scale not bound yet: `unallocated` (the model's dtype, as llm-compressor writes scales).
DType quantized_dtype(const kernels::Matrix& w, const Tensor& t, DType unallocated) {
  using Kind = kernels::StoredQuant::Kind;
  if (t.defined()) return t.dtype();
  const Kind k = w.quant.kind;
  if (&t == &w.data) return k == Kind::PackedInt ? DType::I32 : k == Kind::Fp8 || k == Kind::HfFp8 ? DType::F8_E4M3 : DType::U8;
  if (&t == &w.scales) return w.packed && !w.quant.defined() ? DType::U8 : k == Kind::Nvfp4 ? DType::F8_E4M3 : unallocated;
  if (&t == &w.zero_point) return DType::I32;
  if (&t == &w.weight_shape) return DType::I64;
  return DType::F32;  // NVFP4's global scale
}

}  // namespace

void for_each_stored(Model& m, DType unallocated_dtype, const std::function<void(const StoredTensor&)>& f) {
  for_each_stored([&](const layers::TensorVisitor& v) { m.for_each_tensor(v); }, unallocated_dtype, f);
}

void for_each_stored(const std::function<void(const layers::TensorVisitor&)>& visit, DType unallocated_dtype,
                     const std::function<void(const StoredTensor&)>& f) {
  const kernels::Matrix* at = nullptr;  // the matrix whose tensors come next (visit_matrix)
  visit(layers::TensorVisitor::with_matrices(
      [&](const std::string&, kernels::Matrix& w) { at = &w; },
      [&](const std::string& name, Tensor& t, const Shape& shape, layers::Init) {
        const bool member = at && (at->quant.defined() || at->packed) &&
                            (&t == &at->data || &t == &at->scales || &t == &at->zero_point || &t == &at->weight_shape ||
                             &t == &at->global_scale);
        if (!member) {
          f({name, t, shape, shape_numel(shape), t.defined() && t.shape() == shape ? t.dtype() : unallocated_dtype});
          return;
        }
        f({name, t, shape, &t == &at->data ? at->out * at->in : 0, quantized_dtype(*at, t, unallocated_dtype)});
      }));
}

ParamCount count_params(Model& m, DType unallocated_dtype) {
  ParamCount c;
  std::map<DType, size_t> by;
  for_each_stored(m, unallocated_dtype, [&](const StoredTensor& s) {
    c.total += s.params;
    by[s.dtype] += s.bytes();
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
