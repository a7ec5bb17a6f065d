// Backward of the delta-rule layer's small stages around the recurrence (layers/mixers/delta_rule.cpp):
// the short causal convolution, the q/k normalizations, the ELU+1 map, β's sigmoid, the decay gate and
// the output's gated RMSNorm. Each must match its scalar twin in ref/delta_rule_layer_backward_ref.h,
// which is checked against finite differences in double. Forwards: short_conv.h, vmath.h and the layer.
#pragma once

#include <cstdint>

#include "lineage/core/tensor.h"

namespace lineage::kernels {

// The L2 norm's ε (inside the square root), fla's l2norm: y = x / sqrt(Σx² + 1e-6).
inline constexpr double kL2NormEps = 1e-6;

// Backward of short_conv from an empty tail, without activation, one sequence of T rows:
//   y[t, c] = Σ_{j<W} w[c, j] · x[t − W + 1 + j, c]   (x before row 0 is 0)
//   dx[s, c] = Σ_j w[c, j] · dy[s + W − 1 − j, c] (rows past T − 1 count 0), overwritten;
//   dw[c, j] += Σ_t dy[t, c] · x[t − W + 1 + j, c]   (dw: [C, W] f32, the layout of w [C, 1, W]).
// x, dy, dx: [T, C] with row strides ldx, ldy, lddx; dx must not alias x or dy. w: F32. Threaded over
// channels; each channel's sums run over t in order (the same bits for any thread count).
void short_conv_backward(const float* x, const float* dy, int64_t T, int64_t C, int64_t ldx, int64_t ldy,
                         const Tensor& w, float* dx, int64_t lddx, float* dw);

// Backward of the L2 normalization of rows of n, y = x / sqrt(Σx² + kL2NormEps):
//   dx = dy / ρ − x (x·dy) / ρ³,  ρ = sqrt(Σx² + ε). x, dy, dx: [rows, n]; dx may alias dy.
// Sums in double. Threaded over rows.
void l2_norm_backward(const float* x, const float* dy, int64_t rows, int64_t n, float* dx);

// Backward of the sum normalization y = x / (Σx + eps) (DeltaNet's "sum": eps 0; linear attention's
// norm_q / norm_k: 1e-4): dx = dy / σ − (x·dy) / σ², σ = Σx + eps. Same shapes, aliasing, threading.
void sum_norm_backward(const float* x, const float* dy, int64_t rows, int64_t n, float eps, float* dx);

// Backward of ELU + 1 (y = x + 1 for x > 0, e^x otherwise): dx = dy · (x > 0 ? 1 : e^x). dx may alias dy.
void elu1_backward(const float* x, const float* dy, float* dx, int64_t n);

// Backward of y = m · sigmoid(l) from the forward's output y (β, m = 2 with negative eigenvalues):
// dl = dy · y · (1 − y / m). dl may alias dy or y.
void scaled_sigmoid_backward(const float* y, const float* dy, float m, float* dl, int64_t n);

// Backward of the log decay a [N, HV·K] from its input z = projection + dt_bias (K = 1: one entry per
// value head), with A [HV] the prepared per-head factor:
//   softplus form (lower_bound 0):  a = A · softplus(z),  A = −exp(A_log):
//       dz = da · A · σ(z) (da · A above z = 20, where softplus is the identity),  ∂a/∂A_log = a
//   lower-bound form (lb < 0):      a = lb · σ(A z),  A = exp(A_log):
//       dz = da · lb · s(1 − s) · A,  ∂a/∂A_log = da · lb · s(1 − s) · A z,  s = σ(A z)
// dz overwritten (it is also ∂L/∂dt_bias row by row); dA_log [HV] += Σ_rows,channels da · ∂a/∂A_log;
// ddt_bias [HV·K] += Σ_rows dz. Threaded over columns; sums over rows in order, then over a head's
// channels in order (the same bits for any thread count).
struct DecayGateGrads {
  int64_t N = 0, HV = 0, K = 1;
  const float* A = nullptr;           // [HV]
  float lower_bound = 0;              // < 0: the lower-bound form
  const float* z = nullptr;           // [N, HV·K]
  const float* dlog_decay = nullptr;  // [N, HV·K]
  float* dz = nullptr;                // [N, HV·K], may alias dlog_decay
  float* dA_log = nullptr;            // [HV], added to
  float* ddt_bias = nullptr;          // [HV·K], added to
};
void decay_gate_backward(const DecayGateGrads& g);

// Backward of the gated RMSNorm of rows of n, y = x / sqrt(mean(x²) + eps) · w · gate (the layer's
// per-head output norm; w shared by all rows, gate per element or null for none):
//   x̂ = x·r,  h = dy · gate · w:  dx = r (h − x̂ mean(h x̂)),  dgate = dy · x̂ · w,
//   dw += Σ_rows dy · gate · x̂.
// x, gate, dy, dx, dgate: [rows, n]; w: [n] (ones: pass them; the prepared weight). dx overwritten and
// may alias dy; dgate overwritten (null: not wanted; must not alias dy); dw added to (null: skipped).
// Sums in double. Threaded over rows for dx and dgate, over columns for dw (rows in order).
void gated_rms_norm_backward(const float* x, const float* gate, const float* dy, int64_t rows, int64_t n,
                             const float* w, float eps, float* dx, float* dgate, float* dw);

}  // namespace lineage::kernels
