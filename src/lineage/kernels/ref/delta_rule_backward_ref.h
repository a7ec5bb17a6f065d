// Scalar, obviously-correct backward of the delta-rule family (the oracle of
// lineage/kernels/delta_rule_backward.h), with a matching scalar forward, both templated on the
// scalar type so that finite differences of the forward can run entirely in double.
// Math note: docs/math/delta_rule_backward.md.
#pragma once

#include <cstdint>

#include "lineage/kernels/delta_rule.h"
#include "lineage/kernels/delta_rule_backward.h"

namespace lineage::kernels::ref {

// The problem of DeltaRuleArgs in any scalar type, with the initial state read-only and the final
// state written to separate buffers. Shapes and switches exactly as in DeltaRuleArgs.
template <class Real>
struct DeltaRuleProblem {
  int64_t T = 0, H = 0, HV = 0, K = 0, V = 0;
  Gate gate = Gate::None;
  bool delta = true;
  bool normalize = false;
  Real scale = 1;
  const Real* q = nullptr;          // [T, H, K]
  const Real* k = nullptr;          // [T, H, K]
  const Real* v = nullptr;          // [T, HV, V]
  const Real* beta = nullptr;       // [T, HV]; null means β = 1
  const Real* log_decay = nullptr;  // [T, HV] or [T, HV, K]; null for Gate::None
  const Real* state0 = nullptr;     // [HV, K, V]
  const Real* z0 = nullptr;         // [HV, K], normalize only
};

// Outputs of the forward; a null pointer is not written.
template <class Real>
struct DeltaRuleOutputs {
  Real* out = nullptr;          // [T, HV, V]
  Real* state_final = nullptr;  // [HV, K, V]
  Real* z_final = nullptr;      // [HV, K], normalize only
};

// DeltaRuleGrads in any scalar type; same shapes, same "null = zero in / not wanted out".
template <class Real>
struct DeltaRuleGradsT {
  const Real* dout = nullptr;          // [T, HV, V]
  const Real* dstate_final = nullptr;  // [HV, K, V]
  const Real* dz_final = nullptr;      // [HV, K]
  Real* dq = nullptr;                  // [T, H, K]
  Real* dk = nullptr;                  // [T, H, K]
  Real* dv = nullptr;                  // [T, HV, V]
  Real* dbeta = nullptr;               // [T, HV]
  Real* dlog_decay = nullptr;          // [T, HV] or [T, HV, K]
  Real* dstate0 = nullptr;             // [HV, K, V]
  Real* dz0 = nullptr;                 // [HV, K]
};

// The recurrence of docs/math/delta_rule.md §1, literally, token by token, in Real. Single-threaded.
template <class Real>
void delta_rule_forward(const DeltaRuleProblem<Real>& p, const DeltaRuleOutputs<Real>& o);

// Its backward (docs/math/delta_rule_backward.md §2): the forward is run once storing every state S_{t−1},
// then each token's four steps (read, write, delta, decay) are differentiated in reverse order.
// Single-threaded; dq, dk are summed over value heads in index order.
template <class Real>
void delta_rule_backward(const DeltaRuleProblem<Real>& p, const DeltaRuleGradsT<Real>& g);

extern template void delta_rule_forward<float>(const DeltaRuleProblem<float>&, const DeltaRuleOutputs<float>&);
extern template void delta_rule_forward<double>(const DeltaRuleProblem<double>&, const DeltaRuleOutputs<double>&);
extern template void delta_rule_backward<float>(const DeltaRuleProblem<float>&, const DeltaRuleGradsT<float>&);
extern template void delta_rule_backward<double>(const DeltaRuleProblem<double>&, const DeltaRuleGradsT<double>&);

// The fast kernels' contract (f32 in and out, fwd.state / fwd.z = initial state, read-only) computed
// by delta_rule_backward<double> on widened inputs, then rounded to f32: the test oracle.
void delta_rule_backward(const DeltaRuleArgs& fwd, const DeltaRuleGrads& g);

}  // namespace lineage::kernels::ref
