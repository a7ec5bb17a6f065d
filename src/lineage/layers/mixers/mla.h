// Multi-head Latent Attention (DeepSeek-V2/V3 → Kimi Linear → Kimi K3): keys and values come from a
// small per-token latent, and the cache holds that latent, not the keys and values.
//   q       = W_q·x, or W_qb·RMSNorm(W_qa·x) (q-LoRA)                  [n][d_nope | d_rope]
//   [c|k_r] = W_kva·x;  ĉ = RMSNorm(c)  (ε 1e-6; k_r not normalized, one vector shared by the heads)
//   [k_n|v] = W_kvb·ĉ per head;  K_h = [k_n,h | k_r];  scale = (d_nope + d_rope)^−½
//   out     = W_o·(concat_h o_h  [⊙ σ(W_g·x), gated MLA])
// Switches: q-LoRA or a single q_proj; NoPE (Kimi: the d_rope slot is scored unrotated) or
// DeepSeek-V3's interleaved RoPE on that slot; the sigmoid output gate of K3.
// Two forms of the same attention (Options::mla_path):
//   explicit (prefill): the keys and values of every visible position expanded per head once, then
//     the tiled online-softmax attention with q·k heads of d_nope + d_rope and values of d_v;
//   absorbed (decode): W_UK folded into the query (q̃_h = W_UK,hᵀ q_n,h), attention over the cached
//     [ĉ | k_r] rows in latent space, W_UV applied after: r + d_rope values per token and layer.
// Spec: shared/spec/attention-mla-moe-attnres.md §2; reference/kimi_linear.py.
#pragma once

#include <vector>

#include "lineage/kernels/attention.h"
#include "lineage/kernels/linear.h"
#include "lineage/layers/common.h"
#include "lineage/layers/norm.h"
#include "lineage/layers/train_step.h"

namespace lineage::layers {

struct Mla {
  struct Config {
    int64_t d_model = 0, n_heads = 0;
    int64_t q_lora_rank = 0;  // 0: a single q_proj
    int64_t kv_lora_rank = 0, d_nope = 0, d_rope = 0, d_v = 0;  // r, d_n, d_r, d_v
    bool rope = false;        // false: NoPE (mla_use_nope)
    double rope_theta = 10000.0;
    bool output_gate = false;  // K3's gated MLA: σ(g_proj(x)) before o_proj
    float a_norm_eps = 1e-6f;  // q_a_layernorm and kv_a_layernorm (the reference classes' default)
    int64_t d_qk() const { return d_nope + d_rope; }
    int64_t latent() const { return kv_lora_rank + d_rope; }  // values cached per token
  };
  struct Weights {
    kernels::Matrix q_proj;      // [n·d_qk, D] (no q-LoRA)
    kernels::Matrix q_a_proj;    // [r_q, D] (q-LoRA)
    Norm q_a_norm;               // [r_q]
    kernels::Matrix q_b_proj;    // [n·d_qk, r_q]
    kernels::Matrix kv_a_proj;   // [r + d_r, D]
    Norm kv_a_norm;              // [r]
    kernels::Matrix kv_b_proj;   // [n·(d_n + d_v), r], head-major [n][k_nope | v]
    kernels::Matrix g_proj;      // [n·d_v, D] (gated)
    kernels::Matrix o_proj;      // [D, n·d_v]
  };
  // The absorbed form's per-head matrices, made once by prepare(): W_UK,hᵀ [r, d_n] (a transposed
  // copy of kv_b's key rows, in their dtype, so q̃ is an [out, in] GEMV like every other) and W_UV,h
  // [d_v, r] (views of kv_b's value rows).
  struct Prepared {
    Tensor uk_t;  // [n·r, d_n]
    std::vector<kernels::Matrix> uk, uv;
    bool ready = false;
  };
  // The latent cache: [capacity, r + d_r] f32, row j = [ĉ_j | k_r,j] (k_r rotated at its own
  // position when RoPE is on); rows 0 .. length-1 valid. Grows by doubling; bytes() counts what is
  // in use.
  struct State {
    Tensor kv;
    int64_t length = 0, capacity = 0;
    size_t bytes() const { return capacity ? size_t(length * kv.dim(1)) * sizeof(float) : 0; }
    State clone() const;  // compact: only the filled rows
    void assign(const State& from);
    void clear() { length = 0; }
    void reserve(int64_t width, int64_t positions);
  };
  // A step's activations: q [N, n·d_qk], the latent rows [N, r + d_r], the q-LoRA rank rows, the
  // gate, the head outputs [N, n·d_v]; the explicit form's expanded ĉ / k_n | v / keys of every
  // visible position; the absorbed form's per-head gathers and latent queries and outputs; one
  // kernel argument per sequence or token.
  struct Buffers {
    Buffer q, kv, q_low, gate, context, latents, expanded, keys, head_in, head_out, latent_q, latent_out;
    Buffer share;  // tensor parallelism: this rank's heads' context [N, heads·d_v]
    std::vector<kernels::AttentionSeq> seqs;
    std::vector<kernels::LatentQuery> queries;
    std::vector<int64_t> absorbed;  // token rows of the step that take the absorbed form
  };

  // What the training forward keeps for backward (train_step.h), all in the explicit form, rows
  // b·T + t: the q-LoRA rank rows before and after q_a_layernorm [N, r_q]; q [N, n·d_qk] (rope slot
  // rotated); ĉ before and after kv_a_layernorm [N, r]; the keys [N, n·d_qk] and values [N, n·d_v]
  // packed per head; the context [N, n·d_v], σ(g_proj x) and the gated context; each query's
  // log-sum-exp [B, n, T]. Then backward's own gradients; d_kv [N, r + d_r] and d_expanded
  // [N, n·(d_n + d_v)] hold kv_a's and kv_b's products during the forward (not kept).
  struct Saved {
    Buffer low_pre, low, q, latent_pre, latent, keys, values, context, gate, gated, lse;
    Buffer d_gated, d_context, d_q, d_keys, d_values, d_expanded, d_latent, d_kv, d_low, d_x;
  };

  Config config;
  Weights weights;
  Prepared prepared;

  void for_each_tensor(const std::string& prefix, const TensorVisitor& f);
  void for_each_matrix(const MatrixVisitor& f);
  void prepare();
  // An empty latent cache; `positions` > 0 allocates room for that many now (a pool of fixed context).
  State new_state(int64_t positions = 0) const {
    State s;
    if (positions > 0) s.reserve(config.latent(), positions);
    return s;
  }
  size_t state_bytes_per_token() const { return size_t(config.latent()) * sizeof(float); }
  size_t state_bytes_fixed() const { return 0; }
  // The mixer's own FLOPs for one token that attends `context` positions, counted in the absorbed
  // form: per head, q̃·ĉ and q_r·k_r over the context and the latent-space weighted sum,
  // 2·(2r + d_r)·context (the absorb and un-absorb products are kv_b's 2 FLOPs per parameter).
  double flops_per_token(double context) const;
  std::string describe() const;
};

// y[N, D] = MLA of x[N, D] (already normalized, the step's N tokens): sequence b appends its tokens'
// latents to states[b] and attends its whole cache. Sequences of at least kMlaExplicitMin tokens take
// the explicit form, shorter ones (decode) the absorbed form, unless Options::mla_path forces one.
// y must not alias x. Traces attn.q, attn.latent, attn.k_rope, attn.context, attn.out.
void forward(const Mla& m, const Call& call, const float* x, std::span<Mla::State* const> states, float* y,
             Mla::Buffers& buf, const Trace& trace);

inline constexpr int64_t kMlaExplicitMin = 16;

// Training (train_step.h): the explicit form over B sequences of T tokens from position 0. F32
// weights; y and dx must not alias x. RoPE's backward is the rotation by the opposite angle (the
// same float cosines and sines, so exactly the transpose of the forward's).
void forward_train(const Mla& m, const TrainShape& s, const float* x, float* y, Mla::Saved& saved);
void backward(const Mla& m, const TrainShape& s, const float* x, const float* dy, Mla::Saved& saved, float* dx,
              Mla& grad);

}  // namespace lineage::layers
