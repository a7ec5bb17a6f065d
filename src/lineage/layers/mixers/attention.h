// Causal multi-head softmax attention with a KV cache (GPT-2: fused c_attn, learned positions, no
// rotary). Spec: shared/spec/attention-mla-moe-attnres.md §1.3–1.4; reference/gpt2.py.
#pragma once

#include "lineage/kernels/attention.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/row_split.h"
#include "lineage/layers/common.h"
#include "lineage/layers/train_step.h"

namespace lineage::layers {

struct Attention {
  struct Config {
    int64_t d_model = 0, n_heads = 0, head_dim = 0;
    bool scale_attn_weights = true;  // scores / sqrt(head_dim)
    // Not GPT-2's: lineage's "conv_size" field, for the study's softmax row with the local mixing the
    // delta-rule rows have. > 0: q | k | v += a causal depthwise convolution of this many taps over
    // them (no bias, no activation; the identity kept, so at init it is plain GPT-2). 0: none.
    int64_t conv_size = 0;
  };
  struct Weights {
    kernels::Matrix c_attn;  // [3D, D]: outputs q | k | v, head h at h*hd within each (GPT-2 stores Conv1D [in, out])
    Tensor c_attn_bias;      // [3D]
    kernels::Matrix c_proj;  // [D, D]
    Tensor c_proj_bias;      // [D]
    Tensor c_attn_conv;      // [3D, 1, conv_size] (conv_size > 0)
  };
  // The KV cache. k, v: [H, capacity, hd] f32 (head-major so one head's keys are contiguous for
  // decode); rows 0 .. length-1 valid. Grows by doubling; bytes() counts what is in use. With a
  // short conv, conv_tail [conv_size − 1, 3D] holds the last raw q | k | v rows (zeros at the start).
  // Under tensor parallelism (kernels::rank_heads_now when the state is made) the cache holds only
  // this rank's heads [h0, h1) (GatedAttention: KV heads), and the layer runs only theirs.
  struct State {
    Tensor k, v, conv_tail;
    int64_t length = 0, capacity = 0;
    int64_t h0 = 0, h1 = -1;  // the heads held: [h0, h1); h1 < 0: every head
    int64_t heads(int64_t all) const { return h1 >= 0 ? h1 - h0 : all; }
    size_t bytes() const;
    size_t reserved_bytes() const { return k.nbytes() + v.nbytes() + conv_tail.nbytes(); }
    State clone() const;  // compact: holds only the `length` filled positions
    // Copies `from` into this state: into the buffers it has when they hold from.length positions
    // of the same heads (no new pages to touch), else into new ones with twice that room.
    void assign(const State& from);
    void clear();  // keeps the buffers: a new sequence reuses their pages
    // Room for `positions` positions of H heads of hd channels, allocated now (a pool of fixed
    // context); keeps what is cached.
    void reserve(int64_t H, int64_t hd, int64_t positions);
    // Room for at least `needed` positions, growing by doubling (at least 16): what a step appends.
    void grow(int64_t H, int64_t hd, int64_t needed);
  };
  // A step's activations: the fused q | k | v projection [N, 3D], the attended context [N, D], and
  // one kernel argument per sequence.
  struct Buffers {
    Buffer qkv, context, raw;  // raw: c_attn's output before the short conv
    Buffer share;              // tensor parallelism: this rank's heads' context [N, (h1 − h0)·hd]
    std::vector<kernels::AttentionSeq> seqs;
  };

  // What the training forward keeps for backward (train_step.h): the projection q | k | v [N, 3D],
  // the attended context [N, D] and each query's log-sum-exp [B, H, T]; and backward's own
  // gradients of the context and of q | k | v.
  // With a short conv, also c_attn's output before it (raw, and its gradient) and a zero tail.
  struct Saved {
    Buffer qkv, context, lse, d_context, d_qkv, raw, d_raw, tail;
  };

  Config config;
  Weights weights;

  void for_each_tensor(const std::string& prefix, const TensorVisitor& f);
  void for_each_matrix(const MatrixVisitor& f) { f(weights.c_attn), f(weights.c_proj); }
  // An empty cache; `positions` > 0 allocates room for that many now (a pool of fixed context).
  // Under tensor parallelism, this rank's heads only (State).
  State new_state(int64_t positions = 0) const {
    State s;
    if (const auto share = kernels::rank_heads_now(config.n_heads)) s.h0 = share->first, s.h1 = share->second;
    if (positions > 0) s.reserve(s.heads(config.n_heads), config.head_dim, positions);
    if (config.conv_size > 0) s.conv_tail = Tensor::zeros(DType::F32, {config.conv_size - 1, 3 * config.d_model});
    return s;
  }
  size_t state_bytes_per_token() const { return 2 * size_t(config.d_model) * sizeof(float); }
  size_t state_bytes_fixed() const {
    return config.conv_size > 0 ? size_t((config.conv_size - 1) * 3 * config.d_model) * sizeof(float) : 0;
  }
  // The mixer's own FLOPs for one token that attends `context` positions, beyond its weights' 2 per
  // parameter: q·k and p·v over the context, 4·D·context.
  double flops_per_token(double context) const { return 4.0 * double(config.d_model) * context; }
  std::string describe() const;
};

// y[N, D] = attention of x[N, D] (already normalized, the step's N tokens): sequence b of the step
// attends its own cached past, states[b], and appends its tokens' keys and values to it. The
// projections run once over all N rows. y must not alias x. Traces attn.qkv, attn.context, attn.out.
void forward(const Attention& a, const Call& call, const float* x, std::span<Attention::State* const> states,
             float* y, Attention::Buffers& buf, const Trace& trace);

// Training (train_step.h): y[N, D] = attention of x over B sequences of T tokens, each from an empty
// cache; no T × T score matrix is stored (kernels::attention_causal_train).
void forward_train(const Attention& a, const TrainShape& s, const float* x, float* y, Attention::Saved& saved);
void backward(const Attention& a, const TrainShape& s, const float* x, const float* dy, Attention::Saved& saved,
              float* dx, Attention& grad);

}  // namespace lineage::layers
