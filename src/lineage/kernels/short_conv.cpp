#include "lineage/kernels/short_conv.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "lineage/core/parallel.h"
#include "lineage/kernels/activation.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/vmath.h"

namespace lineage::kernels {

namespace {

// The weights of channels [c0, c0 + n) of w [C, 1, W], widened into wf and laid out tap-major [W, n]
// in taps, so the channel loops of conv_taps run over contiguous taps.
void tap_major(const Tensor& w, int64_t c0, int64_t n, int64_t W, std::vector<float>& wf, std::vector<float>& taps) {
  wf.resize(size_t(n * W));
  taps.resize(size_t(n * W));
  widen_row(w, c0 * W, n * W, wf.data());
  for (int64_t c = 0; c < n; ++c)
    for (int64_t j = 0; j < W; ++j) taps[size_t(j * n + c)] = wf[size_t(c * W + j)];
}

}  // namespace

void short_conv(const float* x, int64_t T, int64_t C, int64_t ldx, const Tensor& w, float* tail, int64_t ld_tail,
                bool silu, float* y, int64_t ldy) {
  const int64_t W = w.dim(-1), P = W - 1;
  thread_local std::vector<float> wf, wt, next;  // reused: no allocation per decode step
  tap_major(w, 0, C, W, wf, wt);
  const float* taps = wt.data();  // a thread_local named inside the lambda would be the worker's own
  // Input row r of the padded sequence [tail; x]: r < P comes from the tail, otherwise x[r − P].
  const auto row = [&](int64_t r) { return r < P ? tail + r * ld_tail : x + (r - P) * ldx; };
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<const float*> rows;  // named here, so each thread has its own
    rows.resize(size_t(W));
    for (int64_t t = t0; t < t1; ++t) {
      float* yt = y + t * ldy;
      for (int64_t j = 0; j < W; ++j) rows[size_t(j)] = row(t + j);
      conv_taps(rows.data(), taps, C, W, 0, C, yt);
      if (silu) activate_serial(Activation::Silu, yt, C);  // already one thread's share
    }
  }, grain_for(C * W * 4));
  // New tail: the last P rows of [tail; x].
  next.resize(P * C);
  for (int64_t r = 0; r < P; ++r) std::memcpy(next.data() + r * C, row(T + r), C * sizeof(float));
  for (int64_t r = 0; r < P; ++r) std::memcpy(tail + r * ld_tail, next.data() + r * C, C * sizeof(float));
}

void short_conv_step(const float* x, int64_t c0, int64_t c1, const Tensor& w, float* tail, int64_t ld_tail, bool silu,
                     float* y) {
  const int64_t W = w.dim(-1), P = W - 1;
  const int64_t block = std::max<int64_t>(1, 1024 / W);  // channels whose widened taps stay in L1
  thread_local std::vector<float> wf, taps;
  thread_local std::vector<const float*> rows;
  rows.resize(size_t(W));
  for (int64_t b = c0; b < c1; b += block) {
    const int64_t n = std::min(block, c1 - b);
    tap_major(w, b, n, W, wf, taps);
    for (int64_t j = 0; j < P; ++j) rows[size_t(j)] = tail + j * ld_tail + b;
    rows[size_t(P)] = x + b;
    conv_taps(rows.data(), taps.data(), n, W, 0, n, y + b);
    if (silu) activate_serial(Activation::Silu, y + b, n);
  }
  for (int64_t r = 0; r + 1 < P; ++r)
    std::memcpy(tail + r * ld_tail + c0, tail + (r + 1) * ld_tail + c0, size_t(c1 - c0) * sizeof(float));
  if (P > 0) std::memcpy(tail + (P - 1) * ld_tail + c0, x + c0, size_t(c1 - c0) * sizeof(float));
}

}  // namespace lineage::kernels
