#include "lineage/kernels/ref/ref.h"

#include <cmath>
#include <vector>

#include "lineage/core/error.h"

namespace lineage::kernels::ref {

double mxfp4_element(const Tensor& codes, const Tensor& scales, int64_t o, int64_t c) {
  static constexpr double kMagnitude[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  const uint8_t byte = static_cast<const uint8_t*>(codes.raw())[o * codes.dim(1) + c / 2];
  const int code = c % 2 ? byte >> 4 : byte & 15;
  const int s = static_cast<const uint8_t*>(scales.raw())[o * scales.dim(1) + c / 32];
  if (s == 255) return std::nan("");
  return (code & 8 ? -1.0 : 1.0) * kMagnitude[code & 7] * std::ldexp(1.0, s - 127);
}

namespace {

void linear_mxfp4(const float* x, int64_t T, const Weight& W, const std::vector<float>& b, float* y) {
  const int64_t in = W.in(), out = W.out();
  std::vector<double> row(in);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t c = 0; c < in; ++c) row[c] = mxfp4_element(*W.w, *W.scales, o, c);
    for (int64_t t = 0; t < T; ++t) {
      double acc = b[o];
      for (int64_t c = 0; c < in; ++c) acc += double(x[t * in + c]) * row[c];
      y[t * out + o] = float(acc);
    }
  }
}

}  // namespace

void linear(const float* x, int64_t T, const Weight& W, const Tensor* bias, float* y) {
  const int64_t in = W.in(), out = W.out();
  if (W.mxfp4()) {
    std::vector<float> b(out, 0.0f);
    if (bias) widen_row(*bias, 0, out, b.data());
    linear_mxfp4(x, T, W, b, y);
    return;
  }
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
