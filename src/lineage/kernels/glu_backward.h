// Backward of the gated MLP's fused gate (layers/ffn/gated_mlp.cpp): SwiGLU h = silu(g) · u and Kimi K3's
// SiTU-GLU h = β·tanh(g/β)·σ(g) · β_lin·tanh(u/β_lin) (vmath.h situ_glu; β_lin = 0 leaves u uncapped).
// Must match the scalar twins in ref/glu_backward_ref.h, checked against finite differences in double.
#pragma once

#include <cstdint>

namespace lineage::kernels {

// dg = dh · u · silu'(g),  du = dh · silu(g). g, u, dh, dg, du: n floats; dg and du overwritten, and
// may alias dh (dg may not alias du). Threaded over elements.
void swiglu_backward(const float* g, const float* u, const float* dh, int64_t n, float* dg, float* du);

// With a = β tanh(g/β) σ(g) and b = β_lin tanh(u/β_lin) (or u when beta_lin is 0):
//   a'(g) = (1 − tanh²(g/β)) σ(g) + β tanh(g/β) σ(g)(1 − σ(g)),  b'(u) = 1 − tanh²(u/β_lin) (or 1),
//   dg = dh · b · a'(g),  du = dh · a · b'(u).
// Same shapes, aliasing and threading as swiglu_backward.
void situ_glu_backward(const float* g, const float* u, const float* dh, int64_t n, float beta, float beta_lin,
                       float* dg, float* du);

}  // namespace lineage::kernels
