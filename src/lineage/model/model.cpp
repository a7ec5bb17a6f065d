#include "lineage/model/model.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/linear.h"

namespace lineage::model {

void Block::for_each_tensor(const std::string& prefix, const layers::TensorVisitor& f) {
  norm1.for_each_tensor(prefix + names.norm1, f);
  std::visit([&](auto& m) { m.for_each_tensor(prefix + names.mixer, f); }, mixer);
  norm2.for_each_tensor(prefix + names.norm2, f);
  std::visit([&](auto& m) { m.for_each_tensor(prefix + names.ffn, f); }, ffn);
}

void Model::for_each_tensor(const layers::TensorVisitor& f) {
  const int64_t V = config.vocab_size, D = config.d_model;
  f(names.embed, embed, {V, D}, layers::Init::Normal);
  if (config.max_positions > 0 && !names.pos_embed.empty())
    f(names.pos_embed, pos_embed, {config.max_positions, D}, layers::Init::Normal);
  for (size_t i = 0; i < blocks.size(); ++i)
    blocks[i].for_each_tensor(names.layer_prefix + std::to_string(i) + ".", f);
  final_norm.for_each_tensor(names.final_norm, f);
  if (!config.tied_lm_head) f(names.lm_head, lm_head, {V, D}, layers::Init::Normal);
}

SequenceState SequenceState::clone() const {
  SequenceState c;
  c.position = position;
  for (const auto& s : layers) c.layers.push_back(std::visit([](const auto& x) { return MixerState(x.clone()); }, s));
  return c;
}

void SequenceState::assign(const SequenceState& from) {
  position = from.position;
  layers.resize(from.layers.size());
  for (size_t i = 0; i < layers.size(); ++i)
    std::visit(
        [&](const auto& src) {
          using S = std::decay_t<decltype(src)>;
          if (auto* to = std::get_if<S>(&layers[i])) to->assign(src);
          else layers[i] = MixerState(src.clone());
        },
        from.layers[i]);
}

void SequenceState::clear() {
  position = 0;
  for (auto& s : layers) std::visit([](auto& x) { x.clear(); }, s);
}

size_t SequenceState::bytes() const {
  size_t n = 0;
  for (const auto& s : layers) n += std::visit([](const auto& x) { return x.bytes(); }, s);
  return n;
}

SequenceState Model::new_state() const {
  SequenceState s;
  for (const auto& b : blocks) s.layers.push_back(std::visit([](const auto& m) { return MixerState(m.new_state()); }, b.mixer));
  return s;
}

namespace {

void embed_tokens(const Model& m, std::span<const int32_t> tokens, int64_t p0, float* x) {
  const int64_t D = m.config.d_model;
  thread_local std::vector<float> pos;
  pos.resize(D);
  for (size_t t = 0; t < tokens.size(); ++t) {
    kernels::widen_row(m.embed, int64_t(tokens[t]) * D, D, x + t * D);
    if (m.pos_embed.defined() && m.pos_embed.numel()) {
      kernels::widen_row(m.pos_embed, (p0 + int64_t(t)) * D, D, pos.data());
      for (int64_t i = 0; i < D; ++i) x[t * D + i] += pos[i];
    }
  }
}

// x += y over n elements, split over the threads for long prompts.
void add_residual(float* x, const float* y, int64_t n) {
  parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) x[i] += y[i];
  }, grain_for(1));
}

void check_input(const Model& m, std::span<const int32_t> tokens, int64_t p0) {
  for (size_t t = 0; t < tokens.size(); ++t)
    if (tokens[t] < 0 || tokens[t] >= m.config.vocab_size)
      throw Error(cat("token id ", tokens[t], " at position ", p0 + int64_t(t), " is outside the vocabulary [0, ",
                      m.config.vocab_size, ")"));
  const int64_t end = p0 + int64_t(tokens.size());
  if (m.config.max_positions > 0 && end > m.config.max_positions)
    throw Error(cat("context of ", end, " tokens exceeds the model's limit of ", m.config.max_positions,
                    " (config.json field ", m.config.max_positions_field, ")"));
}

}  // namespace

void forward(const Model& m, std::span<const int32_t> tokens, SequenceState& state, LogitRows rows, float* logits,
             layers::Scratch& scratch, const layers::Trace& trace) {
  const int64_t T = int64_t(tokens.size()), D = m.config.d_model, p0 = state.position;
  if (T == 0) return;
  check_input(m, tokens, p0);
  LINEAGE_CHECK(state.layers.size() == m.blocks.size(), "state has ", state.layers.size(), " layers, model ",
                m.blocks.size());
  float* x = scratch.get(10, size_t(T) * D);
  float* a = scratch.get(11, size_t(T) * D);
  float* y = scratch.get(12, size_t(T) * D);
  embed_tokens(m, tokens, p0, x);
  trace("embed", x, {T, D});

  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const Block& b = m.blocks[i];
    const layers::Trace tr = trace.with_prefix("h" + std::to_string(i) + ".");
    layers::forward(b.norm1, x, T, a);
    tr(b.names.norm1, a, {T, D});
    std::visit(
        [&](const auto& mixer) {
          using S = std::decay_t<decltype(mixer.new_state())>;
          forward(mixer, a, T, std::get<S>(state.layers[i]), y, scratch, tr);
        },
        b.mixer);
    add_residual(x, y, T * D);
    tr("resid_mid", x, {T, D});
    layers::forward(b.norm2, x, T, a);
    tr(b.names.norm2, a, {T, D});
    std::visit([&](const auto& ffn) { forward(ffn, a, T, y, scratch, tr); }, b.ffn);
    add_residual(x, y, T * D);
    tr("out", x, {T, D});
  }
  state.position = p0 + T;

  layers::forward(m.final_norm, x, T, a);
  trace(m.names.final_norm.substr(m.names.final_norm.rfind('.') + 1), a, {T, D});
  if (rows == LogitRows::None) return;
  const int64_t first = rows == LogitRows::All ? 0 : T - 1, n = T - first;
  kernels::linear(a + first * D, n, {&m.output_weight(), kernels::Layout::OutIn}, nullptr, logits);
  trace("logits", logits, {n, m.config.vocab_size});
}

void store_linear_weights_out_in(Model& m) {
  for (Block& b : m.blocks) {
    if (auto* a = std::get_if<layers::Attention>(&b.mixer)) layers::store_out_in(*a);
    if (auto* f = std::get_if<layers::Mlp>(&b.ffn)) layers::store_out_in(*f);
  }
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

ParamCount count_params(Model& m, DType unallocated_dtype) {
  ParamCount c;
  std::map<DType, size_t> by;
  m.for_each_tensor([&](const std::string&, Tensor& t, const Shape& shape, layers::Init) {
    c.total += shape_numel(shape);
    const DType dt = t.defined() && t.shape() == shape ? t.dtype() : unallocated_dtype;
    by[dt] += size_t(shape_numel(shape)) * dtype_size(dt);
  });
  c.bytes_by_dtype.assign(by.begin(), by.end());
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
