#include "lineage/model/model.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <type_traits>

#include "lineage/core/error.h"
#include "lineage/core/hash.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/linear.h"

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
  f(names.embed, embed, {V, D}, layers::Init::Normal);
  if (config.max_positions > 0 && !names.pos_embed.empty())
    f(names.pos_embed, pos_embed, {config.max_positions, D}, layers::Init::Normal);
  for (size_t i = 0; i < blocks.size(); ++i)
    blocks[i].for_each_tensor(names.layer_prefix + std::to_string(i) + ".", f);
  if (output_res.defined()) output_res.for_each_tensor(names.output_res_norm, names.output_res_proj, f);
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

SequenceState Model::new_state(int64_t positions) const {
  SequenceState s;
  for (const auto& b : blocks)
    s.layers.push_back(std::visit([&](const auto& m) { return MixerState(m.new_state(positions)); }, b.mixer));
  return s;
}

// ---------------------------------------------------------------------------------------------
// State views, lengths and the model's identity.

int64_t StateArray::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

StateArray contiguous(std::string name, Tensor& t) {
  StateArray a{std::move(name), t.shape(), std::vector<int64_t>(t.shape().size(), 1), t.data<float>()};
  for (size_t i = a.shape.size() - 1; i-- > 0;) a.strides[i] = a.strides[i + 1] * a.shape[i + 1];
  return a;
}

}  // namespace

std::vector<StateArray> state_arrays(const Model& m, SequenceState& s, size_t layer) {
  LINEAGE_CHECK(layer < m.blocks.size() && layer < s.layers.size(), "layer index out of range");
  std::vector<StateArray> out;
  const auto& mixer = m.blocks[layer].mixer;
  if (const auto* a = std::get_if<layers::Attention>(&mixer)) {
    auto& st = std::get<layers::Attention::State>(s.layers[layer]);
    const int64_t H = a->config.n_heads, hd = a->config.head_dim, L = st.length, cap = st.capacity;
    for (auto [name, t] : {std::pair<const char*, Tensor*>{"k", &st.k}, {"v", &st.v}})
      out.push_back({name, {H, L, hd}, {cap * hd, hd, 1}, L ? t->data<float>() : nullptr});
    if (st.conv_tail.defined()) out.push_back(contiguous("conv_tail", st.conv_tail));
  } else if (const auto* l = std::get_if<layers::Mla>(&mixer)) {
    auto& st = std::get<layers::Mla::State>(s.layers[layer]);
    const int64_t w = l->config.latent(), L = st.length;
    out.push_back({"kv", {L, w}, {w, 1}, L ? st.kv.data<float>() : nullptr});
  } else {
    auto& st = std::get<layers::DeltaRule::State>(s.layers[layer]);
    out.push_back(contiguous("S", st.S));
    if (st.z.defined()) out.push_back(contiguous("z", st.z));
    if (st.conv_tail.defined()) out.push_back(contiguous("conv_tail", st.conv_tail));
  }
  return out;
}

void set_length(const Model& m, SequenceState& s, int64_t length) {
  LINEAGE_CHECK(length >= 0 && s.layers.size() == m.blocks.size(), "set_length: a state of another model");
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    if (const auto* a = std::get_if<layers::Attention>(&m.blocks[i].mixer)) {
      auto& st = std::get<layers::Attention::State>(s.layers[i]);
      st.reserve(a->config.n_heads, a->config.head_dim, length);
      st.length = length;
    } else if (const auto* l = std::get_if<layers::Mla>(&m.blocks[i].mixer)) {
      auto& st = std::get<layers::Mla::State>(s.layers[i]);
      st.reserve(l->config.latent(), length);
      st.length = length;
    }
  }
  s.position = length;
}

bool truncatable(const Model& m) {
  return std::none_of(m.blocks.begin(), m.blocks.end(), [](const Block& b) {
    const auto* a = std::get_if<layers::Attention>(&b.mixer);
    return std::holds_alternative<layers::DeltaRule>(b.mixer) || (a && a->config.conv_size > 0);
  });
}

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

// ---------------------------------------------------------------------------------------------
// The state pool.

StatePool::StatePool(const Model& m, PoolOptions options) : model_(&m), options_(options) {
  LINEAGE_CHECK(options.slots >= 0 && options.ctx >= 0, "pool options must be >= 0");
  if (options.ctx > 0 && m.config.max_positions > 0 && options.ctx > m.config.max_positions)
    throw Error(cat("--ctx ", options.ctx, " exceeds the model's context limit of ", m.config.max_positions,
                    " (config.json field ", m.config.max_positions_field, ")"));
  for (int64_t i = 0; i < options.slots; ++i) add_slot(false);
}

void StatePool::add_slot(bool used) {
  // With a fixed ctx, room for ctx positions now: the KV caches and latents never grow.
  auto s = std::make_unique<SequenceState>(model_->new_state(options_.ctx));
  slots_.push_back(std::move(s));
  used_.push_back(used ? 1 : 0);
}

int32_t StatePool::acquire() {
  for (size_t i = 0; i < used_.size(); ++i)
    if (!used_[i]) {
      used_[i] = 1;
      slots_[i]->clear();
      return int32_t(i);
    }
  if (options_.slots > 0)
    throw Error(cat("all ", options_.slots, " state slots are in use (a pool of fixed size ", options_.slots,
                    "); release one or make the pool larger"));
  add_slot(true);
  return int32_t(slots_.size() - 1);
}

void StatePool::check(int32_t slot) const {
  if (slot < 0 || slot >= int32_t(slots_.size()) || !used_[size_t(slot)])
    throw Error(cat("state slot ", slot, " is not in use (", used(), " of ", capacity(), " slots acquired)"));
}

void StatePool::release(int32_t slot) {
  check(slot);
  used_[size_t(slot)] = 0;
}

void StatePool::clear(int32_t slot) {
  check(slot);
  slots_[size_t(slot)]->clear();
}

void StatePool::copy(int32_t from, int32_t to) {
  check(from);
  check(to);
  if (from != to) slots_[size_t(to)]->assign(*slots_[size_t(from)]);
}

SequenceState& StatePool::state(int32_t slot) {
  check(slot);
  return *slots_[size_t(slot)];
}

const SequenceState& StatePool::state(int32_t slot) const {
  check(slot);
  return *slots_[size_t(slot)];
}

bool StatePool::in_use(int32_t slot) const {
  return slot >= 0 && slot < int32_t(slots_.size()) && used_[size_t(slot)];
}

size_t StatePool::bytes() const {
  size_t n = 0;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (used_[i]) n += slots_[i]->bytes();
  return n;
}

int64_t StatePool::used() const { return std::count(used_.begin(), used_.end(), char(1)); }

// ---------------------------------------------------------------------------------------------
// The residual stream.

ResidualStream::ResidualStream(const Model& m, float* x, int64_t N, Workspace& ws)
    : m_(m), x_(x), n_(N), d_(m.config.d_model), ar_(&ws.attn_res) {
  if (m.config.residual == ResidualKind::BlockAttention)
    LINEAGE_CHECK(m.config.attn_res_block > 0 && m.output_res.defined(), "Block Attention Residuals without a block size");
}

// The mix of [finished blocks, partial] under query q, into the workspace.
const float* ResidualStream::mixed(const layers::AttnRes& q, const char* name, const layers::Trace& trace) {
  ar_->sources.clear();
  for (int64_t j = 0; j < blocks_; ++j) ar_->sources.push_back(ar_->blocks[size_t(j)].get(0));
  ar_->sources.push_back(x_);
  const int64_t S = int64_t(ar_->sources.size());
  float* out = ar_->mixed.get(size_t(n_ * d_));
  float* w = ar_->weights.get(size_t(n_ * S));
  layers::mix(q, ar_->sources, n_, out, w);
  trace(name, w, {n_, S});
  return out;
}

const float* ResidualStream::input(int64_t sublayer, const layers::Trace& trace) {
  if (m_.config.residual == ResidualKind::Plain) return x_;
  const Block& b = m_.blocks[size_t(sublayer / 2)];
  const float* in = !blocks_ ? x_
                    : sublayer % 2 ? mixed(b.mlp_res, "mlp_res.weights", trace)
                                   : mixed(b.attn_res, "attn_res.weights", trace);
  if (sublayer % m_.config.attn_res_block == 0) {  // the partial becomes a finished block
    if (ar_->blocks.size() <= size_t(blocks_)) ar_->blocks.resize(size_t(blocks_ + 1));
    float* dst = ar_->blocks[size_t(blocks_)].get(size_t(n_ * d_));
    std::memcpy(dst, x_, size_t(n_ * d_) * sizeof(float));
    ++blocks_;
    empty_ = true;
    if (in == x_) in = dst;  // x is overwritten by the next output
  }
  return in;
}

// x += y over n elements (x = y when a new block starts), split over the threads for long prompts.
void ResidualStream::add(int64_t, const float* y) {
  float* x = x_;
  const bool start = empty_;
  empty_ = false;
  parallel_for(n_ * d_, [&](int64_t i0, int64_t i1) {
    if (start) std::memcpy(x + i0, y + i0, size_t(i1 - i0) * sizeof(float));
    else
      for (int64_t i = i0; i < i1; ++i) x[i] += y[i];
  }, grain_for(1));
}

const float* ResidualStream::output(const layers::Trace& trace) {
  if (m_.config.residual == ResidualKind::Plain) return x_;
  return mixed(m_.output_res, "output_res.weights", trace);
}

// ---------------------------------------------------------------------------------------------
// The forward.

namespace {

void embed_tokens(const Model& m, const layers::Step& step, float* x, float* pos) {
  const int64_t D = m.config.d_model;
  const bool positions = m.pos_embed.defined() && m.pos_embed.numel();
  for (int64_t b = 0; b < step.n_seqs(); ++b)
    for (int64_t i = 0; i < step.length(b); ++i) {
      const int64_t t = step.begin(b) + i;
      kernels::widen_row(m.embed, int64_t(step.tokens[size_t(t)]) * D, D, x + t * D);
      if (!positions) continue;
      kernels::widen_row(m.pos_embed, (step.starts[size_t(b)] + i) * D, D, pos);
      for (int64_t c = 0; c < D; ++c) x[t * D + c] += pos[c];
    }
}

void check_step(const Model& m, const layers::Step& step, const StatePool& pool) {
  LINEAGE_CHECK(&pool.model() == &m, "the state pool belongs to another model");
  LINEAGE_CHECK(step.seq_begin.size() == step.slots.size() + 1 && step.starts.size() == step.slots.size() &&
                    step.seq_begin.front() == 0 && step.seq_begin.back() == step.n_tokens(),
                "malformed step: ", step.slots.size(), " sequences, ", step.seq_begin.size(), " offsets, ",
                step.n_tokens(), " tokens");
  const int64_t limit = pool.options().ctx > 0 ? pool.options().ctx : m.config.max_positions;
  for (int64_t b = 0; b < step.n_seqs(); ++b) {
    const int32_t slot = step.slots[size_t(b)];
    if (!pool.in_use(slot)) throw Error(cat("step sequence ", b, ": state slot ", slot, " is not in use"));
    for (int64_t c = 0; c < b; ++c)
      if (step.slots[size_t(c)] == slot) throw Error(cat("state slot ", slot, " appears twice in one step"));
    const int64_t p0 = step.starts[size_t(b)], T = step.length(b);
    if (T < 1) throw Error(cat("step sequence ", b, " (slot ", slot, ") has no tokens"));
    if (p0 != pool.position(slot))
      throw Error(cat("step sequence ", b, " starts at position ", p0, ", but slot ", slot, " is at position ",
                      pool.position(slot)));
    for (int64_t i = 0; i < T; ++i) {
      const int32_t tok = step.tokens[size_t(step.begin(b) + i)];
      if (tok < 0 || tok >= m.config.vocab_size)
        throw Error(cat("token id ", tok, " at position ", p0 + i, " is outside the vocabulary [0, ",
                        m.config.vocab_size, ")"));
    }
    if (limit > 0 && p0 + T > limit) {
      if (pool.options().ctx > 0)
        throw Error(cat("context of ", p0 + T, " tokens exceeds the state pool's room of ", limit,
                        " positions per sequence (--ctx)"));
      throw Error(cat("context of ", p0 + T, " tokens exceeds the model's limit of ", limit, " (config.json field ",
                      m.config.max_positions_field, ")"));
    }
  }
}

// Pointers to layer i's state of each sequence of the step.
template <class S>
std::span<S* const> layer_states(std::vector<S*>& out, const layers::Step& step, StatePool& pool, size_t i) {
  out.clear();
  for (const int32_t slot : step.slots) out.push_back(&std::get<S>(pool.state(slot).layers[i]));
  return out;
}

}  // namespace

void forward(const Model& m, const layers::Step& step, StatePool& pool, LogitRows rows, float* logits, Workspace& ws,
             const layers::Trace& trace) {
  forward(m, step, pool, rows, logits, ws, trace, m.options);
}

void forward(const Model& m, const layers::Step& step, StatePool& pool, LogitRows rows, float* logits, Workspace& ws,
             const layers::Trace& trace, const layers::Options& options) {
  const int64_t N = step.n_tokens(), B = step.n_seqs(), D = m.config.d_model;
  if (N == 0) return;
  check_step(m, step, pool);
  const layers::Call call{step, options};
  float* x = ws.x.get(size_t(N) * D);
  float* a = ws.normed.get(size_t(N) * D);
  float* y = ws.out.get(size_t(N) * D);
  embed_tokens(m, step, x, y);
  trace("embed", x, {N, D});

  ResidualStream stream(m, x, N, ws);
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const Block& b = m.blocks[i];
    const layers::Trace tr = trace.on() ? trace.with_prefix("h" + std::to_string(i) + ".") : layers::Trace{};
    layers::forward(b.norm1, stream.input(2 * i, tr), N, a);
    tr(b.names.norm1, a, {N, D});
    std::visit(
        [&](const auto& mixer) {
          using Mixer = std::decay_t<decltype(mixer)>;
          if constexpr (std::is_same_v<Mixer, layers::Attention>)
            forward(mixer, call, a, layer_states(ws.attention_states, step, pool, i), y, ws.attention, tr);
          else if constexpr (std::is_same_v<Mixer, layers::Mla>)
            forward(mixer, call, a, layer_states(ws.mla_states, step, pool, i), y, ws.mla, tr);
          else
            forward(mixer, call, a, layer_states(ws.delta_rule_states, step, pool, i), y, ws.delta_rule, tr);
        },
        b.mixer);
    stream.add(2 * i, y);
    tr("resid_mid", stream.state(), {N, D});
    layers::forward(b.norm2, stream.input(2 * i + 1, tr), N, a);
    tr(b.names.norm2, a, {N, D});
    std::visit(
        [&](const auto& ffn) {
          using Ffn = std::decay_t<decltype(ffn)>;
          if constexpr (std::is_same_v<Ffn, layers::Mlp>) forward(ffn, call, a, y, ws.mlp, tr);
          else if constexpr (std::is_same_v<Ffn, layers::Moe>) forward(ffn, call, a, y, ws.moe, tr);
          else forward(ffn, call, a, y, ws.gated_mlp, tr);
        },
        b.ffn);
    stream.add(2 * i + 1, y);
    tr("out", stream.state(), {N, D});
  }
  for (int64_t s = 0; s < B; ++s) pool.state(step.slots[size_t(s)]).position += step.length(s);

  layers::forward(m.final_norm, stream.output(trace), N, a);
  trace(m.names.final_norm.substr(m.names.final_norm.rfind('.') + 1), a, {N, D});
  if (rows == LogitRows::None) return;
  const float* head_in = a;
  int64_t n = N;
  if (rows == LogitRows::Last) {  // the last row of each sequence, then one product for all of them
    float* last = ws.head_rows.get(size_t(B) * D);
    for (int64_t s = 0; s < B; ++s)
      std::memcpy(last + s * D, a + (step.begin(s) + step.length(s) - 1) * D, size_t(D) * sizeof(float));
    head_in = last, n = B;
  }
  kernels::linear(head_in, n, {&m.output_weight(), kernels::Layout::OutIn, options.bf16_dot}, nullptr, logits);
  trace("logits", logits, {n, m.config.vocab_size});
}

void prepare(Model& m, bool owned) {
  if (m.output_res.defined()) m.output_res.prepare();
  for (Block& b : m.blocks) {
    if (b.attn_res.defined()) b.attn_res.prepare();
    if (b.mlp_res.defined()) b.mlp_res.prepare();
    if (auto* d = std::get_if<layers::DeltaRule>(&b.mixer)) d->prepare();
    if (auto* a = std::get_if<layers::Mla>(&b.mixer)) a->prepare();
    if (auto* e = std::get_if<layers::Moe>(&b.ffn)) e->prepare();
    if (!owned) continue;
    const layers::MatrixVisitor to_out_in = [](kernels::Matrix& w) { kernels::store_out_in(w); };
    std::visit([&](auto& mixer) { mixer.for_each_matrix(to_out_in); }, b.mixer);
    std::visit([&](auto& ffn) { ffn.for_each_matrix(to_out_in); }, b.ffn);
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
