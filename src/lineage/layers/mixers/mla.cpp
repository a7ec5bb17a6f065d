// Over 400 lines, one concept: Multi-head Latent Attention's forward (prefill on the expanded
// heads, decode on the absorbed latent cache) and its state; the split would cut one data flow.
#include "lineage/layers/mixers/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/backward.h"
#include "lineage/kernels/matrix.h"
#include "lineage/kernels/norm.h"
#include "lineage/kernels/row_split.h"
#include "lineage/kernels/rope.h"
#include "lineage/kernels/vmath.h"

namespace lineage::layers {

namespace {

// The first s.length rows of s into a new cache of `cap` rows.
Tensor copy_rows(const Mla::State& s, int64_t width, int64_t cap) {
  Tensor t = Tensor::empty(DType::F32, {cap, width});
  if (s.length) std::memcpy(t.raw_mut(), s.kv.raw(), size_t(s.length * width) * sizeof(float));
  return t;
}

void grow(Mla::State& s, int64_t width, int64_t needed) {
  if (needed <= s.capacity) return;
  s.reserve(width, std::max<int64_t>({needed, 2 * s.capacity, 16}));
}

// Rows `rows` of the step's [N, ld] activations, columns [c0, c0 + w), packed into dst [rows, w].
void gather(const float* src, int64_t ld, std::span<const int64_t> rows, int64_t c0, int64_t w, float* dst) {
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(dst + int64_t(i) * w, src + rows[i] * ld + c0, size_t(w) * sizeof(float));
}

void scatter(const float* src, std::span<const int64_t> rows, int64_t w, float* dst, int64_t ld, int64_t c0) {
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(dst + rows[i] * ld + c0, src + int64_t(i) * w, size_t(w) * sizeof(float));
}

bool explicit_form(const Options& o, int64_t T) {
  return o.mla_path == MlaPath::Explicit || (o.mla_path == MlaPath::Auto && T >= kMlaExplicitMin);
}

}  // namespace

Mla::State Mla::State::clone() const {
  State c;
  c.length = length;
  if (length) {
    c.capacity = length;
    c.kv = copy_rows(*this, kv.dim(1), length);
  }
  return c;
}

void Mla::State::assign(const State& from) {
  if (!from.length) {
    length = 0;
    return;
  }
  const int64_t w = from.kv.dim(1);
  if (capacity >= from.length && kv.dim(1) == w) {
    std::memcpy(kv.raw_mut(), from.kv.raw(), size_t(from.length * w) * sizeof(float));
  } else {
    capacity = 2 * from.length;
    kv = copy_rows(from, w, capacity);
  }
  length = from.length;
}

void Mla::State::reserve(int64_t width, int64_t positions) {
  if (positions <= capacity) return;
  kv = copy_rows(*this, width, positions);
  capacity = positions;
}

void Mla::for_each_tensor(const std::string& p, const TensorVisitor& f) {
  const Config& c = config;
  const int64_t D = c.d_model, n = c.n_heads, r = c.kv_lora_rank;
  if (c.q_lora_rank > 0) {
    visit_matrix(f, p + ".q_a_proj.weight", weights.q_a_proj, c.q_lora_rank, D);
    weights.q_a_norm.for_each_tensor(p + ".q_a_layernorm", f);
    visit_matrix(f, p + ".q_b_proj.weight", weights.q_b_proj, n * c.d_qk(), c.q_lora_rank);
  } else {
    visit_matrix(f, p + ".q_proj.weight", weights.q_proj, n * c.d_qk(), D);
  }
  visit_matrix(f, p + ".kv_a_proj_with_mqa.weight", weights.kv_a_proj, r + c.d_rope, D);
  weights.kv_a_norm.for_each_tensor(p + ".kv_a_layernorm", f);
  visit_matrix(f, p + ".kv_b_proj.weight", weights.kv_b_proj, n * (c.d_nope + c.d_v), r);
  if (c.output_gate) visit_matrix(f, p + ".g_proj.weight", weights.g_proj, n * c.d_v, D);
  visit_matrix(f, p + ".o_proj.weight", weights.o_proj, D, n * c.d_v);
}

void Mla::for_each_matrix(const MatrixVisitor& f) {
  Weights& w = weights;
  for (kernels::Matrix* m : {&w.q_proj, &w.q_a_proj, &w.q_b_proj, &w.kv_a_proj, &w.kv_b_proj, &w.g_proj, &w.o_proj})
    f(*m);  // the optional ones too, undefined where absent (and everywhere in a skeleton)
}

void Mla::prepare() {
  const Config& c = config;
  const int64_t n = c.n_heads, r = c.kv_lora_rank, dn = c.d_nope, dv = c.d_v, rows = dn + dv;
  const kernels::Matrix& kvb = weights.kv_b_proj;
  LINEAGE_CHECK(kvb.layout == kernels::Layout::OutIn, "MLA kv_b_proj must be an [out, in] matrix");
  Prepared p;
  if (kvb.quant.defined() || kvb.packed) {  // quantized: W_UK decoded (exact values) into f32, W_UV as row views
    const int64_t in = r;
    std::vector<float> rowsf(size_t(rows * in));
    p.uk_t = Tensor::empty(DType::F32, {n * r, dn});
    for (int64_t h = 0; h < n; ++h) {
      kernels::decode_rows(kvb, h * rows, h * rows + dn, rowsf.data());
      for (int64_t i = 0; i < dn; ++i)
        for (int64_t j = 0; j < r; ++j) p.uk_t.data<float>()[(h * r + j) * dn + i] = rowsf[size_t(i * in + j)];
    }
    for (int64_t h = 0; h < n; ++h) {
      kernels::Matrix uk;
      uk.data = p.uk_t.rows(h * r, (h + 1) * r);
      uk.out = r, uk.in = dn;
      p.uk.push_back(std::move(uk));
      p.uv.push_back(kernels::quant_rows(kvb, h * rows + dn, (h + 1) * rows));
    }
    p.ready = true;
    prepared = std::move(p);
    return;
  }
  // W_UK,h = kv_b rows [h·rows, h·rows + dn) as [dn, r]; its transpose [r, dn] into uk_t, element by
  // element in the stored dtype.
  const size_t es = dtype_size(kvb.data.dtype());
  p.uk_t = Tensor::empty(kvb.data.dtype(), {n * r, dn});
  const auto* src = static_cast<const unsigned char*>(kvb.data.raw());
  auto* dst = static_cast<unsigned char*>(p.uk_t.raw_mut());
  for (int64_t h = 0; h < n; ++h)
    for (int64_t i = 0; i < dn; ++i)
      for (int64_t j = 0; j < r; ++j)
        std::memcpy(dst + ((h * r + j) * dn + i) * es, src + ((h * rows + i) * r + j) * es, es);
  for (int64_t h = 0; h < n; ++h) {
    kernels::Matrix uk;
    uk.data = p.uk_t.rows(h * r, (h + 1) * r);
    uk.out = r, uk.in = dn;
    p.uk.push_back(std::move(uk));
    kernels::Matrix uv;
    uv.data = kvb.data.rows(h * rows + dn, (h + 1) * rows);
    uv.out = dv, uv.in = r;
    p.uv.push_back(std::move(uv));
  }
  p.ready = true;
  prepared = std::move(p);
}

double Mla::flops_per_token(double context) const {
  const Config& c = config;
  return 2.0 * double(c.n_heads) * double(2 * c.kv_lora_rank + c.d_rope) * context;
}

std::string Mla::describe() const {
  const Config& c = config;
  return cat("MLA, ", c.n_heads, " heads, latent ", c.kv_lora_rank, " + ", c.d_rope,
             c.rope ? " RoPE" : " NoPE", c.q_lora_rank ? cat(", q-LoRA ", c.q_lora_rank) : std::string(),
             c.output_gate ? ", output gate" : "", ", latent cache");
}

void forward(const Mla& m, const Call& call, const float* x, std::span<Mla::State* const> states, float* y,
             Mla::Buffers& buf, const Trace& trace) {
  const Mla::Config& c = m.config;
  const Step& step = call.step;
  const bool dot = call.options.bf16_dot;
  LINEAGE_CHECK(m.prepared.ready, "MLA layer used before prepare()");
  const int64_t N = step.n_tokens(), D = c.d_model, n = c.n_heads, r = c.kv_lora_rank, dr = c.d_rope,
                dn = c.d_nope, dv = c.d_v, dqk = c.d_qk(), W = c.latent();
  const float scale = float(1.0 / std::sqrt(double(dqk)));

  // Projections of every row of the step.
  float* q = buf.q.get(size_t(N * n * dqk));
  if (c.q_lora_rank > 0) {
    float* low = buf.q_low.get(size_t(N * c.q_lora_rank));
    kernels::linear(x, N, m.weights.q_a_proj, nullptr, low, std::nullopt, dot);
    forward(m.weights.q_a_norm, low, N, low);
    kernels::linear(low, N, m.weights.q_b_proj, nullptr, q, std::nullopt, dot);
  } else {
    kernels::linear(x, N, m.weights.q_proj, nullptr, q, std::nullopt, dot);
  }
  float* kv = buf.kv.get(size_t(N * W));
  kernels::linear(x, N, m.weights.kv_a_proj, nullptr, kv, std::nullopt, dot);
  for (int64_t b = 0; b < step.n_seqs(); ++b)
    for (int64_t i = 0; i < step.length(b); ++i) {
      const int64_t t = step.begin(b) + i, pos = states[size_t(b)]->length + i;
      float* row = kv + t * W;
      kernels::rms_norm(row, 1, r, &m.weights.kv_a_norm.weight, m.weights.kv_a_norm.eps, row);
      if (!c.rope) continue;
      kernels::rope_interleaved(row + r, dr, pos, c.rope_theta);
      for (int64_t h = 0; h < n; ++h) kernels::rope_interleaved(q + (t * n + h) * dqk + dn, dr, pos, c.rope_theta);
    }
  trace("attn.q", q, {N, n * dqk});
  if (trace.on()) {
    std::vector<float> latent(size_t(N * r)), rope(size_t(N * dr));
    for (int64_t t = 0; t < N; ++t) {
      std::memcpy(latent.data() + t * r, kv + t * W, size_t(r) * sizeof(float));
      std::memcpy(rope.data() + t * dr, kv + t * W + r, size_t(dr) * sizeof(float));
    }
    trace("attn.latent", latent.data(), {N, r});
    trace("attn.k_rope", rope.data(), {N, dr});
  }

  // Every sequence appends its rows to its cache; the explicit ones expand theirs.
  float* ctx = buf.context.get(size_t(N * n * dv));
  // Under tensor parallelism this rank attends with its heads [h0, h0 + nh) only, into hctx
  // [N, nh·d_v], and one gather gives every rank every head's context. The latent cache is shared by
  // every head: it stays whole on every rank.
  const auto share = kernels::rank_heads_now(n);
  const int64_t h0 = share ? share->first : 0, nh = share ? share->second - h0 : n;
  float* hctx = share ? buf.share.get(size_t(N * nh * dv)) : ctx;
  int64_t expanded_rows = 0;
  buf.absorbed.clear();
  for (int64_t b = 0; b < step.n_seqs(); ++b) {
    Mla::State& s = *states[size_t(b)];
    const int64_t T = step.length(b), t0 = step.begin(b);
    grow(s, W, s.length + T);
    std::memcpy(s.kv.data<float>() + s.length * W, kv + t0 * W, size_t(T * W) * sizeof(float));
    s.length += T;
    if (explicit_form(call.options, T)) expanded_rows += s.length;
    else
      for (int64_t i = 0; i < T; ++i) buf.absorbed.push_back(t0 + i);
  }

  // Explicit: k_n | v of every visible position from kv_b, the keys [k_n,h | k_r] per head, then the
  // tiled attention reading q in place and the values in place from kv_b's product.
  if (expanded_rows) {
    float* lat = buf.latents.get(size_t(expanded_rows * r));
    float* kvb = buf.expanded.get(size_t(expanded_rows * n * (dn + dv)));
    float* keys = buf.keys.get(size_t(expanded_rows * n * dqk));
    int64_t row = 0;
    for (int64_t b = 0; b < step.n_seqs(); ++b) {
      const Mla::State& s = *states[size_t(b)];
      if (!explicit_form(call.options, step.length(b))) continue;
      for (int64_t j = 0; j < s.length; ++j)
        std::memcpy(lat + (row + j) * r, s.kv.data<float>() + j * W, size_t(r) * sizeof(float));
      row += s.length;
    }
    kernels::linear(lat, expanded_rows, m.weights.kv_b_proj, nullptr, kvb, std::nullopt, dot);
    buf.seqs.clear();
    row = 0;
    for (int64_t b = 0; b < step.n_seqs(); ++b) {
      const Mla::State& s = *states[size_t(b)];
      const int64_t T = step.length(b), t0 = step.begin(b);
      if (!explicit_form(call.options, T)) continue;
      const int64_t L = s.length;
      float* kb = keys + row * n * dqk;
      const float* eb = kvb + row * n * (dn + dv);
      parallel_for(L, [&](int64_t j0, int64_t j1) {
        for (int64_t j = j0; j < j1; ++j)
          for (int64_t h = 0; h < n; ++h) {
            float* k = kb + (j * n + h) * dqk;
            std::memcpy(k, eb + (j * n + h) * (dn + dv), size_t(dn) * sizeof(float));
            std::memcpy(k + dn, s.kv.data<float>() + j * W + r, size_t(dr) * sizeof(float));
          }
      }, grain_for(n * dqk));
      buf.seqs.push_back({q + t0 * n * dqk + h0 * dqk, n * dqk, T, L - T, kb + h0 * dqk, eb + dn + h0 * (dn + dv), dqk,
                          dn + dv, hctx + t0 * nh * dv, nh * dv, n * dqk, n * (dn + dv)});
      row += L;
    }
    kernels::attention_causal(buf.seqs, {nh, dqk, dv, scale});
  }

  // Absorbed: q̃_h = W_UK,hᵀ q_n,h for every absorbed token and head, then [q̃_h | q_r,h] against the
  // cached [ĉ | k_r] rows, then o_h = W_UV,h c̄_h.
  const int64_t Na = int64_t(buf.absorbed.size());
  if (Na) {
    const std::span<const int64_t> rows = buf.absorbed;
    // A head's products run whole on the rank that owns it (the others do not call them).
    std::optional<kernels::RowSplitPause> whole;
    if (share) whole.emplace();
    float* in = buf.head_in.get(size_t(Na * std::max(dn, r)));
    float* out = buf.head_out.get(size_t(Na * std::max(r, dv)));
    float* lq = buf.latent_q.get(size_t(Na * nh * W));
    float* lo = buf.latent_out.get(size_t(Na * nh * r));
    for (int64_t h = h0; h < h0 + nh; ++h) {
      gather(q, n * dqk, rows, h * dqk, dn, in);
      kernels::linear(in, Na, m.prepared.uk[size_t(h)], nullptr, out, std::nullopt, dot);
      for (int64_t i = 0; i < Na; ++i) {
        float* dst = lq + (i * nh + h - h0) * W;
        std::memcpy(dst, out + i * r, size_t(r) * sizeof(float));
        std::memcpy(dst + r, q + (rows[size_t(i)] * n + h) * dqk + dn, size_t(dr) * sizeof(float));
      }
    }
    buf.queries.clear();
    int64_t i = 0;
    for (int64_t b = 0; b < step.n_seqs(); ++b) {
      const Mla::State& s = *states[size_t(b)];
      const int64_t T = step.length(b);
      if (explicit_form(call.options, T)) continue;
      for (int64_t t = 0; t < T; ++t, ++i)
        buf.queries.push_back({lq + i * nh * W, W, s.length - T + t + 1, s.kv.data<float>(), W, lo + i * nh * r, r});
    }
    kernels::latent_attention(buf.queries, nh, W, r, scale);
    for (int64_t h = h0; h < h0 + nh; ++h) {
      for (int64_t a = 0; a < Na; ++a) std::memcpy(in + a * r, lo + (a * nh + h - h0) * r, size_t(r) * sizeof(float));
      kernels::linear(in, Na, m.prepared.uv[size_t(h)], nullptr, out, std::nullopt, dot);
      scatter(out, rows, dv, hctx, nh * dv, (h - h0) * dv);
    }
  }
  if (share) kernels::gather_heads(hctx, N, n, dv, ctx);
  if (trace.on() && N == 1 && !share) {  // one decode token: the weights its query head gave the cache (lineage trace)
    const int64_t L = states[0]->length;
    std::vector<float> w(size_t(N * n * L), 0.0f);
    if (expanded_rows) {
      kernels::attention_weights(buf.seqs[0], {n, dqk, dv, scale}, w.data(), n * L);
    } else {
      for (int64_t t = 0; t < N; ++t)
        for (int64_t h = 0; h < n; ++h) {
          std::vector<float> row(size_t(buf.queries[size_t(t)].n_keys));
          kernels::LatentQuery one = buf.queries[size_t(t)];
          one.q += h * one.ldq;
          kernels::latent_attention_weights(one, 1, W, scale, row.data());
          std::copy(row.begin(), row.end(), w.begin() + (t * n + h) * L);
        }
    }
    trace("attn.weights", w.data(), {N, n, L});
  }
  trace("attn.context", ctx, {N, n * dv});

  if (c.output_gate) {
    float* g = buf.gate.get(size_t(N * n * dv));
    kernels::linear(x, N, m.weights.g_proj, nullptr, g, std::nullopt, dot);
    kernels::sigmoid(g, g, N * n * dv);
    for (int64_t i = 0; i < N * n * dv; ++i) ctx[i] *= g[i];
  }
  kernels::linear(ctx, N, m.weights.o_proj, nullptr, y, std::nullopt, dot);
  trace("attn.out", y, {N, D});
}

namespace {

kernels::AttentionTrainArgs mla_train_args(const Mla& m, const TrainShape& s, Mla::Saved& saved) {
  const Mla::Config& c = m.config;
  const int64_t N = s.N(), n = c.n_heads, dqk = c.d_qk(), dv = c.d_v;
  kernels::AttentionTrainArgs k;
  k.B = s.B, k.T = s.T, k.H = n, k.dk = dqk, k.dv = dv;
  k.scale = float(1.0 / std::sqrt(double(dqk)));
  k.q = saved.q.get(size_t(N * n * dqk)), k.ldq = n * dqk;
  k.k = saved.keys.get(size_t(N * n * dqk)), k.ldk = n * dqk;
  k.v = saved.values.get(size_t(N * n * dv)), k.ldv = n * dv;
  k.out = saved.context.get(size_t(N * n * dv)), k.ldo = n * dv;
  k.lse = saved.lse.get(size_t(s.B * n * s.T));
  return k;
}

void add_into(float* x, const float* y, int64_t n) {
  parallel_for(n, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) x[i] += y[i];
  }, 1 << 14);
}

}  // namespace

void forward_train(const Mla& m, const TrainShape& s, const float* x, float* y, Mla::Saved& saved) {
  const Mla::Config& c = m.config;
  const int64_t N = s.N(), T = s.T, n = c.n_heads, r = c.kv_lora_rank, dr = c.d_rope, dn = c.d_nope, dv = c.d_v,
                dqk = c.d_qk(), W = c.latent(), E = n * (dn + dv);
  const kernels::AttentionTrainArgs args = mla_train_args(m, s, saved);
  float* q = saved.q.get(0);
  if (c.q_lora_rank > 0) {
    float* pre = saved.low_pre.get(size_t(N * c.q_lora_rank));
    float* low = saved.low.get(size_t(N * c.q_lora_rank));
    kernels::linear(x, N, m.weights.q_a_proj, nullptr, pre);
    forward(m.weights.q_a_norm, pre, N, low);
    kernels::linear(low, N, m.weights.q_b_proj, nullptr, q);
  } else {
    kernels::linear(x, N, m.weights.q_proj, nullptr, q);
  }
  // kv_a's product: ĉ (before the norm) packed apart, k_r rotated in place.
  float* kv = saved.d_kv.get(size_t(N * W));  // scratch: backward's buffer, free until then
  kernels::linear(x, N, m.weights.kv_a_proj, nullptr, kv);
  float* lat_pre = saved.latent_pre.get(size_t(N * r));
  float* lat = saved.latent.get(size_t(N * r));
  float* keys = saved.keys.get(0);
  float* values = saved.values.get(0);
  parallel_for(N, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      std::memcpy(lat_pre + t * r, kv + t * W, size_t(r) * sizeof(float));
      if (!c.rope) continue;
      kernels::rope_interleaved(kv + t * W + r, dr, t % T, c.rope_theta);
      for (int64_t h = 0; h < n; ++h) kernels::rope_interleaved(q + (t * n + h) * dqk + dn, dr, t % T, c.rope_theta);
    }
  }, grain_for(n * dqk));
  forward(m.weights.kv_a_norm, lat_pre, N, lat);
  float* ex = saved.d_expanded.get(size_t(N * E));  // scratch likewise
  kernels::linear(lat, N, m.weights.kv_b_proj, nullptr, ex);
  parallel_for(N, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < n; ++h) {
        float* k = keys + (t * n + h) * dqk;
        std::memcpy(k, ex + t * E + h * (dn + dv), size_t(dn) * sizeof(float));
        std::memcpy(k + dn, kv + t * W + r, size_t(dr) * sizeof(float));
        std::memcpy(values + (t * n + h) * dv, ex + t * E + h * (dn + dv) + dn, size_t(dv) * sizeof(float));
      }
  }, grain_for(n * dqk));
  kernels::attention_causal_train(args);
  const float* ctx = args.out;
  if (c.output_gate) {
    float* g = saved.gate.get(size_t(N * n * dv));
    float* gated = saved.gated.get(size_t(N * n * dv));
    kernels::linear(x, N, m.weights.g_proj, nullptr, g);
    kernels::sigmoid(g, g, N * n * dv);
    for (int64_t i = 0; i < N * n * dv; ++i) gated[i] = ctx[i] * g[i];
    ctx = gated;
  }
  kernels::linear(ctx, N, m.weights.o_proj, nullptr, y);
}

void backward(const Mla& m, const TrainShape& s, const float* x, const float* dy, Mla::Saved& saved, float* dx,
              Mla& grad) {
  const Mla::Config& c = m.config;
  const int64_t N = s.N(), T = s.T, D = c.d_model, n = c.n_heads, r = c.kv_lora_rank, dr = c.d_rope, dn = c.d_nope,
                dv = c.d_v, dqk = c.d_qk(), W = c.latent(), E = n * (dn + dv), C = n * dv;
  Mla::Weights& gw = grad.weights;
  const kernels::AttentionTrainArgs args = mla_train_args(m, s, saved);
  float* d_ctx = saved.d_context.get(size_t(N * C));
  float* dxt = saved.d_x.get(size_t(N * D));
  // o_proj, then the gate: y = W_o (ctx ⊙ g), g = σ(W_g x).
  if (c.output_gate) {
    const float* g = saved.gate.get(0);
    float* d_gated = saved.d_gated.get(size_t(N * C));
    kernels::linear_backward(saved.gated.get(0), dy, N, m.weights.o_proj, d_gated, &gw.o_proj, nullptr);
    for (int64_t i = 0; i < N * C; ++i) {
      d_ctx[i] = d_gated[i] * g[i];
      d_gated[i] *= args.out[i] * g[i] * (1.0f - g[i]);  // ∂L/∂(W_g x)
    }
    kernels::linear_backward(x, d_gated, N, m.weights.g_proj, dx, &gw.g_proj, nullptr);
  } else {
    kernels::linear_backward(args.out, dy, N, m.weights.o_proj, d_ctx, &gw.o_proj, nullptr);
    std::memset(dx, 0, size_t(N * D) * sizeof(float));
  }
  float* dq = saved.d_q.get(size_t(N * n * dqk));
  float* dk = saved.d_keys.get(size_t(N * n * dqk));
  float* dvv = saved.d_values.get(size_t(N * C));
  kernels::attention_causal_backward(args, {d_ctx, dq, dk, dvv, C, n * dqk, n * dqk, C});
  // The keys' and values' gradients back into kv_b's product and k_r (shared by the heads), RoPE
  // turned back on q's and k_r's slots.
  float* d_ex = saved.d_expanded.get(size_t(N * E));
  float* d_kv = saved.d_kv.get(size_t(N * W));
  parallel_for(N, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* dkr = d_kv + t * W + r;
      std::memset(dkr, 0, size_t(dr) * sizeof(float));
      for (int64_t h = 0; h < n; ++h) {
        const float* k = dk + (t * n + h) * dqk;
        std::memcpy(d_ex + t * E + h * (dn + dv), k, size_t(dn) * sizeof(float));
        std::memcpy(d_ex + t * E + h * (dn + dv) + dn, dvv + (t * n + h) * dv, size_t(dv) * sizeof(float));
        for (int64_t i = 0; i < dr; ++i) dkr[i] += k[dn + i];
        if (c.rope) kernels::rope_interleaved_backward(dq + (t * n + h) * dqk + dn, dr, t % T, c.rope_theta);
      }
      if (c.rope) kernels::rope_interleaved_backward(dkr, dr, t % T, c.rope_theta);
    }
  }, grain_for(n * dqk));
  float* d_lat = saved.d_latent.get(size_t(N * r));
  kernels::linear_backward(saved.latent.get(0), d_ex, N, m.weights.kv_b_proj, d_lat, &gw.kv_b_proj, nullptr);
  backward(m.weights.kv_a_norm, saved.latent_pre.get(0), N, d_lat, d_lat, gw.kv_a_norm);
  for (int64_t t = 0; t < N; ++t) std::memcpy(d_kv + t * W, d_lat + t * r, size_t(r) * sizeof(float));
  kernels::linear_backward(x, d_kv, N, m.weights.kv_a_proj, dxt, &gw.kv_a_proj, nullptr);
  add_into(dx, dxt, N * D);
  if (c.q_lora_rank > 0) {
    float* d_low = saved.d_low.get(size_t(N * c.q_lora_rank));
    kernels::linear_backward(saved.low.get(0), dq, N, m.weights.q_b_proj, d_low, &gw.q_b_proj, nullptr);
    backward(m.weights.q_a_norm, saved.low_pre.get(0), N, d_low, d_low, gw.q_a_norm);
    kernels::linear_backward(x, d_low, N, m.weights.q_a_proj, dxt, &gw.q_a_proj, nullptr);
  } else {
    kernels::linear_backward(x, dq, N, m.weights.q_proj, dxt, &gw.q_proj, nullptr);
  }
  add_into(dx, dxt, N * D);
}

}  // namespace lineage::layers
