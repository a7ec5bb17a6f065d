// Backward of the MoE router's weights (layers/ffn/moe.cpp route) at a fixed top-k selection: the
// selection and the correction bias take no gradient; the weights' dependence on the logits does.
// Must match the scalar twin in ref/moe_router_ref.h, checked against finite differences in double.
#pragma once

#include <cstdint>

namespace lineage::kernels {

// N tokens, E experts, k chosen each. Per token, with r = σ(z) (+ bias when bias is not null:
// router_bias_in_weights) or r = softmax(z) over all E, and S = Σ_j r[ids_j] + 1e-20:
//   w_j = c·r[ids_j] / S (renormalized: renormalize and, for the sigmoid, k > 1) or c·r[ids_j];
//   dr[ids_j] = c·(dw_j / S − Σ_i dw_i r[ids_i] / S²) (or c·dw_j), 0 elsewhere;
//   dz = dr·σ'(z) (sigmoid) or r ⊙ (dr − Σ_e r_e dr_e) (softmax: every logit gets a gradient).
struct MoeRouterArgs {
  int64_t N = 0, E = 0, k = 0;
  bool renormalize = true;
  double scaling = 1.0;
  const float* bias = nullptr;  // [E] widened e_score_correction_bias, or null
  bool softmax = false;         // Qwen's router: softmax over all experts
};
// logits, dlogits: [N, E]; ids, dw: [N, k]. dlogits overwritten (must not alias logits). Threaded over
// tokens, each token's sums in double in slot order: the same bits for any thread count.
void moe_router_backward(const MoeRouterArgs& a, const float* logits, const int32_t* ids, const float* dw,
                         float* dlogits);

}  // namespace lineage::kernels
