// kernels::short_conv on the delta-rule presets' shapes (width 4 over one projection's 768 channels,
// rows 2304 floats apart as the mixer's q/k/v buffer lays them out): a 512-token prefill with SiLU,
// bound by reading x and writing y once (the taps and the tail stay in L1), and one decoded token's
// step (short_conv_step over all channels), whose tail, taps and rows all sit in L1: its rate is
// against the memory ceiling only for comparison.
#include <algorithm>

#include "bench_support.h"
#include "lineage/kernels/short_conv.h"

namespace lineage::bench {
namespace {

constexpr int64_t kC = 768, kLd = 3 * kC, kW = 4;

Tensor conv_weight() {
  Tensor w = Tensor::empty(DType::F32, {kC, 1, kW});
  const auto v = random_floats(kC * kW, 11, 0.5f);
  std::copy(v.begin(), v.end(), w.data<float>());
  return w;
}

void bm_short_conv_prefill(benchmark::State& state, int64_t T) {
  const Tensor w = conv_weight();
  const auto x = random_floats(T * kLd, 12);
  std::vector<float> y(static_cast<size_t>(T * kLd)), tail(static_cast<size_t>((kW - 1) * kC));
  Work work;
  work.bytes = 2.0 * double(T * kC) * sizeof(float);
  work.flops = 2.0 * double(T * kC * kW);
  work.tokens = double(T);
  run(state, work, [&] {
    std::fill(tail.begin(), tail.end(), 0.0f);
    kernels::short_conv(x.data(), T, kC, kLd, w, tail.data(), kC, true, y.data(), kLd);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  });
}

void bm_short_conv_step(benchmark::State& state) {
  const Tensor w = conv_weight();
  const auto x = random_floats(kC, 13);
  std::vector<float> y(static_cast<size_t>(kC)), tail(static_cast<size_t>((kW - 1) * kC));
  Work work;
  work.bytes = 2.0 * double(kC) * sizeof(float);
  work.flops = 2.0 * double(kC * kW);
  work.tokens = 1;
  run(state, work, [&] {
    kernels::short_conv_step(x.data(), 0, kC, w, tail.data(), kC, true, y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  });
}

const bool registered = [] {
  benchmark::RegisterBenchmark("short_conv/prefill/T512", bm_short_conv_prefill, 512)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("short_conv/step", bm_short_conv_step)->UseRealTime()->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace
}  // namespace lineage::bench
