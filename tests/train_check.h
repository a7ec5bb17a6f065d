// What the model-level training tests share: the directional derivative of a model's loss along a
// seeded random direction of one parameter tensor, by finite differences, against ⟨g, d⟩.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "lineage/core/rng.h"
#include "lineage/train/backprop.h"

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

}  // namespace lineage::test
