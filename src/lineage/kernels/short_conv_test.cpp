// The short convolution: the prefill form against a double-precision formula, and one-token steps
// over channel ranges (as the decode GEMV's row chunks run them) against the prefill form.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "lineage/core/rng.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/short_conv.h"

namespace lineage::kernels {
namespace short_conv_test {
namespace {

std::vector<float> normals(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  Rng rng(seed);
  for (float& x : v) x = rng.normal();
  return v;
}

Tensor conv_weight(int64_t C, int64_t W, DType dt, uint64_t seed) {
  Tensor f = Tensor::empty(DType::F32, {C, 1, W});
  const auto v = normals(C * W, seed);
  std::memcpy(f.data<float>(), v.data(), v.size() * sizeof(float));
  return dt == DType::F32 ? f : convert(f, dt);
}

// y[t, c] = act(Σ_j w[c, j] · [tail; x][t + j, c]) in double, w as stored (bf16 values widened).
std::vector<float> conv_formula(const std::vector<float>& x, int64_t T, int64_t C, const Tensor& w,
                                const std::vector<float>& tail, bool silu) {
  const int64_t W = w.dim(-1), P = W - 1;
  std::vector<float> wf(static_cast<size_t>(C * W));
  widen_row(w, 0, C * W, wf.data());
  std::vector<float> y(size_t(T * C));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double s = 0;
      for (int64_t j = 0; j < W; ++j) {
        const int64_t r = t + j;  // row of [tail; x]
        const float in = r < P ? tail[size_t(r * C + c)] : x[size_t((r - P) * C + c)];
        s += double(wf[size_t(c * W + j)]) * in;
      }
      y[size_t(t * C + c)] = float(silu ? s / (1.0 + std::exp(-s)) : s);
    }
  return y;
}

TEST(ShortConv, PrefillMatchesFormulaAndStepsMatchPrefillBitForBit) {
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t W : {2, 4, 5})
      for (bool silu : {false, true}) {
        const int64_t C = 300, T = 3, P = W - 1;
        const Tensor w = conv_weight(C, W, dt, uint64_t(W * 7 + int(dt)));
        const auto x = normals(T * C, 11);
        const auto tail0 = normals(P * C, 12);
        const std::string where = "dtype " + std::string(dtype_name(dt)) + " W " + std::to_string(W) +
                                  (silu ? " silu" : "");

        // Prefill: T rows at once.
        std::vector<float> tail = tail0, y(size_t(T * C));
        short_conv(x.data(), T, C, C, w, tail.data(), C, silu, y.data(), C);
        const auto want = conv_formula(x, T, C, w, tail0, silu);
        for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << where << " i " << i;
        for (int64_t r = 0; r < P; ++r)  // the new tail is the last P rows of [tail; x]
          for (int64_t c = 0; c < C; ++c) {
            const int64_t src = T + r;
            const float expect = src < P ? tail0[size_t(src * C + c)] : x[size_t((src - P) * C + c)];
            ASSERT_EQ(tail[size_t(r * C + c)], expect) << where;
          }

        // Decode: the same rows one at a time, each over uneven channel ranges, in a tail whose rows
        // are wider than C (this convolution's channels sit at an offset among others').
        const int64_t ld = C + 40, off = 17;
        std::vector<float> shared(size_t(P * ld), -7.0f);
        for (int64_t r = 0; r < P; ++r) std::memcpy(&shared[size_t(r * ld + off)], &tail0[size_t(r * C)], C * 4);
        std::vector<float> ys(size_t(T * C), -1.0f);
        for (int64_t t = 0; t < T; ++t)
          for (auto [c0, c1] : {std::pair<int64_t, int64_t>{128, 300}, {0, 37}, {37, 128}})
            short_conv_step(x.data() + t * C, c0, c1, w, shared.data() + off, ld, silu, ys.data() + t * C);
        for (size_t i = 0; i < ys.size(); ++i) ASSERT_EQ(ys[i], y[i]) << where << " i " << i;
        for (int64_t r = 0; r < P; ++r)
          for (int64_t c = -off; c < ld - off; ++c) {
            const float got = shared[size_t(r * ld + off + c)];
            if (c < 0 || c >= C) ASSERT_EQ(got, -7.0f) << where << ": a channel outside the range was written";
            else ASSERT_EQ(got, tail[size_t(r * C + c)]) << where;
          }
      }
}

}  // namespace
}  // namespace short_conv_test
}  // namespace lineage::kernels
