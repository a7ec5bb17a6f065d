// A model's loss and its gradients: the training forward (each layer's forward_train keeping what
// its backward reads), the chunked cross-entropy, and the backward through the blocks, the final
// norm and the embeddings. Gradients live in a model of the same structure (every tensor F32, the
// same shapes and layouts), so one for_each_tensor walk pairs each parameter with its gradient.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <variant>
#include <vector>

#include "lineage/model/model.h"
#include "lineage/model/forward.h"
#include "lineage/train/adamw.h"

namespace lineage::train {

// Makes every parameter of m an owned F32 tensor (widening other dtypes, copying mapped ones): what
// training updates in place. Throws Error for a model with parameters training cannot update
// (MXFP4 packed matrices).
void to_trainable(model::Model& m);

// A copy of m's structure with every tensor F32 and zero.
model::Model zeros_like(model::Model& m);

// Why m cannot be trained yet (a layer kind without a backward), or "" when it can.
std::string untrainable_reason(const model::Model& m);

class Backprop {
 public:
  // m must stay alive and in place; its tensors F32 (to_trainable).
  explicit Backprop(model::Model& m);
  ~Backprop();

  // tokens: [B, T + 1] row-major; sequence b reads tokens[b, 0:T] from an empty state and predicts
  // tokens[b, 1:T+1]. Returns Σ cross-entropy · scale over the B·T positions and, when `grads`,
  // adds ∂(that)/∂θ into grads() (scale = 1/(B·T·micro-batches) makes it the mean). A target < 0 is
  // ignored.
  double step(std::span<const int32_t> tokens, int64_t B, int64_t T, float scale, bool grads = true);
  // The same with inputs and targets given apart, each [B, T]: tasks that score some positions only
  // (a target < 0 is ignored; MQAR scores its queries).
  double step(std::span<const int32_t> inputs, std::span<const int32_t> targets, int64_t B, int64_t T, float scale,
              bool grads = true);
  // The most likely next token at every position of inputs [B, T] (argmax of the logits, ties to the
  // lower id), through the same forward.
  void predict(std::span<const int32_t> inputs, int64_t B, int64_t T, std::vector<int32_t>& out);

  model::Model& grads() { return grads_; }
  void zero_grads();
  // Each parameter with its gradient, in for_each_tensor order; decay off for 1-D tensors (norms,
  // biases) as in GPT-2 / nanoGPT.
  std::vector<ParamRef> params();
  // Re-derives what layers prepared from their parameters (after an optimizer step).
  void refresh();

 private:
  struct BlockSaved;
  void check_length(int64_t T) const;
  // The training forward over inputs_ ([B, T]): the final norm's output [B·T, D].
  const float* forward(int64_t B, int64_t T);
  // forward(), then the loss against targets_ and, with grads, the backward.
  double run(int64_t B, int64_t T, float scale, bool grads);
  model::Model& m_;
  model::Model grads_;
  std::vector<std::unique_ptr<BlockSaved>> saved_;
  layers::Buffer x_, normed_, dx_, dnormed_, dmix_;
  const float* final_in_ = nullptr;  // what the final norm read: the stream, or the output mix
  // Block AttnRes: the finished blocks of the last forward (the embedding first) and their
  // gradients, the output mix and its softmax weights.
  std::vector<layers::Buffer> blocks_, dblocks_;
  int64_t blocks_used_ = 0;
  layers::Buffer mixed_out_, out_weights_;
  std::vector<int32_t> inputs_, targets_;
};

}  // namespace lineage::train
