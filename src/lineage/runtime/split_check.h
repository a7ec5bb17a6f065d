// Whether one whole prefill and token-by-token decode of the same tokens give the same logits:
// `lineage tour`'s "chunked = decode" column.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lineage/model/model.h"

namespace lineage::runtime {

// The tokens the tour checks with: `count` ids drawn from Rng(seed), uniform over [0, vocab).
std::vector<int32_t> split_check_tokens(int64_t vocab, int64_t count = 48, uint64_t seed = 7);

// ‖got − want‖₂ / ‖want‖₂ over all elements, in double (0 when both are zero). Sizes must match.
double relative_rms(std::span<const float> got, std::span<const float> want);

// Relative RMS of the logits [T, vocab] of `tokens` decoded one at a time in one session against
// those of a single prefill of all of them in another. Both here and in first_divergence the two runs
// take exact f32 products whatever the model's options: the check is of caches, states and positions,
// and the bf16 dot mode's rounding of x to bf16 turns the two summation orders' last-bit differences
// into a bf16 step (2^-8) now and then, past any tolerance that would still tell order from error.
double prefill_decode_rel_rms(const model::Model& m, std::span<const int32_t> tokens);

// Where the two first part: the first traced intermediate [T, ·] whose prefill and decode rows
// differ by more than kPrefillDecodeTolerance (relative RMS), in forward order; `name` empty when
// none does. routing_flip: it is a MoE layer's expert_ids while that layer's router logits still
// agree within the tolerance (`router_rel_rms`): a near tie among the scores picked another
// expert, the two summation orders' last bits deciding it, not a wrong cache or state.
struct Divergence {
  std::string name;
  double rel_rms = 0, router_rel_rms = 0;
  bool routing_flip = false;
};
Divergence first_divergence(const model::Model& m, std::span<const int32_t> tokens);

// Float rounding of the two summation orders stays orders of magnitude below this; a wrong cache,
// state or position does not.
inline constexpr double kPrefillDecodeTolerance = 1e-4;
inline bool prefill_equals_decode(double rel_rms) { return rel_rms < kPrefillDecodeTolerance; }

}  // namespace lineage::runtime
