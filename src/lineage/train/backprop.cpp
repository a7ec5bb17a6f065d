#include "lineage/train/backprop.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/backward.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"
#include "lineage/layers/common.h"
#include "lineage/layers/attn_res.h"
#include "lineage/model/forward.h"
#include "lineage/model/residual.h"

namespace lineage::train {

using model::Model;

void to_trainable(Model& m) {
  m.for_each_tensor(layers::TensorVisitor::with_matrices([](const std::string& name, kernels::Matrix& w) {
    if (w.quant.defined())
      throw Error(cat(name, ": quantized weights (", w.quant.origin,
                      ") cannot be trained (train the float checkpoint, then lineage quantize it)"));
  }));
  m.for_each_tensor([](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    if (!t.defined()) return;
    if (t.dtype() == DType::U8)
      throw Error(cat(name, ": MXFP4-packed weights cannot be trained (load or build the model with float weights)"));
    if (t.dtype() != DType::F32) t = to_f32(t);
    else if (t.is_borrowed()) t = t.clone();
  });
  model::prepare(m, false);
}

Model zeros_like(Model& m) {
  Model g = m;
  g.for_each_tensor([](const std::string&, Tensor& t, const Shape&, layers::Init) {
    if (t.defined()) t = Tensor::zeros(DType::F32, t.shape());
  });
  return g;
}

namespace {

// A layer kind with a training forward and a backward (layers/train_step.h).
template <class L>
concept Trainable = requires(const L& l, const layers::TrainShape& s, const float* x, float* y, typename L::Saved& sv,
                             L& grad) {
  layers::forward_train(l, s, x, y, sv);
  layers::backward(l, s, x, x, sv, y, grad);
};

// Why a mixer or channel mixer cannot be trained, or "".
template <class Variant>
std::string layer_reason(const Variant& v) {
  return std::visit([](const auto& layer) -> std::string {
    if constexpr (Trainable<std::decay_t<decltype(layer)>>) return "";
    else return layer.describe() + " has no backward yet";
  }, v);
}

// f(layer) for the layer a variant holds; only trainable kinds reach here (untrainable_reason).
template <class Variant, class F>
void visit_trainable(const Variant& v, F&& f) {
  std::visit([&](const auto& layer) {
    if constexpr (Trainable<std::decay_t<decltype(layer)>>) f(layer);
    else LINEAGE_CHECK(false, layer.describe(), " has no backward (Backprop checks untrainable_reason)");
  }, v);
}

}  // namespace

std::string untrainable_reason(const Model& m) {
  if (m.trunk) return "its trunk streams from disk (--memory-budget)";
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const model::Block& b = m.blocks[i];
    for (const std::string& why : {layer_reason(b.mixer), layer_reason(b.ffn)})
      if (!why.empty()) return cat("layer ", i, ": ", why);
  }
  return "";
}

// What one block's forward keeps, for each of its two sublayers (0: the mixer, 1: the channel mixer):
// the input its norm read (the stream, or the Block AttnRes mix), the normalized input, and for a
// mix the partial block it mixed in and its softmax weights; then each layer's own saved
// activations (one per trainable kind; the block's own mixer and channel mixer use theirs, of()
// picks it).
struct Backprop::BlockSaved {
  layers::Buffer input[2], normed[2], partial[2], mix_weights[2];
  int64_t mix_sources[2] = {0, 0};  // 0: the sublayer read the stream itself, no mix
  layers::Attention::Saved attention;
  layers::GatedAttention::Saved gated_attention;
  layers::DeltaRule::Saved delta_rule;
  layers::Mla::Saved mla;
  layers::Mlp::Saved mlp;
  layers::GatedMlp::Saved gated_mlp;
  layers::Moe::Saved moe;

  layers::Attention::Saved& of(const layers::Attention&) { return attention; }
  layers::GatedAttention::Saved& of(const layers::GatedAttention&) { return gated_attention; }
  layers::DeltaRule::Saved& of(const layers::DeltaRule&) { return delta_rule; }
  layers::Mla::Saved& of(const layers::Mla&) { return mla; }
  layers::Mlp::Saved& of(const layers::Mlp&) { return mlp; }
  layers::GatedMlp::Saved& of(const layers::GatedMlp&) { return gated_mlp; }
  layers::Moe::Saved& of(const layers::Moe&) { return moe; }
};

Backprop::Backprop(Model& m) : m_(m), grads_(zeros_like(m)) {
  const std::string why = untrainable_reason(m);
  if (!why.empty()) throw Error(cat("cannot train this ", m.config.model_type, " model: ", why));
  for (size_t i = 0; i < m.blocks.size(); ++i) saved_.push_back(std::make_unique<BlockSaved>());
}

Backprop::~Backprop() = default;

void Backprop::zero_grads() {
  grads_.for_each_tensor([](const std::string&, Tensor& t, const Shape&, layers::Init) {
    if (t.defined()) std::memset(t.raw_mut(), 0, t.nbytes());
  });
}

std::vector<ParamRef> Backprop::params() {
  std::vector<ParamRef> out;
  m_.for_each_tensor([&](const std::string& name, Tensor& t, const Shape&, layers::Init) {
    if (t.defined()) out.push_back({name, t.data<float>(), nullptr, t.numel(), t.ndim() >= 2});
  });
  size_t i = 0;
  grads_.for_each_tensor([&](const std::string&, Tensor& t, const Shape&, layers::Init) {
    if (!t.defined()) return;
    LINEAGE_CHECK(i < out.size() && out[i].n == t.numel());
    out[i++].grad = t.data<float>();
  });
  LINEAGE_CHECK(i == out.size());
  return out;
}

void Backprop::refresh() { model::prepare(m_, false); }

namespace {

void add_into(float* x, const float* y, int64_t n) {
  parallel_for(n, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) x[i] += y[i];
  }, 1 << 14);
}

}  // namespace

void Backprop::check_length(int64_t T) const {
  if (m_.config.max_positions > 0 && T > m_.config.max_positions)
    throw Error(cat("sequence length ", T, " exceeds the model's context of ", m_.config.max_positions,
                    " (config.json field ", m_.config.max_positions_field, ")"));
}

double Backprop::step(std::span<const int32_t> tokens, int64_t B, int64_t T, float scale, bool grads) {
  const int64_t N = B * T, V = m_.config.vocab_size;
  LINEAGE_CHECK(int64_t(tokens.size()) == B * (T + 1));
  check_length(T);
  inputs_.resize(size_t(N)), targets_.resize(size_t(N));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t in = tokens[size_t(b * (T + 1) + t)], out = tokens[size_t(b * (T + 1) + t + 1)];
      if (in < 0 || in >= V || out >= V)
        throw Error(cat("token id ", in < 0 || in >= V ? in : out, " is outside the vocabulary [0, ", V, ")"));
      inputs_[size_t(b * T + t)] = in, targets_[size_t(b * T + t)] = out;
    }
  return run(B, T, scale, grads);
}

double Backprop::step(std::span<const int32_t> inputs, std::span<const int32_t> targets, int64_t B, int64_t T,
                      float scale, bool grads) {
  const int64_t N = B * T, V = m_.config.vocab_size;
  LINEAGE_CHECK(int64_t(inputs.size()) == N && int64_t(targets.size()) == N);
  check_length(T);
  for (int64_t i = 0; i < N; ++i)
    if (inputs[size_t(i)] < 0 || inputs[size_t(i)] >= V || targets[size_t(i)] >= V)
      throw Error(cat("token id ", inputs[size_t(i)] < 0 || inputs[size_t(i)] >= V ? inputs[size_t(i)] : targets[size_t(i)],
                      " is outside the vocabulary [0, ", V, ")"));
  inputs_.assign(inputs.begin(), inputs.end());
  targets_.assign(targets.begin(), targets.end());
  return run(B, T, scale, grads);
}

void Backprop::predict(std::span<const int32_t> inputs, int64_t B, int64_t T, std::vector<int32_t>& out) {
  const int64_t N = B * T, V = m_.config.vocab_size, D = m_.config.d_model;
  targets_.assign(size_t(N), -1);
  LINEAGE_CHECK(int64_t(inputs.size()) == N);
  check_length(T);
  for (const int32_t id : inputs)
    if (id < 0 || id >= V) throw Error(cat("token id ", id, " is outside the vocabulary [0, ", V, ")"));
  inputs_.assign(inputs.begin(), inputs.end());
  const float* h = forward(B, T);
  // The head a chunk of rows at a time; argmax with ties to the lower id.
  constexpr int64_t kRows = 64;
  std::vector<float> logits(static_cast<size_t>(kRows * V));
  out.resize(size_t(N));
  for (int64_t r0 = 0; r0 < N; r0 += kRows) {
    const int64_t n = std::min(kRows, N - r0);
    kernels::gemm(false, true, n, V, D, h + r0 * D, D, m_.output_weight().data<float>(), D, 0.0f, logits.data(), V);
    for (int64_t i = 0; i < n; ++i) {
      const float* z = logits.data() + i * V;
      out[size_t(r0 + i)] = int32_t(std::max_element(z, z + V) - z);
    }
  }
}

namespace {

// The mix's sources: the finished blocks [0, n), then the partial one.
std::vector<const float*> mix_sources(std::vector<layers::Buffer>& blocks, int64_t n, const float* partial) {
  std::vector<const float*> out;
  for (int64_t j = 0; j < n; ++j) out.push_back(blocks[size_t(j)].get(0));
  out.push_back(partial);
  return out;
}

// The Block AttnRes query of sublayer s (0: the block's mixer, 1: its channel mixer).
template <class BlockT>
auto& mix_query(BlockT& b, int64_t s) { return s % 2 ? b.mlp_res : b.attn_res; }

}  // namespace

// The residual wiring as model.h's ResidualStream runs it (spec §6.3), keeping what the backward
// reads. Plain: each sublayer reads the stream and adds its output to it. Block AttnRes: x is the
// partial block; a sublayer reads the mix of [finished blocks, partial] once a block is finished;
// at s % block == 0 the partial is finished (pushed) and the sublayer's output starts the next.
const float* Backprop::forward(int64_t B, int64_t T) {
  const int64_t D = m_.config.d_model, N = B * T;
  const layers::TrainShape shape{B, T};
  const bool attn_res = m_.config.residual == model::ResidualKind::BlockAttention;

  // Embeddings: the token's row plus its position's.
  float* x = x_.get(size_t(N) * D);
  const bool positions = m_.pos_embed.defined() && m_.pos_embed.numel();
  parallel_for(N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      std::memcpy(x + r * D, m_.embed.data<float>() + int64_t(inputs_[size_t(r)]) * D, size_t(D) * sizeof(float));
      if (positions)
        for (int64_t c = 0; c < D; ++c) x[r * D + c] += m_.pos_embed.data<float>()[(r % T) * D + c];
    }
  }, 16);

  float* y = dmix_.get(size_t(N) * D);
  blocks_used_ = 0;
  for (int64_t s = 0; s < 2 * int64_t(m_.blocks.size()); ++s) {
    const model::Block& blk = m_.blocks[size_t(s / 2)];
    BlockSaved& sv = *saved_[size_t(s / 2)];
    const int64_t k = s % 2;
    sv.delta_rule.path = m_.options.delta_rule_path;
    float* in = sv.input[k].get(size_t(N) * D);
    sv.mix_sources[k] = attn_res && blocks_used_ > 0 ? blocks_used_ + 1 : 0;
    if (sv.mix_sources[k]) {
      float* partial = sv.partial[k].get(size_t(N) * D);
      std::memcpy(partial, x, size_t(N * D) * sizeof(float));
      layers::mix(mix_query(blk, s), mix_sources(blocks_, blocks_used_, partial), N, in,
                  sv.mix_weights[k].get(size_t(N * sv.mix_sources[k])));
    } else {
      std::memcpy(in, x, size_t(N * D) * sizeof(float));
    }
    const bool push = attn_res && s % m_.config.attn_res_block == 0;
    if (push) {
      if (blocks_.size() <= size_t(blocks_used_)) blocks_.resize(size_t(blocks_used_ + 1));
      std::memcpy(blocks_[size_t(blocks_used_++)].get(size_t(N) * D), x, size_t(N * D) * sizeof(float));
    }
    float* a = sv.normed[k].get(size_t(N) * D);
    if (k == 0) {
      layers::forward(blk.norm1, in, N, a);
      visit_trainable(blk.mixer, [&](const auto& mixer) { layers::forward_train(mixer, shape, a, y, sv.of(mixer)); });
    } else {
      layers::forward(blk.norm2, in, N, a);
      visit_trainable(blk.ffn, [&](const auto& ffn) { layers::forward_train(ffn, shape, a, y, sv.of(ffn)); });
    }
    if (push) std::memcpy(x, y, size_t(N * D) * sizeof(float));
    else add_into(x, y, N * D);
  }
  final_in_ = x;
  if (attn_res) {
    float* mixed = mixed_out_.get(size_t(N) * D);
    layers::mix(m_.output_res, mix_sources(blocks_, blocks_used_, x), N, mixed,
                out_weights_.get(size_t(N * (blocks_used_ + 1))));
    final_in_ = mixed;
  }
  float* h = normed_.get(size_t(N) * D);
  layers::forward(m_.final_norm, final_in_, N, h);
  return h;
}

double Backprop::run(int64_t B, int64_t T, float scale, bool grads) {
  const int64_t D = m_.config.d_model, N = B * T;
  const layers::TrainShape shape{B, T};
  const float* h = forward(B, T);
  const bool positions = m_.pos_embed.defined() && m_.pos_embed.numel();
  Tensor& head_grad = grads_.config.tied_lm_head ? grads_.embed : grads_.lm_head;
  float* dh = grads ? dnormed_.get(size_t(N) * D) : nullptr;
  const double loss = kernels::cross_entropy_backward(h, N, D, m_.output_weight(), targets_.data(), scale, dh,
                                                      grads ? head_grad.data<float>() : nullptr);
  if (!grads) return loss;

  // Backward: dx is ∂L/∂(the stream, or the partial block) at each point, walking the sublayers in
  // reverse; dblocks_[j] gathers ∂L/∂(finished block j) from every mix that read it.
  float* dx = dx_.get(size_t(N) * D);
  float* dsub = dmix_.get(size_t(N) * D);
  if (dblocks_.size() < blocks_.size()) dblocks_.resize(blocks_.size());
  for (int64_t j = 0; j < blocks_used_; ++j) std::memset(dblocks_[size_t(j)].get(size_t(N) * D), 0, size_t(N * D) * sizeof(float));
  int64_t blocks = blocks_used_;
  // Scatters ∂L/∂(a mix's output) over its sources: the finished blocks and the partial (into dx).
  const auto mix_backward = [&](const layers::AttnRes& q, layers::AttnRes& gq, const float* partial, const float* weights,
                                int64_t S, const float* dout) {
    LINEAGE_CHECK(S == blocks + 1, "AttnRes backward: ", S, " sources with ", blocks, " finished blocks");
    std::vector<float*> dsources;
    for (int64_t j = 0; j < blocks; ++j) dsources.push_back(dblocks_[size_t(j)].get(0));
    dsources.push_back(dx);
    layers::mix_backward(q, mix_sources(blocks_, blocks, partial), N, weights, dout, dsources, gq);
  };
  if (m_.config.residual == model::ResidualKind::BlockAttention) {
    layers::backward(m_.final_norm, final_in_, N, dh, dsub, grads_.final_norm);
    std::memset(dx, 0, size_t(N * D) * sizeof(float));
    mix_backward(m_.output_res, grads_.output_res, x_.get(0), out_weights_.get(0), blocks + 1, dsub);
  } else {
    layers::backward(m_.final_norm, final_in_, N, dh, dx, grads_.final_norm);
  }
  float* da = dnormed_.get(size_t(N) * D);
  for (int64_t s = 2 * int64_t(m_.blocks.size()); s-- > 0;) {
    const model::Block& blk = m_.blocks[size_t(s / 2)];
    model::Block& gb = grads_.blocks[size_t(s / 2)];
    BlockSaved& sv = *saved_[size_t(s / 2)];
    const int64_t k = s % 2;
    // dx is ∂L/∂(this sublayer's output): through the layer and its norm to ∂L/∂(its input), dsub.
    if (k == 0) {
      visit_trainable(blk.mixer, [&](const auto& mixer) {
        using L = std::decay_t<decltype(mixer)>;
        layers::backward(mixer, shape, sv.normed[0].get(0), dx, sv.of(mixer), da, std::get<L>(gb.mixer));
      });
      layers::backward(blk.norm1, sv.input[0].get(0), N, da, dsub, gb.norm1);
    } else {
      visit_trainable(blk.ffn, [&](const auto& ffn) {
        using L = std::decay_t<decltype(ffn)>;
        layers::backward(ffn, shape, sv.normed[1].get(0), dx, sv.of(ffn), da, std::get<L>(gb.ffn));
      });
      layers::backward(blk.norm2, sv.input[1].get(0), N, da, dsub, gb.norm2);
    }
    // The output started a new partial block: what came before it is the block it pushed.
    if (m_.config.residual == model::ResidualKind::BlockAttention && s % m_.config.attn_res_block == 0) {
      --blocks;
      std::memcpy(dx, dblocks_[size_t(blocks)].get(0), size_t(N * D) * sizeof(float));
    }
    if (sv.mix_sources[k]) mix_backward(mix_query(blk, s), mix_query(gb, s), sv.partial[k].get(0), sv.mix_weights[k].get(0),
                                        sv.mix_sources[k], dsub);
    else add_into(dx, dsub, N * D);
  }
  LINEAGE_CHECK(blocks == 0);
  // Embedding rows, summed over the tokens that read them in row order (deterministic); positions
  // split over columns.
  float* dE = grads_.embed.data<float>();
  for (int64_t r = 0; r < N; ++r) {
    float* row = dE + int64_t(inputs_[size_t(r)]) * D;
    for (int64_t c = 0; c < D; ++c) row[c] += dx[r * D + c];
  }
  if (positions) {
    float* dP = grads_.pos_embed.data<float>();
    parallel_for(D, [&](int64_t c0, int64_t c1) {
      for (int64_t r = 0; r < N; ++r)
        for (int64_t c = c0; c < c1; ++c) dP[(r % T) * D + c] += dx[r * D + c];
    }, 16);
  }
  return loss;
}

}  // namespace lineage::train
