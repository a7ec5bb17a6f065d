// The roofline kernels themselves: each iteration is one full measurement (best of its passes), its
// figure reported as the rate (manual time = work / measured rate).
#include "bench_support.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/roofline.h"

namespace lineage::bench {
namespace {

constexpr size_t kBytes = size_t(1) << 30;
constexpr double kFlopsUnit = 1e9;

void bm_read_bandwidth(benchmark::State& state) {
  for (auto _ : state) state.SetIterationTime(double(kBytes) / kernels::measure_read_bandwidth(num_threads(), kBytes));
  state.counters["bytes_per_second"] = benchmark::Counter(double(kBytes), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(kernels::read_bandwidth_kernel());
}

void bm_peak_flops(benchmark::State& state, DType weights) {
  for (auto _ : state) state.SetIterationTime(kFlopsUnit / kernels::measure_peak_flops(weights, num_threads()));
  state.counters["FLOPS"] = benchmark::Counter(kFlopsUnit, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(kernels::peak_flops_kernel(weights));
}

const bool registered = [] {
  benchmark::RegisterBenchmark("roofline/read_bandwidth", bm_read_bandwidth)
      ->UseManualTime()
      ->Iterations(3)
      ->Unit(benchmark::kMillisecond);
  for (DType dt : {DType::F32, DType::BF16})
    benchmark::RegisterBenchmark((std::string("roofline/peak_flops/") + dtype_label(dt)).c_str(), bm_peak_flops, dt)
        ->UseManualTime()
        ->Iterations(3)
        ->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace
}  // namespace lineage::bench
