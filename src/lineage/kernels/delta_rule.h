// The delta-rule family (linear attention, Mamba-2-style scalar decay, DeltaNet, Gated DeltaNet, KDA)
// as one recurrence with switches: Yang et al. 2024 (DeltaNet, WY/UT chunking), Yang et al. 2025
// (Gated DeltaNet), Kimi Linear 2025 (KDA). Must match fla `fla/ops/kda/naive.py` and
// `fla/ops/gated_delta_rule/naive.py` (shared/spec/linear-attention-family.md §1.5, §1.6, §2.3).
// Math note: docs/math/delta_rule.md.
#pragma once

#include <cstdint>
#include <span>

namespace lineage::kernels {

// How the state decays before each write: not at all, by one factor per value head, or by one factor
// per key channel (per row d of S).
enum class Gate : uint8_t { None, PerHead, PerChannel };

// Per value head j (q/k head j / (HV/H), i.e. repeat_interleave), for t = 0 .. T-1:
//   S ← decay_t(S);  u = β_t (v_t − Sᵀk_t) if delta else β_t v_t;  S ← S + k_t u_tᵀ;  o_t = Sᵀ(scale·q_t)
// decay_t: None → identity; PerHead → S *= exp(g_t[j]); PerChannel → row d of S *= exp(g_t[j, d]).
// normalize (Katharopoulos normalizer, delta must be off): z is the extra value column v ≡ 1 of S,
//   z ← decay_t(z) + β_t k_t (= z + k_t for plain linear attention);  o_t ← o_t / (scale·q_t·z + 1e-10).
// q, k arrive already feature-mapped / L2-normalized (the layer does that), unscaled. All row-major.
// The fast kernels flush per-channel decay factors below e^-87 to 0 (the ref twins do not).
struct DeltaRuleArgs {
  int64_t T = 0, H = 0, HV = 0, K = 0, V = 0;  // HV must be a multiple of H
  Gate gate = Gate::None;
  bool delta = true;
  bool normalize = false;
  float scale = 1.0f;                // usually K^-1/2
  const float* q = nullptr;          // [T, H, K]
  const float* k = nullptr;          // [T, H, K]
  const float* v = nullptr;          // [T, HV, V]
  const float* beta = nullptr;       // [T, HV]; null means β = 1
  const float* log_decay = nullptr;  // [T, HV] (PerHead) or [T, HV, K] (PerChannel), entries ≤ 0; null for None
  float* state = nullptr;            // [HV, K, V] f32, in/out (initial state in, final state out)
  float* z = nullptr;                // [HV, K] f32 in/out, only when normalize
  float* out = nullptr;              // [T, HV, V]; must not alias any input
};

// Aborts through LINEAGE_CHECK when the arguments break the contract above (shapes, pointers, gate
// data, the normalizer only with delta off). Every kernel of the family, fast and ref, calls it first.
void delta_rule_check_args(const DeltaRuleArgs& a);

// Token by token (the decode path). One fused pass over each head's [K, V] state per token: the
// previous token's rank-1 write, the decay, kᵀS and qᵀS happen in the same sweep, and the read uses
// o = S̃ᵀq + (q·k) u. f32 throughout. Threaded over value heads (small problems stay on one thread);
// bit-identical for any thread count.
void delta_rule_recurrent(const DeltaRuleArgs& a);

// Many sequences in one call (a batch of decode tokens): one DeltaRuleArgs per sequence, each with
// its own tokens and its own state (the layer turns each sequence's pool slot into its state and z
// pointers, as fla's ssm_state_indices index initial_state [N, HV, K, V]). All share H, HV, K, V and
// the switches; every (sequence, head block) of the call is one item of a single parallel region.
// A sequence's tokens never touch another's state, and each sequence gets the same bits as alone.
void delta_rule_recurrent(std::span<const DeltaRuleArgs> seqs);

// Same results as delta_rule_recurrent (to f32 rounding), computed C = chunk tokens at a time with
// the WY / UT transform: small dense matmuls over the chunk (an AVX-512 register-tiled routine
// where the CPU has it, OpenBLAS otherwise) plus a forward substitution for (I + N)⁻¹. Every decay factor is a product of per-step factors exp(g) ≤ 1, i.e.
// exp of a chunk-local cumulative log-decay difference ≤ 0; nothing > 1 is ever formed.
// chunk ∈ [1, 64] (16, 32, 64 are the intended sizes); a partial last chunk is handled exactly.
// Threaded over value heads; deterministic for a given thread count.
void delta_rule_chunked(const DeltaRuleArgs& a, int chunk);

}  // namespace lineage::kernels
