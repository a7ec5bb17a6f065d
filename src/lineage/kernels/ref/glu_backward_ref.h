// Scalar twins of kernels/glu_backward.h (and of the forward gates in vmath.h / gated_mlp.cpp), templated
// on the scalar type so finite differences can run wholly in double.
#pragma once

#include <cmath>

namespace lineage::kernels::ref {

template <class F>
F sigmoid(F x) {
  return F(1) / (F(1) + std::exp(-x));
}

// h = silu(g) · u
template <class F>
F swiglu(F g, F u) {
  return g * sigmoid(g) * u;
}

// h = β tanh(g/β) σ(g) · β_lin tanh(u/β_lin) (beta_lin = 0: u)
template <class F>
F situ_glu(F g, F u, F beta, F beta_lin) {
  const F b = beta_lin > F(0) ? beta_lin * std::tanh(u / beta_lin) : u;
  return beta * std::tanh(g / beta) * sigmoid(g) * b;
}

// ∂h/∂g and ∂h/∂u of each, by the product rule term by term.
template <class F>
void swiglu_backward(F g, F u, F dh, F& dg, F& du) {
  const F s = sigmoid(g);
  dg = dh * u * (s + g * s * (F(1) - s));
  du = dh * g * s;
}

template <class F>
void situ_glu_backward(F g, F u, F dh, F beta, F beta_lin, F& dg, F& du) {
  const F s = sigmoid(g), th = std::tanh(g / beta);
  const F cap = beta * th;                          // β tanh(g/β)
  const F dcap = F(1) - th * th;                    // its derivative
  const F a = cap * s, da = dcap * s + cap * s * (F(1) - s);
  const F b = beta_lin > F(0) ? beta_lin * std::tanh(u / beta_lin) : u;
  const F db = beta_lin > F(0) ? F(1) - std::tanh(u / beta_lin) * std::tanh(u / beta_lin) : F(1);
  dg = dh * b * da;
  du = dh * a * db;
}

}  // namespace lineage::kernels::ref
