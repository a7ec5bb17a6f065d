#include "lineage/layers/mixers/delta_rule.h"

#include <atomic>
#include <cmath>
#include <cstring>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/activation.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/vmath.h"
#include "lineage/kernels/short_conv.h"

namespace lineage::layers {

namespace {

std::atomic<DeltaRulePath> g_path{DeltaRulePath::Auto};

// Scratch slots of this mixer (the model uses 10–12; other mixers 0–9).
enum Slot { kQ = 20, kK, kV, kRaw, kBeta, kDecay, kLowRank, kCore, kGate, kFeature, kFeature2, kLowDecay, kLowGate };


kernels::Weight lin(const Tensor& w) { return {&w, kernels::Layout::OutIn}; }

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
void product_map(float* x, int64_t rows, int64_t K, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                 const Tensor& b2, Scratch& scratch) {
  float* a = scratch.get(kFeature, size_t(rows) * K);
  float* b = scratch.get(kFeature2, size_t(rows) * K);
  kernels::linear(x, rows, lin(w1), &b1, a);
  kernels::linear(x, rows, lin(w2), &b2, b);
  for (int64_t i = 0; i < rows * K; ++i) x[i] = a[i] * b[i];
}

// Runs fn(r0, r1) over rows split across the threads once there are enough of them (prefill); each
// row costs about `work` operations.
void over_rows(int64_t rows, int64_t work, const std::function<void(int64_t, int64_t)>& fn) {
  parallel_for(rows, fn, grain_for(work));
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

void set_delta_rule_path(DeltaRulePath p) { g_path = p; }

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
    case DecayInput::PerChannelLowRank: return kernels::Gate::PerChannel;
  }
  return kernels::Gate::None;
}

void DeltaRule::for_each_tensor(const std::string& p, const TensorVisitor& f) {
  const Config& c = config;
  const int64_t D = c.d_model, H = c.n_heads, KVH = c.n_kv_heads, HV = c.n_v_heads, K = c.head_k, V = c.head_v;
  const int64_t v_rows = c.delta ? HV * V : KVH * V;
  const auto proj = [&](const std::string& name, Tensor& t, Shape s) { f(p + "." + name, t, s, Init::Normal); };
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
    proj("q_conv1d.weight", weights.q_conv, {H * K, 1, c.conv_size});
    proj("k_conv1d.weight", weights.k_conv, {H * K, 1, c.conv_size});
    proj("v_conv1d.weight", weights.v_conv, {HV * V, 1, c.conv_size});
  }
  if (c.has_beta) proj("b_proj.weight", weights.b_proj, {HV, D});
  if (c.decay == DecayInput::PerHeadProj) {
    proj("a_proj.weight", weights.a_proj, {HV, D});
    f(p + ".A_log", weights.A_log, {HV}, Init::Custom);
    f(p + ".dt_bias", weights.dt_bias, {HV}, Init::Custom);
  } else if (c.decay == DecayInput::PerChannelLowRank) {
    proj(c.names.f_a + ".weight", weights.f_a, {V, D});
    proj(c.names.f_b + ".weight", weights.f_b, {HV * K, V});
    f(p + ".A_log", weights.A_log, {HV}, Init::Custom);
    f(p + ".dt_bias", weights.dt_bias, {HV * K}, Init::Custom);
  }
  if (c.out_gate == OutGate::Swish) proj("g_proj.weight", weights.g_proj, {HV * V, D});
  if (c.out_gate == OutGate::SigmoidLowRank) {
    proj(c.names.g_a + ".weight", weights.g_a, {V, D});
    proj(c.names.g_b + ".weight", weights.g_b, {HV * V, V});
    if (g_b_has_bias) f(p + "." + c.names.g_b + ".bias", weights.g_b_bias, {HV * V}, Init::Zeros);
  }
  if (c.out_norm_weight) f(p + "." + c.names.o_norm + ".weight", weights.o_norm, {V}, Init::Ones);
  proj("o_proj.weight", weights.o_proj, {D, HV * V});
}

DeltaRule::State DeltaRule::new_state() const {
  const Config& c = config;
  State s;
  s.S = Tensor::zeros(DType::F32, {c.n_v_heads, c.head_k, c.head_v});
  if (c.normalize) s.z = Tensor::zeros(DType::F32, {c.n_v_heads, c.head_k});
  if (c.conv_size > 0)
    s.conv_tail = Tensor::zeros(DType::F32, {c.conv_size - 1, 2 * c.n_heads * c.head_k + c.n_v_heads * c.head_v});
  return s;
}

size_t DeltaRule::state_bytes_fixed() const {
  const Config& c = config;
  size_t n = size_t(c.n_v_heads * c.head_k * c.head_v);
  if (c.normalize) n += size_t(c.n_v_heads * c.head_k);
  if (c.conv_size > 0) n += size_t((c.conv_size - 1) * (2 * c.n_heads * c.head_k + c.n_v_heads * c.head_v));
  return n * sizeof(float);
}

std::string DeltaRule::describe() const {
  const Config& c = config;
  std::string s = c.kind + ", " + std::to_string(c.n_heads) + " heads";
  if (c.n_v_heads != c.n_heads) s += " / " + std::to_string(c.n_v_heads) + " v-heads";
  s += ", S " + std::to_string(c.head_k) + "x" + std::to_string(c.head_v);
  if (c.conv_size) s += ", conv " + std::to_string(c.conv_size);
  return s;
}

void forward(const DeltaRule& m, const float* x, int64_t T, DeltaRule::State& s, float* y, Scratch& scratch,
             const Trace& trace) {
  const DeltaRule::Config& c = m.config;
  const DeltaRule::Weights& w = m.weights;
  const int64_t H = c.n_heads, KVH = c.n_kv_heads, HV = c.n_v_heads, K = c.head_k, V = c.head_v;
  const int64_t v_heads_proj = c.delta ? HV : KVH;  // heads that v_proj produces
  const int64_t Cq = H * K, Ck = KVH * K, Cv = v_heads_proj * V;

  // Where the projections of x land: q | k | v side by side in one buffer (so the short conv runs
  // over all channels), β, the decay's input and the output gate's input.
  const int64_t C = Cq + Ck + Cv;
  float* raw = scratch.get(kRaw, size_t(T) * C);
  const bool has_beta = c.delta && c.has_beta;
  const bool per_channel = c.decay == DeltaRule::DecayInput::PerChannelLowRank;
  const int64_t decay_width = per_channel ? HV * K : HV;
  float* beta = c.delta ? scratch.get(kBeta, size_t(T) * HV) : nullptr;
  float* decay = c.decay != DeltaRule::DecayInput::None ? scratch.get(kDecay, size_t(T) * decay_width) : nullptr;
  float* low_decay = per_channel ? scratch.get(kLowDecay, size_t(T) * V) : nullptr;
  const bool swish_gate = c.out_gate == DeltaRule::OutGate::Swish;
  const bool low_rank_gate = c.out_gate == DeltaRule::OutGate::SigmoidLowRank;
  float* gate = swish_gate || low_rank_gate ? scratch.get(kGate, size_t(T) * HV * V) : nullptr;
  float* low_gate = low_rank_gate ? scratch.get(kLowGate, size_t(T) * V) : nullptr;

  float* qkv = scratch.get(kLowRank, size_t(T) * C);  // q | k | v after the short conv

  // 1. The projections. One token: every projection of x in one parallel region, each chunk of
  // q, k and v rows convolved (one short-conv step) by the thread that computed it.
  const bool step_conv = T == 1 && c.conv_size > 0;
  if (T == 1) {
    kernels::LinearOut outs[6] = {{lin(w.q_proj), nullptr, raw},
                                  {lin(w.k_proj), nullptr, raw + Cq},
                                  {lin(w.v_proj), nullptr, raw + Cq + Ck}};
    struct ConvStep {
      const Tensor* w;
      int64_t off;  // first channel in raw, the tail and qkv
      bool silu;
    };
    const ConvStep steps[3] = {{&w.q_conv, 0, c.qk_conv_silu}, {&w.k_conv, Cq, c.qk_conv_silu}, {&w.v_conv, Cq + Ck, true}};
    float* tail = step_conv ? s.conv_tail.data<float>() : nullptr;
    const auto conv = [&](int i, int64_t o0, int64_t o1) {
      const ConvStep& st = steps[i];
      kernels::short_conv_step(raw + st.off, o0, o1, *st.w, tail + st.off, C, st.silu, qkv + st.off);
    };
    for (int i = 0; step_conv && i < 3; ++i)  // two words each: std::function keeps them without allocating
      outs[i].then = [&conv, i](int64_t o0, int64_t o1) { conv(i, o0, o1); };
    size_t n = 3;
    if (has_beta) outs[n++] = {lin(w.b_proj), nullptr, beta};
    if (per_channel) outs[n++] = {lin(w.f_a), nullptr, low_decay};
    else if (decay) outs[n++] = {lin(w.a_proj), nullptr, decay};
    if (swish_gate) outs[n++] = {lin(w.g_proj), nullptr, gate, kernels::Activation::Silu};
    if (low_rank_gate) outs[n++] = {lin(w.g_a), nullptr, low_gate};
    kernels::linear_group(x, 1, {outs, n});
  } else {
    float* tmp = scratch.get(kCore, size_t(T) * std::max({Cq, Ck, Cv}));
    const std::pair<const Tensor*, int64_t> parts[] = {{&w.q_proj, 0}, {&w.k_proj, Cq}, {&w.v_proj, Cq + Ck}};
    for (const auto& [wt, off] : parts) {
      const int64_t n = wt->dim(0);
      kernels::linear(x, T, lin(*wt), nullptr, tmp);
      // `off` by init-capture: clang before 16 cannot capture a structured binding.
      over_rows(T, n, [&, off = off](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) std::memcpy(raw + t * C + off, tmp + t * n, n * sizeof(float));
      });
    }
  }
  float* q = scratch.get(kQ, size_t(T) * H * K);
  float* kk = scratch.get(kK, size_t(T) * H * K);
  float* v = scratch.get(kV, size_t(T) * HV * V);
  if (c.conv_size > 0 && !step_conv) {
    // One tail for all channels; q/k and v differ only in whether SiLU follows.
    float* tail = s.conv_tail.data<float>();
    const int64_t P = c.conv_size - 1;
    thread_local std::vector<float> tq, tk, tv;  // reused: no allocation per decode step
    tq.resize(P * Cq), tk.resize(P * Ck), tv.resize(P * Cv);
    for (int64_t r = 0; r < P; ++r) {
      std::memcpy(tq.data() + r * Cq, tail + r * C, Cq * 4);
      std::memcpy(tk.data() + r * Ck, tail + r * C + Cq, Ck * 4);
      std::memcpy(tv.data() + r * Cv, tail + r * C + Cq + Ck, Cv * 4);
    }
    kernels::short_conv(raw, T, Cq, C, w.q_conv, tq.data(), c.qk_conv_silu, qkv, C);
    kernels::short_conv(raw + Cq, T, Ck, C, w.k_conv, tk.data(), c.qk_conv_silu, qkv + Cq, C);
    kernels::short_conv(raw + Cq + Ck, T, Cv, C, w.v_conv, tv.data(), true, qkv + Cq + Ck, C);
    for (int64_t r = 0; r < P; ++r) {
      std::memcpy(tail + r * C, tq.data() + r * Cq, Cq * 4);
      std::memcpy(tail + r * C + Cq, tk.data() + r * Ck, Ck * 4);
      std::memcpy(tail + r * C + Cq + Ck, tv.data() + r * Cv, Cv * 4);
    }
  } else if (c.conv_size == 0) {
    std::memcpy(qkv, raw, size_t(T) * C * 4);
    if (c.delta) {  // fla applies the activation directly when there is no short conv
      for (int64_t t = 0; t < T; ++t) {
        if (c.qk_conv_silu) apply_map(DeltaRule::FeatureMap::Silu, qkv + t * C, Cq + Ck);
        apply_map(DeltaRule::FeatureMap::Silu, qkv + t * C + Cq + Ck, Cv);
      }
    }
  }
  // 2. Split into heads; linear attention repeats its k/v heads up to H (GQA).
  const int64_t G = H / KVH, Gv = c.delta ? 1 : G;
  const auto split = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = qkv + t * C;
      std::memcpy(q + t * Cq, row, Cq * 4);
      repeat_heads(row + Cq, KVH, G, K, kk + t * H * K);
      repeat_heads(row + Cq + Ck, v_heads_proj, Gv, V, v + t * HV * V);
    }
  };
  if (T > 1) over_rows(T, H * K + HV * V, split);
  else split(0, T);  // one token: no std::function to build
  // 3. q/k feature map or activation, traced before the normalization.
  if (c.qk_map == DeltaRule::FeatureMap::ElementwiseProduct) {
    product_map(q, T * H, K, w.fm_q1_w, w.fm_q1_b, w.fm_q2_w, w.fm_q2_b, scratch);
    product_map(kk, T * H, K, w.fm_k1_w, w.fm_k1_b, w.fm_k2_w, w.fm_k2_b, scratch);
  } else {
    apply_map(c.qk_map, q, T * H * K);
    apply_map(c.qk_map, kk, T * H * K);
  }
  trace("attn.q", q, {T, H * K});
  trace("attn.k", kk, {T, H * K});
  trace("attn.v", v, {T, HV * V});
  normalize_heads(c.q_norm, q, T * H, K);
  normalize_heads(c.k_norm, kk, T * H, K);

  // 4. β and the log decay.
  if (c.delta) {
    if (has_beta) {
      if (T > 1) kernels::linear(x, T, lin(w.b_proj), nullptr, beta);
      kernels::sigmoid(beta, beta, T * HV);
    } else {
      std::fill(beta, beta + T * HV, 1.0f);
    }
    if (c.neg_eigval)
      for (int64_t i = 0; i < T * HV; ++i) beta[i] *= 2.0f;
    trace("attn.beta", beta, {T, HV});
  }
  if (decay) {
    const int64_t width = decay_width;
    thread_local std::vector<float> A, dt;
    A.resize(HV), dt.resize(width);
    kernels::widen_row(w.A_log, 0, HV, A.data());
    kernels::widen_row(w.dt_bias, 0, width, dt.data());
    for (float& a : A) a = -std::exp(a);
    const float* Ap = A.data();  // thread_local: the workers must see the caller's copies
    const float* dtp = dt.data();
    // Entries [i0, i1) of one token's decay row: + dt_bias, softplus, × the head's A.
    const auto finish = [=](float* a, int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) a[i] += dtp[i];
      kernels::softplus(a + i0, a + i0, i1 - i0);
      for (int64_t i = i0; i < i1; ++i) a[i] *= Ap[per_channel ? i / K : i];
    };
    if (per_channel && T == 1) {  // each chunk finished by the thread that computed it
      kernels::LinearOut up{lin(w.f_b), nullptr, decay};
      up.then = [&](int64_t o0, int64_t o1) { finish(decay, o0, o1); };
      kernels::linear_group(low_decay, 1, {&up, 1});
    } else {
      if (per_channel) {
        if (T > 1) kernels::linear(x, T, lin(w.f_a), nullptr, low_decay);
        kernels::linear(low_decay, T, lin(w.f_b), nullptr, decay);
      } else if (T > 1) {
        kernels::linear(x, T, lin(w.a_proj), nullptr, decay);
      }
      over_rows(T, 24 * width, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) finish(decay + t * width, 0, width);
      });
    }
    trace("attn.log_decay", decay, {T, width});
  }

  // 5. The recurrence.
  float* core = scratch.get(kCore, size_t(T) * HV * V);
  kernels::DeltaRuleArgs args;
  args.T = T, args.H = H, args.HV = HV, args.K = K, args.V = V;
  args.gate = c.gate();
  args.delta = c.delta;
  args.normalize = c.normalize;
  args.scale = 1.0f / std::sqrt(float(K));
  args.q = q, args.k = kk, args.v = v, args.beta = beta, args.log_decay = decay;
  args.state = s.S.data<float>();
  args.z = c.normalize ? s.z.data<float>() : nullptr;
  args.out = core;
  const DeltaRulePath path = g_path.load();
  if (path == DeltaRulePath::Chunked || (path == DeltaRulePath::Auto && T >= chunk_threshold(K)))
    kernels::delta_rule_chunked(args, kChunkSize);
  else
    kernels::delta_rule_recurrent(args);
  trace("attn.core", core, {T, HV * V});
  trace("attn.state", s.S.data<float>(), {HV, K, V});

  // 6. Per-head RMSNorm and output gate, then o_proj.
  thread_local std::vector<float> onw;
  onw.assign(V, 1.0f);
  if (c.out_norm_weight) kernels::widen_row(w.o_norm, 0, V, onw.data());
  if (swish_gate && T > 1) {  // one token: SiLU applied by the projections' GEMV
    kernels::linear(x, T, lin(w.g_proj), nullptr, gate, kernels::Activation::Silu);
  } else if (low_rank_gate) {
    const Tensor* g_bias = m.g_b_has_bias ? &w.g_b_bias : nullptr;
    if (T == 1) {  // the sigmoid on each chunk, by the thread that computed it
      kernels::LinearOut up{lin(w.g_b), g_bias, gate};
      up.then = [&](int64_t o0, int64_t o1) { kernels::sigmoid(gate + o0, gate + o0, o1 - o0); };
      kernels::linear_group(low_gate, 1, {&up, 1});
    } else {
      kernels::linear(x, T, lin(w.g_a), nullptr, low_gate);
      kernels::linear(low_gate, T, lin(w.g_b), g_bias, gate);
      over_rows(T, 16 * HV * V, [&](int64_t t0, int64_t t1) {
        kernels::sigmoid(gate + t0 * HV * V, gate + t0 * HV * V, (t1 - t0) * HV * V);
      });
    }
  }
  const float* onw_p = onw.data();  // thread_local, as above
  over_rows(T * HV, 4 * V, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* o = core + r * V;
      double ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < V; ++i) ss += double(o[i]) * o[i];
      const float inv = float(1.0 / std::sqrt(ss / V + c.norm_eps));
      for (int64_t i = 0; i < V; ++i) o[i] = o[i] * inv * onw_p[i] * (gate ? gate[r * V + i] : 1.0f);
    }
  });
  kernels::linear(core, T, lin(w.o_proj), nullptr, y);
  trace("attn.out", y, {T, c.d_model});
}

}  // namespace lineage::layers
