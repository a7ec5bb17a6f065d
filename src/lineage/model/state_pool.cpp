#include "lineage/model/state_pool.h"

#include <algorithm>
#include <type_traits>
#include <utility>

#include "lineage/core/error.h"

namespace lineage::model {

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


// The heads and head width of a mixer whose state is a KV cache (softmax attention, GPT-2's or the
// gated one's KV heads); {0, 0} for the other mixers.
std::pair<int64_t, int64_t> kv_cache_heads(const TokenMixer& mixer) {
  if (const auto* a = std::get_if<layers::Attention>(&mixer)) return {a->config.n_heads, a->config.head_dim};
  if (const auto* g = std::get_if<layers::GatedAttention>(&mixer)) return {g->config.n_kv_heads, g->config.head_dim};
  return {0, 0};
}

}  // namespace

std::vector<StateArray> state_arrays(const Model& m, SequenceState& s, size_t layer) {
  LINEAGE_CHECK(layer < m.blocks.size() && layer < s.layers.size(), "layer index out of range");
  std::vector<StateArray> out;
  const auto& mixer = m.blocks[layer].mixer;
  if (const auto [all, hd] = kv_cache_heads(mixer); all > 0) {
    auto& st = std::get<layers::Attention::State>(s.layers[layer]);
    const int64_t L = st.length, cap = st.capacity, H = st.heads(all);
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
    if (const auto [H, hd] = kv_cache_heads(m.blocks[i].mixer); H > 0) {
      auto& st = std::get<layers::Attention::State>(s.layers[i]);
      st.reserve(st.heads(H), hd, length);
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

}  // namespace lineage::model
