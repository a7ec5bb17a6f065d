// Mixture-of-Experts (DeepSeek-V3 style, as Kimi Linear and Kimi K3 route): a sigmoid router in f32,
// a correction bias that selects but does not weigh, grouped top-k, renormalized and scaled weights,
// SwiGLU (or SiTU) experts, and shared experts as one MLP added unweighted:
//   s = σ(W_gate·x);  s' = s + b;  [groups: keep the topk_group groups by the sum of their top-2 s',
//   the others' s' set to 0.0 (Kimi K3: −inf)];  idx = top-k of s' (ties: lower index first);
//   w = s[idx] (router_bias_in_weights: s'[idx], as the released modeling_kimi.py computes it
//   through an aliased view);  w /= Σw + 1e-20 (k > 1 and renormalize);  w ·= routed_scaling_factor
//   y = Σ_j w_j·expert_idx_j(x) + shared(x)
// Kimi K3's Stable LatentMoE (config.latent > 0) routes on the full width x but runs the experts in a
// narrower latent space:
//   z = W_down·x;  a = Σ_j w_j·expert_idx_j(z);  a = RMSNorm(a) (latent_norm, once on the aggregate);
//   y = W_up·a + shared(x)
// Qwen3-Next and Qwen3.5 route with a softmax instead (Router::Softmax): p = softmax(W_gate·x) over
// all experts in f32, idx = top-k of p, w = p[idx], w /= Σw (norm_topk_prob; even for k = 1), no
// bias, groups or scaling; and their shared expert is gated per token (shared_gate):
//   y = Σ_j w_j·expert_idx_j(x) + σ(W_sg·x)·shared(x)
// Spec: shared/spec/attention-mla-moe-attnres.md §3, §4.2; qwen3-next-and-qwen3.5.md §3.5;
// reference/kimi_linear.py, kimi_k3.py, qwen.py.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "lineage/kernels/row_split.h"
#include "lineage/layers/common.h"
#include "lineage/layers/ffn/gated_mlp.h"

namespace lineage::layers {

// Routed experts that live outside memory (io/expert_stream.h: read from the checkpoint's files as
// the router chooses them, under a memory budget). A step asks for its distinct chosen experts at once,
// ascending (`request`: reads for every one not resident issued together), then runs them in that
// order: expert(i) waits for the i-th and returns it resident, its weights valid until the next
// request (the ones before it may then be evicted). One step at a time per model.
class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual void request(const int32_t* experts, int64_t n) = 0;
  virtual const GatedMlp& expert(int64_t i) = 0;
};

struct Moe {
  enum class Router : uint8_t { Sigmoid, Softmax };
  struct Config {
    int64_t d_model = 0;
    int64_t n_experts = 0, top_k = 0;    // E, k
    Router router = Router::Sigmoid;     // Softmax: no e_score_correction_bias
    int64_t hidden = 0;                  // each routed expert's width I
    int64_t shared_hidden = 0;           // the shared MLP's width I·n_shared; 0 = none
    int64_t n_group = 1, topk_group = 1; // group-limited routing (1 group: plain top-k)
    bool renormalize = true;
    double scaling = 1.0;                // routed_scaling_factor
    bool bias_in_weights = false;        // router_bias_in_weights (see above)
    bool mask_neg_inf = false;           // groups left out are masked with −inf (K3), not 0.0
    // Stable LatentMoE: the experts' width L_a (routed_expert_hidden_size; 0 = experts at d_model),
    // and whether their weighted sum is RMSNormed (latent_moe_use_norm, ε latent_eps).
    int64_t latent = 0;
    bool latent_norm = false;
    float latent_eps = 1e-5f;
    // The experts' and the shared MLP's activation (GatedMlp::Config).
    GatedMlp::Act act = GatedMlp::Act::Silu;
    bool shared_gate = false;            // the shared MLP's output times σ(shared_expert_gate·x)
    float situ_beta = 4.0f, situ_linear_beta = 25.0f;
  };
  struct Weights {
    kernels::Matrix gate;         // [E, D], run in f32
    Tensor bias;                  // [E] e_score_correction_bias
    std::vector<GatedMlp> experts;
    GatedMlp shared;              // shared_hidden > 0
    kernels::Matrix latent_down;  // [L_a, D] routed_expert_down_proj (latent > 0)
    Tensor latent_norm;           // [L_a]    routed_expert_norm (latent_norm)
    kernels::Matrix latent_up;    // [D, L_a] routed_expert_up_proj
    kernels::Matrix shared_gate;  // [1, D] shared_expert_gate (shared_gate)
  };
  struct Prepared {
    std::vector<float> bias;      // [E], widened once
    bool ready = false;
  };
  // A step's activations: router logits [N, E], the chosen experts and weights [N, k], the tokens
  // grouped by expert, one expert's rows in and out, the shared output [N, D]; with a latent space
  // the experts' input z and their weighted sum [N, L_a], and the up-projected sum [N, D].
  struct Buffers {
    Buffer logits, weights, rows_in, rows_out, shared, shared_gate, ids_f, latent_in, latent_sum, routed;
    Buffer split_mine, split_all, split_hidden, split_sum;  // tensor parallelism (moe.cpp, routed_split)
    std::vector<int64_t> split_counts;                       // and each rank's floats in its gathers
    std::vector<int32_t> ids, order, scratch, chosen;
    std::vector<int64_t> offsets;
    GatedMlp::Buffers mlp;
  };
  // Training (train_step.h): the router logits [N, E], the chosen experts [N, k] and their weights
  // [N, k]; the slots (t·k + j) grouped by expert (order [N·k], offsets [E + 1]); the experts' rows in
  // and out in that order [N·k, X] and each expert's own activations; with a latent space z [N, L_a],
  // the weighted sum before and after its norm [N, L_a]; the shared MLP's output [N, D] and activations
  // and its gate σ(W_sg·x) [N]. Backward's ∂L/∂(weighted sum) [N, X], ∂L/∂(shared output) [N, D] and
  // ∂L/∂(gate's input) [N], ∂L/∂(experts' rows out, then in) [N·k, X], ∂L/∂(weights) [N, k],
  // ∂L/∂logits [N, E], ∂L/∂(experts' input) [N, X], and a share of ∂L/∂x [N, D].
  struct Saved {
    Buffer logits, weights, rows_in, rows_out, latent_in, latent_sum, latent_normed, shared_out, shared_gate;
    Buffer d_shared, d_shared_gate, d_sum, d_rows_out, d_rows_in, d_weights, d_logits, d_in, d_x;
    std::vector<int32_t> ids, order, scratch;
    std::vector<int64_t> offsets;
    std::vector<GatedMlp::Saved> experts;
    GatedMlp::Saved shared;
  };

  Config config;
  Weights weights;
  Prepared prepared;
  // The routed experts' matrix names: DeepSeek's gate_proj / up_proj / down_proj unless the family's
  // file says otherwise (Kimi: w1 / w3 / w2).
  GatedMlp::Names expert_names;
  // The shared MLP's name under the layer: Kimi's "shared_experts", Qwen's "shared_expert".
  std::string shared_name = "shared_experts";
  // Set when the routed experts stream from disk (weights.experts then hold their shapes and where
  // they lie in the files; forward() takes them from here).
  std::shared_ptr<ExpertSource> source;

  void for_each_tensor(const std::string& prefix, const TensorVisitor& f);
  void for_each_matrix(const MatrixVisitor& f);
  void prepare();
  std::string describe() const;
  // The experts' input width: L_a with a latent space, else d_model.
  int64_t expert_width() const { return config.latent > 0 ? config.latent : config.d_model; }
  // Parameters of the routed experts, all of them and those one token runs (k of E).
  int64_t routed_params() const { return config.n_experts * 3 * expert_width() * config.hidden; }
  int64_t active_routed_params() const { return config.top_k * 3 * expert_width() * config.hidden; }
  // Weight bytes one step of `tokens` tokens reads: router, shared MLP and the distinct experts the
  // tokens are expected to choose, E·(1 − (1 − k/E)^tokens) (uniform routing).
  double bytes_per_step(double tokens) const;
};

// One token's routing: logits [E] (f32) and the widened bias [E] to the chosen experts ids[k], in
// order of their biased scores (larger first, then lower index), and their weights w[k]. scratch
// holds E ints.
void route(const Moe::Config& c, const float* logits, const float* bias, int32_t* ids, float* w,
           std::vector<int32_t>& scratch);

// y[N, D] = the MoE on x[N, D] (already normalized). The step's tokens are grouped by expert, so
// each chosen expert's weights are read once per step and the others not at all; each token sums
// its experts in ascending expert order (the same bits alone or in a batch of up to 8 decode
// tokens). Traces moe.router_logits, moe.expert_ids, moe.expert_weights, moe.latent and moe.routed
// (latent space), moe.shared, moe.out.
void forward(const Moe& m, const Call& call, const float* x, float* y, Moe::Buffers& buf, const Trace& trace);

// How forward() runs the routed experts under the row split `s` (kernels/row_split.h; null: none):
// whole on every rank (no split, streamed experts, or matrices under the split's min_bytes), each
// split inside itself by rows (every rank its rows of each expert), or placed by rank
// (RowSplit::experts_by_rank: rank r runs experts [E·r/P, E·(r+1)/P) whole). The one rule for what a
// rank reads of them (apps/lineage/ranks.cpp unmaps the rest).
enum class RoutedSplit { Whole, Rows, ByRank };
RoutedSplit routed_split_mode(const Moe& m, const kernels::RowSplit* s);

// Training (train_step.h), the same routing and sums as forward() over B·T rows. The router's
// gradient flows through the chosen experts' weights (kernels/moe_router_backward.h); the top-k
// choice and e_score_correction_bias take none (the bias's gradient stays 0: DeepSeek-V3 moves it by
// load balance, not by the loss).
void forward_train(const Moe& m, const TrainShape& s, const float* x, float* y, Moe::Saved& saved);
void backward(const Moe& m, const TrainShape& s, const float* x, const float* dy, Moe::Saved& saved, float* dx,
              Moe& grad);

}  // namespace lineage::layers
