#include "lineage/train/adamw.h"

#include <cmath>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"

namespace lineage::train {

AdamW::AdamW(std::span<const ParamRef> params) {
  for (const ParamRef& p : params) {
    m_.emplace_back(size_t(p.n), 0.0f);
    v_.emplace_back(size_t(p.n), 0.0f);
  }
}

void AdamW::step(std::span<const ParamRef> params, const AdamWConfig& c, double lr, float grad_scale) {
  LINEAGE_CHECK(params.size() == m_.size());
  ++t_;
  const float b1 = float(c.beta1), b2 = float(c.beta2);
  const float bc1 = float(1.0 - std::pow(c.beta1, double(t_))), bc2 = float(1.0 - std::pow(c.beta2, double(t_)));
  const float step_size = float(lr) / bc1, eps = float(c.eps);
  const float bc2_sqrt = std::sqrt(bc2);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamRef& p = params[i];
    LINEAGE_CHECK(int64_t(m_[i].size()) == p.n);
    const float decay = p.decay ? float(1.0 - lr * c.weight_decay) : 1.0f;
    float* w = p.value;
    const float* g = p.grad;
    float* m = m_[i].data();
    float* v = v_[i].data();
    parallel_for(p.n, [&](int64_t a, int64_t b) {
      for (int64_t j = a; j < b; ++j) {
        const float gj = g[j] * grad_scale;
        m[j] = b1 * m[j] + (1.0f - b1) * gj;
        v[j] = b2 * v[j] + (1.0f - b2) * gj * gj;
        w[j] = w[j] * decay - step_size * m[j] / (std::sqrt(v[j]) / bc2_sqrt + eps);
      }
    }, 1 << 14);
  }
}

double grad_norm(std::span<const ParamRef> params) {
  double s = 0;
  for (const ParamRef& p : params)
    for (int64_t j = 0; j < p.n; ++j) s += double(p.grad[j]) * double(p.grad[j]);
  return std::sqrt(s);
}

double schedule_lr(int64_t step, int64_t total, int64_t warmup, double lr, double min_lr) {
  if (warmup > 0 && step < warmup) return lr * double(step + 1) / double(warmup);
  const int64_t span = total - warmup;
  if (span <= 1) return lr;
  const double progress = std::min(1.0, double(step - warmup) / double(span - 1));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(3.141592653589793 * progress));
}

}  // namespace lineage::train
