// Vectorizable math (plain loops the compiler turns into SIMD at any ISA level): elementwise
// functions, and the row loops of the norms and the short conv.
#pragma once

#include <cstdint>

namespace lineage::kernels {

// y = exp(x) for x ≤ 0, within 1 ulp for −87 ≤ x ≤ 0 (Cephes expf polynomial); x < −87 gives
// exactly 0 rather than a denormal. y must not alias x.
void exp_nonpositive(const float* x, float* y, int64_t n);

// y = sigmoid(x), formed from exp(−|x|) so no exponent is ever positive. y may alias x.
void sigmoid(const float* x, float* y, int64_t n);

// y = softplus(x) = log(1 + e^x), x itself above 20 as in PyTorch; formed from exp(−|x|) and a
// log1p that keeps full precision for tiny arguments. y may alias x.
void softplus(const float* x, float* y, int64_t n);

// Kimi K3's SiTU-GLU in place of the gate: g ← β·tanh(g/β)·σ(g) · β_lin·tanh(u/β_lin), f32, one pass
// over g and u (the sigmoid takes the uncapped g; beta_lin = 0 leaves u uncapped). |result| ≤ β·β_lin.
void situ_glu(float* g, const float* u, int64_t n, float beta, float beta_lin);

// One row of LayerNorm: y = (x − mean) / sqrt(var + eps) · w + b, biased variance, the sums in
// double. One row of RMSNorm: y = x / sqrt(mean(x²) + eps) · w. x, y, w, b: [D]; y may alias x.
void layer_norm_row(const float* x, int64_t D, const float* w, const float* b, float eps, float* y);
void rms_norm_row(const float* x, int64_t D, const float* w, float eps, float* y);

// y[c] = Σ_j taps[j·C + c] · rows[j][c] over j < W (in order of j), for c in [c0, c1): one output row
// of a depthwise causal convolution, weights tap-major [W, C].
void conv_taps(const float* const* rows, const float* taps, int64_t C, int64_t W, int64_t c0, int64_t c1, float* y);

}  // namespace lineage::kernels
