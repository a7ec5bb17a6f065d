// lineage trace's data: what each layer of a model stores, overwrites and reads back, token by
// token. A sequence is decoded one token at a time through runtime::Session with the trace hook set
// (layers/common.h), and the hook's named intermediates are kept per layer: the softmax weights every
// query gave the cache (attn.weights), the delta rule's q, k, v, β, decay, read-out and state after
// each token (attn.q_read, attn.k_write, attn.v, attn.beta, attn.log_decay, attn.core, attn.state),
// the experts each token chose (moe.expert_ids / moe.expert_weights) and Block AttnRes's mix weights.
//
// The delta-rule state's change at token t is split into its three parts from the recorded values
// (value head j reads q/k head j / (HV / H)):
//   decay:  S̃ − S_{t−1},  S̃ = a ⊙ S_{t−1} (a = exp(log decay): one factor per head or per key row)
//   erase:  −β k rᵀ       with r = S̃ᵀk, what the state held at k before the write (delta rule only)
//   write:  +β v kᵀ       stored as k vᵀ·β (the state is [K, V], row d of key channel d)
// and S̃ + erase + write is checked against the engine's own S_t (`worst_residual`): the parts are the
// recurrence the kernels ran, not a second model of it. docs/trace.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "lineage/model/model.h"

namespace lineage::runtime {

enum class TraceMixer { Softmax, Mla, DeltaRule };

struct TraceLayer {
  TraceMixer mixer = TraceMixer::Softmax;
  std::string kind;          // "softmax attention", "gated attention", "MLA", or the delta rule's kind
  int64_t heads = 0;         // query heads (softmax, MLA) or value heads HV (delta rule)
  int64_t qk_heads = 0;      // delta rule: H, the q/k heads (value head j reads head j / (HV / H))
  int64_t dk = 0, dv = 0;    // a head's widths: the delta-rule state is [dk, dv]; softmax: the head width
  bool erase = false;        // delta rule: the delta write (erase then write); false: additive
  int gate = 0;              // delta rule: 0 no decay, 1 one factor per head, 2 one per key channel
  size_t bytes_per_token = 0;  // what the layer's memory grows by per token (a KV or latent cache)
  size_t fixed_bytes = 0;      // what it holds whatever the length (the delta-rule state and tails)
  int64_t experts = 0, top_k = 0;  // the MoE that follows, 0 when dense

  // Softmax and MLA: token t's weights over keys 0 .. t, head h at weights[heads·t(t+1)/2 + h·(t+1)].
  std::vector<float> weights;
  // Delta rule, one row per token: q, k [T, H, K] as the recurrence uses them (after the feature
  // map and the norm); v, read-out o (the recurrence's output Sᵀq, before the output norm and gate)
  // and recalled r = S̃ᵀk [T, HV, V]; β [T, HV] (1 when the rule has none); log decay [T, HV] or
  // [T, HV, K] (empty without decay); per head the Frobenius norms of S_{t−1}, the decay part, the
  // erase, the write and S_t: [T, HV, 5].
  std::vector<float> q, k, v, out, recalled, beta, log_decay, norms;
  // For the heads the options asked to keep: S_t [T, K, V], and the token's three parts of its
  // change [T, 3, K, V]: decay S̃ − S_{t−1}, erase −β k rᵀ (zeros for an additive rule), write β k vᵀ.
  std::map<int64_t, std::vector<float>> states, parts;
  double worst_residual = 0;  // max |S̃ + erase + write − S_t| / max |S_t| over tokens and heads
  // MoE: the experts token t chose and their weights [T, top_k], in the router's order.
  std::vector<int32_t> expert_ids;
  std::vector<float> expert_weights;
  // Block AttnRes: the mixes' weights over the finished blocks and the partial one, [T, sources].
  std::vector<float> attn_res, mlp_res;
  int64_t attn_res_sources = 0, mlp_res_sources = 0;
};

struct TraceRecording {
  std::vector<int32_t> tokens;
  std::vector<TraceLayer> layers;
  // After token t: the bytes the sequence's memory holds (the model's fixed state plus its caches'
  // rows), and what a softmax KV cache of the same depth and width would hold (2 · layers · d_model
  // · 4 bytes a token, GPT-2's).
  std::vector<size_t> state_bytes, softmax_bytes;
  // The model's most likely next token after token t and its probability.
  std::vector<int32_t> next_id;
  std::vector<float> next_p;
};

struct TraceOptions {
  // Which delta-rule heads keep their state S_t for every token; empty: none.
  std::function<bool(int64_t layer, int64_t head)> keep_state;
};

// Decodes `tokens` from an empty sequence one at a time and records what the header says.
// Throws Error when the model's experts or trunk stream from disk (the trace runs its own session beside the
// model's others) or when tokens is empty or past the model's context.
TraceRecording record_trace(const model::Model& m, std::span<const int32_t> tokens, const TraceOptions& options = {});

// The layers' kinds and sizes alone (no tokens run).
std::vector<TraceLayer> trace_layers(const model::Model& m);

}  // namespace lineage::runtime
