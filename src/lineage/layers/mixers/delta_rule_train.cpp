// DeltaRule's training: the forward's stages (delta_rule_stages.h) over B sequences from empty
// states, keeping what backward reads, and their backward in reverse order.
#include <algorithm>
#include <cstring>
#include <tuple>

#include "lineage/core/error.h"
#include "lineage/kernels/activation.h"
#include "lineage/kernels/backward.h"
#include "lineage/kernels/delta_rule_backward.h"
#include "lineage/kernels/delta_rule_layer_backward.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/short_conv.h"
#include "lineage/layers/mixers/delta_rule.h"
#include "lineage/layers/mixers/delta_rule_stages.h"

namespace lineage::layers {

using namespace delta_rule_stages;

namespace {

// B sequences of T tokens, sequence b from position 0 of its own (empty) state.
Step train_step(const TrainShape& s) {
  Step step;
  step.tokens.assign(size_t(s.N()), 0);
  for (int64_t b = 0; b < s.B; ++b) {
    step.seq_begin.push_back((b + 1) * s.T);
    step.slots.push_back(int32_t(b));
    step.starts.push_back(0);
  }
  return step;
}

// Runs f(pass) over the saved buffers: the forward's Pass, every stage in its many-token form (which
// keeps each in-place stage's input apart, DeltaRule::Saved), the states those of the saved sequences.
template <class F>
void with_train_pass(const DeltaRule& m, const TrainShape& s, DeltaRule::Saved& saved, F&& f) {
  LINEAGE_CHECK(m.prepared.ready, "DeltaRule::prepare() must run after the weights are bound");
  const Step step = train_step(s);
  Options options;
  options.delta_rule_path = saved.path == DeltaRulePath::Recurrent ? DeltaRulePath::Recurrent : DeltaRulePath::Chunked;
  options.bf16_dot = false;
  const Call call{step, options};
  while (int64_t(saved.states.size()) < s.B) saved.states.push_back(m.new_state());
  std::vector<DeltaRule::State*> states;
  for (int64_t b = 0; b < s.B; ++b) states.push_back(&saved.states[size_t(b)]);
  Pass p = make_pass(m, call, states, saved.fwd);
  const size_t N = size_t(p.N);
  p.one_token = false;
  if (p.decay) p.decay_in = saved.decay_in.get(N * p.decay_width);
  if (p.gate) p.gate_in = saved.gate_in.get(N * p.HV * p.V);
  p.q_mapped = saved.q_mapped.get(N * p.H * p.K);
  p.k_mapped = saved.k_mapped.get(N * p.H * p.K);
  p.normed = saved.normed.get(N * p.HV * p.V);
  f(p);
}

// ∂L/∂(an input read by several projections), summed over them in call order: the first overwrites dx.
struct InputGrad {
  float* dx;
  int64_t rows;
  bool written = false;
  // The projection y = x·Wᵀ (+ bias) of x [rows, in] with ∂L/∂y = dy [rows, out]: ∂W (and ∂bias) added
  // into the gradient layer's dW (dbias), dy·W into dx.
  void add(const float* x, const float* dy, const kernels::Matrix& W, kernels::Matrix& dW, float* dbias = nullptr) {
    kernels::linear_backward(x, dy, rows, W, nullptr, &dW, dbias);
    const bool out_in = W.layout == kernels::Layout::OutIn;
    kernels::gemm(false, !out_in, rows, W.in, W.out, dy, W.out, W.data.data<float>(), out_in ? W.in : W.out,
                  written ? 1.0f : 0.0f, dx, W.in);
    written = true;
  }
};

// Stage 6 backward: o_proj, the per-head RMSNorm and its gate (through the gate's activation and
// projections to x).
void output_backward(Pass& p, const float* x, const float* dy, DeltaRule::Saved& sv, DeltaRule& grad, InputGrad& dx) {
  const DeltaRule::Config& c = p.m.config;
  const DeltaRule::Weights& w = p.m.weights;
  DeltaRule::Weights& gw = grad.weights;
  const int64_t N = p.N, HV = p.HV, V = p.V, n = N * HV * V;
  float* d_normed = sv.d_normed.get(size_t(n));
  kernels::linear_backward(p.normed, dy, N, w.o_proj, d_normed, &gw.o_proj, nullptr);
  float* d_gate = p.gate ? sv.d_gate.get(size_t(n)) : nullptr;
  float* d_onorm = c.out_norm_weight && gw.o_norm.defined() ? gw.o_norm.data<float>() : nullptr;
  kernels::gated_rms_norm_backward(p.core, p.gate, d_normed, N * HV, V, p.m.prepared.o_norm.data(), c.norm_eps,
                                   sv.d_core.get(size_t(n)), d_gate, d_onorm);
  if (!p.gate) return;
  const kernels::Activation act = p.swish_gate() ? kernels::Activation::Silu : kernels::Activation::Sigmoid;
  kernels::activation_backward(act, p.gate_in, d_gate, d_gate, n);
  if (!p.low_rank_gate()) {
    dx.add(x, d_gate, w.g_proj, gw.g_proj);
    return;
  }
  float* d_low = sv.d_low.get(size_t(N * V));
  kernels::linear_backward(p.low_gate, d_gate, N, w.g_b, d_low, &gw.g_b,
                           p.m.g_b_has_bias ? gw.g_b_bias.data<float>() : nullptr);
  dx.add(x, d_low, w.g_a, gw.g_a);
}

// Stage 5 backward: each sequence's recurrence from the zero state it started from, into d_q, d_k
// (of the normalized heads), d_v, d_beta and d_decay.
void recur_backward(Pass& p, DeltaRule::Saved& sv) {
  const Step& step = p.call.step;
  const int64_t N = p.N, H = p.H, HV = p.HV, K = p.K, V = p.V;
  float* dq = sv.d_q.get(size_t(N * H * K));
  float* dk = sv.d_k.get(size_t(N * H * K));
  float* dv = sv.d_v.get(size_t(N * HV * V));
  float* dbeta = p.has_beta() ? sv.d_beta.get(size_t(N * HV)) : nullptr;
  float* ddecay = p.decay ? sv.d_decay.get(size_t(N * p.decay_width)) : nullptr;
  float* zero = sv.zero_state.get(size_t(HV * K * V + HV * K));
  std::memset(zero, 0, size_t(HV * K * V + HV * K) * sizeof(float));
  const float* d_core = sv.d_core.get(0);
  for (int64_t b = 0; b < step.n_seqs(); ++b) {
    const int64_t t0 = step.begin(b);
    const kernels::DeltaRuleArgs a = seq_args(p, b, zero, zero + HV * K * V);
    kernels::DeltaRuleGrads g;
    g.dout = d_core + t0 * HV * V;
    g.dq = dq + t0 * H * K, g.dk = dk + t0 * H * K, g.dv = dv + t0 * HV * V;
    g.dbeta = dbeta ? dbeta + t0 * HV : nullptr;
    g.dlog_decay = ddecay ? ddecay + t0 * p.decay_width : nullptr;
    if (p.call.options.delta_rule_path == DeltaRulePath::Recurrent) kernels::delta_rule_recurrent_backward(a, g);
    else kernels::delta_rule_chunked_backward(a, g, kChunkSize);
  }
}

// Stage 4 backward: β's sigmoid and the log decay's gate (A_log, dt_bias) to their projections.
void gates_backward(Pass& p, const float* x, DeltaRule::Saved& sv, DeltaRule& grad, InputGrad& dx) {
  const DeltaRule::Config& c = p.m.config;
  const DeltaRule::Weights& w = p.m.weights;
  DeltaRule::Weights& gw = grad.weights;
  const int64_t N = p.N, HV = p.HV;
  if (p.has_beta()) {
    float* db = sv.d_beta.get(0);
    kernels::scaled_sigmoid_backward(p.beta, db, c.neg_eigval ? 2.0f : 1.0f, db, N * HV);
    dx.add(x, db, w.b_proj, gw.b_proj);
  }
  if (!p.decay) return;
  float* dz = sv.d_decay.get(0);
  kernels::decay_gate_backward({N, HV, p.per_channel() ? p.K : 1, p.m.prepared.A.data(), c.gate_lower_bound,
                                p.decay_in, dz, dz, gw.A_log.data<float>(), gw.dt_bias.data<float>()});
  if (!p.low_rank_decay()) {
    dx.add(x, dz, p.per_channel() ? w.f_proj : w.a_proj, p.per_channel() ? gw.f_proj : gw.a_proj);
    return;
  }
  float* d_low = sv.d_low.get(size_t(N * p.V));
  kernels::linear_backward(p.low_decay, dz, N, w.f_b, d_low, &gw.f_b, nullptr);
  dx.add(x, d_low, w.f_a, gw.f_a);
}

void norm_backward(DeltaRule::QkNorm n, const float* x, float* d, int64_t rows, int64_t K) {
  switch (n) {
    case DeltaRule::QkNorm::None: break;
    case DeltaRule::QkNorm::L2: kernels::l2_norm_backward(x, d, rows, K, d); break;
    case DeltaRule::QkNorm::Sum: kernels::sum_norm_backward(x, d, rows, K, 0.0f, d); break;
    case DeltaRule::QkNorm::SumEps: kernels::sum_norm_backward(x, d, rows, K, 1e-4f, d); break;
  }
}

// The feature map's backward on rows of K, in place on d, from the heads before it (pre). The product
// map's weights (w1, b1, w2, b2) get their gradients in (g1, gb1, g2, gb2).
struct ProductMapGrads {
  const kernels::Matrix &w1, &w2;
  const Tensor &b1, &b2;
  kernels::Matrix &g1, &g2;
  Tensor &gb1, &gb2;
};
void map_backward(Pass& p, DeltaRule::FeatureMap m, const float* pre, float* d, int64_t rows,
                  const ProductMapGrads& pm, DeltaRule::Saved& sv) {
  const int64_t K = p.K, n = rows * K;
  switch (m) {
    case DeltaRule::FeatureMap::Identity: return;
    case DeltaRule::FeatureMap::Silu: kernels::activation_backward(kernels::Activation::Silu, pre, d, d, n); return;
    case DeltaRule::FeatureMap::Relu: kernels::activation_backward(kernels::Activation::Relu, pre, d, d, n); return;
    case DeltaRule::FeatureMap::Elu1: kernels::elu1_backward(pre, d, d, n); return;
    case DeltaRule::FeatureMap::ElementwiseProduct: break;
  }
  // y = a ⊙ b with a = pre·W1ᵀ + b1, b = pre·W2ᵀ + b2 (recomputed): da = d ⊙ b, db = d ⊙ a.
  float* a = sv.feature_a.get(size_t(n));
  float* b = sv.feature_b.get(size_t(n));
  kernels::linear(pre, rows, pm.w1, &pm.b1, a);
  kernels::linear(pre, rows, pm.w2, &pm.b2, b);
  over_rows(rows, 2 * K, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0 * K; i < r1 * K; ++i) {
      const float ai = a[i];
      a[i] = d[i] * b[i], b[i] = d[i] * ai;
    }
  });
  InputGrad dpre{d, rows};
  dpre.add(pre, a, pm.w1, pm.g1, pm.gb1.data<float>());
  dpre.add(pre, b, pm.w2, pm.g2, pm.gb2.data<float>());
}

// Stage 3 backward: the q/k normalizations and feature maps, then the heads back into packed rows
// d_qkv [N, C] (linear attention's repeated k/v heads summed, in head order).
void heads_backward(Pass& p, DeltaRule::Saved& sv, DeltaRule& grad) {
  const DeltaRule::Config& c = p.m.config;
  const DeltaRule::Weights& w = p.m.weights;
  DeltaRule::Weights& gw = grad.weights;
  const int64_t N = p.N, H = p.H, KVH = p.KVH, HV = p.HV, K = p.K, V = p.V, C = p.C, Cq = p.Cq, Ck = p.Ck;
  float* dq = sv.d_q.get(0);
  float* dk = sv.d_k.get(0);
  norm_backward(c.q_norm, p.q_mapped, dq, N * H, K);
  norm_backward(c.k_norm, p.k_mapped, dk, N * H, K);
  if (c.qk_map != DeltaRule::FeatureMap::Identity) {
    float* pre_q = sv.pre_q.get(size_t(N * H * K));
    float* pre_k = sv.pre_k.get(size_t(N * H * K));
    split_heads(p, p.qkv, pre_q, pre_k, nullptr);
    map_backward(p, c.qk_map, pre_q, dq, N * H,
                 {w.fm_q1_w, w.fm_q2_w, w.fm_q1_b, w.fm_q2_b, gw.fm_q1_w, gw.fm_q2_w, gw.fm_q1_b, gw.fm_q2_b}, sv);
    map_backward(p, c.qk_map, pre_k, dk, N * H,
                 {w.fm_k1_w, w.fm_k2_w, w.fm_k1_b, w.fm_k2_b, gw.fm_k1_w, gw.fm_k2_w, gw.fm_k1_b, gw.fm_k2_b}, sv);
  }
  const int64_t G = H / KVH, Gv = c.delta ? 1 : G, v_heads = c.delta ? HV : KVH;
  const float* dv = sv.d_v.get(0);
  float* d_qkv = sv.d_qkv.get(size_t(N * C));
  // Sums each group of G repeated heads of d channels back onto its source head.
  const auto unrepeat = [](const float* src, int64_t heads, int64_t G, int64_t d, float* dst) {
    for (int64_t h = 0; h < heads; ++h) {
      float* o = dst + h * d;
      std::memcpy(o, src + h * G * d, size_t(d) * sizeof(float));
      for (int64_t g = 1; g < G; ++g)
        for (int64_t i = 0; i < d; ++i) o[i] += src[(h * G + g) * d + i];
    }
  };
  over_rows(N, H * K + HV * V, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* row = d_qkv + t * C;
      std::memcpy(row, dq + t * Cq, size_t(Cq) * sizeof(float));
      unrepeat(dk + t * H * K, KVH, G, K, row + Cq);
      unrepeat(dv + t * HV * V, v_heads, Gv, V, row + Cq + Ck);
    }
  });
}

// Stage 2 backward: d_qkv through the SiLU and each sequence's short convolution (from its zero
// tail) into ∂L/∂raw; returns it (d_qkv itself where there is no convolution).
float* convolve_backward(Pass& p, DeltaRule::Saved& sv, DeltaRule& grad) {
  const DeltaRule::Config& c = p.m.config;
  const DeltaRule::Weights& w = p.m.weights;
  DeltaRule::Weights& gw = grad.weights;
  const int64_t N = p.N, C = p.C, Cq = p.Cq, Ck = p.Ck, Cv = p.Cv;
  float* d_qkv = sv.d_qkv.get(0);
  const Step& step = p.call.step;
  struct Part {
    const Tensor& w;
    Tensor& dw;
    int64_t off, n;
  };
  const Part parts[3] = {
      {w.q_conv, gw.q_conv, 0, Cq}, {w.k_conv, gw.k_conv, Cq, Ck}, {w.v_conv, gw.v_conv, Cq + Ck, Cv}};
  // The activation's input: the conv output before its SiLU (recomputed), or raw without a conv.
  const float* pre = p.raw;
  if (c.conv_size > 0) {
    float* out = sv.pre_conv.get(size_t(N * C));
    float* tail = sv.conv_tail.get(size_t((c.conv_size - 1) * C));
    for (int64_t b = 0; b < step.n_seqs(); ++b) {
      const int64_t t0 = step.begin(b), T = step.length(b);
      std::memset(tail, 0, size_t((c.conv_size - 1) * C) * sizeof(float));
      for (const Part& part : parts)
        kernels::short_conv(p.raw + t0 * C + part.off, T, part.n, C, part.w, tail + part.off, C, false,
                            out + t0 * C + part.off, C);
    }
    pre = out;
  } else if (!c.delta) {
    return d_qkv;  // linear attention: the projections themselves
  }
  const bool qk_silu = c.qk_conv_silu, v_silu = c.delta;  // convolve's activations
  if (qk_silu && v_silu) {
    kernels::activation_backward(kernels::Activation::Silu, pre, d_qkv, d_qkv, N * C);
  } else {
    for (int64_t t = 0; t < N; ++t) {
      if (qk_silu)
        kernels::activation_backward(kernels::Activation::Silu, pre + t * C, d_qkv + t * C, d_qkv + t * C, Cq + Ck);
      if (v_silu)
        kernels::activation_backward(kernels::Activation::Silu, pre + t * C + Cq + Ck, d_qkv + t * C + Cq + Ck,
                                     d_qkv + t * C + Cq + Ck, Cv);
    }
  }
  if (c.conv_size == 0) return d_qkv;
  float* d_raw = sv.d_raw.get(size_t(N * C));
  for (int64_t b = 0; b < step.n_seqs(); ++b) {
    const int64_t t0 = step.begin(b), T = step.length(b);
    for (const Part& part : parts)
      kernels::short_conv_backward(p.raw + t0 * C + part.off, d_qkv + t0 * C + part.off, T, part.n, C, C, part.w,
                                   d_raw + t0 * C + part.off, C, part.dw.data<float>());
  }
  return d_raw;
}

// Stage 1 backward: the q, k and v projections (each part of the packed rows made contiguous).
void project_backward(Pass& p, const float* x, const float* d_raw, DeltaRule::Saved& sv, DeltaRule& grad,
                      InputGrad& dx) {
  const DeltaRule::Weights& w = p.m.weights;
  DeltaRule::Weights& gw = grad.weights;
  const int64_t N = p.N, C = p.C;
  float* part = sv.d_part.get(size_t(N) * std::max({p.Cq, p.Ck, p.Cv}));
  const std::tuple<const kernels::Matrix*, kernels::Matrix*, int64_t> parts[] = {
      {&w.q_proj, &gw.q_proj, 0}, {&w.k_proj, &gw.k_proj, p.Cq}, {&w.v_proj, &gw.v_proj, p.Cq + p.Ck}};
  for (const auto& [wt, gt, off] : parts) {
    const int64_t n = wt->out;
    over_rows(N, n, [&, off = off](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) std::memcpy(part + t * n, d_raw + t * C + off, size_t(n) * sizeof(float));
    });
    dx.add(x, part, *wt, *gt);
  }
}

}  // namespace

void forward_train(const DeltaRule& m, const TrainShape& s, const float* x, float* y, DeltaRule::Saved& saved) {
  with_train_pass(m, s, saved, [&](Pass& p) {
    for (DeltaRule::State* st : p.states) st->clear();
    const Trace none;
    project(p, x);
    convolve(p);
    heads(p, none);
    gates(p, none);
    recur(p, none);
    output(p, y, none);
  });
}

void backward(const DeltaRule& m, const TrainShape& s, const float* x, const float* dy, DeltaRule::Saved& saved,
              float* dx, DeltaRule& grad) {
  with_train_pass(m, s, saved, [&](Pass& p) {
    InputGrad dx_sum{dx, p.N};
    output_backward(p, x, dy, saved, grad, dx_sum);
    recur_backward(p, saved);
    gates_backward(p, x, saved, grad, dx_sum);
    heads_backward(p, saved, grad);
    project_backward(p, x, convolve_backward(p, saved, grad), saved, grad, dx_sum);
  });
}

}  // namespace lineage::layers
