// The least work one token costs, from the model's shapes alone: the bytes a decode step must move
// and the FLOPs a prefilled token must do. The roofline arithmetic of `lineage bench`; the
// definitions and their approximations are in docs/performance.md.
#pragma once

#include <cstdint>

#include "lineage/model/model.h"

namespace lineage::runtime {

// Bytes one decode step moves at least. weights: every parameter once in its stored dtype, except
// the token embedding (one gathered row) and the position embedding (one row); the LM head counts
// whole, so a tied head is the embedding read whole plus the gathered row. state: the KV rows the
// step attends (`context` positions, its own included, all layers, K and V, f32) plus each
// recurrent state (S, z, conv tail) read and written back.
struct DecodeBytes {
  double weights = 0, state = 0;
  double total() const { return weights + state; }
};
// A MoE layer's routed experts count only as far as a step reads them: a step of
// `tokens_per_step` tokens (B sequences decoding together) is expected to choose
// E·(1 − (1 − k/E)^B) distinct experts of E (uniform routing; k of them at B = 1), so `weights`
// is then the bytes of the whole step, not of each token. Tensors not allocated yet (a preset's
// skeleton) count as `unallocated_dtype`. Non-const only because the tensor list is walked through
// Model::for_each_tensor; nothing is modified.
DecodeBytes decode_bytes_per_token(model::Model& m, double context, DType unallocated_dtype = DType::F32,
                                   double tokens_per_step = 1);

// FLOPs per token of one prefill of `tokens` tokens after `depth` tokens of context. weights:
// 2 per parameter per token for every block and the final norm (a MoE layer's routed experts: the
// k of E a token runs); the LM head runs for the last
// token only, so its 2·V·D is spread over the tokens; embedding gathers cost nothing. mixers: the
// token mixers' own work at the mean attended context depth + (tokens + 1) / 2 (mixer_flops_per_token).
struct PrefillFlops {
  double weights = 0, mixers = 0;
  double total() const { return weights + mixers; }
};
PrefillFlops prefill_flops_per_token(model::Model& m, int64_t tokens, int64_t depth);

// FLOPs of the token mixers for one token that attends `context` positions, all layers: each
// mixer's own flops_per_token (softmax attention 4·D·context; the delta-rule family's recurrence,
// the same at any context; their definitions beside them in layers/mixers/).
double mixer_flops_per_token(const model::Model& m, double context);

// Mean context a decode step attends when `gen` tokens are decoded after `depth`: step i (from 0)
// attends depth + i + 1 positions, so the mean is depth + (gen + 1) / 2.
inline double mean_decode_context(int64_t depth, int64_t gen) { return double(depth) + double(gen + 1) / 2.0; }

// The decode roofline of B sequences stepping together at `context`: a step reads the weights once
// (the experts B tokens choose) and each sequence's state, and does B tokens' FLOPs; tokens/s is
// bounded by B · bandwidth / (weights + B · state) and by peak / FLOPs per token, whichever binds.
struct DecodeRoofline {
  double tokens_per_second = 0;
  bool compute_bound = false;
  DecodeBytes bytes;  // per token, the step's weights whole
  PrefillFlops flops;  // per token
};
// `weight_share`: the part of the weights' bytes this process reads (one rank's under tensor
// parallelism: its rows of the split matrices and everything replicated), 1 alone.
DecodeRoofline decode_roofline(model::Model& m, double context, double batch, double bandwidth, double peak,
                               double weight_share = 1.0);

}  // namespace lineage::runtime
