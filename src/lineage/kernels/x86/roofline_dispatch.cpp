// Roofline measurements: picks the widest kernel the GEMV dispatch chose (so LINEAGE_ISA applies
// here too), plus AVX512_BF16 from cpuid for the bf16 peak; runs it on the engine's pool and keeps
// the best pass.
#include <cpuid.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/roofline.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {

namespace {

std::atomic<float> g_sink{0.0f};  // keeps every kernel's result alive

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// CPUID leaf 7 sub-leaf 1, EAX bit 5. The OS-saves-zmm check is part of the avx512 table choice.
bool cpu_has_avx512_bf16() {
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  __get_cpuid_count(7, 1, &a, &b, &c, &d);
  return a & (1u << 5);
}

bool isa_is(const char* name) { return !std::strcmp(isa_name(), name); }

roofline::ReadKernel read_kernel() {
  if (isa_is("avx512")) return roofline::read_avx512();
  if (isa_is("avx2")) return roofline::read_avx2();
  return roofline::read_scalar();
}

roofline::PeakKernel peak_kernel(DType weights) {
  if (weights == DType::BF16 && isa_is("avx512") && cpu_has_avx512_bf16()) return roofline::dpbf16_avx512bf16();
  if (isa_is("avx512")) return roofline::fma_avx512();
  if (isa_is("avx2")) return roofline::fma_avx2();
  return roofline::fma_scalar();
}

}  // namespace

const char* peak_flops_kernel(DType weights) { return peak_kernel(weights).name; }
const char* read_bandwidth_kernel() { return read_kernel().name; }

namespace {
// 1 MiB per work item; 2 MiB alignment lets the kernel back the buffer with huge pages, so the walk
// measures DRAM, not TLB misses.
constexpr size_t kBlock = size_t(1) << 20, kAlign = size_t(2) << 20;
constexpr int64_t kBlockFloats = int64_t(kBlock / sizeof(float));
}  // namespace

ReadBandwidthProbe::ReadBandwidthProbe(int threads, size_t bytes)
    : threads_(threads), blocks_(int64_t(std::max(bytes / kBlock, size_t(1)))), buf_(nullptr) {
  LINEAGE_CHECK(threads > 0, "threads ", threads);
  const size_t total = size_t(blocks_) * kBlock;
  buf_ = static_cast<float*>(std::aligned_alloc(kAlign, (total + kAlign - 1) / kAlign * kAlign));
  LINEAGE_CHECK(buf_, "cannot allocate ", total, " bytes for the bandwidth measurement");
#ifdef MADV_HUGEPAGE
  madvise(buf_, total, MADV_HUGEPAGE);
#endif
  // First touch with the same split as the reads: each thread's pages are local to it.
  const ScopedThreads scope(threads_);
  parallel_for(blocks_, [&](int64_t b0, int64_t b1) {
    std::memset(buf_ + b0 * kBlockFloats, 0, size_t(b1 - b0) * kBlock);
  });
}

ReadBandwidthProbe::~ReadBandwidthProbe() { std::free(buf_); }

double ReadBandwidthProbe::measure(int passes) const {
  LINEAGE_CHECK(passes > 0, "passes ", passes);
  const ScopedThreads scope(threads_);
  const roofline::ReadKernel k = read_kernel();
  double best = std::numeric_limits<double>::infinity();
  for (int pass = 0; pass < passes; ++pass) {
    const double t0 = now();
    parallel_for(blocks_, [&](int64_t b0, int64_t b1) {
      g_sink.store(k.sum(buf_ + b0 * kBlockFloats, (b1 - b0) * kBlockFloats), std::memory_order_relaxed);
    });
    best = std::min(best, now() - t0);
  }
  return double(size_t(blocks_) * kBlock) / best;
}

double measure_read_bandwidth(int threads, size_t bytes, int passes) {
  LINEAGE_CHECK(threads > 0 && passes > 0, "threads ", threads, ", passes ", passes);
  const ReadBandwidthProbe probe(threads, bytes);
  probe.measure(1);  // warm-up
  return probe.measure(passes);
}

double measure_peak_flops(DType weights, int threads) {
  LINEAGE_CHECK(threads > 0, "threads ", threads);
  const ScopedThreads scope(threads);
  const roofline::PeakKernel k = peak_kernel(weights);
  constexpr int64_t kIters = int64_t(1) << 24;  // ≈ 30-60 ms per pass on a 3-4 GHz core
  constexpr int kPasses = 5;
  double best = std::numeric_limits<double>::infinity();
  for (int pass = 0; pass <= kPasses; ++pass) {
    const double t0 = now();
    parallel_for(threads, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) g_sink.store(k.run(kIters), std::memory_order_relaxed);
    });
    if (pass > 0) best = std::min(best, now() - t0);
  }
  return double(threads) * double(kIters) * k.flops_per_iter / best;
}

}  // namespace lineage::kernels
