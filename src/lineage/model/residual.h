// The residual stream: how the sublayers' outputs are combined into the next sublayer's input
// (plain addition, or Kimi K3's Block Attention Residuals).
#pragma once

#include <cstdint>

#include "lineage/layers/attn_res.h"
#include "lineage/layers/common.h"
#include "lineage/model/workspace.h"

namespace lineage::model {

struct Model;  // model.h

// How the sublayers' outputs are combined into the next sublayer's input.
//   Plain: x += f(norm(x)) (GPT-2, fla, Kimi Linear).
//   BlockAttention: Block Attention Residuals (Kimi K3): each sublayer reads a learned softmax mixture
//   of the block representations so far (ResidualStream below, spec §6.3).
enum class ResidualKind : uint8_t { Plain, BlockAttention };

// The residual wiring of one forward over N rows of width D (ResidualKind). x holds the embedding
// to begin with and is the stream (plain) or the current partial block (BlockAttention) after.
//   Plain: a sublayer reads x and its output is added to x.
//   BlockAttention (spec §6.3, block size B sublayers): sublayer s (2i: layer i's attention, 2i + 1
//   its ffn) reads the mix of [finished blocks, partial] (the partial alone while no block is
//   finished); at s % B == 0 the partial is then pushed as a finished block (sublayer 0 pushes the
//   embedding) and s's output starts the next; outputs add to the partial; the model's output is
//   the mix of [finished blocks, partial] under the model-level query. K3's blocks of n decoder
//   layers are B = 2n; fla's attnres_block_size is B (1: every sublayer's output its own source). Traces attn_res.weights, mlp_res.weights and
//   output_res.weights, [N, sources].
class ResidualStream {
 public:
  ResidualStream(const Model& m, float* x, int64_t N, Workspace& ws);
  const float* input(int64_t sublayer, const layers::Trace& trace);  // what sublayer i normalizes and reads
  void add(int64_t sublayer, const float* y);                         // sublayer i's output [N, D]
  const float* state() const { return x_; }  // the stream (or partial block) after the last add
  const float* output(const layers::Trace& trace);  // what the final norm reads

 private:
  const float* mixed(const layers::AttnRes& q, const char* name, const layers::Trace& trace);
  const Model& m_;
  float* x_;
  int64_t n_, d_;
  Workspace::AttnRes* ar_;
  int64_t blocks_ = 0;   // finished blocks so far
  bool empty_ = false;   // the partial was just pushed: the next output starts a new one
};

}  // namespace lineage::model
