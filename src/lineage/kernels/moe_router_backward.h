// Backward of the MoE router's weights (layers/ffn/moe.cpp route) at a fixed top-k selection: the
// selection and the correction bias take no gradient; the weights' dependence on the logits does.
// Must match the scalar twin in ref/moe_router_ref.h, checked against finite differences in double.
#pragma once

#include <cstdint>

namespace lineage::kernels {

// N tokens, E experts, k chosen each. Per token, with r_j = σ(z[ids_j]) (+ bias[ids_j] when bias is
// not null: router_bias_in_weights) and S = Σ_j r_j + 1e-20:
//   w_j = c·r_j / S (renormalize and k > 1) or c·r_j;
//   dz[ids_j] = σ'(z[ids_j]) · c · (dw_j / S − Σ_i dw_i r_i / S²)   (or c·dw_j), dz = 0 elsewhere.
struct MoeRouterArgs {
  int64_t N = 0, E = 0, k = 0;
  bool renormalize = true;
  double scaling = 1.0;
  const float* bias = nullptr;  // [E] widened e_score_correction_bias, or null
};
// logits, dlogits: [N, E]; ids, dw: [N, k]. dlogits overwritten (must not alias logits). Threaded over
// tokens, each token's sums in double in slot order: the same bits for any thread count.
void moe_router_backward(const MoeRouterArgs& a, const float* logits, const int32_t* ids, const float* dw,
                         float* dlogits);

}  // namespace lineage::kernels
