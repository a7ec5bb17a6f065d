// Two-layer MLP with a GELU between (GPT-2: Conv1D c_fc [D, F] and c_proj [F, D], with biases).
#pragma once

#include "lineage/kernels/activation.h"
#include "lineage/kernels/linear.h"
#include "lineage/layers/common.h"

namespace lineage::layers {

struct Mlp {
  struct Config {
    int64_t d_model = 0, hidden = 0;  // D, F
    kernels::Activation act = kernels::Activation::GeluTanh;
  };
  struct Weights {
    Tensor c_fc_weight;    // [D, F] Conv1D [in, out]
    Tensor c_fc_bias;      // [F]
    Tensor c_proj_weight;  // [F, D] Conv1D [in, out]
    Tensor c_proj_bias;    // [D]
    // How c_fc and c_proj are stored: as checkpoints have them, or [out, in] after store_out_in.
    kernels::Layout layout = kernels::Layout::InOut;
  };
  struct Buffers {
    Buffer hidden;  // [N, F]
  };
  Config config;
  Weights weights;
  void for_each_tensor(const std::string& prefix, const TensorVisitor& f);
  std::string describe() const;
};

// Transposes c_fc and c_proj into owned [out, in] tensors (no-op when they are already).
void store_out_in(Mlp& m);

// y[N, D] = c_proj(act(c_fc(x))) over the step's N rows. y must not alias x. Traces mlp.act, mlp.out.
void forward(const Mlp& m, const Call& call, const float* x, float* y, Mlp::Buffers& buf, const Trace& trace);

}  // namespace lineage::layers
