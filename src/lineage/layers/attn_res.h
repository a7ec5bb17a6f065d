// Block Attention Residuals (Kimi team, arXiv 2603.15031; Kimi K3): the input of a sublayer is a
// learned softmax mixture over depth of the block representations so far, instead of the running
// sum of a plain residual stream. One mix, for one sublayer:
//   z_j = Σ_d w_d · s_j,d / sqrt(mean(s_j²) + ε)   (w = norm.weight ⊙ proj.weight[0], folded at prepare)
//   p   = softmax_j(z) (f32);   mix = Σ_j p_j · s_j   (the sources raw, their keys RMSNormed)
// The sources (the embedding, each finished block, the current partial block) and where blocks
// begin belong to the model's residual stream (model.h, ResidualStream); this is the mix alone.
// Spec: shared/spec/attention-mla-moe-attnres.md §6; reference/kimi_k3.py.
#pragma once

#include <span>
#include <vector>

#include "lineage/layers/common.h"

namespace lineage::layers {

struct AttnRes {
  int64_t dim = 0;
  float eps = 1e-5f;
  Tensor norm;  // [D] the keys' RMSNorm weight
  Tensor proj;  // [1, D] the pseudo-query
  std::vector<float> fold;  // [D] norm ⊙ proj, by prepare()

  // `norm_name` and `proj_name` are full tensor prefixes ("….self_attention_res_norm").
  void for_each_tensor(const std::string& norm_name, const std::string& proj_name, const TensorVisitor& f);
  void prepare();
  bool defined() const { return dim > 0; }
};

// out[N, D] = the mix of `sources` (each [N, D]) for each of the N rows; weights[N, S] receives the
// softmax weights (S = sources.size() ≥ 1). out must not alias a source. Threaded over rows.
void mix(const AttnRes& m, std::span<const float* const> sources, int64_t N, float* out, float* weights);

// The backward of mix (training): from the forward's sources and weights [N, S] and dout [N, D],
// adds ∂L/∂(source j) into dsources[j] ([N, D], none aliasing another or dout) and ∂L/∂ of the
// keys' norm weight and the pseudo-query into grad.norm and grad.proj (F32). Threaded over rows
// for the sources and over columns for the two weights (each column summed over rows in order: the
// same bits for any thread count). Twin: kernels/ref/backward_ref.h attn_res_mix_backward.
void mix_backward(const AttnRes& m, std::span<const float* const> sources, int64_t N, const float* weights,
                  const float* dout, std::span<float* const> dsources, AttnRes& grad);

}  // namespace lineage::layers
