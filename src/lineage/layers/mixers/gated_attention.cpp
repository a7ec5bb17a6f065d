#include "lineage/layers/mixers/gated_attention.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/backward.h"
#include "lineage/kernels/norm.h"
#include "lineage/kernels/row_split.h"
#include "lineage/kernels/rope.h"
#include "lineage/kernels/vmath.h"

namespace lineage::layers {

namespace {

// q_proj's rows per head, [query; gate], into the queries and the gates [N, H·hd] each.
void split_query_gate(const float* qg, int64_t N, int64_t H, int64_t hd, float* q, float* gate) {
  const int64_t Q = H * hd;
  parallel_for(N, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H; ++h) {
        std::memcpy(q + t * Q + h * hd, qg + t * 2 * Q + h * 2 * hd, size_t(hd) * sizeof(float));
        std::memcpy(gate + t * Q + h * hd, qg + t * 2 * Q + h * 2 * hd + hd, size_t(hd) * sizeof(float));
      }
  }, grain_for(2 * Q));
}

}  // namespace

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
    split_query_gate(qg, N, H, hd, q, gate);
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
  // Under tensor parallelism this rank's KV heads [h0, h0 + KVr) and their query heads (the states
  // hold only theirs); else all.
  const bool share = step.n_seqs() > 0 && states[0]->h1 >= 0;
  const int64_t h0 = share ? states[0]->h0 : 0, KVr = share ? states[0]->h1 - h0 : KVH, Qr = KVr * group * hd;
  float* out = share ? buf.share.get(size_t(N * Qr)) : ctx;
  buf.seqs.clear();
  for (int64_t b = 0; b < step.n_seqs(); ++b) {
    GatedAttention::State& s = *states[size_t(b)];
    const int64_t p0 = s.length, T = step.length(b), t0 = step.begin(b);
    s.grow(KVr, hd, p0 + T);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < KVr; ++h) {
        const int64_t src = (t0 + t) * KV + (h0 + h) * hd;
        std::memcpy(s.k.data<float>() + (h * s.capacity + p0 + t) * hd, k + src, size_t(hd) * 4);
        std::memcpy(s.v.data<float>() + (h * s.capacity + p0 + t) * hd, v + src, size_t(hd) * 4);
      }
    s.length = p0 + T;
    for (int64_t h = 0; h < KVr; ++h)
      buf.seqs.push_back({q + t0 * Q + (h0 + h) * group * hd, Q, T, p0, s.k.data<float>() + h * s.capacity * hd,
                          s.v.data<float>() + h * s.capacity * hd, 0, 0, out + t0 * Qr + h * group * hd, Qr});
  }
  kernels::attention_causal(buf.seqs, {group, hd, hd, 1.0f / std::sqrt(float(hd))});
  if (share) kernels::gather_heads(out, N, KVH, group * hd, ctx);  // every rank's query heads' context into ctx
  if (trace.on() && N == 1 && !share) {  // one decode token: the weights its query head gave the cache (lineage trace)
    const int64_t L = buf.seqs[0].p0 + N, heads = KVH * group;
    std::vector<float> w(size_t(N * heads * L));
    for (int64_t h = 0; h < KVH; ++h)
      kernels::attention_weights(buf.seqs[size_t(h)], {group, hd, hd, 1.0f / std::sqrt(float(hd))},
                                 w.data() + h * group * L, heads * L);
    trace("attn.weights", w.data(), {N, heads, L});
  }
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

namespace {

// The attention kernel's arguments over the saved buffers: H heads reading the widened keys and
// values, the scale 1/√hd.
kernels::AttentionTrainArgs train_args(const GatedAttention& a, const TrainShape& s, GatedAttention::Saved& sv) {
  const int64_t hd = a.config.head_dim, Q = a.config.n_heads * hd, N = s.N();
  kernels::AttentionTrainArgs k;
  k.B = s.B, k.T = s.T, k.H = a.config.n_heads, k.dk = k.dv = hd;
  k.scale = 1.0f / std::sqrt(float(hd));
  k.q = sv.q.get(size_t(N * Q)), k.k = sv.k_wide.get(size_t(N * Q)), k.v = sv.v_wide.get(size_t(N * Q));
  k.ldq = k.ldk = k.ldv = Q;
  k.out = sv.context.get(size_t(N * Q)), k.ldo = Q;
  k.lse = sv.lse.get(size_t(s.B * k.H * s.T));
  return k;
}

// Rotates (or with `backward` turns back) the first rope_dims of each of `heads` heads of hd in every
// row of x [N, heads·hd]; row n is position n mod T of its sequence.
void rotate_rows(const GatedAttention::Config& c, float* x, int64_t heads, const TrainShape& s, bool backward) {
  const int64_t w = heads * c.head_dim;
  parallel_for(s.N(), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t h = 0; h < heads; ++h) {
        float* row = x + n * w + h * c.head_dim;
        if (backward) kernels::rope_neox_backward(row, c.rope_dims, n % s.T, c.rope_theta);
        else kernels::rope_neox(row, c.rope_dims, n % s.T, c.rope_theta);
      }
  }, grain_for(4 * heads * c.rope_dims));
}

}  // namespace

void forward_train(const GatedAttention& a, const TrainShape& s, const float* x, float* y, GatedAttention::Saved& sv) {
  const GatedAttention::Config& c = a.config;
  const int64_t N = s.N(), H = c.n_heads, KVH = c.n_kv_heads, hd = c.head_dim;
  const int64_t Q = H * hd, KV = KVH * hd, group = H / KVH;
  const kernels::AttentionTrainArgs args = train_args(a, s, sv);
  float* q = sv.q.get(0);
  float* gate = sv.gate.get(size_t(N * Q));
  float* k = sv.k_raw.get(size_t(N * KV));
  float* v = sv.d_v.get(size_t(N * KV));  // the values before widening (d_v is free until backward)
  if (c.output_gate) {
    float* qg = sv.qg.get(size_t(N * 2 * Q));
    kernels::linear(x, N, a.weights.q_proj, nullptr, qg);
    split_query_gate(qg, N, H, hd, q, gate);
  } else {
    kernels::linear(x, N, a.weights.q_proj, nullptr, q);
  }
  kernels::linear(x, N, a.weights.k_proj, nullptr, k);
  kernels::linear(x, N, a.weights.v_proj, nullptr, v);
  float* kn = sv.d_k.get(size_t(N * KV));  // the keys after their norm and rotation, before widening
  if (c.qk_norm) {
    float* q_raw = sv.q_raw.get(size_t(N * Q));
    std::memcpy(q_raw, q, size_t(N * Q) * sizeof(float));
    forward(a.weights.q_norm, q_raw, N * H, q);
    forward(a.weights.k_norm, k, N * KVH, kn);
  } else {
    std::memcpy(kn, k, size_t(N * KV) * sizeof(float));
  }
  rotate_rows(c, q, H, s, false);
  rotate_rows(c, kn, KVH, s, false);
  float* kw = sv.k_wide.get(0);
  float* vw = sv.v_wide.get(0);
  parallel_for(N, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H; ++h) {
        std::memcpy(kw + t * Q + h * hd, kn + t * KV + (h / group) * hd, size_t(hd) * sizeof(float));
        std::memcpy(vw + t * Q + h * hd, v + t * KV + (h / group) * hd, size_t(hd) * sizeof(float));
      }
  }, grain_for(2 * Q));
  kernels::attention_causal_train(args);
  float* gated = sv.gated.get(size_t(N * Q));
  if (c.output_gate) {
    kernels::sigmoid(gate, gate, N * Q);
    parallel_for(N * Q, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) gated[i] = args.out[i] * gate[i];
    }, grain_for(1));
  } else {
    std::memcpy(gated, args.out, size_t(N * Q) * sizeof(float));
  }
  kernels::linear(gated, N, a.weights.o_proj, nullptr, y);
}

void backward(const GatedAttention& a, const TrainShape& s, const float* x, const float* dy, GatedAttention::Saved& sv,
              float* dx, GatedAttention& grad) {
  const GatedAttention::Config& c = a.config;
  const int64_t N = s.N(), D = c.d_model, H = c.n_heads, KVH = c.n_kv_heads, hd = c.head_dim;
  const int64_t Q = H * hd, KV = KVH * hd, group = H / KVH;
  const kernels::AttentionTrainArgs args = train_args(a, s, sv);
  GatedAttention::Weights& gw = grad.weights;
  // o_proj, then the gate: ∂context = ∂gated·σ, ∂(gate's input) = ∂gated·context·σ(1 − σ) (into gate's
  // place in ∂q_proj's rows).
  float* d_gated = sv.d_gated.get(size_t(N * Q));
  kernels::linear_backward(sv.gated.get(0), dy, N, a.weights.o_proj, d_gated, &gw.o_proj, nullptr);
  float* d_qg = sv.d_qg.get(size_t(N * (c.output_gate ? 2 : 1) * Q));
  if (c.output_gate) {
    const float* gate = sv.gate.get(0);
    parallel_for(N, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t i = 0; i < Q; ++i) {
          const int64_t at = t * Q + i, h = i / hd;
          const float g = gate[at], d = d_gated[at];
          d_qg[t * 2 * Q + (2 * h + 1) * hd + i % hd] = d * args.out[at] * g * (1.0f - g);
          d_gated[at] = d * g;
        }
    }, grain_for(4 * Q));
  }
  float* dq = sv.d_q.get(size_t(N * Q));
  float* dkw = sv.d_k_wide.get(size_t(N * Q));
  float* dvw = sv.d_v_wide.get(size_t(N * Q));
  kernels::attention_causal_backward(args, {d_gated, dq, dkw, dvw, Q, Q, Q, Q});
  // The widened keys' and values' gradients summed back onto their KV head, in head order.
  float* dk = sv.d_k.get(size_t(N * KV));
  float* dv = sv.d_v.get(size_t(N * KV));
  parallel_for(N, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t j = 0; j < KVH; ++j)
        for (int64_t e = 0; e < hd; ++e) {
          float sk = 0, sv_ = 0;
          for (int64_t h = j * group; h < (j + 1) * group; ++h) sk += dkw[t * Q + h * hd + e], sv_ += dvw[t * Q + h * hd + e];
          dk[t * KV + j * hd + e] = sk, dv[t * KV + j * hd + e] = sv_;
        }
  }, grain_for(2 * Q));
  rotate_rows(c, dq, H, s, true);
  rotate_rows(c, dk, KVH, s, true);
  if (c.qk_norm) {
    backward(a.weights.q_norm, sv.q_raw.get(0), N * H, dq, dq, gw.q_norm);
    backward(a.weights.k_norm, sv.k_raw.get(0), N * KVH, dk, dk, gw.k_norm);
  }
  if (c.output_gate) {
    parallel_for(N, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t h = 0; h < H; ++h)
          std::memcpy(d_qg + t * 2 * Q + h * 2 * hd, dq + t * Q + h * hd, size_t(hd) * sizeof(float));
    }, grain_for(2 * Q));
  } else {
    d_qg = dq;
  }
  // x fed q_proj, k_proj and v_proj: their input gradients summed.
  float* tmp = sv.d_x.get(size_t(N * D));
  kernels::linear_backward(x, d_qg, N, a.weights.q_proj, dx, &gw.q_proj, nullptr);
  const float* d_kv[2] = {dk, dv};
  const kernels::Matrix* W[2] = {&a.weights.k_proj, &a.weights.v_proj};
  kernels::Matrix* dW[2] = {&gw.k_proj, &gw.v_proj};
  for (int i = 0; i < 2; ++i) {
    kernels::linear_backward(x, d_kv[i], N, *W[i], tmp, dW[i], nullptr);
    parallel_for(N * D, [&](int64_t i0, int64_t i1) {
      for (int64_t j = i0; j < i1; ++j) dx[j] += tmp[j];
    }, grain_for(1));
  }
}

}  // namespace lineage::layers
