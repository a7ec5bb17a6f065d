// The row-wise kernels between the GEMMs on GPT-2 small's shapes: LayerNorm (GPT-2) and RMSNorm (the
// delta-rule presets) over a 512-token prefill's 768-wide rows and over one decoded token's row, and
// the standalone activations over the MLP's 512 × 3072 hidden rows (GPT-2's GELU is applied by the
// GEMM as it stores c_fc in the model; the loop here is the one the gated MLPs and the fallbacks
// run). Each reads its input once and writes its output once; the prefill rows (1.5–6 MiB) sit in
// L2 / L3 between kernels in a forward pass, so the memory ceiling they are printed against is a
// reference point, not a bound (a share above 1 means the data came from cache).
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "bench_support.h"
#include "lineage/kernels/activation.h"
#include "lineage/kernels/norm.h"
#include "lineage/kernels/vmath.h"

namespace lineage::bench {
namespace {

constexpr int64_t kD = 768, kHidden = 3072;

Tensor filled(Shape shape, uint64_t seed, float offset) {
  Tensor t = Tensor::empty(DType::F32, std::move(shape));
  const auto v = random_floats(t.numel(), seed, 0.1f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = offset + v[size_t(i)];
  return t;
}

void bm_norm(benchmark::State& state, bool rms, int64_t T) {
  const Tensor w = filled({kD}, 21, 1.0f), b = filled({kD}, 22, 0.0f);
  const auto x = random_floats(T * kD, 23);
  std::vector<float> y(static_cast<size_t>(T * kD));
  Work work;
  work.bytes = 2.0 * double(T * kD) * sizeof(float);
  // Per element: LayerNorm adds it to the mean, centres, squares and adds it to the variance, then
  // centres, scales, weights and biases it (8); RMSNorm squares and adds, then scales and weights (4).
  work.flops = (rms ? 4.0 : 8.0) * double(T * kD);
  work.tokens = double(T);
  run(state, work, [&] {
    if (rms) kernels::rms_norm(x.data(), T, kD, &w, 1e-6f, y.data());
    else kernels::layer_norm(x.data(), T, kD, w, &b, 1e-5f, y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  });
}

void bm_activation(benchmark::State& state, kernels::Activation act, int64_t T) {
  const auto x = random_floats(T * kHidden, 24, 2.0f);
  std::vector<float> y(x.size());
  Work work;
  // The kernel works in place: each pass first copies the same input back (read and written once
  // more, counted in the bytes; applied to its own output again and again, GELU would drive the
  // negative inputs into denormals).
  work.bytes = 4.0 * double(x.size()) * sizeof(float);
  work.tokens = double(T);
  run(state, work, [&] {
    std::copy(x.begin(), x.end(), y.begin());
    kernels::activate(act, y.data(), int64_t(y.size()));
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  });
}

// SiTU-GLU over the gate and up rows of a gated MLP (Kimi K3's experts; spec §5): fused, one pass
// that reads g and u once and writes g (kernels::situ_glu), against the same arithmetic as separate
// elementwise passes, each over the whole rows (tanh of g/β, σ(g), tanh of u/β_lin, then the two
// products), as a framework that composes it from tensor ops runs it.
void bm_situ(benchmark::State& state, bool fused, int64_t T) {
  const auto g0 = random_floats(T * kHidden, 25, 3.0f), u = random_floats(T * kHidden, 26, 3.0f);
  std::vector<float> g(g0.size()), a(g0.size()), s(g0.size()), c(g0.size());
  const int64_t n = int64_t(g.size());
  Work work;
  work.bytes = 3.0 * double(n) * sizeof(float);  // the copy back of g is the same for both forms
  work.tokens = double(T);
  run(state, work, [&] {
    std::copy(g0.begin(), g0.end(), g.begin());
    if (fused) {
      kernels::situ_glu(g.data(), u.data(), n, 4.0f, 25.0f);
    } else {
      for (int64_t i = 0; i < n; ++i) a[size_t(i)] = 4.0f * std::tanh(g[size_t(i)] / 4.0f);
      kernels::sigmoid(g.data(), s.data(), n);
      for (int64_t i = 0; i < n; ++i) c[size_t(i)] = 25.0f * std::tanh(u[size_t(i)] / 25.0f);
      for (int64_t i = 0; i < n; ++i) a[size_t(i)] *= s[size_t(i)];
      for (int64_t i = 0; i < n; ++i) g[size_t(i)] = a[size_t(i)] * c[size_t(i)];
    }
    benchmark::DoNotOptimize(g.data());
    benchmark::ClobberMemory();
  });
}

const bool registered = [] {
  for (int64_t T : {int64_t(1), int64_t(512)})
    for (bool fused : {true, false}) {
      const std::string name = std::string("situ_glu/") + (fused ? "fused" : "unfused") + "/T" + std::to_string(T) + "x3072";
      benchmark::RegisterBenchmark(name.c_str(), bm_situ, fused, T)->UseRealTime()->Unit(benchmark::kMicrosecond);
    }
  for (int64_t T : {int64_t(1), int64_t(512)})
    for (bool rms : {false, true}) {
      const std::string name = std::string(rms ? "rms_norm" : "layer_norm") + "/T" + std::to_string(T);
      benchmark::RegisterBenchmark(name.c_str(), bm_norm, rms, T)->UseRealTime()->Unit(benchmark::kMicrosecond);
    }
  const std::pair<const char*, kernels::Activation> acts[] = {{"gelu_tanh", kernels::Activation::GeluTanh},
                                                              {"silu", kernels::Activation::Silu}};
  for (const auto& [label, act] : acts) {
    const std::string name = std::string("activation/") + label + "/T512x3072";
    benchmark::RegisterBenchmark(name.c_str(), bm_activation, act, 512)->UseRealTime()->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
}  // namespace lineage::bench
