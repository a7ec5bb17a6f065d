#include "lineage/runtime/split_check.h"

#include <cmath>
#include <map>

#include "lineage/core/error.h"
#include "lineage/core/rng.h"
#include "lineage/layers/step.h"
#include "lineage/runtime/session.h"

namespace lineage::runtime {

std::vector<int32_t> split_check_tokens(int64_t vocab, int64_t count, uint64_t seed) {
  return random_tokens(count, vocab, seed);
}

double relative_rms(std::span<const float> got, std::span<const float> want) {
  LINEAGE_CHECK(got.size() == want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * double(want[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

namespace {

// Both runs take exact f32 products (split_check.h).
void exact_products(Session& s) {
  layers::Options o = s.options();
  o.bf16_dot = false;
  s.set_options(o);
}

}  // namespace

double prefill_decode_rel_rms(const model::Model& m, std::span<const int32_t> tokens) {
  const size_t V = size_t(m.config.vocab_size);
  Session whole(m), step(m);
  exact_products(whole);
  exact_products(step);
  const auto all = whole.prefill(tokens, true);
  std::vector<float> decoded;
  decoded.reserve(tokens.size() * V);
  for (int32_t t : tokens) {
    const auto l = step.decode(t);
    decoded.insert(decoded.end(), l.begin(), l.end());
  }
  return relative_rms(decoded, all);
}

Divergence first_divergence(const model::Model& m, std::span<const int32_t> tokens) {
  // Per-token intermediates ([T, width]: embeddings, activations, router outputs) of both runs, by
  // name; the decode's rows appended token after token.
  std::vector<std::string> order;
  std::map<std::string, std::vector<float>> whole_out, step_out;
  Session whole(m), step(m);
  exact_products(whole);
  exact_products(step);
  const int64_t T = int64_t(tokens.size());
  whole.set_trace(layers::Trace{[&](const std::string& n, const float* d, const Shape& s) {
    if (s.size() != 2 || s[0] != T) return;
    order.push_back(n);
    whole_out[n].assign(d, d + shape_numel(s));
  }, ""});
  step.set_trace(layers::Trace{[&](const std::string& n, const float* d, const Shape& s) {
    if (s.size() == 2 && s[0] == 1) step_out[n].insert(step_out[n].end(), d, d + shape_numel(s));
  }, ""});
  whole.prefill(tokens, true);
  for (int32_t t : tokens) step.decode(t);
  Divergence d;
  for (const std::string& n : order) {
    const auto& a = whole_out[n];
    const auto& b = step_out[n];
    if (a.size() != b.size()) continue;
    const double r = relative_rms(b, a);
    if (r <= kPrefillDecodeTolerance) continue;
    d.name = n, d.rel_rms = r;
    const std::string ids = "moe.expert_ids";
    if (n.size() > ids.size() && n.ends_with(ids)) {
      const std::string logits = n.substr(0, n.size() - ids.size()) + "moe.router_logits";
      if (whole_out.count(logits) && whole_out[logits].size() == step_out[logits].size()) {
        d.router_rel_rms = relative_rms(step_out[logits], whole_out[logits]);
        d.routing_flip = d.router_rel_rms <= kPrefillDecodeTolerance;
      }
    }
    break;
  }
  return d;
}

}  // namespace lineage::runtime
