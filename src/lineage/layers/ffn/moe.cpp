#include "lineage/layers/ffn/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/kernels/backward.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/row_split.h"
#include "lineage/kernels/moe_router_backward.h"
#include "lineage/kernels/norm.h"
#include "lineage/kernels/vmath.h"

namespace lineage::layers {

void Moe::for_each_tensor(const std::string& p, const TensorVisitor& f) {
  const Config& c = config;
  visit_matrix(f, p + ".gate.weight", weights.gate, c.n_experts, c.d_model);
  if (c.router == Router::Sigmoid) f(p + ".gate.e_score_correction_bias", weights.bias, {c.n_experts}, Init::Zeros);
  const int64_t X = expert_width();
  if (c.latent > 0) visit_matrix(f, p + ".routed_expert_down_proj.weight", weights.latent_down, c.latent, c.d_model);
  if (c.latent > 0 && c.latent_norm) f(p + ".routed_expert_norm.weight", weights.latent_norm, {c.latent}, Init::Ones);
  if (c.latent > 0) visit_matrix(f, p + ".routed_expert_up_proj.weight", weights.latent_up, c.d_model, c.latent);
  weights.experts.resize(size_t(c.n_experts));
  for (int64_t e = 0; e < c.n_experts; ++e) {
    GatedMlp& x = weights.experts[size_t(e)];
    x.config = {X, c.hidden, c.act, c.situ_beta, c.situ_linear_beta};
    x.names = expert_names;
    x.for_each_tensor(p + ".experts." + std::to_string(e), f);
  }
  if (c.shared_hidden > 0) {
    weights.shared.config = {c.d_model, c.shared_hidden, c.act, c.situ_beta, c.situ_linear_beta};
    weights.shared.for_each_tensor(p + "." + shared_name, f);
    if (c.shared_gate) visit_matrix(f, p + ".shared_expert_gate.weight", weights.shared_gate, 1, c.d_model);
  }
}

void Moe::for_each_matrix(const MatrixVisitor& f) {
  f(weights.gate);
  if (config.latent > 0) f(weights.latent_down), f(weights.latent_up);
  for (GatedMlp& e : weights.experts) e.for_each_matrix(f);
  if (config.shared_hidden > 0) weights.shared.for_each_matrix(f);
  if (config.shared_gate) f(weights.shared_gate);
}

void Moe::prepare() {
  Prepared p;
  p.bias.assign(size_t(config.n_experts), 0.0f);
  if (weights.bias.defined()) kernels::widen_row(weights.bias, 0, config.n_experts, p.bias.data());
  p.ready = true;
  prepared = std::move(p);
}

std::string Moe::describe() const {
  const Config& c = config;
  return cat(c.latent > 0 ? cat("latent MoE (", c.latent, "), ") : std::string("MoE, "), c.n_experts,
             c.act == GatedMlp::Act::Situ ? " SiTU" : " SwiGLU", " experts of ", c.hidden, ", ", c.top_k, " per token",
             c.n_group > 1 ? cat(" (", c.topk_group, " of ", c.n_group, " groups)") : std::string(),
             c.shared_hidden ? cat(c.shared_gate ? ", gated shared MLP " : ", shared MLP ", c.shared_hidden) : std::string(),
             c.router == Router::Softmax ? ", softmax router" : "");
}

double Moe::bytes_per_step(double tokens) const {
  const Config& c = config;
  const double E = double(c.n_experts), k = double(c.top_k);
  const double chosen = E * (1.0 - std::pow(1.0 - k / E, tokens));
  double bytes = double(weights.gate.bytes()) + double(weights.bias.nbytes()) + double(weights.latent_down.bytes()) +
                 double(weights.latent_up.bytes()) + double(weights.latent_norm.nbytes()) +
                 double(weights.shared_gate.bytes());
  if (c.shared_hidden > 0) {
    const GatedMlp::Weights& s = weights.shared.weights;
    bytes += double(s.gate_proj.bytes() + s.up_proj.bytes() + s.down_proj.bytes());
  }
  if (!weights.experts.empty()) {
    const GatedMlp::Weights& e = weights.experts[0].weights;
    bytes += chosen * double(e.gate_proj.bytes() + e.up_proj.bytes() + e.down_proj.bytes());
  }
  return bytes;
}

void route(const Moe::Config& c, const float* logits, const float* bias, int32_t* ids, float* w,
           std::vector<int32_t>& scratch) {
  const int64_t E = c.n_experts, k = c.top_k;
  // s and s' in f32 as the reference computes them (σ of the f32 logits; the bias added in f32), or
  // the softmax of the logits (max subtracted, the sum in double) with s' = s.
  thread_local std::vector<float> s, biased;
  s.resize(size_t(E)), biased.resize(size_t(E));
  if (c.router == Moe::Router::Softmax) {
    float top = logits[0];
    for (int64_t e = 1; e < E; ++e) top = std::max(top, logits[e]);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += double(s[size_t(e)] = std::exp(logits[e] - top));
    for (int64_t e = 0; e < E; ++e) biased[size_t(e)] = s[size_t(e)] = float(double(s[size_t(e)]) / sum);
  } else {
    for (int64_t e = 0; e < E; ++e) {
      s[size_t(e)] = 1.0f / (1.0f + std::exp(-logits[e]));
      biased[size_t(e)] = s[size_t(e)] + bias[e];
    }
  }
  scratch.resize(size_t(E));
  const auto before = [](const std::vector<float>& v) {
    return [&v](int32_t a, int32_t b) { return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b); };
  };
  // What the top-k ranks: s', or with groups s' of the kept groups and 0.0 elsewhere (the
  // references' mask: a kept expert with a negative s' ranks below a masked one), or −inf (K3).
  const std::vector<float>* rank = &biased;
  if (c.n_group > 1) {
    const int64_t per = E / c.n_group;
    thread_local std::vector<float> gscore, masked;
    thread_local std::vector<int32_t> groups;
    gscore.resize(size_t(c.n_group)), groups.resize(size_t(c.n_group));
    for (int64_t g = 0; g < c.n_group; ++g) {  // the sum of the group's two largest biased scores
      float a = -INFINITY, b = -INFINITY;
      for (int64_t e = g * per; e < (g + 1) * per; ++e) {
        const float v = biased[size_t(e)];
        if (v > a) b = a, a = v;
        else if (v > b) b = v;
      }
      gscore[size_t(g)] = per > 1 ? a + b : a;
      groups[size_t(g)] = int32_t(g);
    }
    std::partial_sort(groups.begin(), groups.begin() + c.topk_group, groups.end(), before(gscore));
    masked.assign(size_t(E), c.mask_neg_inf ? -INFINITY : 0.0f);
    for (int64_t i = 0; i < c.topk_group; ++i)
      for (int64_t e = groups[size_t(i)] * per; e < (groups[size_t(i)] + 1) * per; ++e)
        masked[size_t(e)] = biased[size_t(e)];
    rank = &masked;
  }
  for (int64_t e = 0; e < E; ++e) scratch[size_t(e)] = int32_t(e);
  std::partial_sort(scratch.begin(), scratch.begin() + k, scratch.end(), before(*rank));
  double sum = 0;
  for (int64_t j = 0; j < k; ++j) {
    const int32_t e = scratch[size_t(j)];
    ids[j] = e;
    w[j] = c.bias_in_weights ? biased[size_t(e)] : s[size_t(e)];
    sum += w[j];
  }
  if (c.renormalize && (k > 1 || c.router == Moe::Router::Softmax)) {
    const float denom = float(sum) + 1e-20f;
    for (int64_t j = 0; j < k; ++j) w[j] /= denom;
  }
  for (int64_t j = 0; j < k; ++j) w[j] = float(double(w[j]) * c.scaling);
}

namespace {

// The slots t·k + j grouped by their expert (counting sort: ascending expert, then ascending slot):
// expert e's slots are order[offsets[e] .. offsets[e + 1]).
void group_by_expert(const std::vector<int32_t>& ids, int64_t E, std::vector<int64_t>& offsets,
                     std::vector<int32_t>& order, std::vector<int32_t>& scratch) {
  offsets.assign(size_t(E + 1), 0);
  for (const int32_t e : ids) ++offsets[size_t(e) + 1];
  for (int64_t e = 0; e < E; ++e) offsets[size_t(e + 1)] += offsets[size_t(e)];
  order.resize(ids.size());
  scratch.assign(offsets.begin(), offsets.end() - 1);
  for (size_t i = 0; i < ids.size(); ++i) order[size_t(scratch[size_t(ids[i])]++)] = int32_t(i);
}

void add_into(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// An expert's n output rows `out` [n, width] (its slots `slots`, slot = token·k + j) added with the
// router's weights w into their tokens' rows of acc [N, width], slot by slot.
void add_weighted(const int32_t* slots, int64_t n, const float* w, int64_t k, const float* out, int64_t width,
                  float* acc) {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t slot = slots[i];
    const float wi = w[slot];
    float* at = acc + (slot / k) * width;
    const float* o = out + i * width;
    for (int64_t d = 0; d < width; ++d) at[d] += wi * o[d];
  }
}

// The routed experts under tensor parallelism (kernels/row_split.h), each split inside itself, in two
// gathers for all of them: every rank computes its share [f0, f1) of each chosen expert's hidden
// units (gate, up, the gate's activation: element by element), one gather gives every rank every
// expert's whole hidden rows; every rank then computes its share [x0, x1) of each expert's output
// rows and adds them with the router's weights into its share of the sum, experts and slots in the
// order one process adds them, and a second gather gives every rank the whole sum. Each sum is one
// rank's, in one process's order: nothing is summed across ranks, so the result is bit for bit one
// process's. xe: the experts' input [N, X]; w: the router's weights [N, k]; acc: the sum [N, X], zeroed.
void routed_split(const kernels::RowSplit& s, const Moe& m, const float* xe, const float* w, float* acc, int64_t N,
                  Moe::Buffers& buf, bool dot) {
  const int64_t E = m.config.n_experts, k = m.config.top_k, X = m.expert_width(), F = m.config.hidden;
  const int P = s.ranks;
  const int64_t R = buf.offsets[size_t(E)];  // the chosen (token, expert) slots, grouped by expert
  const auto [f0, f1] = kernels::rank_rows(F, s.rank, P);
  const auto [x0, x1] = kernels::rank_rows(X, s.rank, P);
  const int64_t Fr = f1 - f0, Xr = x1 - x0;
  // Each slot's share of its expert's hidden units, slots in expert order: [R, Fr].
  float* h_mine = buf.split_mine.get(size_t(R * Fr));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t b = buf.offsets[size_t(e)], n = buf.offsets[size_t(e + 1)] - b;
    if (!n || !Fr) continue;
    const GatedMlp& ex = m.weights.experts[size_t(e)];
    float* in = buf.rows_in.get(size_t(n * X));
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(in + i * X, xe + (buf.order[size_t(b + i)] / k) * X, size_t(X) * sizeof(float));
    float* g = h_mine + b * Fr;
    float* u = buf.mlp.up.get(size_t(n * Fr));
    kernels::linear_rows(in, n, ex.weights.gate_proj.view(dot), f0, f1, g);
    kernels::linear_rows(in, n, ex.weights.up_proj.view(dot), f0, f1, u);
    gate_rows(ex.config, g, u, n, Fr);
  }
  float* h = buf.split_hidden.get(size_t(R * F));  // [R, F]: every slot's hidden units, every rank's share
  kernels::gather_columns(s, h_mine, R, F, 1, h);
  // This rank's share of every expert's output rows, added into its share of the sum [N, Xr].
  float* sum = buf.split_sum.get(size_t(N * Xr));
  std::memset(sum, 0, size_t(N * Xr) * sizeof(float));
  for (int64_t e = 0; e < E && Xr > 0; ++e) {
    const int64_t b = buf.offsets[size_t(e)], n = buf.offsets[size_t(e + 1)] - b;
    if (!n) continue;
    float* out = buf.rows_out.get(size_t(n * Xr));
    kernels::linear_rows(h + b * F, n, m.weights.experts[size_t(e)].weights.down_proj.view(dot), x0, x1, out);
    add_weighted(buf.order.data() + b, n, w, k, out, Xr, sum);
  }
  kernels::gather_columns(s, sum, N, X, 1, acc);
}

// The routed experts placed by rank (RowSplit::experts_by_rank, --parallel expert): rank r runs the
// experts [E·r/P, E·(r+1)/P) whole on their slots' rows, as one process runs them, and one gather gives
// every rank every chosen expert's output rows in expert order (the ranks' blocks of experts follow
// each other); every rank then adds them with the router's weights in one process's order. Every row
// is one rank's, every sum one process's: bit for bit one process. The tokens need no dispatch: every
// rank holds every token's input, gathered before.
void routed_by_rank(const kernels::RowSplit& s, const Moe& m, const float* xe, const float* w, float* acc,
                    Moe::Buffers& buf, bool dot) {
  const int64_t E = m.config.n_experts, k = m.config.top_k, X = m.expert_width();
  const int P = s.ranks;
  std::vector<int64_t>& counts = buf.split_counts;
  counts.resize(size_t(P));
  for (int r = 0; r < P; ++r) {
    const auto [a, z] = kernels::rank_rows(E, r, P);
    counts[size_t(r)] = (buf.offsets[size_t(z)] - buf.offsets[size_t(a)]) * X;
  }
  const auto [e0, e1] = kernels::rank_rows(E, s.rank, P);
  const int64_t first = buf.offsets[size_t(e0)];
  float* mine = buf.split_mine.get(size_t(counts[size_t(s.rank)]));
  {
    const kernels::RowSplitPause whole;  // this rank's experts, every row of them
    for (int64_t e = e0; e < e1; ++e) {
      const int64_t b = buf.offsets[size_t(e)], n = buf.offsets[size_t(e + 1)] - b;
      if (!n) continue;
      float* in = buf.rows_in.get(size_t(n * X));
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(in + i * X, xe + (buf.order[size_t(b + i)] / k) * X, size_t(X) * sizeof(float));
      forward_rows(m.weights.experts[size_t(e)], in, n, mine + (b - first) * X, buf.mlp, dot);
    }
  }
  float* out = buf.split_all.get(size_t(buf.offsets[size_t(E)] * X));  // [R, X], slots in expert order
  kernels::gather_rows(s, mine, counts, out, true);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t b = buf.offsets[size_t(e)], n = buf.offsets[size_t(e + 1)] - b;
    if (n) add_weighted(buf.order.data() + b, n, w, k, out + b * X, X, acc);
  }
}

// The routed experts in one process: each chosen expert on its slots' rows, its outputs added with the
// router's weights into acc [N, X] (zeroed), experts and slots in order.
void run_experts(const Moe& m, const float* xe, const float* w, float* acc, Moe::Buffers& buf, bool dot) {
  const int64_t E = m.config.n_experts, k = m.config.top_k, X = m.expert_width();
  if (m.source) {  // streamed: the step's distinct experts asked for at once, their reads issued together
    buf.chosen.clear();
    for (int64_t e = 0; e < E; ++e)
      if (buf.offsets[size_t(e + 1)] > buf.offsets[size_t(e)]) buf.chosen.push_back(int32_t(e));
    m.source->request(buf.chosen.data(), int64_t(buf.chosen.size()));
  }
  for (int64_t e = 0, j = 0; e < E; ++e) {
    const int64_t b = buf.offsets[size_t(e)], n = buf.offsets[size_t(e + 1)] - b;
    if (!n) continue;
    float* in = buf.rows_in.get(size_t(n * X));
    float* out = buf.rows_out.get(size_t(n * X));
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(in + i * X, xe + (buf.order[size_t(b + i)] / k) * X, size_t(X) * sizeof(float));
    forward_rows(m.source ? m.source->expert(j++) : m.weights.experts[size_t(e)], in, n, out, buf.mlp, dot);
    add_weighted(buf.order.data() + b, n, w, k, out, X, acc);
  }
}

}  // namespace

RoutedSplit routed_split_mode(const Moe& m, const kernels::RowSplit* s) {
  if (!s || m.source || m.weights.experts.empty()) return RoutedSplit::Whole;
  if (s->experts_by_rank) return RoutedSplit::ByRank;
  const GatedMlp& e = m.weights.experts.front();
  for (const kernels::Matrix* w : {&e.weights.gate_proj, &e.weights.up_proj, &e.weights.down_proj})
    if (!kernels::splits(*s, w->view(false))) return RoutedSplit::Whole;
  return RoutedSplit::Rows;
}

void forward(const Moe& m, const Call& call, const float* x, float* y, Moe::Buffers& buf, const Trace& trace) {
  const Moe::Config& c = m.config;
  LINEAGE_CHECK(m.prepared.ready, "MoE layer used before prepare()");
  const int64_t N = call.step.n_tokens(), D = c.d_model, E = c.n_experts, k = c.top_k;
  const bool dot = call.options.bf16_dot;

  // The sigmoid router in f32 (exact products whatever the gate's dtype, as Kimi's reference casts
  // it); the softmax router in the model's dtype (Qwen's runs the gate as any other linear).
  float* logits = buf.logits.get(size_t(N * E));
  kernels::linear(x, N, m.weights.gate, nullptr, logits, std::nullopt, c.router == Moe::Router::Softmax && dot);
  trace("moe.router_logits", logits, {N, E});
  buf.ids.resize(size_t(N * k));
  float* w = buf.weights.get(size_t(N * k));
  for (int64_t t = 0; t < N; ++t)
    route(c, logits + t * E, m.prepared.bias.data(), buf.ids.data() + t * k, w + t * k, buf.scratch);
  if (trace.on()) {
    float* f = buf.ids_f.get(size_t(N * k));
    for (int64_t i = 0; i < N * k; ++i) f[i] = float(buf.ids[size_t(i)]);
    trace("moe.expert_ids", f, {N, k});
    trace("moe.expert_weights", w, {N, k});
  }

  group_by_expert(buf.ids, E, buf.offsets, buf.order, buf.scratch);
  // The experts' input and their weighted sum: x and y, or z = W_down·x and a [N, L_a].
  const int64_t X = m.expert_width();
  const float* xe = x;
  float* acc = y;
  if (c.latent > 0) {
    float* z = buf.latent_in.get(size_t(N * X));
    kernels::linear(x, N, m.weights.latent_down, nullptr, z, std::nullopt, dot);
    trace("moe.latent", z, {N, X});
    xe = z, acc = buf.latent_sum.get(size_t(N * X));
  }
  std::memset(acc, 0, size_t(N * X) * sizeof(float));
  const kernels::RowSplit* split = kernels::row_split_now();
  switch (routed_split_mode(m, split)) {
    case RoutedSplit::ByRank: routed_by_rank(*split, m, xe, w, acc, buf, dot); break;
    case RoutedSplit::Rows: routed_split(*split, m, xe, w, acc, N, buf, dot); break;
    case RoutedSplit::Whole: run_experts(m, xe, w, acc, buf, dot); break;
  }
  if (c.latent > 0) {  // RMSNorm of the aggregate (once), then back up to the full width
    if (c.latent_norm) kernels::rms_norm(acc, N, X, &m.weights.latent_norm, c.latent_eps, acc);
    kernels::linear(acc, N, m.weights.latent_up, nullptr, y, std::nullopt, dot);
    trace("moe.routed", y, {N, D});
  }
  if (c.shared_hidden > 0) {
    float* sh = buf.shared.get(size_t(N * D));
    forward_rows(m.weights.shared, x, N, sh, buf.mlp, dot);
    if (c.shared_gate) {  // one σ(W_sg·x) per token
      float* g = buf.shared_gate.get(size_t(N));
      kernels::linear(x, N, m.weights.shared_gate, nullptr, g, std::nullopt, dot);
      kernels::sigmoid(g, g, N);
      for (int64_t t = 0; t < N; ++t)
        for (int64_t d = 0; d < D; ++d) sh[t * D + d] *= g[t];
    }
    trace("moe.shared", sh, {N, D});
    for (int64_t i = 0; i < N * D; ++i) y[i] += sh[i];
  }
  trace("moe.out", y, {N, D});
}

void forward_train(const Moe& m, const TrainShape& s, const float* x, float* y, Moe::Saved& sv) {
  const Moe::Config& c = m.config;
  LINEAGE_CHECK(m.prepared.ready, "MoE layer used before prepare()");
  const int64_t N = s.N(), D = c.d_model, E = c.n_experts, k = c.top_k, X = m.expert_width();
  LINEAGE_CHECK(!m.source, "training a MoE layer whose experts stream from disk (--memory-budget)");
  float* logits = sv.logits.get(size_t(N * E));
  kernels::linear(x, N, m.weights.gate, nullptr, logits);
  sv.ids.resize(size_t(N * k));
  float* w = sv.weights.get(size_t(N * k));
  for (int64_t t = 0; t < N; ++t)
    route(c, logits + t * E, m.prepared.bias.data(), sv.ids.data() + t * k, w + t * k, sv.scratch);
  group_by_expert(sv.ids, E, sv.offsets, sv.order, sv.scratch);

  const float* xe = x;
  if (c.latent > 0) {
    float* z = sv.latent_in.get(size_t(N * X));
    kernels::linear(x, N, m.weights.latent_down, nullptr, z);
    xe = z;
  }
  float* acc = c.latent > 0 ? sv.latent_sum.get(size_t(N * X)) : y;
  std::memset(acc, 0, size_t(N * X) * sizeof(float));
  float* in = sv.rows_in.get(size_t(N * k * X));
  float* out = sv.rows_out.get(size_t(N * k * X));
  sv.experts.resize(size_t(E));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t b = sv.offsets[size_t(e)], n = sv.offsets[size_t(e + 1)] - b;
    if (!n) continue;
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(in + (b + i) * X, xe + (sv.order[size_t(b + i)] / k) * X, size_t(X) * sizeof(float));
    forward_train(m.weights.experts[size_t(e)], TrainShape{1, n}, in + b * X, out + b * X, sv.experts[size_t(e)]);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t slot = sv.order[size_t(b + i)];
      float* at = acc + (slot / k) * X;
      const float* o = out + (b + i) * X;
      for (int64_t d = 0; d < X; ++d) at[d] += w[slot] * o[d];
    }
  }
  if (c.latent > 0) {
    const float* a = acc;
    if (c.latent_norm) {
      float* normed = sv.latent_normed.get(size_t(N * X));
      kernels::rms_norm(acc, N, X, &m.weights.latent_norm, c.latent_eps, normed);
      a = normed;
    }
    kernels::linear(a, N, m.weights.latent_up, nullptr, y);
  }
  if (c.shared_hidden > 0) {  // plus the shared MLP's output, with the gate times σ(W_sg·x) per token
    float* sh = sv.shared_out.get(size_t(N * D));
    forward_train(m.weights.shared, s, x, sh, sv.shared);
    if (c.shared_gate) {
      float* g = sv.shared_gate.get(size_t(N));
      kernels::linear(x, N, m.weights.shared_gate, nullptr, g);
      kernels::sigmoid(g, g, N);
      for (int64_t t = 0; t < N; ++t)
        for (int64_t d = 0; d < D; ++d) y[t * D + d] += g[t] * sh[t * D + d];
    } else {
      add_into(y, sh, N * D);
    }
  }
}

namespace {

// The routed experts' backward: ∂L/∂(each slot's weight) into sv.d_weights [N, k], the experts'
// parameter gradients into grad, and ∂L/∂(their input) [N, X] returned (slots summed per token in
// ascending expert order).
const float* experts_backward(const Moe& m, const float* d_sum, Moe::Saved& sv, Moe& grad, int64_t N) {
  const int64_t E = m.config.n_experts, k = m.config.top_k, X = m.expert_width();
  const float* w = sv.weights.get(0);
  const float* in = sv.rows_in.get(0);
  const float* out = sv.rows_out.get(0);
  float* dw = sv.d_weights.get(size_t(N * k));
  float* d_out = sv.d_rows_out.get(size_t(N * k * X));
  float* d_in = sv.d_rows_in.get(size_t(N * k * X));
  float* dxe = sv.d_in.get(size_t(N * X));
  std::memset(dxe, 0, size_t(N * X) * sizeof(float));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t b = sv.offsets[size_t(e)], n = sv.offsets[size_t(e + 1)] - b;
    if (!n) continue;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t slot = sv.order[size_t(b + i)];
      const float* g = d_sum + (slot / k) * X;
      const float* o = out + (b + i) * X;
      float* go = d_out + (b + i) * X;
      double dot = 0;
      for (int64_t d = 0; d < X; ++d) dot += double(g[d]) * double(o[d]), go[d] = w[slot] * g[d];
      dw[slot] = float(dot);
    }
    backward(m.weights.experts[size_t(e)], TrainShape{1, n}, in + b * X, d_out + b * X, sv.experts[size_t(e)],
             d_in + b * X, grad.weights.experts[size_t(e)]);
    for (int64_t i = 0; i < n; ++i) add_into(dxe + (sv.order[size_t(b + i)] / k) * X, d_in + (b + i) * X, X);
  }
  return dxe;
}

}  // namespace

void backward(const Moe& m, const TrainShape& s, const float* x, const float* dy, Moe::Saved& sv, float* dx,
              Moe& grad) {
  const Moe::Config& c = m.config;
  const int64_t N = s.N(), D = c.d_model, E = c.n_experts, k = c.top_k, X = m.expert_width();
  float* tmp = sv.d_x.get(size_t(N * D));
  if (c.shared_hidden > 0 && c.shared_gate) {
    // y += σ(a)·sh, a = W_sg·x: ∂sh = σ(a)·dy, ∂a = (dy·sh)·σ(a)(1 − σ(a)).
    const float* g = sv.shared_gate.get(0);
    const float* sh = sv.shared_out.get(0);
    float* d_sh = sv.d_shared.get(size_t(N * D));
    float* d_a = sv.d_shared_gate.get(size_t(N));
    for (int64_t t = 0; t < N; ++t) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) d_sh[t * D + d] = g[t] * dy[t * D + d], dot += double(dy[t * D + d]) * sh[t * D + d];
      d_a[t] = float(dot * double(g[t]) * (1.0 - double(g[t])));
    }
    backward(m.weights.shared, s, x, d_sh, sv.shared, dx, grad.weights.shared);
    kernels::linear_backward(x, d_a, N, m.weights.shared_gate, tmp, &grad.weights.shared_gate, nullptr);
    add_into(dx, tmp, N * D);
  } else if (c.shared_hidden > 0) {
    backward(m.weights.shared, s, x, dy, sv.shared, dx, grad.weights.shared);
  } else {
    std::memset(dx, 0, size_t(N * D) * sizeof(float));
  }

  // ∂L/∂(the experts' weighted sum): dy itself, or back through the up projection and the norm.
  const float* d_sum = dy;
  if (c.latent > 0) {
    float* da = sv.d_sum.get(size_t(N * X));
    const float* a = c.latent_norm ? sv.latent_normed.get(0) : sv.latent_sum.get(0);
    kernels::linear_backward(a, dy, N, m.weights.latent_up, da, &grad.weights.latent_up, nullptr);
    if (c.latent_norm)
      kernels::rms_norm_backward(sv.latent_sum.get(0), da, N, X, &m.weights.latent_norm, c.latent_eps, da,
                                 grad.weights.latent_norm.data<float>());
    d_sum = da;
  }
  const float* dxe = experts_backward(m, d_sum, sv, grad, N);
  if (c.latent > 0) {
    kernels::linear_backward(x, dxe, N, m.weights.latent_down, tmp, &grad.weights.latent_down, nullptr);
    add_into(dx, tmp, N * D);
  } else {
    add_into(dx, dxe, N * D);
  }

  // The router: through the chosen experts' weights only.
  float* dlogits = sv.d_logits.get(size_t(N * E));
  const kernels::MoeRouterArgs ra{N, E, k, c.renormalize, c.scaling, c.bias_in_weights ? m.prepared.bias.data() : nullptr,
                                  c.router == Moe::Router::Softmax};
  kernels::moe_router_backward(ra, sv.logits.get(0), sv.ids.data(), sv.d_weights.get(0), dlogits);
  kernels::linear_backward(x, dlogits, N, m.weights.gate, tmp, &grad.weights.gate, nullptr);
  add_into(dx, tmp, N * D);
}

}  // namespace lineage::layers
