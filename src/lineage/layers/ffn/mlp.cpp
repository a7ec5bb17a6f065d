#include "lineage/layers/ffn/mlp.h"

#include <cstring>

#include "lineage/kernels/backward.h"
#include "lineage/kernels/linear.h"

namespace lineage::layers {

std::string Mlp::describe() const {
  const char* act = config.act == kernels::Activation::GeluTanh ? "gelu_new"
                    : config.act == kernels::Activation::GeluErf ? "gelu"
                    : config.act == kernels::Activation::Silu    ? "silu"
                                                                  : "relu";
  return std::string("MLP ") + std::to_string(config.d_model) + " -> " + std::to_string(config.hidden) + " (" + act +
         ") -> " + std::to_string(config.d_model);
}

void Mlp::for_each_tensor(const std::string& prefix, const TensorVisitor& f) {
  const int64_t D = config.d_model, F = config.hidden;
  visit_matrix(f, prefix + ".c_fc.weight", weights.c_fc, F, D);
  f(prefix + ".c_fc.bias", weights.c_fc_bias, {F}, Init::Zeros);
  visit_matrix(f, prefix + ".c_proj.weight", weights.c_proj, D, F);
  f(prefix + ".c_proj.bias", weights.c_proj_bias, {D}, Init::Zeros);
}

void forward(const Mlp& m, const Call& call, const float* x, float* y, Mlp::Buffers& buf, const Trace& trace) {
  const int64_t D = m.config.d_model, F = m.config.hidden, T = call.step.n_tokens();
  const bool dot = call.options.bf16_dot;
  float* h = buf.hidden.get(size_t(T) * F);
  kernels::linear(x, T, m.weights.c_fc, &m.weights.c_fc_bias, h, m.config.act, dot);
  trace("mlp.act", h, {T, F});
  kernels::linear(h, T, m.weights.c_proj, &m.weights.c_proj_bias, y, std::nullopt, dot);
  trace("mlp.out", y, {T, D});
}

void forward_train(const Mlp& m, const TrainShape& s, const float* x, float* y, Mlp::Saved& saved) {
  const int64_t F = m.config.hidden, N = s.N();
  float* pre = saved.pre.get(size_t(N) * F);
  float* h = saved.hidden.get(size_t(N) * F);
  kernels::linear(x, N, m.weights.c_fc, &m.weights.c_fc_bias, pre);
  std::memcpy(h, pre, size_t(N * F) * sizeof(float));
  kernels::activate(m.config.act, h, N * F);
  kernels::linear(h, N, m.weights.c_proj, &m.weights.c_proj_bias, y);
}

void backward(const Mlp& m, const TrainShape& s, const float* x, const float* dy, Mlp::Saved& saved, float* dx,
              Mlp& grad) {
  const int64_t F = m.config.hidden, N = s.N();
  float* dh = saved.d_hidden.get(size_t(N) * F);
  kernels::linear_backward(saved.hidden.get(0), dy, N, m.weights.c_proj, dh, &grad.weights.c_proj,
                           grad.weights.c_proj_bias.data<float>());
  kernels::activation_backward(m.config.act, saved.pre.get(0), dh, dh, N * F);
  kernels::linear_backward(x, dh, N, m.weights.c_fc, dx, &grad.weights.c_fc, grad.weights.c_fc_bias.data<float>());
}

}  // namespace lineage::layers
