// Backward of the delta-rule family kernels (lineage/kernels/delta_rule.h): the gradients of the
// recurrence with respect to q, k, v, β, log decay and the initial state, for training. Must match the
// scalar twin ref::delta_rule_backward (kernels/ref/delta_rule_backward_ref.h), which is checked
// against finite differences. Math note: docs/math/delta_rule_backward.md.
#pragma once

#include <cstdint>

#include "lineage/kernels/delta_rule.h"

namespace lineage::kernels {

// Gradients in (of a scalar loss with respect to the forward's outputs) and out (with respect to its
// inputs), for the forward described by a DeltaRuleArgs. Outputs are written, never accumulated into;
// dq, dk, dv are required (T > 0), the others may be null ("not wanted"). Row-major f32 throughout.
struct DeltaRuleGrads {
  const float* dout = nullptr;          // [T, HV, V]  ∂L/∂out
  const float* dstate_final = nullptr;  // [HV, K, V]  ∂L/∂S_T; null means 0
  const float* dz_final = nullptr;      // [HV, K]     ∂L/∂z_T (normalize only); null means 0
  float* dq = nullptr;                  // [T, H, K]   summed over the HV/H value heads of each q/k head
  float* dk = nullptr;                  // [T, H, K]   likewise
  float* dv = nullptr;                  // [T, HV, V]
  float* dbeta = nullptr;               // [T, HV]     only when the forward had β (null otherwise)
  float* dlog_decay = nullptr;          // [T, HV] (PerHead) or [T, HV, K] (PerChannel); null for Gate::None
  float* dstate0 = nullptr;             // [HV, K, V]  ∂L/∂S_0
  float* dz0 = nullptr;                 // [HV, K]     ∂L/∂z_0 (normalize only)
};

// Aborts through LINEAGE_CHECK when the forward's arguments break delta_rule_check_args (fwd.out
// excepted: the backward does not read it) or the gradients do not fit them: dout, dq, dk, dv present
// when T > 0; dbeta only with β; dlog_decay only with a gate; dz_final, dz0 only with the normalizer.
// Every backward, fast and ref, calls it first.
void delta_rule_check_grads(const DeltaRuleArgs& fwd, const DeltaRuleGrads& g);

// Backward of delta_rule_recurrent (docs/math/delta_rule_backward.md §2), token by token in reverse.
// fwd is the forward call's arguments with fwd.state (and fwd.z) holding the INITIAL state S_0 (z_0):
// they are read, never written; fwd.out is ignored. Per value head, the forward kernel keeps S (and z)
// every kRecurrentCheckpoint = 32 tokens; then, segment by segment from the end, the segment's decayed
// states S̃_t are recomputed into a [32, K, V] buffer and walked back, one fused pass over the state per
// token. Memory per head O(T/32·K·V + 32·K·V), never O(T·K·V). Threaded over value heads; with HV > H
// each head's dq, dk rows go to a buffer of its own, summed over the q/k group in head order, so
// results are bit-identical for any thread count.
// Outputs must not alias inputs or each other.
void delta_rule_recurrent_backward(const DeltaRuleArgs& fwd, const DeltaRuleGrads& g);

// Backward of delta_rule_chunked (docs/math/delta_rule_backward.md §3), chunk = C tokens at a time
// (chunk ∈ [1, 64], any T), same contract and same results (to f32 rounding) as
// delta_rule_recurrent_backward. Per head, a forward pass over the chunks keeps each chunk's entering
// state and its A, Nk (decayed q·k, k·k), U (corrected values) and rv = v − Kg S: memory
// O(T/C·K·V + T·(C + V)) per thread. Then chunk by chunk from the end: the chunk's factors F, L and
// (I + diag(β) Nk) are rebuilt, and the gradients taken through the chunked forward: dense products as
// sgemm, (I + N)ᵀ dR = dU by a transposed unit-triangular solve, per-channel decayed products as
// running products of factors ≤ 1 (never exp(+G)), dlog_decay as a reverse cumulative sum of ∂L/∂G.
// Threaded over value heads; bit-identical for any thread count (BLAS runs single-threaded in each).
void delta_rule_chunked_backward(const DeltaRuleArgs& fwd, const DeltaRuleGrads& g, int chunk);

}  // namespace lineage::kernels
