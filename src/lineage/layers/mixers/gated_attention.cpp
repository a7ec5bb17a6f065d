#include "lineage/layers/mixers/gated_attention.h"

#include <cmath>
#include <cstring>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/norm.h"
#include "lineage/kernels/rope.h"
#include "lineage/kernels/vmath.h"

namespace lineage::layers {

std::string GatedAttention::describe() const {
  const Config& c = config;
  return cat("gated softmax attention, ", c.n_heads, " heads x ", c.head_dim, ", ", c.n_kv_heads, " KV heads, RoPE on ",
             c.rope_dims, " dims", c.qk_norm ? ", q/k norm" : "", c.output_gate ? ", output gate" : "", ", KV cache");
}

void GatedAttention::for_each_tensor(const std::string& p, const TensorVisitor& f) {
  const Config& c = config;
  const int64_t D = c.d_model, Q = c.n_heads * c.head_dim, KV = c.n_kv_heads * c.head_dim;
  visit_matrix(f, p + ".q_proj.weight", weights.q_proj, c.output_gate ? 2 * Q : Q, D);
  visit_matrix(f, p + ".k_proj.weight", weights.k_proj, KV, D);
  visit_matrix(f, p + ".v_proj.weight", weights.v_proj, KV, D);
  visit_matrix(f, p + ".o_proj.weight", weights.o_proj, D, Q);
  if (c.qk_norm) {
    for (Norm* n : {&weights.q_norm, &weights.k_norm})
      n->kind = Norm::Kind::Rms, n->dim = c.head_dim, n->eps = c.norm_eps, n->unit_offset = true;
    weights.q_norm.for_each_tensor(p + ".q_norm", f);
    weights.k_norm.for_each_tensor(p + ".k_norm", f);
  }
}

void forward(const GatedAttention& a, const Call& call, const float* x, std::span<GatedAttention::State* const> states,
             float* y, GatedAttention::Buffers& buf, const Trace& trace) {
  const GatedAttention::Config& c = a.config;
  const Step& step = call.step;
  const bool dot = call.options.bf16_dot;
  const int64_t N = step.n_tokens(), H = c.n_heads, KVH = c.n_kv_heads, hd = c.head_dim;
  const int64_t Q = H * hd, KV = KVH * hd, group = H / KVH;
  float* q = buf.q.get(size_t(N * Q));
  float* gate = buf.gate.get(size_t(N * Q));
  float* k = buf.k.get(size_t(N * KV));
  float* v = buf.v.get(size_t(N * KV));
  float* ctx = buf.context.get(size_t(N * Q));
  if (c.output_gate) {  // q_proj's rows per head: its query, then its gate
    float* qg = buf.qg.get(size_t(N * 2 * Q));
    kernels::linear(x, N, a.weights.q_proj, nullptr, qg, std::nullopt, dot);
    parallel_for(N, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t h = 0; h < H; ++h) {
          std::memcpy(q + t * Q + h * hd, qg + t * 2 * Q + h * 2 * hd, size_t(hd) * sizeof(float));
          std::memcpy(gate + t * Q + h * hd, qg + t * 2 * Q + h * 2 * hd + hd, size_t(hd) * sizeof(float));
        }
    }, grain_for(2 * Q));
  } else {
    kernels::linear(x, N, a.weights.q_proj, nullptr, q, std::nullopt, dot);
  }
  kernels::linear(x, N, a.weights.k_proj, nullptr, k, std::nullopt, dot);
  kernels::linear(x, N, a.weights.v_proj, nullptr, v, std::nullopt, dot);
  if (c.qk_norm) {  // every head's hd dims a row of its own
    forward(a.weights.q_norm, q, N * H, q);
    forward(a.weights.k_norm, k, N * KVH, k);
  }
  for (int64_t b = 0; b < step.n_seqs(); ++b) {  // rotary positions continue each sequence's cache
    const int64_t p0 = states[size_t(b)]->length, t0 = step.begin(b), T = step.length(b);
    const auto rotate = [&](int64_t r0, int64_t r1) {
      for (int64_t t = r0; t < r1; ++t) {
        for (int64_t h = 0; h < H; ++h) kernels::rope_neox(q + (t0 + t) * Q + h * hd, c.rope_dims, p0 + t, c.rope_theta);
        for (int64_t h = 0; h < KVH; ++h)
          kernels::rope_neox(k + (t0 + t) * KV + h * hd, c.rope_dims, p0 + t, c.rope_theta);
      }
    };
    if (T > 1) parallel_for(T, rotate, grain_for(4 * (H + KVH) * c.rope_dims));
    else rotate(0, T);
  }
  trace("attn.q", q, {N, Q});
  trace("attn.k", k, {N, KV});
  trace("attn.v", v, {N, KV});
  if (c.output_gate) trace("attn.gate", gate, {N, Q});

  // Each sequence's keys and values into its cache, then one kernel argument per (sequence, KV
  // head): the group of query heads that reads that head's rows (k_stride 0).
  buf.seqs.clear();
  for (int64_t b = 0; b < step.n_seqs(); ++b) {
    GatedAttention::State& s = *states[size_t(b)];
    const int64_t p0 = s.length, T = step.length(b), t0 = step.begin(b);
    s.grow(KVH, hd, p0 + T);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < KVH; ++h) {
        std::memcpy(s.k.data<float>() + (h * s.capacity + p0 + t) * hd, k + (t0 + t) * KV + h * hd, size_t(hd) * 4);
        std::memcpy(s.v.data<float>() + (h * s.capacity + p0 + t) * hd, v + (t0 + t) * KV + h * hd, size_t(hd) * 4);
      }
    s.length = p0 + T;
    for (int64_t h = 0; h < KVH; ++h)
      buf.seqs.push_back({q + t0 * Q + h * group * hd, Q, T, p0, s.k.data<float>() + h * s.capacity * hd,
                          s.v.data<float>() + h * s.capacity * hd, 0, 0, ctx + t0 * Q + h * group * hd, Q});
  }
  kernels::attention_causal(buf.seqs, {group, hd, hd, 1.0f / std::sqrt(float(hd))});
  trace("attn.context", ctx, {N, Q});
  if (c.output_gate) {
    kernels::sigmoid(gate, gate, N * Q);
    parallel_for(N * Q, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) ctx[i] *= gate[i];
    }, grain_for(1));
  }
  kernels::linear(ctx, N, a.weights.o_proj, nullptr, y, std::nullopt, dot);
  trace("attn.out", y, {N, c.d_model});
}

}  // namespace lineage::layers
