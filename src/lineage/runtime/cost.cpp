#include "lineage/model/accounting.h"
#include "lineage/runtime/cost.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

namespace lineage::runtime {

namespace {

// The routed experts' weight tensors, and for each MoE layer the fraction of its experts a step of
// `tokens` tokens is expected to read: E·(1 − (1 − k/E)^tokens) of E (uniform routing).
struct Routed {
  std::unordered_set<const Tensor*> tensors;
  std::unordered_map<const Tensor*, double> share;
};
Routed routed_experts(const model::Model& m, double tokens) {
  Routed r;
  for (const auto& block : m.blocks) {
    const auto* moe = std::get_if<layers::Moe>(&block.ffn);
    if (!moe) continue;
    const double E = double(moe->config.n_experts), k = double(moe->config.top_k);
    const double share = 1.0 - std::pow(1.0 - k / E, tokens);
    for (const auto& e : moe->weights.experts)
      for (const kernels::Matrix* w : {&e.weights.gate_proj, &e.weights.up_proj, &e.weights.down_proj})
        for (const Tensor* t : {&w->data, &w->scales, &w->zero_point, &w->global_scale, &w->weight_shape})
          r.tensors.insert(t), r.share[t] = share;
  }
  return r;
}

}  // namespace

DecodeBytes decode_bytes_per_token(model::Model& m, double context, DType unallocated_dtype, double tokens_per_step) {
  DecodeBytes b;
  const Routed routed = routed_experts(m, tokens_per_step);
  model::for_each_stored(m, unallocated_dtype, [&](const model::StoredTensor& s) {
    const Tensor& t = s.t;
    const double whole = double(s.bytes());
    const double row = whole / double(s.shape[0]);
    if (&t == &m.embed || &t == &m.embed_blocks.data) b.weights += m.config.tied_lm_head ? whole + row : row;
    else if (&t == &m.pos_embed) b.weights += row;
    else if (routed.tensors.count(&t)) b.weights += whole * routed.share.at(&t);
    else b.weights += whole;
  });
  for (const auto& block : m.blocks)
    std::visit(
        [&](const auto& mixer) {
          b.state += double(mixer.state_bytes_per_token()) * context + 2.0 * double(mixer.state_bytes_fixed());
        },
        block.mixer);
  return b;
}

double mixer_flops_per_token(const model::Model& m, double context) {
  double f = 0;
  for (const auto& block : m.blocks) f += std::visit([&](const auto& mixer) { return mixer.flops_per_token(context); }, block.mixer);
  return f;
}

PrefillFlops prefill_flops_per_token(model::Model& m, int64_t tokens, int64_t depth) {
  PrefillFlops p;
  const double n = double(tokens);
  const Routed routed = routed_experts(m, 1);  // a token runs k of E experts
  model::for_each_stored(m, DType::F32, [&](const model::StoredTensor& s) {
    const Tensor& t = s.t;
    const double params = double(s.params) * (routed.tensors.count(&t) ? routed.share.at(&t) : 1.0);
    const bool embed = &t == &m.embed || &t == &m.embed_blocks.data;
    const bool is_head = &t == &m.lm_head || &t == &m.head_blocks.data || (embed && m.config.tied_lm_head);
    if (is_head) p.weights += 2.0 * params / n;
    else if (!embed && &t != &m.pos_embed) p.weights += 2.0 * params;
  });
  p.mixers = mixer_flops_per_token(m, double(depth) + (n + 1.0) / 2.0);
  return p;
}

DecodeRoofline decode_roofline(model::Model& m, double context, double batch, double bandwidth, double peak,
                               double weight_share) {
  DecodeRoofline r;
  r.bytes = decode_bytes_per_token(m, context, DType::F32, batch);
  r.bytes.weights *= weight_share;
  r.flops = prefill_flops_per_token(m, 1, int64_t(context) - 1);
  const double memory = batch * bandwidth / (r.bytes.weights + batch * r.bytes.state);
  const double compute = peak / r.flops.total();
  r.compute_bound = compute < memory;
  r.tokens_per_second = std::min(memory, compute);
  return r;
}

}  // namespace lineage::runtime
