#include "lineage/model/model.h"

#include <string>
#include <variant>

#include "lineage/core/error.h"
#include "lineage/model/state_pool.h"

namespace lineage::model {

void Block::for_each_tensor(const std::string& prefix, const layers::TensorVisitor& f) {
  if (attn_res.defined()) attn_res.for_each_tensor(prefix + names.attn_res_norm, prefix + names.attn_res_proj, f);
  if (mlp_res.defined()) mlp_res.for_each_tensor(prefix + names.mlp_res_norm, prefix + names.mlp_res_proj, f);
  norm1.for_each_tensor(prefix + names.norm1, f);
  std::visit([&](auto& m) { m.for_each_tensor(prefix + names.mixer, f); }, mixer);
  norm2.for_each_tensor(prefix + names.norm2, f);
  std::visit([&](auto& m) { m.for_each_tensor(prefix + names.ffn, f); }, ffn);
}

void Model::for_each_tensor(const layers::TensorVisitor& f) {
  const int64_t V = config.vocab_size, D = config.d_model;
  if (embed_blocks.quant.defined()) layers::visit_matrix(f, names.embed, embed_blocks, V, D);
  else f(names.embed, embed, {V, D}, layers::Init::Normal);
  if (config.max_positions > 0 && !names.pos_embed.empty())
    f(names.pos_embed, pos_embed, {config.max_positions, D}, layers::Init::Normal);
  for (size_t i = 0; i < blocks.size(); ++i)
    blocks[i].for_each_tensor(names.layer_prefix + std::to_string(i) + ".", f);
  if (output_res.defined()) output_res.for_each_tensor(names.output_res_norm, names.output_res_proj, f);
  final_norm.for_each_tensor(names.final_norm, f);
  if (config.tied_lm_head) return;
  if (head_blocks.quant.defined()) layers::visit_matrix(f, names.lm_head, head_blocks, V, D);
  else f(names.lm_head, lm_head, {V, D}, layers::Init::Normal);
}

SequenceState Model::new_state(int64_t positions) const {
  SequenceState s;
  for (const auto& b : blocks)
    s.layers.push_back(std::visit([&](const auto& m) { return MixerState(m.new_state(positions)); }, b.mixer));
  return s;
}

void check_tensors_finite(Model& m, const std::string& where) {
  m.for_each_tensor([&](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    if (!t.defined()) return;
    const int64_t i = first_non_finite(t.dtype(), t.raw(), t.numel());
    if (i < 0) return;
    throw Error(cat(where, ": tensor \"", name, "\" ", shape_str(t.shape()), " ", dtype_name(t.dtype()),
                    " holds a NaN or Inf at element ", i, " (--check-tensors); the checkpoint is damaged"));
  });
}

}  // namespace lineage::model
