// AdamW (Loshchilov & Hutter 2019, decoupled weight decay) over f32 master weights, with the
// learning-rate schedule (linear warm-up, cosine decay to a floor) and global-norm gradient clipping.
// Matches torch.optim.AdamW's update order (bias-corrected moments, decay applied to the weights).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace lineage::train {

struct AdamWConfig {
  double lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// One parameter tensor the optimizer updates: its f32 values, the gradient (same length), and
// whether weight decay applies (matrices and embeddings yes; norms, biases and other 1-D tensors no).
struct ParamRef {
  std::string name;
  float* value = nullptr;
  const float* grad = nullptr;
  int64_t n = 0;
  bool decay = true;
};

// Adam's moments for a list of parameters, in the list's order. step() counts from 1.
class AdamW {
 public:
  AdamW() = default;
  explicit AdamW(std::span<const ParamRef> params);
  // One update at learning rate `lr` (the schedule's value for this step), gradients scaled by
  // `grad_scale` first (clipping and averaging over accumulated micro-batches). Threaded over
  // elements; the same bits for any thread count (each element is updated on its own).
  void step(std::span<const ParamRef> params, const AdamWConfig& c, double lr, float grad_scale);
  int64_t steps() const { return t_; }
  // The moments as flat arrays (m then v per parameter), for the optimizer's checkpoint file.
  std::vector<std::vector<float>>& m() { return m_; }
  std::vector<std::vector<float>>& v() { return v_; }
  const std::vector<std::vector<float>>& m() const { return m_; }
  const std::vector<std::vector<float>>& v() const { return v_; }
  void set_steps(int64_t t) { t_ = t; }

 private:
  std::vector<std::vector<float>> m_, v_;
  int64_t t_ = 0;
};

// √(Σ grad²) over every parameter, summed in double in the list's order (deterministic).
double grad_norm(std::span<const ParamRef> params);

// The learning rate at step `step` (0-based) of `total`: linear warm-up from lr/warmup to lr over
// `warmup` steps, then cosine decay to min_lr at the last step.
double schedule_lr(int64_t step, int64_t total, int64_t warmup, double lr, double min_lr);

}  // namespace lineage::train
