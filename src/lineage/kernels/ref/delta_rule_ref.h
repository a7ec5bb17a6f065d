// Scalar, obviously-correct twins of the delta-rule family kernels: the specification and the test
// oracle. Same contracts as lineage/kernels/delta_rule.h; internal state and sums are kept in double.
#pragma once

#include "lineage/kernels/delta_rule.h"

namespace lineage::kernels::ref {

// The recurrence of shared/spec/linear-attention-family.md §1.5 written out literally, token by token:
// decay, kᵀS, delta, rank-1 write, read. State held in double for the whole call. Single-threaded.
void delta_rule_recurrent(const DeltaRuleArgs& a);

// The chunked (UT transform) math of §1.6 written out literally: chunk-local cumulative log decays G,
// elementwise exp(G_i − G_j) for i ≥ j only, X = (I + N)⁻¹ by forward substitution, W, U, corrected
// values Vn = U − W S, output and state update. Double inside. Any chunk ≥ 1. Single-threaded.
void delta_rule_chunked(const DeltaRuleArgs& a, int chunk);

}  // namespace lineage::kernels::ref
