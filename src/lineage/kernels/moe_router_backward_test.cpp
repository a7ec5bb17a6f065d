// The MoE router weights' backward: the scalar twin against central finite differences in double
// (relative error <= 1e-6), then the fast f32 kernel against it with 1 and 2 threads, over
// renormalized and plain weights, k = 1 and k > 1, with and without the bias in the weights, sigmoid
// (Kimi's) and softmax (Qwen's) routers.
#include "lineage/kernels/moe_router_backward.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "grad_check.h"
#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/kernels/ref/moe_router_ref.h"

namespace lineage::kernels {
namespace moe_router_backward_test {
namespace {

struct RouterCase {
  int64_t N, E, k;
  bool renormalize, bias;
  double scaling;
  bool softmax = false;
};

const RouterCase kCases[] = {{5, 8, 2, true, false, 2.446}, {7, 6, 3, true, true, 1.0}, {3, 4, 1, true, false, 1.5},
                             {9, 16, 4, false, false, 1.0}, {33, 5, 2, false, true, 0.7},
                             {6, 10, 3, true, false, 1.0, true}, {5, 7, 1, true, false, 1.0, true},
                             {8, 12, 2, false, false, 1.0, true}, {33, 9, 4, true, false, 2.5, true}};

struct Inputs {
  std::vector<double> z, bias, dw;
  std::vector<int32_t> ids;
};

// Random logits and upstream gradients; each token's k ids distinct (the selection is an input here).
Inputs make(const RouterCase& c, uint64_t seed) {
  Rng r(seed);
  Inputs in;
  for (int64_t i = 0; i < c.N * c.E; ++i) in.z.push_back(2.0 * r.normal());
  for (int64_t i = 0; i < c.E; ++i) in.bias.push_back(0.1 * r.normal());
  for (int64_t i = 0; i < c.N * c.k; ++i) in.dw.push_back(r.normal());
  for (int64_t t = 0; t < c.N; ++t) {
    std::vector<int32_t> perm(size_t(c.E));
    for (int64_t e = 0; e < c.E; ++e) perm[size_t(e)] = int32_t(e);
    for (int64_t e = c.E - 1; e > 0; --e) std::swap(perm[size_t(e)], perm[size_t(r.next_u64() % uint64_t(e + 1))]);
    in.ids.insert(in.ids.end(), perm.begin(), perm.begin() + c.k);
  }
  return in;
}

std::string name(const RouterCase& c) {
  return "N=" + std::to_string(c.N) + " E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) +
         (c.renormalize ? " renormalized" : "") + (c.bias ? " bias in weights" : "") + (c.softmax ? " softmax" : "");
}

// L = Σ_t Σ_j dw_tj · w_tj(z_t), the twin's backward against its central differences.
TEST(MoeRouterBackwardRef, MatchesFiniteDifferences) {
  for (const RouterCase& c : kCases) {
    Inputs in = make(c, 11);
    const double* bias = c.bias ? in.bias.data() : nullptr;
    const auto loss = [&] {
      double l = 0;
      std::vector<double> w(size_t(c.k));
      for (int64_t t = 0; t < c.N; ++t) {
        ref::moe_router_weights(in.z.data() + t * c.E, bias, in.ids.data() + t * c.k, c.E, c.k, c.renormalize,
                                c.scaling, w.data(), c.softmax);
        for (int64_t j = 0; j < c.k; ++j) l += in.dw[size_t(t * c.k + j)] * w[size_t(j)];
      }
      return l;
    };
    std::vector<double> dz(in.z.size());
    for (int64_t t = 0; t < c.N; ++t)
      ref::moe_router_backward(in.z.data() + t * c.E, bias, in.ids.data() + t * c.k, c.E, c.k, c.renormalize,
                               c.scaling, in.dw.data() + t * c.k, dz.data() + t * c.E, c.softmax);
    double num = 0, den = 0;
    for (size_t i = 0; i < in.z.size(); ++i) {
      const double keep = in.z[i], h = 1e-6 * std::max(1.0, std::fabs(keep));
      in.z[i] = keep + h;
      const double up = loss();
      in.z[i] = keep - h;
      const double down = loss();
      in.z[i] = keep;
      const double fd = (up - down) / (2 * h);
      num += (dz[i] - fd) * (dz[i] - fd), den += fd * fd;
    }
    // A softmax router renormalized over k = 1 gives every token the weight c whatever its logits: a
    // gradient of exactly 0, held absolutely (the RMS over the logits).
    const double err = std::sqrt(den > 1e-20 ? num / den : num / double(in.z.size()));
    std::cout << "[ measured ] router twin vs finite differences, " << name(c) << ": " << err << " relative RMS\n";
    EXPECT_LE(err, 1e-6) << name(c);
  }
}

TEST(MoeRouterBackward, FastKernelMatchesTheTwin) {
  for (const RouterCase& c : kCases) {
    const Inputs in = make(c, 12);
    std::vector<double> want(in.z.size());
    for (int64_t t = 0; t < c.N; ++t)
      ref::moe_router_backward(in.z.data() + t * c.E, c.bias ? in.bias.data() : nullptr, in.ids.data() + t * c.k, c.E,
                               c.k, c.renormalize, c.scaling, in.dw.data() + t * c.k, want.data() + t * c.E, c.softmax);
    const std::vector<float> z(in.z.begin(), in.z.end()), bias(in.bias.begin(), in.bias.end()),
        dw(in.dw.begin(), in.dw.end());
    for (const int threads : {1, 2}) {
      ScopedThreads st(threads);
      std::vector<float> got(in.z.size(), 7.0f);
      moe_router_backward({c.N, c.E, c.k, c.renormalize, c.scaling, c.bias ? bias.data() : nullptr, c.softmax}, z.data(),
                          in.ids.data(), dw.data(), got.data());
      test::expect_close(got.data(), want, 1e-6, name(c) + ", " + std::to_string(threads) + " threads");
    }
  }
}

}  // namespace
}  // namespace moe_router_backward_test
}  // namespace lineage::kernels
