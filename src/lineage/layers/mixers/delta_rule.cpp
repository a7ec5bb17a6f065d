// The delta-rule mixer's forward for every member of the family (projections, short conv, gates,
// recurrent or chunked kernel, output norm and gate); over 400 lines, one concept: one mixer's step.
#include "lineage/layers/mixers/delta_rule.h"
#include "lineage/layers/mixers/delta_rule_stages.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/activation.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/row_split.h"
#include "lineage/kernels/short_conv.h"
#include "lineage/kernels/vmath.h"

namespace lineage::layers {

using namespace delta_rule_stages;

namespace {

// The q/k feature map or activation, in place on n values.
void apply_map(DeltaRule::FeatureMap m, float* x, int64_t n) {
  switch (m) {
    case DeltaRule::FeatureMap::Identity:
    case DeltaRule::FeatureMap::ElementwiseProduct: break;  // the product map needs weights: see below
    case DeltaRule::FeatureMap::Silu:
      kernels::activate(kernels::Activation::Silu, x, n);
      break;
    case DeltaRule::FeatureMap::Relu:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0 ? x[i] : 0.0f;
      break;
    case DeltaRule::FeatureMap::Elu1:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0 ? x[i] + 1.0f : std::exp(x[i]);
      break;
  }
}

// fla HadamardFeatureMap on rows of K: x ← (x·W2ᵀ + b2) ⊙ (x·W1ᵀ + b1).
void product_map(float* x, int64_t rows, int64_t K, const kernels::Matrix& w1, const Tensor& b1,
                 const kernels::Matrix& w2, const Tensor& b2, bool dot, DeltaRule::Buffers& buf) {
  float* a = buf.feature_a.get(size_t(rows) * K);
  float* b = buf.feature_b.get(size_t(rows) * K);
  kernels::linear(x, rows, w1, &b1, a, std::nullopt, dot);
  kernels::linear(x, rows, w2, &b2, b, std::nullopt, dot);
  for (int64_t i = 0; i < rows * K; ++i) x[i] = a[i] * b[i];
}

void normalize_heads(DeltaRule::QkNorm n, float* x, int64_t rows, int64_t K) {
  if (n == DeltaRule::QkNorm::None) return;
  over_rows(rows, 3 * K, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* v = x + r * K;
      double acc = 0;
      if (n == DeltaRule::QkNorm::L2) {
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < K; ++i) acc += double(v[i]) * v[i];
        const float inv = float(1.0 / std::sqrt(acc + 1e-6));
        for (int64_t i = 0; i < K; ++i) v[i] *= inv;
      } else {
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < K; ++i) acc += v[i];
        const float inv = float(1.0 / (acc + (n == DeltaRule::QkNorm::SumEps ? 1e-4 : 0.0)));
        for (int64_t i = 0; i < K; ++i) v[i] *= inv;
      }
    }
  });
}

// One token's heads of d channels, each written G times in a row: dst[(h·G + g)·d + i] = src[h·d + i].
void repeat_heads(const float* src, int64_t heads, int64_t G, int64_t d, float* dst) {
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t g = 0; g < G; ++g) std::memcpy(dst + (h * G + g) * d, src + h * d, d * sizeof(float));
}

}  // namespace

void DeltaRule::State::clear() {
  for (Tensor* t : {&S, &z, &conv_tail})
    if (t->nbytes()) std::memset(t->raw_mut(), 0, t->nbytes());
}

void DeltaRule::State::assign(const State& from) {
  if (S.shape() != from.S.shape() || z.shape() != from.z.shape() || conv_tail.shape() != from.conv_tail.shape()) {
    *this = from.clone();
    return;
  }
  for (auto [to, src] : {std::pair{&S, &from.S}, {&z, &from.z}, {&conv_tail, &from.conv_tail}})
    if (src->nbytes()) std::memcpy(to->raw_mut(), src->raw(), src->nbytes());
}

kernels::Gate DeltaRule::Config::gate() const {
  switch (decay) {
    case DecayInput::None: return kernels::Gate::None;
    case DecayInput::PerHeadProj: return kernels::Gate::PerHead;
    case DecayInput::PerChannelLowRank:
    case DecayInput::PerChannelProj: return kernels::Gate::PerChannel;
  }
  return kernels::Gate::None;
}

void DeltaRule::for_each_tensor(const std::string& p, const TensorVisitor& f) {
  const Config& c = config;
  const int64_t D = c.d_model, H = c.n_heads, KVH = c.n_kv_heads, HV = c.n_v_heads, K = c.head_k, V = c.head_v;
  const int64_t v_rows = c.delta ? HV * V : KVH * V;
  const auto proj = [&](const std::string& name, kernels::Matrix& m, Shape s) {
    visit_matrix(f, p + "." + name, m, s[0], s[1]);
  };
  const auto conv = [&](const std::string& name, Tensor& t, Shape s) { f(p + "." + name, t, s, Init::Normal); };
  if (c.qk_map == FeatureMap::ElementwiseProduct) {
    for (auto [which, w1, b1, w2, b2] :
         {std::tuple{"q", &weights.fm_q1_w, &weights.fm_q1_b, &weights.fm_q2_w, &weights.fm_q2_b},
          std::tuple{"k", &weights.fm_k1_w, &weights.fm_k1_b, &weights.fm_k2_w, &weights.fm_k2_b}}) {
      const std::string fm = std::string("feature_map_") + which;
      proj(fm + ".layer1.weight", *w1, {K, K});
      f(p + "." + fm + ".layer1.bias", *b1, {K}, Init::Zeros);
      proj(fm + ".layer2.weight", *w2, {K, K});
      f(p + "." + fm + ".layer2.bias", *b2, {K}, Init::Zeros);
    }
  }
  proj("q_proj.weight", weights.q_proj, {H * K, D});
  proj("k_proj.weight", weights.k_proj, {KVH * K, D});
  proj("v_proj.weight", weights.v_proj, {v_rows, D});
  if (c.conv_size > 0) {
    conv("q_conv1d.weight", weights.q_conv, {H * K, 1, c.conv_size});
    conv("k_conv1d.weight", weights.k_conv, {H * K, 1, c.conv_size});
    conv("v_conv1d.weight", weights.v_conv, {HV * V, 1, c.conv_size});
  }
  if (c.has_beta) proj("b_proj.weight", weights.b_proj, {HV, D});
  if (c.decay == DecayInput::PerHeadProj) proj("a_proj.weight", weights.a_proj, {HV, D});
  if (c.decay == DecayInput::PerChannelLowRank) {
    proj("f_proj.0.weight", weights.f_a, {V, D});
    proj("f_proj.1.weight", weights.f_b, {HV * K, V});
  }
  if (c.decay == DecayInput::PerChannelProj) proj("f_proj.weight", weights.f_proj, {HV * K, D});
  if (c.decay != DecayInput::None) {
    f(p + ".A_log", weights.A_log, {c.a_log_len ? c.a_log_len : HV}, Init::Custom);
    f(p + ".dt_bias", weights.dt_bias, {c.per_channel() ? HV * K : HV}, Init::Custom);
  }
  if (c.out_gate == OutGate::Swish || c.out_gate == OutGate::Sigmoid) proj("g_proj.weight", weights.g_proj, {HV * V, D});
  if (c.out_gate == OutGate::SigmoidLowRank) {
    proj("g_proj.0.weight", weights.g_a, {V, D});
    proj("g_proj.1.weight", weights.g_b, {HV * V, V});
    if (g_b_has_bias) f(p + ".g_proj.1.bias", weights.g_b_bias, {HV * V}, Init::Zeros);
  }
  if (c.out_norm_weight) f(p + "." + c.names.o_norm + ".weight", weights.o_norm, {V}, Init::Ones);
  proj("o_proj.weight", weights.o_proj, {D, HV * V});
}

namespace {

// The heads whose recurrence and state a rank holds under tensor parallelism: q/k heads [h0, h1) of
// H, [H·r/P, H·(r+1)/P), and their value heads [v0, v1) (HV/H each). Nothing (every head on every
// rank) without a split, with fewer heads than ranks, or where S is under the split's min_bytes: a
// gather costs more.
struct HeadShare {
  int64_t h0, h1, v0, v1;
};
std::optional<HeadShare> head_share(const DeltaRule::Config& c) {
  const kernels::RowSplit* s = kernels::row_split_now();
  if (!s || size_t(c.n_v_heads * c.head_k * c.head_v) * sizeof(float) < s->min_bytes) return std::nullopt;
  const auto heads = kernels::rank_heads_now(c.n_heads);
  if (!heads) return std::nullopt;
  const int64_t G = c.n_v_heads / c.n_heads;
  return HeadShare{heads->first, heads->second, G * heads->first, G * heads->second};
}

}  // namespace

DeltaRule::State DeltaRule::new_state(int64_t) const {
  const Config& c = config;
  State s;
  const std::optional<HeadShare> share = head_share(c);
  const int64_t HV = share ? share->v1 - share->v0 : c.n_v_heads;
  s.S = Tensor::zeros(DType::F32, {HV, c.head_k, c.head_v});
  if (c.normalize) s.z = Tensor::zeros(DType::F32, {HV, c.head_k});
  if (c.conv_size > 0)
    s.conv_tail = Tensor::zeros(DType::F32, {c.conv_size - 1, 2 * c.n_heads * c.head_k + c.n_v_heads * c.head_v});
  return s;
}

void DeltaRule::for_each_matrix(const MatrixVisitor& f) {
  Weights& w = weights;
  for (kernels::Matrix* m : {&w.q_proj, &w.k_proj, &w.v_proj, &w.fm_q1_w, &w.fm_q2_w, &w.fm_k1_w, &w.fm_k2_w, &w.b_proj,
                             &w.a_proj, &w.f_a, &w.f_b, &w.f_proj, &w.g_proj, &w.g_a, &w.g_b, &w.o_proj})
    f(*m);  // the optional ones too, undefined where absent (and everywhere in a skeleton)
}

void DeltaRule::prepare() {
  const Config& c = config;
  Prepared p;
  if (c.decay != DecayInput::None) {
    const int64_t width = c.per_channel() ? c.n_v_heads * c.head_k : c.n_v_heads;
    LINEAGE_CHECK(weights.A_log.numel() >= c.n_v_heads, "A_log holds ", weights.A_log.numel(), " values for ",
                  c.n_v_heads, " heads");
    p.A.resize(size_t(c.n_v_heads));
    p.dt_bias.resize(size_t(width));
    kernels::widen_row(weights.A_log, 0, c.n_v_heads, p.A.data());
    kernels::widen_row(weights.dt_bias, 0, width, p.dt_bias.data());
    for (float& a : p.A) a = c.gate_lower_bound < 0 ? std::exp(a) : -std::exp(a);
  }
  p.o_norm.assign(size_t(c.head_v), 1.0f);
  if (c.out_norm_weight && weights.o_norm.defined()) kernels::widen_row(weights.o_norm, 0, c.head_v, p.o_norm.data());
  p.ready = true;
  prepared = std::move(p);
}

size_t DeltaRule::state_bytes_fixed() const {
  const Config& c = config;
  size_t n = size_t(c.n_v_heads * c.head_k * c.head_v);
  if (c.normalize) n += size_t(c.n_v_heads * c.head_k);
  if (c.conv_size > 0) n += size_t((c.conv_size - 1) * (2 * c.n_heads * c.head_k + c.n_v_heads * c.head_v));
  return n * sizeof(float);
}

double DeltaRule::flops_per_token(double) const {
  const Config& c = config;
  const double kv = double(c.n_v_heads) * double(c.head_k) * double(c.head_v);
  double f = kv * (4.0 + (c.delta ? 2.0 : 0.0) + (c.decay != DecayInput::None ? 1.0 : 0.0));
  if (c.qk_map == FeatureMap::ElementwiseProduct) {
    // Two [K, K] layers with biases for q and for k, applied to each of the H heads; the weight
    // count covers one application.
    const double K = double(c.head_k);
    f += 2.0 * double(c.n_heads - 1) * 2.0 * (2.0 * K * K + 2.0 * K);
  }
  return f;
}

std::string DeltaRule::describe() const {
  const Config& c = config;
  std::string s = c.kind + ", " + std::to_string(c.n_heads) + " heads";
  if (c.n_v_heads != c.n_heads) s += " / " + std::to_string(c.n_v_heads) + " v-heads";
  s += ", S " + std::to_string(c.head_k) + "x" + std::to_string(c.head_v);
  if (c.conv_size) s += ", conv " + std::to_string(c.conv_size);
  if (c.gate_lower_bound < 0) s += cat(", decay in (", c.gate_lower_bound, ", 0)");
  return s;
}

namespace delta_rule_stages {


Pass make_pass(const DeltaRule& m, const Call& call, std::span<DeltaRule::State* const> states,
               DeltaRule::Buffers& buf) {
  const DeltaRule::Config& c = m.config;
  Pass p{m, call, states, buf};
  p.N = call.step.n_tokens(), p.H = c.n_heads, p.KVH = c.n_kv_heads, p.HV = c.n_v_heads, p.K = c.head_k,
  p.V = c.head_v;
  p.Cq = p.H * p.K, p.Ck = p.KVH * p.K, p.Cv = (c.delta ? p.HV : p.KVH) * p.V, p.C = p.Cq + p.Ck + p.Cv;
  p.decay_width = p.per_channel() ? p.HV * p.K : p.HV;
  p.one_token = p.N == 1;
  const size_t N = size_t(p.N);
  p.raw = buf.raw.get(N * p.C);
  p.qkv = buf.qkv.get(N * p.C);
  p.q = buf.q.get(N * p.H * p.K);
  p.k = buf.k.get(N * p.H * p.K);
  p.v = buf.v.get(N * p.HV * p.V);
  p.beta = c.delta ? buf.beta.get(N * p.HV) : nullptr;
  p.decay = c.decay != DeltaRule::DecayInput::None ? buf.decay.get(N * p.decay_width) : nullptr;
  p.low_decay = p.low_rank_decay() ? buf.low_decay.get(N * p.V) : nullptr;
  p.gate = p.swish_gate() || p.low_rank_gate() || p.sigmoid_gate() ? buf.gate.get(N * p.HV * p.V) : nullptr;
  p.low_gate = p.low_rank_gate() ? buf.low_gate.get(N * p.V) : nullptr;
  p.core = buf.core.get(N * p.HV * p.V);
  p.decay_in = p.decay, p.gate_in = p.gate, p.normed = p.core;
  return p;
}

// Stage 1: the projections of x, q | k | v side by side in raw (so the short conv runs over all
// channels), β, the decay's input and the output gate's input. One token: every projection in one
// parallel region, each chunk of q, k and v rows convolved (one short-conv step) by the thread that
// computed it. Otherwise one GEMM per weight over all N rows of the step.
void project(Pass& p, const float* x) {
  const DeltaRule::Config& c = p.m.config;
  const DeltaRule::Weights& w = p.m.weights;
  if (!p.one_token) {
    const int64_t N = p.N;
    float* tmp = p.buf.staging.get(size_t(N) * std::max({p.Cq, p.Ck, p.Cv}));
    const std::pair<const kernels::Matrix*, int64_t> parts[] = {
        {&w.q_proj, 0}, {&w.k_proj, p.Cq}, {&w.v_proj, p.Cq + p.Ck}};
    for (const auto& [wt, off] : parts) {
      const int64_t n = wt->out, C = p.C;
      float* raw = p.raw;
      kernels::linear(x, N, p.lin(*wt), nullptr, tmp);
      // `off` by init-capture: clang before 16 cannot capture a structured binding.
      over_rows(N, n, [&, off = off](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) std::memcpy(raw + t * C + off, tmp + t * n, n * sizeof(float));
      });
    }
    if (p.has_beta()) kernels::linear(x, N, p.lin(w.b_proj), nullptr, p.beta);
    if (p.low_rank_decay()) kernels::linear(x, N, p.lin(w.f_a), nullptr, p.low_decay);
    else if (p.decay) kernels::linear(x, N, p.lin(p.per_channel() ? w.f_proj : w.a_proj), nullptr, p.decay_in);
    if (p.swish_gate() || p.sigmoid_gate()) {
      const kernels::Activation act = p.swish_gate() ? kernels::Activation::Silu : kernels::Activation::Sigmoid;
      if (p.gate_in == p.gate) {
        kernels::linear(x, N, p.lin(w.g_proj), nullptr, p.gate, act);
      } else {
        const int64_t n = N * p.HV * p.V;
        kernels::linear(x, N, p.lin(w.g_proj), nullptr, p.gate_in);
        std::memcpy(p.gate, p.gate_in, size_t(n) * sizeof(float));
        kernels::activate(act, p.gate, n);
      }
    }
    if (p.low_rank_gate()) kernels::linear(x, N, p.lin(w.g_a), nullptr, p.low_gate);
    return;
  }
  kernels::LinearOut outs[7] = {{p.lin(w.q_proj), nullptr, p.raw},
                                {p.lin(w.k_proj), nullptr, p.raw + p.Cq},
                                {p.lin(w.v_proj), nullptr, p.raw + p.Cq + p.Ck}};
  struct ConvStep {
    const Tensor* w;
    int64_t off;  // first channel in raw, the tail and qkv
    bool silu;
  };
  const ConvStep steps[3] = {
      {&w.q_conv, 0, c.qk_conv_silu}, {&w.k_conv, p.Cq, c.qk_conv_silu}, {&w.v_conv, p.Cq + p.Ck, c.delta}};
  const bool conv = c.conv_size > 0;
  float* tail = conv ? p.states[0]->conv_tail.data<float>() : nullptr;
  const auto step = [&](int i, int64_t o0, int64_t o1) {
    const ConvStep& st = steps[i];
    kernels::short_conv_step(p.raw + st.off, o0, o1, *st.w, tail + st.off, p.C, st.silu, p.qkv + st.off);
  };
  for (int i = 0; conv && i < 3; ++i)  // two words each: std::function keeps them without allocating
    outs[i].then = [&step, i](int64_t o0, int64_t o1) { step(i, o0, o1); };
  size_t n = 3;
  if (p.has_beta()) outs[n++] = {p.lin(w.b_proj), nullptr, p.beta};
  if (p.low_rank_decay()) outs[n++] = {p.lin(w.f_a), nullptr, p.low_decay};
  else if (p.decay) outs[n++] = {p.lin(p.per_channel() ? w.f_proj : w.a_proj), nullptr, p.decay};
  if (p.swish_gate()) outs[n++] = {p.lin(w.g_proj), nullptr, p.gate, kernels::Activation::Silu};
  if (p.sigmoid_gate()) outs[n++] = {p.lin(w.g_proj), nullptr, p.gate, kernels::Activation::Sigmoid};
  if (p.low_rank_gate()) outs[n++] = {p.lin(w.g_a), nullptr, p.low_gate};
  kernels::linear_group(x, 1, {outs, n});
}

// Stage 2: raw → qkv through each sequence's short convolution, continuing its own tail (already
// done for one token, by the projections). Without a conv, fla applies the activation directly.
void convolve(Pass& p) {
  const DeltaRule::Config& c = p.m.config;
  const DeltaRule::Weights& w = p.m.weights;
  const int64_t C = p.C, Cq = p.Cq, Ck = p.Ck, Cv = p.Cv;
  if (c.conv_size > 0) {
    if (p.one_token) return;
    const Step& step = p.call.step;
    for (int64_t b = 0; b < step.n_seqs(); ++b) {
      const int64_t t0 = step.begin(b), T = step.length(b);
      float* tail = p.states[size_t(b)]->conv_tail.data<float>();
      const float* raw = p.raw + t0 * C;
      float* out = p.qkv + t0 * C;
      kernels::short_conv(raw, T, Cq, C, w.q_conv, tail, C, c.qk_conv_silu, out, C);
      kernels::short_conv(raw + Cq, T, Ck, C, w.k_conv, tail + Cq, C, c.qk_conv_silu, out + Cq, C);
      kernels::short_conv(raw + Cq + Ck, T, Cv, C, w.v_conv, tail + Cq + Ck, C, c.delta, out + Cq + Ck, C);
    }
    return;
  }
  std::memcpy(p.qkv, p.raw, size_t(p.N) * C * 4);
  if (!c.delta) return;
  for (int64_t t = 0; t < p.N; ++t) {
    if (c.qk_conv_silu) apply_map(DeltaRule::FeatureMap::Silu, p.qkv + t * C, Cq + Ck);
    apply_map(DeltaRule::FeatureMap::Silu, p.qkv + t * C + Cq + Ck, Cv);
  }
}

// The packed rows qkv [N, C] split into heads: q [N, H, K], k [N, H, K] (linear attention's k/v heads
// repeated up to H), v [N, HV, V] (v null: skipped).
void split_heads(const Pass& p, const float* qkv, float* q, float* k, float* v) {
  const DeltaRule::Config& c = p.m.config;
  const int64_t N = p.N, H = p.H, KVH = p.KVH, HV = p.HV, K = p.K, V = p.V, C = p.C, Cq = p.Cq, Ck = p.Ck;
  const int64_t G = H / KVH, Gv = c.delta ? 1 : G, v_heads = c.delta ? HV : KVH;
  const auto split = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = qkv + t * C;
      std::memcpy(q + t * Cq, row, Cq * 4);
      repeat_heads(row + Cq, KVH, G, K, k + t * H * K);
      if (v) repeat_heads(row + Cq + Ck, v_heads, Gv, V, v + t * HV * V);
    }
  };
  if (N > 1) over_rows(N, H * K + HV * V, split);
  else split(0, N);  // one token: no std::function to build
}

// Stage 3: split into heads (linear attention repeats its k/v heads up to H, GQA), the q/k feature
// map or activation (traced before the normalization), then the q/k normalization (the training pass
// keeps q and k from before it).
void heads(Pass& p, const Trace& trace) {
  const DeltaRule::Config& c = p.m.config;
  const DeltaRule::Weights& w = p.m.weights;
  const int64_t N = p.N, H = p.H, HV = p.HV, K = p.K, V = p.V;
  split_heads(p, p.qkv, p.q, p.k, p.v);
  if (c.qk_map == DeltaRule::FeatureMap::ElementwiseProduct) {
    const bool dot = p.call.options.bf16_dot;
    product_map(p.q, N * H, K, w.fm_q1_w, w.fm_q1_b, w.fm_q2_w, w.fm_q2_b, dot, p.buf);
    product_map(p.k, N * H, K, w.fm_k1_w, w.fm_k1_b, w.fm_k2_w, w.fm_k2_b, dot, p.buf);
  } else {
    apply_map(c.qk_map, p.q, N * H * K);
    apply_map(c.qk_map, p.k, N * H * K);
  }
  trace("attn.q", p.q, {N, H * K});
  trace("attn.k", p.k, {N, H * K});
  trace("attn.v", p.v, {N, HV * V});
  if (p.q_mapped) {
    std::memcpy(p.q_mapped, p.q, size_t(N * H * K) * sizeof(float));
    std::memcpy(p.k_mapped, p.k, size_t(N * H * K) * sizeof(float));
  }
  normalize_heads(c.q_norm, p.q, N * H, K);
  normalize_heads(c.k_norm, p.k, N * H, K);
  trace("attn.q_read", p.q, {N, H * K});  // as the recurrence reads and writes with them (lineage trace)
  trace("attn.k_write", p.k, {N, H * K});
}

// Stage 4: β = sigmoid(b_proj x) (or 1; ×2 with negative eigenvalues) and the log decay
// A·softplus(input + dt_bias), or lb·σ(A·(input + dt_bias)) with a lower bound, per head or per key
// channel.
void gates(Pass& p, const Trace& trace) {
  const DeltaRule::Config& c = p.m.config;
  const DeltaRule::Weights& w = p.m.weights;
  const int64_t N = p.N, HV = p.HV, K = p.K;
  if (c.delta) {
    if (p.has_beta()) kernels::sigmoid(p.beta, p.beta, N * HV);
    else std::fill(p.beta, p.beta + N * HV, 1.0f);
    if (c.neg_eigval)
      for (int64_t i = 0; i < N * HV; ++i) p.beta[i] *= 2.0f;
    trace("attn.beta", p.beta, {N, HV});
  }
  if (!p.decay) return;
  const int64_t width = p.decay_width;
  const bool per_channel = p.per_channel();
  const float* A = p.m.prepared.A.data();
  const float* dt = p.m.prepared.dt_bias.data();
  const float lb = c.gate_lower_bound;
  float* decay = p.decay;
  float* decay_in = p.decay_in;
  // Entries [i0, i1) of one token's decay row: z = input + dt_bias (left in `in`), then into `a`
  // softplus(z) × the head's A, or σ(A z) × the lower bound. `in` may be `a`.
  const auto finish = [=](float* in, float* a, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) in[i] += dt[i];
    if (lb < 0) {
      for (int64_t i = i0; i < i1; ++i) a[i] = in[i] * A[per_channel ? i / K : i];
      kernels::sigmoid(a + i0, a + i0, i1 - i0);
      for (int64_t i = i0; i < i1; ++i) a[i] *= lb;
      return;
    }
    kernels::softplus(in + i0, a + i0, i1 - i0);
    for (int64_t i = i0; i < i1; ++i) a[i] *= A[per_channel ? i / K : i];
  };
  if (p.low_rank_decay() && p.one_token) {  // each chunk finished by the thread that computed it
    kernels::LinearOut up{p.lin(w.f_b), nullptr, decay};
    up.then = [&](int64_t o0, int64_t o1) { finish(decay, decay, o0, o1); };
    kernels::linear_group(p.low_decay, 1, {&up, 1});
  } else {
    if (p.low_rank_decay()) kernels::linear(p.low_decay, N, p.lin(w.f_b), nullptr, decay_in);
    over_rows(N, 24 * width, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) finish(decay_in + t * width, decay + t * width, 0, width);
    });
  }
  trace("attn.log_decay", decay, {N, width});
}

// The kernel's arguments for the step's sequence b: its rows of q, k, v, β and the log decay, its
// output rows of core, and the state S (and z) it starts from.
kernels::DeltaRuleArgs seq_args(const Pass& p, int64_t b, float* S, float* z) {
  const DeltaRule::Config& c = p.m.config;
  const int64_t t0 = p.call.step.begin(b), H = p.H, HV = p.HV, K = p.K, V = p.V;
  kernels::DeltaRuleArgs a;
  a.T = p.call.step.length(b), a.H = H, a.HV = HV, a.K = K, a.V = V;
  a.gate = c.gate();
  a.delta = c.delta;
  a.normalize = c.normalize;
  a.scale = 1.0f / std::sqrt(float(K));
  a.q = p.q + t0 * H * K, a.k = p.k + t0 * H * K, a.v = p.v + t0 * HV * V;
  a.beta = p.beta ? p.beta + t0 * HV : nullptr;
  a.log_decay = p.decay ? p.decay + t0 * p.decay_width : nullptr;
  a.state = S;
  a.z = c.normalize ? z : nullptr;
  a.out = p.core + t0 * HV * V;
  return a;
}

namespace {

// Whether a sequence of T tokens runs the chunked kernel (else the recurrent one).
bool runs_chunked(const Pass& p, int64_t T) {
  const DeltaRulePath path = p.call.options.delta_rule_path;
  return path == DeltaRulePath::Chunked || (path == DeltaRulePath::Auto && T >= chunk_threshold(p.K));
}

// Stage 5 under tensor parallelism, the states holding this rank's heads (DeltaRule::new_state): those
// heads' rows of q, k, v, β and the decay copied apart, their recurrence from the states, and one
// gather that gives every rank every head's output rows in core. Each head's recurrence is one rank's,
// the same kernels on the same rows: the outputs are one process's bits.
void recur_share(Pass& p) {
  const std::optional<HeadShare> share = head_share(p.m.config);
  LINEAGE_CHECK(share && share->v1 - share->v0 == p.states[0]->S.dim(0),
                "a delta-rule state split by heads is used where its split is not installed");
  const Step& step = p.call.step;
  const int64_t N = p.N, H = p.H, HV = p.HV, K = p.K, V = p.V;
  const int64_t h0 = share->h0, v0 = share->v0, Hr = share->h1 - h0, HVr = share->v1 - v0;
  const int64_t dw = p.decay ? p.decay_width / HV : 0;  // decay entries a value head: 1 or K
  float* core = p.buf.share_core.get(size_t(N * HVr * V));
  if (Hr > 0) {
    float* q = p.buf.share_q.get(size_t(N * Hr * K));
    float* k = p.buf.share_k.get(size_t(N * Hr * K));
    float* v = p.buf.share_v.get(size_t(N * HVr * V));
    float* beta = p.beta ? p.buf.share_beta.get(size_t(N * HVr)) : nullptr;
    float* decay = p.decay ? p.buf.share_decay.get(size_t(N * HVr * dw)) : nullptr;
    for (int64_t t = 0; t < N; ++t) {
      std::memcpy(q + t * Hr * K, p.q + (t * H + h0) * K, size_t(Hr * K) * sizeof(float));
      std::memcpy(k + t * Hr * K, p.k + (t * H + h0) * K, size_t(Hr * K) * sizeof(float));
      std::memcpy(v + t * HVr * V, p.v + (t * HV + v0) * V, size_t(HVr * V) * sizeof(float));
      if (beta) std::memcpy(beta + t * HVr, p.beta + t * HV + v0, size_t(HVr) * sizeof(float));
      if (decay) std::memcpy(decay + t * HVr * dw, p.decay + t * p.decay_width + v0 * dw, size_t(HVr * dw) * sizeof(float));
    }
    p.buf.recurrent.clear();
    for (int64_t b = 0; b < step.n_seqs(); ++b) {
      DeltaRule::State& st = *p.states[size_t(b)];
      kernels::DeltaRuleArgs a = seq_args(p, b, st.S.data<float>(), st.z.data<float>());
      const int64_t t0 = step.begin(b);
      a.H = Hr, a.HV = HVr;
      a.q = q + t0 * Hr * K, a.k = k + t0 * Hr * K, a.v = v + t0 * HVr * V;
      a.beta = beta ? beta + t0 * HVr : nullptr;
      a.log_decay = decay ? decay + t0 * HVr * dw : nullptr;
      a.out = core + t0 * HVr * V;
      if (runs_chunked(p, a.T)) kernels::delta_rule_chunked(a, kChunkSize);
      else p.buf.recurrent.push_back(a);
    }
    kernels::delta_rule_recurrent(p.buf.recurrent);
  }
  // Every rank's heads' rows [N, HVr·V] back into core [N, HV·V].
  kernels::gather_heads(core, N, H, (HV / H) * V, p.core);
}

}  // namespace

// Stage 5: the recurrence, each sequence from its own state. Sequences shorter than the chunk
// threshold share one call of the recurrent kernel (one parallel region for a batch of decode
// tokens); longer ones run the chunked kernel each. States holding some of the heads (tensor
// parallelism): recur_share.
void recur(Pass& p, const Trace& trace) {
  const Step& step = p.call.step;
  const int64_t HV = p.HV, K = p.K, V = p.V;
  if (step.n_seqs() > 0 && p.states[0]->S.dim(0) != HV) {
    recur_share(p);
    trace("attn.core", p.core, {p.N, HV * V});
    return;
  }
  p.buf.recurrent.clear();
  for (int64_t b = 0; b < step.n_seqs(); ++b) {
    const int64_t T = step.length(b);
    DeltaRule::State& s = *p.states[size_t(b)];
    const kernels::DeltaRuleArgs a = seq_args(p, b, s.S.data<float>(), s.z.data<float>());
    if (runs_chunked(p, T)) kernels::delta_rule_chunked(a, kChunkSize);
    else p.buf.recurrent.push_back(a);
  }
  kernels::delta_rule_recurrent(p.buf.recurrent);
  trace("attn.core", p.core, {p.N, HV * V});
  if (step.n_seqs() == 1) trace("attn.state", p.states[0]->S.data<float>(), {HV, K, V});
}

// Stage 6: per-head RMSNorm times the output gate, then o_proj.
void output(Pass& p, float* y, const Trace& trace) {
  const DeltaRule::Config& c = p.m.config;
  const DeltaRule::Weights& w = p.m.weights;
  const int64_t N = p.N, HV = p.HV, V = p.V;
  float* gate = p.gate;
  if (p.low_rank_gate()) {
    const Tensor* g_bias = p.m.g_b_has_bias ? &w.g_b_bias : nullptr;
    if (p.one_token) {  // the sigmoid on each chunk, by the thread that computed it
      kernels::LinearOut up{p.lin(w.g_b), g_bias, gate};
      up.then = [&](int64_t o0, int64_t o1) { kernels::sigmoid(gate + o0, gate + o0, o1 - o0); };
      kernels::linear_group(p.low_gate, 1, {&up, 1});
    } else {
      float* gate_in = p.gate_in;
      kernels::linear(p.low_gate, N, p.lin(w.g_b), g_bias, gate_in);
      over_rows(N, 16 * HV * V, [&](int64_t t0, int64_t t1) {
        kernels::sigmoid(gate_in + t0 * HV * V, gate + t0 * HV * V, (t1 - t0) * HV * V);
      });
    }
  }
  const float* onw = p.m.prepared.o_norm.data();
  const float eps = c.norm_eps;
  const float* core = p.core;
  float* normed = p.normed;
  over_rows(N * HV, 4 * V, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* o = core + r * V;
      float* out = normed + r * V;
      double ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < V; ++i) ss += double(o[i]) * o[i];
      const float inv = float(1.0 / std::sqrt(ss / V + eps));
      for (int64_t i = 0; i < V; ++i) out[i] = o[i] * inv * onw[i] * (gate ? gate[r * V + i] : 1.0f);
    }
  });
  kernels::linear(normed, N, p.lin(w.o_proj), nullptr, y);
  trace("attn.out", y, {N, c.d_model});
}

}  // namespace delta_rule_stages

void forward(const DeltaRule& m, const Call& call, const float* x, std::span<DeltaRule::State* const> states,
             float* y, DeltaRule::Buffers& buf, const Trace& trace) {
  LINEAGE_CHECK(m.prepared.ready, "DeltaRule::prepare() must run after the weights are bound");
  LINEAGE_CHECK(int64_t(states.size()) == call.step.n_seqs(), "one state per sequence of the step");
  Pass p = make_pass(m, call, states, buf);
  project(p, x);
  convolve(p);
  heads(p, trace);
  gates(p, trace);
  recur(p, trace);
  output(p, y, trace);
}

}  // namespace lineage::layers
