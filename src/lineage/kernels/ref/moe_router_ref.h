// Scalar twin of kernels/moe_router_backward.h: one token's router weights at a fixed selection and
// their backward (sigmoid or softmax router), templated on the scalar type so finite differences can run wholly in double.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace lineage::kernels::ref {

// The router's probabilities r[E] from logits z[E]: σ(z_e) (+ bias_e when bias is not null), or with
// softmax the softmax over all E (max subtracted).
template <class F>
void moe_router_scores(const F* z, const F* bias, int64_t E, bool softmax, F* r) {
  if (softmax) {
    F top = z[0], sum = 0;
    for (int64_t e = 1; e < E; ++e) top = z[e] > top ? z[e] : top;
    for (int64_t e = 0; e < E; ++e) sum += r[e] = std::exp(z[e] - top);
    for (int64_t e = 0; e < E; ++e) r[e] /= sum;
  } else {
    for (int64_t e = 0; e < E; ++e) r[e] = F(1) / (F(1) + std::exp(-z[e])) + (bias ? bias[e] : F(0));
  }
}

// Whether the chosen weights are divided by their sum: sigmoid routers when k > 1, softmax ones for any k.
inline bool moe_router_renormalizes(bool renormalize, int64_t k, bool softmax) { return renormalize && (k > 1 || softmax); }

// w[k] from logits z[E] at ids[k]: r as above, w_j = c·r_ids_j / (Σ_j r_ids_j + 1e-20) when
// renormalized, else c·r_ids_j.
template <class F>
void moe_router_weights(const F* z, const F* bias, const int32_t* ids, int64_t E, int64_t k, bool renormalize,
                        double scaling, F* w, bool softmax = false) {
  std::vector<F> r(static_cast<size_t>(E));
  moe_router_scores(z, bias, E, softmax, r.data());
  F sum = 0;
  for (int64_t j = 0; j < k; ++j) sum += w[j] = r[size_t(ids[j])];
  const F denom = moe_router_renormalizes(renormalize, k, softmax) ? sum + F(1e-20) : F(1);
  for (int64_t j = 0; j < k; ++j) w[j] = w[j] / denom * F(scaling);
}

// dz[E] (overwritten) from dw[k]: with S = Σ_j r_ids_j + 1e-20, dr_ids_j = c·(dw_j / S − Σ_i dw_i r_ids_i / S²)
// (renormalized) or c·dw_j, 0 off the selection; then through r: dz = dr·σ(1 − σ) (sigmoid, the bias
// taking none) or dz = r ⊙ (dr − Σ_e r_e dr_e) (softmax).
template <class F>
void moe_router_backward(const F* z, const F* bias, const int32_t* ids, int64_t E, int64_t k, bool renormalize,
                         double scaling, const F* dw, F* dz, bool softmax = false) {
  std::vector<F> r(static_cast<size_t>(E)), dr(static_cast<size_t>(E), F(0));
  moe_router_scores(z, bias, E, softmax, r.data());
  const bool renorm = moe_router_renormalizes(renormalize, k, softmax);
  F sum = 0, dot = 0;
  for (int64_t j = 0; j < k; ++j) sum += r[size_t(ids[j])], dot += dw[j] * r[size_t(ids[j])];
  const F S = renorm ? sum + F(1e-20) : F(1);
  for (int64_t j = 0; j < k; ++j) dr[size_t(ids[j])] += F(scaling) * (renorm ? dw[j] / S - dot / (S * S) : dw[j]);
  F rdr = 0;
  for (int64_t e = 0; e < E; ++e) rdr += r[size_t(e)] * dr[size_t(e)];
  for (int64_t e = 0; e < E; ++e) {
    if (softmax) {
      dz[e] = r[size_t(e)] * (dr[size_t(e)] - rdr);
    } else {
      const F s = F(1) / (F(1) + std::exp(-z[e]));
      dz[e] = dr[size_t(e)] * s * (F(1) - s);
    }
  }
}

}  // namespace lineage::kernels::ref
