// The small per-token pieces the delta-rule kernels share, forward (delta_rule.cpp) and backward
// (delta_rule_backward.cpp): head mapping, β, the decay factors exactly as the forward forms them,
// and short vector loops marked simd (the baseline build's cost model would leave them scalar).
// Internal to those two files.
#pragma once

#include <cmath>
#include <cstdint>

#include "lineage/kernels/delta_rule.h"
#include "lineage/kernels/vmath.h"

namespace lineage::kernels::delta_rule_loops {

// The q/k head a value head j reads (GVA: HV / H value heads per q/k head).
inline int64_t qk_head(const DeltaRuleArgs& a, int64_t j) { return j / (a.HV / a.H); }

inline float beta_at(const DeltaRuleArgs& a, int64_t t, int64_t j) { return a.beta ? a.beta[t * a.HV + j] : 1.0f; }

// Number of decay factors per token: one per key channel, or one per head (also for Gate::None,
// whose factor is exactly 1, so "no gate" runs the same arithmetic with exact multiplications by 1).
inline int64_t gate_width(const DeltaRuleArgs& a) { return a.gate == Gate::PerChannel ? a.K : 1; }

// e[0 .. gate_width) = exp(g) of token t, value head j.
inline void step_factors(const DeltaRuleArgs& a, int64_t t, int64_t j, float* e) {
  switch (a.gate) {
    case Gate::None: e[0] = 1.0f; break;
    case Gate::PerHead: e[0] = std::exp(a.log_decay[t * a.HV + j]); break;
    case Gate::PerChannel: exp_nonpositive(a.log_decay + (t * a.HV + j) * a.K, e, a.K); break;
  }
}

inline float dot(const float* x, const float* y, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

inline void mul(const float* x, const float* y, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = x[i] * y[i];
}

inline void scale(const float* x, float s, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = s * x[i];
}

// dst = x ⊙ f, where f holds gate_width factors: one per channel, or one broadcast over the row.
inline void apply_factors(const float* x, const float* f, int64_t ew, float* dst, int64_t n) {
  if (ew == 1) scale(x, f[0], dst, n);
  else mul(x, f, dst, n);
}

}  // namespace lineage::kernels::delta_rule_loops
