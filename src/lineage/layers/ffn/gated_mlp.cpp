#include "lineage/layers/ffn/gated_mlp.h"

#include <cmath>

#include "lineage/core/parallel.h"
#include "lineage/kernels/activation.h"
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

void forward_rows(const GatedMlp& m, const float* x, int64_t T, float* y, GatedMlp::Buffers& buf, bool dot) {
  const int64_t F = m.config.hidden;
  float* g = buf.gate.get(size_t(T) * F);
  float* u = buf.up.get(size_t(T) * F);
  const kernels::LinearOut gate_up[] = {{m.weights.gate_proj.view(dot), nullptr, g},
                                        {m.weights.up_proj.view(dot), nullptr, u}};
  kernels::linear_group(x, T, gate_up);
  // g ← SiLU(g) ⊙ u (or SiTU(g, u)), one pass over the rows split across the threads (prefill).
  const GatedMlp::Config& c = m.config;
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
  kernels::linear(g, T, m.weights.down_proj, nullptr, y, std::nullopt, dot);
}

}  // namespace lineage::layers
