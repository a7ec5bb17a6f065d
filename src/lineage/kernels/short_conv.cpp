#include "lineage/kernels/short_conv.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "lineage/core/parallel.h"
#include "lineage/kernels/activation.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/vmath.h"

namespace lineage::kernels {

void short_conv(const float* x, int64_t T, int64_t C, int64_t ldx, const Tensor& w, float* tail, bool silu,
                float* y, int64_t ldy) {
  const int64_t W = w.dim(-1), P = W - 1;
  thread_local std::vector<float> wf, wt, next;  // reused: no allocation per decode step
  wf.resize(C * W);
  widen_row(w, 0, C * W, wf.data());
  wt.resize(W * C);  // tap-major [W, C], so the channel loops below run over contiguous taps
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < W; ++j) wt[j * C + c] = wf[c * W + j];
  const float* taps = wt.data();  // a thread_local named inside the lambda would be the worker's own
  // Input row r of the padded sequence [tail; x]: r < P comes from the tail, otherwise x[r − P].
  const auto row = [&](int64_t r) { return r < P ? tail + r * C : x + (r - P) * ldx; };
  parallel_for(C, [&](int64_t c0, int64_t c1) {
    thread_local std::vector<const float*> rows;  // named here, so each thread has its own
    rows.resize(size_t(W));
    for (int64_t t = 0; t < T; ++t) {
      float* yt = y + t * ldy;
      for (int64_t j = 0; j < W; ++j) rows[size_t(j)] = row(t + j);
      conv_taps(rows.data(), taps, C, W, c0, c1, yt);
      if (silu) activate(Activation::Silu, yt + c0, c1 - c0);
    }
  }, std::max<int64_t>(64, grain_for(T * W)));
  // New tail: the last P rows of [tail; x].
  next.resize(P * C);
  for (int64_t r = 0; r < P; ++r) std::memcpy(next.data() + r * C, row(T + r), C * sizeof(float));
  std::memcpy(tail, next.data(), P * C * sizeof(float));
}

}  // namespace lineage::kernels
