// The delta-rule family as one token mixer: linear attention (fla LinearAttention), DeltaNet,
// Gated DeltaNet and Kimi Delta Attention differ only in the switches of Config. One recurrent
// kernel (decode, short prompts) and one chunked kernel (prefill) serve all of them.
// Spec: shared/spec/linear-attention-family.md §1–§5; reference/delta_family.py.
#pragma once

#include "lineage/kernels/delta_rule.h"
#include "lineage/layers/common.h"
#include "lineage/layers/train_step.h"

namespace lineage::layers {

struct DeltaRule {
  // What is applied to q and k after the projection (and short conv): fla's qk_activation or
  // linear attention's feature_map. ElementwiseProduct is fla's HadamardFeatureMap (two biased
  // Linear(K, K) per q and k, multiplied).
  enum class FeatureMap : uint8_t { Identity, Silu, Relu, Elu1, ElementwiseProduct };
  // Normalization of each q / k head vector: L2 (eps 1e-6 inside the sqrt), x / Σx (DeltaNet's
  // "sum"), x / (Σx + 1e-4) (linear attention's norm_q / norm_k), or none.
  enum class QkNorm : uint8_t { None, L2, Sum, SumEps };
  // Output gate applied after the per-head RMSNorm: swish(g_proj(x)), sigmoid(g_b(g_a(x)) + bias),
  // or Kimi K3's full-rank sigmoid(g_proj(x)).
  enum class OutGate : uint8_t { None, Swish, SigmoidLowRank, Sigmoid };
  // How the decay's input is projected: GDN a_proj(x) per value head; KDA f_b(f_a(x)) (low rank) or
  // f_proj(x) (one full-rank projection) per value head and key channel. The log decay is then
  // −exp(A_log[h])·softplus(input + dt_bias), or with Config::gate_lower_bound lb < 0 (K3, fla's
  // lower_bound) lb·σ(exp(A_log[h])·(input + dt_bias)): a reparameterization into (lb, 0), not a clamp.
  enum class DecayInput : uint8_t { None, PerHeadProj, PerChannelLowRank, PerChannelProj };

  // Checkpoint names that differ between fla's layers (linear attention's output norm is "norm");
  // Kimi's names for the low-rank pairs (f_a_proj, ...) are renames in its binding table.
  struct Names {
    std::string o_norm = "o_norm";
  };

  struct Config {
    std::string kind;            // "linear attention", "DeltaNet", ... (for describe())
    int64_t d_model = 0;         // D
    int64_t n_heads = 0;         // H (q/k heads)
    int64_t n_kv_heads = 0;      // heads of k_proj / v_proj before the GQA repeat (linear attention); = H otherwise
    int64_t n_v_heads = 0;       // HV (value heads; > H is GVA)
    int64_t head_k = 0, head_v = 0;  // K, V
    int64_t conv_size = 0;       // W; 0 = no short convolution
    bool qk_conv_silu = true;    // SiLU after the q/k short conv (v's has it where the write is delta)
    FeatureMap qk_map = FeatureMap::Identity;
    QkNorm q_norm = QkNorm::L2, k_norm = QkNorm::L2;
    bool has_beta = true;        // β = sigmoid(b_proj(x)); false: β = 1 (delta) or no β (linear attention)
    bool neg_eigval = false;     // β ∈ (0, 2)
    bool delta = true;           // delta write vs additive write
    bool normalize = false;      // linear attention's (S, z) normalizer
    DecayInput decay = DecayInput::None;
    OutGate out_gate = OutGate::None;
    bool out_norm_weight = true;  // the output RMSNorm has a weight (fla elementwise_affine)
    float norm_eps = 1e-6f;
    float gate_lower_bound = 0;  // < 0: the lower-bound gate above; 0: softplus
    // A_log's stored length: n_v_heads, or more (K3 stores [head_dim = 128] for 96 heads); the first
    // n_v_heads entries are used. 0 = n_v_heads.
    int64_t a_log_len = 0;
    Names names;

    bool per_channel() const { return decay == DecayInput::PerChannelLowRank || decay == DecayInput::PerChannelProj; }

    kernels::Gate gate() const;
  };

  struct Weights {
    kernels::Matrix q_proj, k_proj, v_proj;  // [H*K, D], [KVH*K, D], [KVH*V or HV*V, D]
    Tensor q_conv, k_conv, v_conv;           // [channels, 1, W]
    kernels::Matrix fm_q1_w, fm_q2_w, fm_k1_w, fm_k2_w;  // feature_map_{q,k}.layer{1,2}: [K, K]
    Tensor fm_q1_b, fm_q2_b, fm_k1_b, fm_k2_b;           // their biases [K]
    kernels::Matrix b_proj;                  // [HV, D] (DeltaNet: [H, D], H = HV)
    kernels::Matrix a_proj;                  // [HV, D] (GDN)
    kernels::Matrix f_a, f_b;                // [V, D], [HV*K, V] (KDA low-rank gate input)
    kernels::Matrix f_proj;                  // [HV*K, D] (KDA full-rank gate input)
    Tensor A_log;                            // [a_log_len]
    Tensor dt_bias;                          // [HV] (GDN) or [HV*K] (KDA)
    kernels::Matrix g_proj;                  // [HV*V, D] (swish or full-rank sigmoid gate)
    kernels::Matrix g_a, g_b;                // [V, D], [HV*V, V] (sigmoid gate)
    Tensor g_b_bias;                         // [HV*V] (may be absent)
    Tensor o_norm;                           // [V]
    kernels::Matrix o_proj;                  // [D, HV*V]
  };

  // Per-sequence memory, fixed size whatever the context length.
  struct State {
    Tensor S;          // [HV, K, V] f32, row-major: value head j's state maps key channel d to row d
    Tensor z;          // [H, K] f32, the normalizer's key sum (linear attention with normalize)
    Tensor conv_tail;  // [W − 1, Cq + Ck + Cv] f32: the last raw q | k | v projections (oldest first)
    size_t bytes() const { return S.nbytes() + z.nbytes() + conv_tail.nbytes(); }
    State clone() const { return {S.clone(), z.clone(), conv_tail.clone()}; }
    void assign(const State& from);  // copies `from` into these buffers (same shapes), else clones it
    void clear();  // back to the empty sequence, reusing the buffers
  };

  // Small parameters widened to f32 once by prepare(), after the weights are bound: the decay's
  // A = −exp(A_log) (softplus form) or exp(A_log) (lower-bound form) [HV] and dt_bias [HV or HV·K],
  // and the output norm's weight [V] (ones when the norm has none).
  struct Prepared {
    std::vector<float> A, dt_bias, o_norm;
    bool ready = false;
  };

  // A step's activations, each [N, width]: raw projections q | k | v (then after the short conv in
  // qkv), the heads q, k, v, β, the log decay (and its low-rank input), the output gate (and its
  // low-rank input), the recurrence's output, a projection's staging rows, the product feature map's
  // two halves; and one kernel argument per sequence.
  struct Buffers {
    Buffer raw, qkv, q, k, v, beta, decay, low_decay, gate, low_gate, core, staging, feature_a, feature_b;
    // Tensor parallelism with the heads split (new_state): this rank's heads' rows, copied apart, and
    // every rank's outputs gathered.
    Buffer share_q, share_k, share_v, share_beta, share_decay, share_core;
    std::vector<kernels::DeltaRuleArgs> recurrent;
  };

  // What the training forward keeps for backward (train_step.h). fwd: the forward's own buffers as its
  // stages leave them (raw q | k | v projections, qkv after the short conv, the heads q, k (normalized)
  // and v, β, the log decay and its low-rank input, the output gate and its low-rank input, the
  // recurrence's output core). Beside them what the in-place stages would overwrite, each [N, width]:
  // the decay's input + dt_bias, the output gate before its activation, q and k before their
  // normalization, and the normed, gated output o_proj reads. One empty state per sequence. path: the
  // recurrence's kernels, forward and backward alike (the caller sets it from Options::delta_rule_path):
  // Recurrent token by token, Auto and Chunked the chunked ones (kChunkSize). The rest is backward's
  // scratch: gradients of those activations; recomputed, the short conv's output before its SiLU (from
  // a zero tail) and the heads before their feature map (with the product map's two halves); a zero
  // initial state.
  struct Saved {
    Buffers fwd;
    Buffer decay_in, gate_in, q_mapped, k_mapped, normed;
    std::vector<State> states;
    DeltaRulePath path = DeltaRulePath::Auto;
    Buffer d_normed, d_core, d_gate, d_low, d_q, d_k, d_v, d_beta, d_decay, d_qkv, d_raw, d_part;
    Buffer pre_conv, conv_tail, pre_q, pre_k, feature_a, feature_b, zero_state;
  };

  Config config;
  Weights weights;
  Prepared prepared;
  bool g_b_has_bias = true;  // Kimi's g_b_proj has none

  void for_each_tensor(const std::string& prefix, const TensorVisitor& f);
  void for_each_matrix(const MatrixVisitor& f);
  void prepare();
  // Fixed size: `positions` changes nothing. Under tensor parallelism (a row split installed on this
  // thread, kernels/row_split.h) S and z hold only this rank's value heads (head_share), where S is at
  // least the split's min_bytes: the recurrence of those heads runs on this rank alone.
  State new_state(int64_t positions = 0) const;
  size_t state_bytes_per_token() const { return 0; }
  size_t state_bytes_fixed() const;
  // The mixer's own FLOPs for one token beyond its weights' 2 per parameter (the same at any
  // context), counted in the recurrent form per value head: read qᵀS and write k uᵀ (2·K·V each),
  // the delta rule's prediction kᵀS (2·K·V), the decay (K·V multiplies); the chunked kernel does
  // more than this. A product feature map's [K, K] weights run once per q/k head, H − 1 times more
  // than their 2 FLOP per parameter: the difference counts here.
  double flops_per_token(double context) const;
  std::string describe() const;
};

// y[N, D] = the mixer on x[N, D] (already normalized, the step's N tokens): sequence b continues
// from and updates states[b] (S, z, conv tail), and nothing else. Its stages: project, convolve,
// heads (split, feature map, q/k norm), gates (β, log decay), recurrence, output (per-head norm,
// gate, o_proj). Traces attn.q, attn.k, attn.v, attn.beta, attn.log_decay, attn.core, attn.state
// (one sequence only), attn.out.
void forward(const DeltaRule& m, const Call& call, const float* x, std::span<DeltaRule::State* const> states,
             float* y, DeltaRule::Buffers& buf, const Trace& trace);

// Training (train_step.h): y[N, D] = the mixer on x over B sequences of T tokens, each from an empty
// state (zero S and z, zero conv tail), through the forward's own stages. backward: ∂L/∂x into dx and
// every parameter's gradient (for_each_tensor's list; A_log's first n_v_heads entries) added into grad;
// the recurrence through kernels::delta_rule_chunked_backward (or _recurrent_backward, Saved::path).
void forward_train(const DeltaRule& m, const TrainShape& s, const float* x, float* y, DeltaRule::Saved& saved);
void backward(const DeltaRule& m, const TrainShape& s, const float* x, const float* dy, DeltaRule::Saved& saved,
              float* dx, DeltaRule& grad);

// The recurrent kernel runs for sequences of a step shorter than this (Options::delta_rule_path
// Auto), the chunked one from it on. From 64 tokens on; from 4 where a key head has 256 channels or more (Gated DeltaNet's released size,
// K = 256, V = 512: the chunked kernel 1.3–1.7× faster at 4 to 48 tokens, AVX-512; at K = 64 the
// recurrent one stays ahead up to 63 tokens, at K = 128 the two are within 20 % either way).
inline int64_t chunk_threshold(int64_t K) { return K >= 256 ? 4 : 64; }
inline constexpr int kChunkSize = 16;  // fastest of 16 / 32 / 64 on this CPU (docs/math/delta_rule.md)

}  // namespace lineage::layers
