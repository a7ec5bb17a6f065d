#include "lineage/runtime/trace_record.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <type_traits>
#include <variant>

#include "lineage/core/error.h"
#include "lineage/runtime/session.h"

namespace lineage::runtime {

std::vector<TraceLayer> trace_layers(const model::Model& m) {
  std::vector<TraceLayer> out;
  for (const model::Block& b : m.blocks) {
    TraceLayer l;
    std::visit(
        [&](const auto& x) {
          using X = std::decay_t<decltype(x)>;
          l.bytes_per_token = x.state_bytes_per_token();
          l.fixed_bytes = x.state_bytes_fixed();
          if constexpr (std::is_same_v<X, layers::DeltaRule>) {
            const auto& c = x.config;
            l.mixer = TraceMixer::DeltaRule;
            l.kind = c.kind;
            l.heads = c.n_v_heads, l.qk_heads = c.n_heads, l.dk = c.head_k, l.dv = c.head_v;
            l.erase = c.delta;
            l.gate = c.decay == layers::DeltaRule::DecayInput::None ? 0 : c.per_channel() ? 2 : 1;
          } else if constexpr (std::is_same_v<X, layers::Mla>) {
            l.mixer = TraceMixer::Mla;
            l.kind = "MLA";
            l.heads = x.config.n_heads;
          } else if constexpr (std::is_same_v<X, layers::GatedAttention>) {
            l.kind = "gated attention";
            l.heads = x.config.n_heads, l.dk = l.dv = x.config.head_dim;
          } else {
            l.kind = "softmax attention";
            l.heads = x.config.n_heads, l.dk = l.dv = x.config.head_dim;
          }
        },
        b.mixer);
    if (const auto* moe = std::get_if<layers::Moe>(&b.ffn)) l.experts = moe->config.n_experts, l.top_k = moe->config.top_k;
    out.push_back(std::move(l));
  }
  return out;
}

namespace {

double frobenius(const double* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  return std::sqrt(s);
}

// One layer's delta-rule values of the current token, filled by the hook until attn.state arrives.
struct DeltaToken {
  std::vector<float> q, k, v, beta, log_decay, out;
};

class Recorder {
 public:
  Recorder(const model::Model& m, const TraceOptions& o, TraceRecording& r) : opt_(o), rec_(r) {
    rec_.layers = trace_layers(m);
    prev_.resize(rec_.layers.size());
    cur_.resize(rec_.layers.size());
    for (size_t i = 0; i < rec_.layers.size(); ++i) {
      const TraceLayer& l = rec_.layers[i];
      if (l.mixer == TraceMixer::DeltaRule) prev_[i].assign(size_t(l.heads * l.dk * l.dv), 0.0f);
    }
  }

  void token(int64_t t) { t_ = t; }

  void operator()(const std::string& name, const float* d, const Shape& shape) {
    if (name.size() < 2 || name[0] != 'h' || !std::isdigit(static_cast<unsigned char>(name[1]))) return;
    const size_t dot = name.find('.');
    const size_t i = size_t(std::stoul(name.substr(1, dot - 1)));
    const std::string what = name.substr(dot + 1);
    TraceLayer& l = rec_.layers.at(i);
    const int64_t n = shape_numel(shape);
    const auto append = [&](std::vector<float>& v) { v.insert(v.end(), d, d + n); };
    if (what == "attn.weights") {  // [1, heads, t + 1]
      if (shape.size() != 3 || shape[0] != 1 || shape[2] != t_ + 1)
        throw Error(cat("trace: ", name, " of another shape than [1, heads, ", t_ + 1, "]"));
      append(l.weights);
    } else if (what == "moe.expert_ids") {
      for (int64_t j = 0; j < n; ++j) l.expert_ids.push_back(int32_t(d[j]));
    } else if (what == "moe.expert_weights") {
      append(l.expert_weights);
    } else if (what == "attn_res.weights") {
      l.attn_res_sources = shape.back();
      append(l.attn_res);
    } else if (what == "mlp_res.weights") {
      l.mlp_res_sources = shape.back();
      append(l.mlp_res);
    } else if (l.mixer == TraceMixer::DeltaRule) {
      DeltaToken& c = cur_[i];
      if (what == "attn.q_read") c.q.assign(d, d + n);
      else if (what == "attn.k_write") c.k.assign(d, d + n);
      else if (what == "attn.v") c.v.assign(d, d + n);
      else if (what == "attn.beta") c.beta.assign(d, d + n);
      else if (what == "attn.log_decay") c.log_decay.assign(d, d + n);
      else if (what == "attn.core") c.out.assign(d, d + n);
      else if (what == "attn.state") finish_delta(i, d);
    }
  }

 private:
  // The token's parts of the state's change, from S_{t−1} (prev_) and the recorded values, checked
  // against the engine's S_t.
  void finish_delta(size_t i, const float* after) {
    TraceLayer& l = rec_.layers[i];
    DeltaToken& c = cur_[i];
    const int64_t HV = l.heads, H = l.qk_heads, K = l.dk, V = l.dv, G = HV / H;
    if (int64_t(c.q.size()) != H * K || int64_t(c.k.size()) != H * K || int64_t(c.v.size()) != HV * V ||
        int64_t(c.out.size()) != HV * V)
      throw Error(cat("trace: layer ", i, " traced no q_read / k_write / v / core of the expected sizes this token"));
    if (c.beta.empty()) c.beta.assign(size_t(HV), 1.0f);
    l.q.insert(l.q.end(), c.q.begin(), c.q.end());
    l.k.insert(l.k.end(), c.k.begin(), c.k.end());
    l.v.insert(l.v.end(), c.v.begin(), c.v.end());
    l.out.insert(l.out.end(), c.out.begin(), c.out.end());
    l.beta.insert(l.beta.end(), c.beta.begin(), c.beta.end());
    if (l.gate) l.log_decay.insert(l.log_decay.end(), c.log_decay.begin(), c.log_decay.end());
    std::vector<double> decayed(size_t(K * V)), delta(size_t(K * V));
    std::vector<float>& prev = prev_[i];
    for (int64_t j = 0; j < HV; ++j) {
      const float* S0 = prev.data() + j * K * V;
      const float* S1 = after + j * K * V;
      const float* k = c.k.data() + (j / G) * K;
      const float* v = c.v.data() + j * V;
      const double beta = c.beta[size_t(j)];
      for (int64_t a = 0; a < K; ++a) {
        const double f = l.gate == 0   ? 1.0
                         : l.gate == 1 ? std::exp(double(c.log_decay.at(size_t(j))))
                                       : std::exp(double(c.log_decay.at(size_t(j * K + a))));
        for (int64_t b = 0; b < V; ++b) {
          decayed[size_t(a * V + b)] = f * S0[a * V + b];
          delta[size_t(a * V + b)] = decayed[size_t(a * V + b)] - S0[a * V + b];
        }
      }
      std::vector<double> r(size_t(V), 0.0);  // S̃ᵀk
      for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < V; ++b) r[size_t(b)] += decayed[size_t(a * V + b)] * k[a];
      double k2 = 0, r2 = 0, v2 = 0, worst = 0, top = 0;
      for (int64_t a = 0; a < K; ++a) k2 += double(k[a]) * k[a];
      for (int64_t b = 0; b < V; ++b) r2 += r[size_t(b)] * r[size_t(b)], v2 += double(v[b]) * v[b];
      for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < V; ++b) {
          const double u = beta * ((l.erase ? -r[size_t(b)] : 0.0) + v[b]);
          const double want = decayed[size_t(a * V + b)] + k[a] * u;
          worst = std::max(worst, std::abs(want - S1[a * V + b]));
          top = std::max(top, std::abs(double(S1[a * V + b])));
        }
      l.worst_residual = std::max(l.worst_residual, worst / std::max(top, 1e-30));
      std::vector<double> s0(S0, S0 + K * V), s1(S1, S1 + K * V);
      const double parts[5] = {frobenius(s0.data(), K * V), frobenius(delta.data(), K * V),
                               l.erase ? beta * std::sqrt(k2 * r2) : 0.0, beta * std::sqrt(k2 * v2),
                               frobenius(s1.data(), K * V)};
      for (double p : parts) l.norms.push_back(float(p));
      for (int64_t b = 0; b < V; ++b) l.recalled.push_back(float(r[size_t(b)]));
      if (opt_.keep_state && opt_.keep_state(int64_t(i), j)) {
        std::vector<float>& kept = l.states[j];
        kept.insert(kept.end(), S1, S1 + K * V);
        std::vector<float>& p = l.parts[j];
        for (int64_t c = 0; c < K * V; ++c) p.push_back(float(delta[size_t(c)]));
        for (int64_t a = 0; a < K; ++a)
          for (int64_t b = 0; b < V; ++b) p.push_back(l.erase ? float(-beta * k[a] * r[size_t(b)]) : 0.0f);
        for (int64_t a = 0; a < K; ++a)
          for (int64_t b = 0; b < V; ++b) p.push_back(float(beta * k[a] * v[b]));
      }
    }
    std::copy(after, after + HV * K * V, prev.begin());
    c = DeltaToken{};
  }

  const TraceOptions& opt_;
  TraceRecording& rec_;
  std::vector<std::vector<float>> prev_;
  std::vector<DeltaToken> cur_;
  int64_t t_ = 0;
};

}  // namespace

TraceRecording record_trace(const model::Model& m, std::span<const int32_t> tokens, const TraceOptions& options) {
  if (tokens.empty()) throw Error("trace: no tokens to run");
  if (m.config.max_positions && int64_t(tokens.size()) > m.config.max_positions)
    throw Error(cat("trace: ", tokens.size(), " tokens are more than the model's context of ", m.config.max_positions,
                    " positions (", m.config.max_positions_field, ")"));
  for (const model::Block& b : m.blocks)
    if (const auto* moe = std::get_if<layers::Moe>(&b.ffn); moe && moe->source)
      throw Error("trace: this model's experts stream from disk (--memory-budget); trace a model that fits in memory");
  if (m.trunk) throw Error("trace: this model's trunk streams from disk (--memory-budget); trace a model that fits in memory");
  for (int32_t t : tokens)
    if (t < 0 || t >= m.config.vocab_size)
      throw Error(cat("trace: token id ", t, " is outside the vocabulary [0, ", m.config.vocab_size, ")"));
  TraceRecording rec;
  rec.tokens.assign(tokens.begin(), tokens.end());
  Recorder recorder(m, options, rec);
  Session s(m);
  s.set_trace(layers::Trace{[&](const std::string& name, const float* d, const Shape& shape) { recorder(name, d, shape); }, ""});
  size_t fixed = 0, per_token = 0;
  for (const TraceLayer& l : rec.layers) fixed += l.fixed_bytes, per_token += l.bytes_per_token;
  const size_t softmax_per_token = 2 * size_t(m.n_layers()) * size_t(m.config.d_model) * sizeof(float);
  for (size_t t = 0; t < tokens.size(); ++t) {
    recorder.token(int64_t(t));
    const std::span<const float> logits = s.decode(tokens[t]);
    rec.state_bytes.push_back(fixed + per_token * (t + 1));
    rec.softmax_bytes.push_back(softmax_per_token * (t + 1));
    const auto top = std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float x : logits) sum += std::exp(double(x) - double(*top));
    rec.next_id.push_back(int32_t(top - logits.begin()));
    rec.next_p.push_back(float(1.0 / sum));
  }
  return rec;
}

}  // namespace lineage::runtime
