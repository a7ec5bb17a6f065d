// Roofline ceilings of this machine, measured in the same run as a benchmark (Williams, Waterman,
// Patterson 2009): streaming read bandwidth and register-resident peak FLOP/s per weight dtype.
// The per-ISA inner loops live in x86/roofline_*.cpp; roofline_dispatch.cpp picks them from cpuid.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lineage/core/dtype.h"

namespace lineage::kernels {

// Bytes/s of the best of `passes` (after one warm-up) streaming reads of a `bytes` buffer, far
// larger than the caches. The buffer is allocated once per call and first touched by the thread
// that later reads each part; each of `threads` threads of the engine's pool sums its contiguous
// part with full-width SIMD loads into independent accumulators. Sets the pool to `threads` for
// the measurement and restores the previous count.
double measure_read_bandwidth(int threads, size_t bytes = size_t(1) << 30, int passes = 5);

// The same streaming read on a buffer kept between measurements, for a ceiling taken right next to
// each repetition of a benchmark (a shared memory bus can change its bandwidth several-fold within
// seconds). The buffer (`bytes`, first-touched by the reading threads) is allocated once here.
class ReadBandwidthProbe {
 public:
  ReadBandwidthProbe(int threads, size_t bytes);
  ~ReadBandwidthProbe();
  ReadBandwidthProbe(const ReadBandwidthProbe&) = delete;
  ReadBandwidthProbe& operator=(const ReadBandwidthProbe&) = delete;
  // Bytes/s of the best of `passes` reads of the whole buffer (no warm-up pass).
  double measure(int passes) const;

 private:
  int threads_;
  int64_t blocks_;
  float* buf_;
};

// FLOP/s of independent multiply-add chains held in registers, `threads` threads each running the
// same count; best of 5 passes after a warm-up. F32 and F16 (widened to f32 before the multiply)
// → f32 FMA, 2 FLOP per lane; BF16 → vdpbf16ps, 4 FLOP per f32 lane, where cpuid reports
// AVX512_BF16, else the f32 figure. Threads as measure_read_bandwidth.
double measure_peak_flops(DType weights, int threads);

// The kernel measure_peak_flops runs for `weights` ("avx512 fma", "avx512_bf16 dpbf16", ...).
const char* peak_flops_kernel(DType weights);
// The kernel measure_read_bandwidth runs ("avx512", "avx2", "scalar").
const char* read_bandwidth_kernel();

// Per-ISA inner loops, one set per file x86/roofline_{scalar,avx2,avx512,avx512bf16}.cpp.
namespace roofline {

struct ReadKernel {
  const char* name;
  // Σ p[0 .. n). p: 64-byte aligned, n a multiple of 256. Reads every element once.
  float (*sum)(const float* p, int64_t n);
};

struct PeakKernel {
  const char* name;
  // Runs `iters` rounds of independent multiply-add chains; returns a value depending on all of
  // them so nothing is optimized away. FLOPs done = iters · flops_per_iter.
  float (*run)(int64_t iters);
  double flops_per_iter;
};

ReadKernel read_scalar();
ReadKernel read_avx2();
ReadKernel read_avx512();
PeakKernel fma_scalar();
PeakKernel fma_avx2();
PeakKernel fma_avx512();
PeakKernel dpbf16_avx512bf16();

}  // namespace roofline

}  // namespace lineage::kernels
