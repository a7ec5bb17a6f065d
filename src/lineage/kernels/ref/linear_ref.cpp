#include "lineage/kernels/ref/ref.h"

#include <vector>

#include "lineage/core/error.h"

namespace lineage::kernels::ref {

void linear(const float* x, int64_t T, const Weight& W, const Tensor* bias, float* y) {
  const int64_t in = W.in(), out = W.out();
  std::vector<float> w_row(W.w->numel());
  widen_row(*W.w, 0, W.w->numel(), w_row.data());
  std::vector<float> b(out, 0.0f);
  if (bias) widen_row(*bias, 0, out, b.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double acc = b[o];
      for (int64_t i = 0; i < in; ++i) {
        const float w = W.layout == Layout::OutIn ? w_row[o * in + i] : w_row[i * out + o];
        acc += double(x[t * in + i]) * double(w);
      }
      y[t * out + o] = float(acc);
    }
}

}  // namespace lineage::kernels::ref
