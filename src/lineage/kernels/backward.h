// Backward passes of the elementwise, normalization, linear, attention and loss kernels (training).
// Each mirrors its forward's contract (norm.h, activation.h, matrix.h, attention.h); the scalar
// twins in ref/backward_ref.h are the oracle, checked against finite differences in double.
#pragma once

#include <cstdint>

#include "lineage/core/tensor.h"
#include "lineage/kernels/activation.h"
#include "lineage/kernels/matrix.h"

namespace lineage::kernels {

// C[M, N] = op(A)·op(B) + beta·C, f32 row-major; op(A) is [M, K] (A stored [K, M] when trans_a),
// op(B) is [K, N] (B stored [N, K] when trans_b). With β ∈ {0, 1} and B dense (ldb = its row length)
// on the engine's own AVX-512 GEMM (linear_strided: A read in place or, transposed, in strips;
// β = 1 accumulated in the register tiles); otherwise OpenBLAS, split over the engine's threads along
// the larger of M and N. Deterministic for a thread count.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc);

// dx = dy · act'(pre), elementwise over n: pre is the activation's input as the forward saw it.
// dx may alias dy.
void activation_backward(Activation act, const float* pre, const float* dy, float* dx, int64_t n);

// LayerNorm's backward (norm.h layer_norm: biased variance, eps inside the sqrt). x, dy, dx:
// [T, D]; w [D] F32; dw, db [D] are added to (db may be null). dx may alias dy, not x. The row
// statistics are recomputed from x. Threaded over rows for dx and over columns for dw, db (each
// column summed over rows in order: the same bits for any thread count).
void layer_norm_backward(const float* x, const float* dy, int64_t T, int64_t D, const Tensor& w, float eps, float* dx,
                         float* dw, float* db);

// RMSNorm's backward (norm.h rms_norm, y = x / sqrt(mean(x²) + eps) · (w + w_offset)). w may be
// undefined-null (no scale; dw then null). Same aliasing and threading as layer_norm_backward.
void rms_norm_backward(const float* x, const float* dy, int64_t T, int64_t D, const Tensor* w, float eps, float* dx,
                       float* dw, float w_offset = 0.0f);

// The backward of linear(x, T, W, bias, y) for an F32 matrix in either layout: dx[T, in] = dy·W
// (overwritten; skipped when null), dW (stored layout, F32) += ∂L/∂W, dbias[out] += Σ_t dy[t]
// (skipped when null). x: [T, in], dy: [T, out].
void linear_backward(const float* x, const float* dy, int64_t T, const Matrix& W, float* dx, Matrix* dW, float* dbias);

// Causal softmax attention for training: B sequences of T tokens, each attending its own past,
// H heads; query (b, t) head h at q + (b·T + t)·ldq + h·dk, likewise k (ldk, dk), v (ldv, dv), out
// (ldo, dv). lse: [B, H, T], the log-sum-exp of each query's scaled scores (what the backward
// recomputes the probabilities from). Tiles of queries against all their keys: at most
// kAttentionTrainTile × T scores live per thread, never T × T. Threaded over (sequence, head).
constexpr int64_t kAttentionTrainTile = 64;
struct AttentionTrainArgs {
  int64_t B = 0, T = 0, H = 0, dk = 0, dv = 0;
  float scale = 1.0f;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t ldq = 0, ldk = 0, ldv = 0;
  float* out = nullptr;
  int64_t ldo = 0;
  float* lse = nullptr;
};
void attention_causal_train(const AttentionTrainArgs& a);

// Its backward from the forward's q, k, v, out and lse: dq, dk, dv (same layouts as q, k, v, with
// their own leading dims) overwritten. dout: the gradient of out (ldo layout).
struct AttentionGrads {
  const float* dout = nullptr;
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  int64_t lddo = 0, lddq = 0, lddk = 0, lddv = 0;
};
void attention_causal_backward(const AttentionTrainArgs& fwd, const AttentionGrads& g);

// Mean cross-entropy of the logits h·Wᵀ (W: [Vocab, D] F32, the LM head) against `targets`, computed
// `chunk` rows at a time so no more than chunk × Vocab logits ever exist. Returns Σ_rows CE · scale
// (in double); dh[N, D] = ∂(that)/∂h (overwritten), dW += ∂/∂W. A target < 0 is ignored (no loss, no
// gradient).
double cross_entropy_backward(const float* h, int64_t N, int64_t D, const Tensor& W, const int32_t* targets,
                              float scale, float* dh, float* dW, int64_t chunk = 256);

}  // namespace lineage::kernels
