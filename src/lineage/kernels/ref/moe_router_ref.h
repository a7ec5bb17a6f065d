// Scalar twin of kernels/moe_router_backward.h: one token's router weights at a fixed selection and
// their backward, templated on the scalar type so finite differences can run wholly in double.
#pragma once

#include <cmath>
#include <cstdint>

namespace lineage::kernels::ref {

// w[k] from logits z[E] at ids[k]: r_j = σ(z_ids_j) (+ bias_ids_j when bias is not null),
// w_j = c·r_j / (Σr + 1e-20) when renormalize and k > 1, else c·r_j.
template <class F>
void moe_router_weights(const F* z, const F* bias, const int32_t* ids, int64_t k, bool renormalize, double scaling,
                        F* w) {
  F sum = 0;
  for (int64_t j = 0; j < k; ++j) {
    const F x = z[ids[j]];
    w[j] = F(1) / (F(1) + std::exp(-x)) + (bias ? bias[ids[j]] : F(0));
    sum += w[j];
  }
  const F denom = renormalize && k > 1 ? sum + F(1e-20) : F(1);
  for (int64_t j = 0; j < k; ++j) w[j] = w[j] / denom * F(scaling);
}

// dz[E] (overwritten; 0 off the selection) from dw[k]: with S = Σr + 1e-20,
// dr_j = c·(dw_j / S − Σ_i dw_i r_i / S²) (renormalized) or c·dw_j; dz_ids_j = dr_j·σ(z)(1 − σ(z)).
template <class F>
void moe_router_backward(const F* z, const F* bias, const int32_t* ids, int64_t E, int64_t k, bool renormalize,
                         double scaling, const F* dw, F* dz) {
  for (int64_t e = 0; e < E; ++e) dz[e] = F(0);
  const bool renorm = renormalize && k > 1;
  F sum = 0, dot = 0;
  for (int64_t j = 0; j < k; ++j) {
    const F r = F(1) / (F(1) + std::exp(-z[ids[j]])) + (bias ? bias[ids[j]] : F(0));
    sum += r, dot += dw[j] * r;
  }
  const F S = renorm ? sum + F(1e-20) : F(1);
  for (int64_t j = 0; j < k; ++j) {
    const F s = F(1) / (F(1) + std::exp(-z[ids[j]]));
    const F dr = F(scaling) * (renorm ? dw[j] / S - dot / (S * S) : dw[j]);
    dz[ids[j]] += dr * s * (F(1) - s);
  }
}

}  // namespace lineage::kernels::ref
