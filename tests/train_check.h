// What the model-level training tests share: the directional derivative of a model's loss along a
// seeded random direction of one parameter tensor, by finite differences, against ⟨g, d⟩; every
// gradient in one vector; gradients at 1 and 2 threads; the held-out loss of a short run on a
// repeating sequence.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <gtest/gtest.h>
#include <vector>

#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/train/backprop.h"
#include "lineage/train/trainer.h"
#include "test_support.h"

namespace lineage::test {

struct Directional {
  double fd = 0;  // the finite difference of the loss along d
  double gd = 0;  // ⟨g, d⟩ from the backward
};

// d ~ N(0, 1) seeded by `seed`; central differences at steps 2ε and ε (ε = eps / rms(d) per element),
// Richardson-combined so their ε² terms cancel. `loss` evaluates the model as it stands (no
// gradients); p's values are restored and the model refreshed after each evaluation.
inline Directional directional_derivative(train::Backprop& bp, const train::ParamRef& p, uint64_t seed, double eps,
                                          const std::function<double()>& loss) {
  Rng r(seed);
  std::vector<float> d(static_cast<size_t>(p.n)), keep(p.value, p.value + p.n);
  Directional out;
  double dd = 0;
  for (int64_t j = 0; j < p.n; ++j) {
    const double dj = d[size_t(j)] = r.normal();
    out.gd += double(p.grad[j]) * dj, dd += dj * dj;
  }
  const double step = eps / std::sqrt(dd / double(p.n));
  const auto loss_at = [&](double s) {
    for (int64_t j = 0; j < p.n; ++j) p.value[j] = float(keep[size_t(j)] + s * d[size_t(j)]);
    bp.refresh();
    const double l = loss();
    std::copy(keep.begin(), keep.end(), p.value);
    return l;
  };
  const double fd2 = (loss_at(2 * step) - loss_at(-2 * step)) / (4 * step);
  const double fd1 = (loss_at(step) - loss_at(-step)) / (2 * step);
  out.fd = (4 * fd1 - fd2) / 3;
  bp.refresh();
  return out;
}

// Every parameter's gradient, in params() order.
inline std::vector<float> all_grads(train::Backprop& bp) {
  std::vector<float> all;
  for (const train::ParamRef& p : bp.params()) all.insert(all.end(), p.grad, p.grad + p.n);
  return all;
}

// The gradients of one step of `make()`'s model over 3 seeded sequences of 30 tokens (ids < vocab)
// are the same at 1 and 2 threads, to 1e-5 relative RMS (sums may split differently).
inline void expect_thread_count_invariant(const std::function<model::Model()>& make, int64_t vocab) {
  std::vector<std::vector<float>> grads;
  const std::vector<int32_t> tokens = random_tokens(3 * 31, vocab, 8);
  for (const int threads : {1, 2}) {
    ScopedThreads st(threads);
    model::Model m = make();
    train::Backprop bp(m);
    bp.step(tokens, 3, 30, 1.0f / 90);
    grads.push_back(all_grads(bp));
  }
  EXPECT_LE(rel_rms(grads[1].data(), grads[0].data(), int64_t(grads[0].size())), 1e-5);
}

struct HeldOut {
  double before = 0, after = 0;  // the held-out loss before training and after 60 steps
};

// 60 steps (batch 4 × 24, lr 1e-2 after 5 warm-up steps, cosine to 1e-3) on a sequence that repeats
// with period 7 (seeded ids < vocab); held out: the same cycle at other offsets.
inline HeldOut train_on_a_cycle(model::Model& m, int64_t vocab) {
  const std::vector<int32_t> cycle = random_tokens(7, vocab, 9);
  train::TokenData data;
  for (int64_t i = 0; i < 2000; ++i) data.train.push_back(cycle[size_t(i % 7)]);
  for (int64_t i = 0; i < 500; ++i) data.val.push_back(cycle[size_t((i + 3) % 7)]);
  train::TrainConfig c;
  c.batch = 4, c.seq_len = 24, c.steps = 60, c.warmup = 5, c.lr = 1e-2, c.min_lr = 1e-3;
  c.eval_every = 20, c.eval_batches = 2;
  train::Trainer tr(m, c, data);
  HeldOut out;
  out.before = tr.evaluate();
  train::LogRow last;
  while (tr.steps_done() < c.steps) last = tr.step();
  EXPECT_TRUE(last.val_loss.has_value());
  out.after = last.val_loss.value_or(INFINITY);
  return out;
}

}  // namespace lineage::test
