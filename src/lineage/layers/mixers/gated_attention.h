// Softmax attention as Qwen3-Next and Qwen3.5 run it in their full-attention layers: separate q, k,
// v projections without biases, grouped KV heads (query head h reads KV head h / (H / KVH)), a
// zero-centred RMSNorm on each q and k head, rotary positions (rotate-half) on the first `rope_dims`
// dims of each head, and the context times σ(gate) before o_proj, the gate read from q_proj's second
// half of each head's rows ([query; gate] per head). Spec: shared/spec/qwen3-next-and-qwen3.5.md
// §3.3; reference/qwen.py.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "lineage/kernels/attention.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/row_split.h"
#include "lineage/layers/common.h"
#include "lineage/layers/mixers/attention.h"
#include "lineage/layers/norm.h"
#include "lineage/layers/step.h"
#include "lineage/layers/train_step.h"

namespace lineage::layers {

struct GatedAttention {
  struct Config {
    int64_t d_model = 0;               // D
    int64_t n_heads = 0, n_kv_heads = 0;  // H query heads, KVH key / value heads (H % KVH == 0)
    int64_t head_dim = 0;              // hd (not D / H in Qwen: 256 at D = 2048, H = 16)
    int64_t rope_dims = 0;             // R: the rotated leading dims of each q and k head (even, <= hd)
    double rope_theta = 10000.0;
    bool output_gate = true;           // q_proj holds [query; gate] per head, the context times σ(gate)
    bool qk_norm = true;               // q_norm / k_norm: zero-centred RMSNorm over each head's hd dims
    float norm_eps = 1e-6f;
  };
  struct Weights {
    kernels::Matrix q_proj;  // [H·hd·(2 with the gate), D]: per head its query rows, then its gate rows
    kernels::Matrix k_proj;  // [KVH·hd, D]
    kernels::Matrix v_proj;  // [KVH·hd, D]
    kernels::Matrix o_proj;  // [D, H·hd]
    Norm q_norm, k_norm;     // [hd] each, (1 + w)
  };
  // The KV cache: GPT-2's attention's, holding KVH heads (k after its norm and rotation).
  using State = Attention::State;
  // A step's activations: q_proj's output [N, H·hd·(1 or 2)], queries [N, H·hd] (normalized and
  // rotated), the gates [N, H·hd], keys and values [N, KVH·hd], the context [N, H·hd], and one
  // kernel argument per sequence and KV head.
  struct Buffers {
    Buffer qg, q, gate, k, v, context;
    Buffer share;  // tensor parallelism: this rank's query heads' context
    std::vector<kernels::AttentionSeq> seqs;
  };
  // What the training forward keeps for backward (train_step.h): q_proj's output, the queries and
  // keys before their norms ([N, H·hd], [N, KVH·hd]), the queries after norm and rotation and the
  // keys and values widened to every query head ([N, H·hd] each: the attention kernel reads one KV
  // head per query head), σ(gate), the context before and after the gate ([N, H·hd]), each query's
  // log-sum-exp [B, H, T]; and backward's own gradients.
  struct Saved {
    Buffer qg, q_raw, k_raw, q, k_wide, v_wide, gate, context, gated, lse;
    Buffer d_gated, d_q, d_k_wide, d_v_wide, d_k, d_v, d_qg, d_x;
  };

  Config config;
  Weights weights;

  void for_each_tensor(const std::string& prefix, const TensorVisitor& f);
  void for_each_matrix(const MatrixVisitor& f) {
    f(weights.q_proj), f(weights.k_proj), f(weights.v_proj), f(weights.o_proj);
  }
  // Under tensor parallelism, this rank's KV heads only (Attention::State) and their query heads.
  State new_state(int64_t positions = 0) const {
    State s;
    if (const auto share = kernels::rank_heads_now(config.n_kv_heads)) s.h0 = share->first, s.h1 = share->second;
    if (positions > 0) s.reserve(s.heads(config.n_kv_heads), config.head_dim, positions);
    return s;
  }
  size_t state_bytes_per_token() const { return 2 * size_t(config.n_kv_heads * config.head_dim) * sizeof(float); }
  size_t state_bytes_fixed() const { return 0; }
  // q·k and p·v over the context for every query head: 4·H·hd·context.
  double flops_per_token(double context) const {
    return 4.0 * double(config.n_heads) * double(config.head_dim) * context;
  }
  std::string describe() const;
};

// y[N, D] = gated attention of x[N, D] (already normalized): sequence b of the step attends its own
// cached past, states[b], and appends its tokens' keys and values. y must not alias x. Traces
// attn.q, attn.k, attn.v, attn.gate, attn.context (before the gate) and attn.out.
void forward(const GatedAttention& a, const Call& call, const float* x, std::span<GatedAttention::State* const> states,
             float* y, GatedAttention::Buffers& buf, const Trace& trace);

// Training (train_step.h): y[N, D] = gated attention of x over B sequences of T tokens, each from an
// empty cache at position 0; no T × T score matrix is stored (kernels::attention_causal_train).
void forward_train(const GatedAttention& a, const TrainShape& s, const float* x, float* y,
                   GatedAttention::Saved& saved);
void backward(const GatedAttention& a, const TrainShape& s, const float* x, const float* dy,
              GatedAttention::Saved& saved, float* dx, GatedAttention& grad);

}  // namespace lineage::layers
