// lineage_bench: Google Benchmark over the hot kernels, after measuring the roofline ceilings.
// Takes --threads N (default: all cores) besides the usual --benchmark_* flags.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_support.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/roofline.h"
#include "lineage/kernels/threads.h"

namespace {

// Removes --threads N / --threads=N from argv (Google Benchmark rejects flags it does not know).
int take_threads(int& argc, char** argv) {
  int threads = 0, out = 1;
  for (int i = 1; i < argc; ++i) {
    if (!std::strncmp(argv[i], "--threads=", 10)) threads = std::atoi(argv[i] + 10);
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
    else argv[out++] = argv[i];
  }
  argc = out;
  return threads;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = take_threads(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  lineage::kernels::set_threads(threads);
  const int n = lineage::num_threads();
  lineage::bench::measure_ceilings(n);
  const auto& c = lineage::bench::ceilings();
  char buf[64];
  benchmark::AddCustomContext("lineage_threads", std::to_string(n));
  std::snprintf(buf, sizeof buf, "%.2f GB/s (%s)", c.bandwidth / 1e9, lineage::kernels::read_bandwidth_kernel());
  benchmark::AddCustomContext("roofline_read_bandwidth", buf);
  std::snprintf(buf, sizeof buf, "%.1f GFLOP/s (%s)", c.peak_f32 / 1e9,
                lineage::kernels::peak_flops_kernel(lineage::DType::F32));
  benchmark::AddCustomContext("roofline_peak_f32", buf);
  std::snprintf(buf, sizeof buf, "%.1f GFLOP/s (%s)", c.peak_bf16 / 1e9,
                lineage::kernels::peak_flops_kernel(lineage::DType::BF16));
  benchmark::AddCustomContext("roofline_peak_bf16", buf);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
