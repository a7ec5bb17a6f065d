// Gated MLP (GLU): down(act(gate(x)) ⊙ up(x)), nn.Linear weights [out, in], no biases.
// fla GatedMLP and Llama-style MLPs use SiLU ("swish"); Kimi K3 SiTU (spec §5).
#pragma once

#include "lineage/layers/common.h"
#include "lineage/layers/train_step.h"

namespace lineage::layers {

struct GatedMlp {
  // The gate's activation: SwiGLU's SiLU(g)·u, or Kimi K3's SiTU-GLU β·tanh(g/β)·σ(g) · β_lin·tanh(u/β_lin)
  // (situ_linear_beta 0: u uncapped), fused into the one pass over g and u.
  enum class Act : uint8_t { Silu, Situ };
  struct Config {
    int64_t d_model = 0, hidden = 0;  // D, F
    Act act = Act::Silu;
    float situ_beta = 4.0f, situ_linear_beta = 25.0f;
  };
  // Checkpoint names of the three matrices (Kimi's routed experts: w1, w3, w2).
  struct Names {
    std::string gate = "gate_proj", up = "up_proj", down = "down_proj";
  };
  struct Weights {
    kernels::Matrix gate_proj;  // [F, D]
    kernels::Matrix up_proj;    // [F, D]
    kernels::Matrix down_proj;  // [D, F]
  };
  struct Buffers {
    Buffer gate, up;  // [N, F] each
  };
  // Training (train_step.h): the gate and up projections [N, F] before the gate's activation, the
  // gated product down_proj reads [N, F]; backward's ∂L/∂(that product, then the gate) and ∂L/∂up
  // [N, F], and the up projection's share of ∂L/∂x [N, D].
  struct Saved {
    Buffer gate, up, hidden, d_hidden, d_up, d_x;
  };
  Config config;
  Weights weights;
  Names names;
  void for_each_tensor(const std::string& prefix, const TensorVisitor& f);
  void for_each_matrix(const MatrixVisitor& f) { f(weights.gate_proj), f(weights.up_proj), f(weights.down_proj); }
  std::string describe() const;
};

// y[N, D] = down(silu(gate(x)) ⊙ up(x)) over the step's N rows. y must not alias x. Traces mlp.out.
void forward(const GatedMlp& m, const Call& call, const float* x, float* y, GatedMlp::Buffers& buf,
             const Trace& trace);
// The same over any T rows (a routed expert's tokens), untraced.
void forward_rows(const GatedMlp& m, const float* x, int64_t T, float* y, GatedMlp::Buffers& buf, bool bf16_dot);
// The gate's activation on T rows of `width` gate and up values (all F of a row, or one rank's share
// of them under tensor parallelism): g ← SiLU(g) ⊙ u (or SiTU(g, u)), element by element.
void gate_rows(const GatedMlp::Config& c, float* g, const float* u, int64_t T, int64_t width);

// Training (train_step.h); the gate's derivative from kernels/glu_backward.h.
void forward_train(const GatedMlp& m, const TrainShape& s, const float* x, float* y, GatedMlp::Saved& saved);
void backward(const GatedMlp& m, const TrainShape& s, const float* x, const float* dy, GatedMlp::Saved& saved,
              float* dx, GatedMlp& grad);

}  // namespace lineage::layers
