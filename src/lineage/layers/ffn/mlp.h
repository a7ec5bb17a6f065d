// Two-layer MLP with a GELU between (GPT-2: Conv1D c_fc [D, F] and c_proj [F, D], with biases).
#pragma once

#include "lineage/kernels/activation.h"
#include "lineage/kernels/linear.h"
#include "lineage/layers/common.h"
#include "lineage/layers/train_step.h"

namespace lineage::layers {

struct Mlp {
  struct Config {
    int64_t d_model = 0, hidden = 0;  // D, F
    kernels::Activation act = kernels::Activation::GeluTanh;
  };
  struct Weights {
    kernels::Matrix c_fc;    // [F, D] (GPT-2 stores Conv1D [in, out])
    Tensor c_fc_bias;        // [F]
    kernels::Matrix c_proj;  // [D, F]
    Tensor c_proj_bias;      // [D]
  };
  struct Buffers {
    Buffer hidden;  // [N, F]
  };
  // Training: the hidden layer before and after the activation [N, F], and its gradient.
  struct Saved {
    Buffer pre, hidden, d_hidden;
  };
  Config config;
  Weights weights;
  void for_each_tensor(const std::string& prefix, const TensorVisitor& f);
  void for_each_matrix(const MatrixVisitor& f) { f(weights.c_fc), f(weights.c_proj); }
  std::string describe() const;
};

// y[N, D] = c_proj(act(c_fc(x))) over the step's N rows. y must not alias x. Traces mlp.act, mlp.out.
void forward(const Mlp& m, const Call& call, const float* x, float* y, Mlp::Buffers& buf, const Trace& trace);

// Training (train_step.h).
void forward_train(const Mlp& m, const TrainShape& s, const float* x, float* y, Mlp::Saved& saved);
void backward(const Mlp& m, const TrainShape& s, const float* x, const float* dy, Mlp::Saved& saved, float* dx,
              Mlp& grad);

}  // namespace lineage::layers
