#include "lineage/layers/mixers/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "lineage/core/parallel.h"
#include "lineage/kernels/attention.h"
#include "lineage/kernels/backward.h"
#include "lineage/kernels/delta_rule_layer_backward.h"
#include "lineage/kernels/row_split.h"
#include "lineage/kernels/short_conv.h"

namespace lineage::layers {

namespace {

// The first s.length positions of every head of s into k and v, caches of `cap` >= s.length positions.
void copy_positions(const Attention::State& s, int64_t H, int64_t hd, int64_t cap, Tensor& k, Tensor& v) {
  const size_t bytes = size_t(s.length * hd) * sizeof(float);
  for (int64_t h = 0; h < H; ++h) {
    std::memcpy(k.data<float>() + h * cap * hd, s.k.data<float>() + h * s.capacity * hd, bytes);
    std::memcpy(v.data<float>() + h * cap * hd, s.v.data<float>() + h * s.capacity * hd, bytes);
  }
}

// k and v holding the first s.length positions of every head, in a cache of `cap` positions.
void copy_cache(const Attention::State& s, int64_t H, int64_t hd, int64_t cap, Tensor& k, Tensor& v) {
  k = Tensor::empty(DType::F32, {H, cap, hd});
  v = Tensor::empty(DType::F32, {H, cap, hd});
  if (s.length) copy_positions(s, H, hd, cap, k, v);
}

// qkv = raw + the short conv of raw: T rows of 3D continuing `tail` (which then holds their last rows).
void convolve_rows(const Attention& a, const float* raw, int64_t T, float* tail, float* qkv) {
  const int64_t C = 3 * a.config.d_model;
  kernels::short_conv(raw, T, C, C, a.weights.c_attn_conv, tail, C, false, qkv, C);
  const auto add = [&](int64_t t0, int64_t t1) {
    for (int64_t i = t0 * C; i < t1 * C; ++i) qkv[i] += raw[i];
  };
  if (T > 1) parallel_for(T, add, grain_for(C));
  else add(0, T);
}

}  // namespace

size_t Attention::State::bytes() const {
  if (!capacity) return conv_tail.nbytes();
  const int64_t H = k.dim(0), hd = k.dim(2);
  return 2 * size_t(H * length * hd) * sizeof(float) + conv_tail.nbytes();
}

void Attention::State::clear() {
  length = 0;
  if (conv_tail.nbytes()) std::memset(conv_tail.raw_mut(), 0, conv_tail.nbytes());
}

// A compact snapshot: only the filled positions are copied (and held), not the spare capacity.
Attention::State Attention::State::clone() const {
  State c;
  c.length = length;
  c.h0 = h0, c.h1 = h1;
  c.conv_tail = conv_tail.clone();
  if (length) {
    c.capacity = length;
    copy_cache(*this, k.dim(0), k.dim(2), length, c.k, c.v);
  }
  return c;
}

void Attention::State::assign(const State& from) {
  h0 = from.h0, h1 = from.h1;
  if (conv_tail.shape() != from.conv_tail.shape()) conv_tail = from.conv_tail.clone();
  else if (conv_tail.nbytes()) std::memcpy(conv_tail.raw_mut(), from.conv_tail.raw(), conv_tail.nbytes());
  if (!from.length) {
    length = 0;
    return;
  }
  const int64_t H = from.k.dim(0), hd = from.k.dim(2);
  if (capacity >= from.length && k.dim(0) == H && k.dim(2) == hd) {
    copy_positions(from, H, hd, capacity, k, v);
  } else {
    capacity = 2 * from.length;
    copy_cache(from, H, hd, capacity, k, v);
  }
  length = from.length;
}

std::string Attention::describe() const {
  return "softmax attention, " + std::to_string(config.n_heads) + " heads x " + std::to_string(config.head_dim) +
         (config.conv_size > 0 ? ", short conv " + std::to_string(config.conv_size) : "") + ", KV cache";
}

void Attention::for_each_tensor(const std::string& prefix, const TensorVisitor& f) {
  const int64_t D = config.d_model;
  visit_matrix(f, prefix + ".c_attn.weight", weights.c_attn, 3 * D, D);
  f(prefix + ".c_attn.bias", weights.c_attn_bias, {3 * D}, Init::Zeros);
  visit_matrix(f, prefix + ".c_proj.weight", weights.c_proj, D, D);
  f(prefix + ".c_proj.bias", weights.c_proj_bias, {D}, Init::Zeros);
  if (config.conv_size > 0)
    f(prefix + ".c_attn_conv1d.weight", weights.c_attn_conv, {3 * D, 1, config.conv_size}, Init::Normal);
}

void Attention::State::grow(int64_t H, int64_t hd, int64_t needed) {
  if (needed <= capacity) return;
  const int64_t cap = std::max<int64_t>({needed, 2 * capacity, 16});
  Tensor nk, nv;
  copy_cache(*this, H, hd, cap, nk, nv);
  k = std::move(nk);
  v = std::move(nv);
  capacity = cap;
}

void Attention::State::reserve(int64_t H, int64_t hd, int64_t positions) {
  if (positions <= capacity) return;
  Tensor nk, nv;
  copy_cache(*this, H, hd, positions, nk, nv);
  k = std::move(nk);
  v = std::move(nv);
  capacity = positions;
}

void forward(const Attention& a, const Call& call, const float* x, std::span<Attention::State* const> states,
             float* y, Attention::Buffers& buf, const Trace& trace) {
  const Step& step = call.step;
  const int64_t D = a.config.d_model, H = a.config.n_heads, hd = a.config.head_dim, N = step.n_tokens();
  const bool dot = call.options.bf16_dot;
  float* qkv = buf.qkv.get(size_t(N) * 3 * D);
  float* ctx = buf.context.get(size_t(N) * D);
  if (a.config.conv_size > 0) {  // each sequence's rows through the conv from its own tail
    float* raw = buf.raw.get(size_t(N) * 3 * D);
    kernels::linear(x, N, a.weights.c_attn, &a.weights.c_attn_bias, raw, std::nullopt, dot);
    for (int64_t b = 0; b < step.n_seqs(); ++b)
      convolve_rows(a, raw + step.begin(b) * 3 * D, step.length(b), states[size_t(b)]->conv_tail.data<float>(),
                    qkv + step.begin(b) * 3 * D);
  } else {
    kernels::linear(x, N, a.weights.c_attn, &a.weights.c_attn_bias, qkv, std::nullopt, dot);
  }
  trace("attn.qkv", qkv, {N, 3 * D});

  // This rank's heads [h0, h0 + Hr) under tensor parallelism (the states hold only theirs), else all.
  const bool share = step.n_seqs() > 0 && states[0]->h1 >= 0;
  const int64_t h0 = share ? states[0]->h0 : 0, Hr = share ? states[0]->h1 - h0 : H;
  float* out = share ? buf.share.get(size_t(N * Hr * hd)) : ctx;
  buf.seqs.clear();
  for (int64_t b = 0; b < step.n_seqs(); ++b) {
    Attention::State& s = *states[size_t(b)];
    const int64_t p0 = s.length, T = step.length(b), t0 = step.begin(b);
    s.grow(Hr, hd, p0 + T);
    const float* rows = qkv + t0 * 3 * D;
    const auto store = [&](int64_t r0, int64_t r1) {  // K and V into the cache; queries are read in place
      for (int64_t t = r0; t < r1; ++t)
        for (int64_t h = 0; h < Hr; ++h) {
          const float* row = rows + t * 3 * D + (h0 + h) * hd;
          std::memcpy(s.k.data<float>() + (h * s.capacity + p0 + t) * hd, row + D, hd * 4);
          std::memcpy(s.v.data<float>() + (h * s.capacity + p0 + t) * hd, row + 2 * D, hd * 4);
        }
    };
    if (T > 1) parallel_for(T, store, grain_for(2 * Hr * hd));
    else store(0, T);
    s.length = p0 + T;
    buf.seqs.push_back({rows + h0 * hd, 3 * D, T, p0, s.k.data<float>(), s.v.data<float>(), s.capacity * hd,
                        s.capacity * hd, out + t0 * Hr * hd, Hr * hd});
  }
  const float scale = a.config.scale_attn_weights ? 1.0f / std::sqrt(float(hd)) : 1.0f;
  kernels::attention_causal(buf.seqs, {Hr, hd, hd, scale});
  if (share) kernels::gather_heads(out, N, H, hd, ctx);  // every rank's heads' context into ctx [N, D]
  if (trace.on() && N == 1 && !share) {  // one decode token: the weights its query gave the cache (lineage trace)
    const int64_t L = buf.seqs[0].p0 + N;
    std::vector<float> w(size_t(N * H * L));
    kernels::attention_weights(buf.seqs[0], {H, hd, hd, scale}, w.data(), H * L);
    trace("attn.weights", w.data(), {N, H, L});
  }
  trace("attn.context", ctx, {N, D});
  kernels::linear(ctx, N, a.weights.c_proj, &a.weights.c_proj_bias, y, std::nullopt, dot);
  trace("attn.out", y, {N, D});
}

namespace {

kernels::AttentionTrainArgs train_args(const Attention& a, const TrainShape& s, Attention::Saved& saved) {
  const int64_t D = a.config.d_model, H = a.config.n_heads, hd = a.config.head_dim;
  kernels::AttentionTrainArgs k;
  k.B = s.B, k.T = s.T, k.H = H, k.dk = k.dv = hd;
  k.scale = a.config.scale_attn_weights ? 1.0f / std::sqrt(float(hd)) : 1.0f;
  float* qkv = saved.qkv.get(size_t(s.N()) * 3 * D);
  k.q = qkv, k.k = qkv + D, k.v = qkv + 2 * D, k.ldq = k.ldk = k.ldv = 3 * D;
  k.out = saved.context.get(size_t(s.N()) * D), k.ldo = D;
  k.lse = saved.lse.get(size_t(s.B * H * s.T));
  return k;
}

}  // namespace

void forward_train(const Attention& a, const TrainShape& s, const float* x, float* y, Attention::Saved& saved) {
  const int64_t N = s.N(), C = 3 * a.config.d_model, W = a.config.conv_size;
  const kernels::AttentionTrainArgs args = train_args(a, s, saved);
  if (W > 0) {  // every sequence from a zero tail
    float* raw = saved.raw.get(size_t(N * C));
    float* tail = saved.tail.get(size_t((W - 1) * C));
    kernels::linear(x, N, a.weights.c_attn, &a.weights.c_attn_bias, raw);
    for (int64_t b = 0; b < s.B; ++b) {
      std::fill(tail, tail + (W - 1) * C, 0.0f);
      convolve_rows(a, raw + b * s.T * C, s.T, tail, saved.qkv.get(0) + b * s.T * C);
    }
  } else {
    kernels::linear(x, N, a.weights.c_attn, &a.weights.c_attn_bias, saved.qkv.get(0));
  }
  kernels::attention_causal_train(args);
  kernels::linear(args.out, N, a.weights.c_proj, &a.weights.c_proj_bias, y);
}

void backward(const Attention& a, const TrainShape& s, const float* x, const float* dy, Attention::Saved& saved,
              float* dx, Attention& grad) {
  const int64_t D = a.config.d_model, N = s.N();
  const kernels::AttentionTrainArgs args = train_args(a, s, saved);
  float* d_ctx = saved.d_context.get(size_t(N) * D);
  float* d_qkv = saved.d_qkv.get(size_t(N) * 3 * D);
  kernels::linear_backward(args.out, dy, N, a.weights.c_proj, d_ctx, &grad.weights.c_proj,
                           grad.weights.c_proj_bias.data<float>());
  kernels::attention_causal_backward(args, {d_ctx, d_qkv, d_qkv + D, d_qkv + 2 * D, D, 3 * D, 3 * D, 3 * D});
  if (a.config.conv_size > 0) {  // ∂raw = ∂qkv through the conv, plus ∂qkv itself (the identity)
    const int64_t C = 3 * D;
    float* d_raw = saved.d_raw.get(size_t(N * C));
    for (int64_t b = 0; b < s.B; ++b)
      kernels::short_conv_backward(saved.raw.get(0) + b * s.T * C, d_qkv + b * s.T * C, s.T, C, C, C,
                                   a.weights.c_attn_conv, d_raw + b * s.T * C, C,
                                   grad.weights.c_attn_conv.data<float>());
    parallel_for(N, [&](int64_t t0, int64_t t1) {
      for (int64_t i = t0 * C; i < t1 * C; ++i) d_raw[i] += d_qkv[i];
    }, grain_for(C));
    d_qkv = d_raw;
  }
  kernels::linear_backward(x, d_qkv, N, a.weights.c_attn, dx, &grad.weights.c_attn, grad.weights.c_attn_bias.data<float>());
}

}  // namespace lineage::layers
