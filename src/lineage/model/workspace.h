// A step's activations, by name (STYLE.md habit 12): one Workspace serves every forward of a model
// and grows to the largest step it has run.
#pragma once

#include <vector>

#include "lineage/layers/attn_res.h"
#include "lineage/layers/common.h"
#include "lineage/layers/ffn/gated_mlp.h"
#include "lineage/layers/ffn/mlp.h"
#include "lineage/layers/ffn/moe.h"
#include "lineage/layers/mixers/attention.h"
#include "lineage/layers/mixers/delta_rule.h"
#include "lineage/layers/mixers/gated_attention.h"
#include "lineage/layers/mixers/mla.h"
#include "lineage/layers/norm.h"

namespace lineage::model {

// A step's activations, by name, sized from the model and the step as they run: the residual
// stream, the normalized input of a sublayer, a sublayer's output, the rows the LM head reads, each
// layer kind's own buffers (shared by the layers of that kind, which run one after another), and
// the per-sequence state pointers handed to the mixers. Once a workspace has run a step of some
// shape, steps up to that shape allocate nothing.
struct Workspace {
  layers::Buffer x, normed, out, head_rows;
  layers::Attention::Buffers attention;
  layers::GatedAttention::Buffers gated_attention;
  layers::DeltaRule::Buffers delta_rule;
  layers::Mla::Buffers mla;
  layers::Mlp::Buffers mlp;
  layers::GatedMlp::Buffers gated_mlp;
  layers::Moe::Buffers moe;
  std::vector<layers::Attention::State*> attention_states;  // GatedAttention's too (the same cache)
  std::vector<layers::DeltaRule::State*> delta_rule_states;
  std::vector<layers::Mla::State*> mla_states;
  // Block Attention Residuals: the finished blocks (the embedding first), the mixed input of a
  // sublayer, the softmax weights [N, sources].
  struct AttnRes {
    std::vector<layers::Buffer> blocks;
    layers::Buffer mixed, weights;
    std::vector<const float*> sources;
  } attn_res;
};

}  // namespace lineage::model
