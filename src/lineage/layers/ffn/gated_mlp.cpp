#include "lineage/layers/ffn/gated_mlp.h"

#include <cmath>
#include <cstring>

#include "lineage/core/parallel.h"
#include "lineage/kernels/activation.h"
#include "lineage/kernels/backward.h"
#include "lineage/kernels/glu_backward.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/vmath.h"

namespace lineage::layers {

void GatedMlp::for_each_tensor(const std::string& p, const TensorVisitor& f) {
  const int64_t D = config.d_model, F = config.hidden;
  visit_matrix(f, p + "." + names.gate + ".weight", weights.gate_proj, F, D);
  visit_matrix(f, p + "." + names.up + ".weight", weights.up_proj, F, D);
  visit_matrix(f, p + "." + names.down + ".weight", weights.down_proj, D, F);
}

std::string GatedMlp::describe() const {
  return std::string(config.act == Act::Situ ? "SiTU" : "SwiGLU") + " MLP " + std::to_string(config.d_model) + " -> " + std::to_string(config.hidden) + " -> " +
         std::to_string(config.d_model);
}

void forward(const GatedMlp& m, const Call& call, const float* x, float* y, GatedMlp::Buffers& buf,
             const Trace& trace) {
  forward_rows(m, x, call.step.n_tokens(), y, buf, call.options.bf16_dot);
  trace("mlp.out", y, {call.step.n_tokens(), m.config.d_model});
}

namespace {

// g ← SiLU(g) ⊙ u (or SiTU(g, u)) over T rows of F, one pass over the rows split across the threads
// (prefill).
void glu(const GatedMlp::Config& c, float* g, const float* u, int64_t T, int64_t F) {
  const auto gate = [&](int64_t t0, int64_t t1) {
    float* gt = g + t0 * F;
    const float* ut = u + t0 * F;
    if (c.act == GatedMlp::Act::Situ) {
      kernels::situ_glu(gt, ut, (t1 - t0) * F, c.situ_beta, c.situ_linear_beta);
      return;
    }
    kernels::activate_serial(kernels::Activation::Silu, gt, (t1 - t0) * F);
    for (int64_t i = 0; i < (t1 - t0) * F; ++i) gt[i] *= ut[i];
  };
  if (T > 1) parallel_for(T, gate, grain_for(20 * F));
  else gate(0, T);  // one token: no std::function to build
}

}  // namespace

void gate_rows(const GatedMlp::Config& c, float* g, const float* u, int64_t T, int64_t width) { glu(c, g, u, T, width); }

void forward_rows(const GatedMlp& m, const float* x, int64_t T, float* y, GatedMlp::Buffers& buf, bool dot) {
  const int64_t F = m.config.hidden;
  float* g = buf.gate.get(size_t(T) * F);
  float* u = buf.up.get(size_t(T) * F);
  const kernels::LinearOut gate_up[] = {{m.weights.gate_proj.view(dot), nullptr, g},
                                        {m.weights.up_proj.view(dot), nullptr, u}};
  kernels::linear_group(x, T, gate_up);
  glu(m.config, g, u, T, F);
  kernels::linear(g, T, m.weights.down_proj, nullptr, y, std::nullopt, dot);
}

void forward_train(const GatedMlp& m, const TrainShape& s, const float* x, float* y, GatedMlp::Saved& saved) {
  const int64_t F = m.config.hidden, N = s.N();
  float* g = saved.gate.get(size_t(N) * F);
  float* u = saved.up.get(size_t(N) * F);
  float* h = saved.hidden.get(size_t(N) * F);
  kernels::linear(x, N, m.weights.gate_proj, nullptr, g);
  kernels::linear(x, N, m.weights.up_proj, nullptr, u);
  std::memcpy(h, g, size_t(N * F) * sizeof(float));
  glu(m.config, h, u, N, F);
  kernels::linear(h, N, m.weights.down_proj, nullptr, y);
}

void backward(const GatedMlp& m, const TrainShape& s, const float* x, const float* dy, GatedMlp::Saved& saved,
              float* dx, GatedMlp& grad) {
  const GatedMlp::Config& c = m.config;
  const int64_t D = c.d_model, F = c.hidden, N = s.N();
  float* dh = saved.d_hidden.get(size_t(N) * F);
  float* du = saved.d_up.get(size_t(N) * F);
  kernels::linear_backward(saved.hidden.get(0), dy, N, m.weights.down_proj, dh, &grad.weights.down_proj, nullptr);
  const float* g = saved.gate.get(0);
  const float* u = saved.up.get(0);
  if (c.act == GatedMlp::Act::Situ)
    kernels::situ_glu_backward(g, u, dh, N * F, c.situ_beta, c.situ_linear_beta, dh, du);
  else kernels::swiglu_backward(g, u, dh, N * F, dh, du);
  float* dx_up = saved.d_x.get(size_t(N) * D);
  kernels::linear_backward(x, dh, N, m.weights.gate_proj, dx, &grad.weights.gate_proj, nullptr);
  kernels::linear_backward(x, du, N, m.weights.up_proj, dx_up, &grad.weights.up_proj, nullptr);
  parallel_for(N * D, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) dx[i] += dx_up[i];
  }, 1 << 14);
}

}  // namespace lineage::layers
