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
#include <memory>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/kernels/roofline.h"
#include "lineage/kernels/threads.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {

namespace {

std::atomic<float> g_sink{0.0f};  // keeps every kernel's result alive

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Sets the pool to n threads for one measurement; restores the previous count.
class ThreadScope {
 public:
  explicit ThreadScope(int n) : previous_(num_threads()) { set_threads(n); }
  ~ThreadScope() { set_threads(previous_); }

 private:
  int previous_;
};

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

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

}  // namespace

const char* peak_flops_kernel(DType weights) { return peak_kernel(weights).name; }
const char* read_bandwidth_kernel() { return read_kernel().name; }

double measure_read_bandwidth(int threads, size_t bytes, int passes) {
  LINEAGE_CHECK(threads > 0 && passes > 0, "threads ", threads, ", passes ", passes);
  const ThreadScope scope(threads);
  const roofline::ReadKernel k = read_kernel();
  // 1 MiB per work item; 2 MiB alignment lets the kernel back the buffer with huge pages, so the
  // walk measures DRAM, not TLB misses.
  constexpr size_t kBlock = size_t(1) << 20, kAlign = size_t(2) << 20;
  const int64_t blocks = int64_t(std::max(bytes / kBlock, size_t(1)));
  const size_t total = size_t(blocks) * kBlock;
  std::unique_ptr<float, FreeDeleter> buf(
      static_cast<float*>(std::aligned_alloc(kAlign, (total + kAlign - 1) / kAlign * kAlign)));
  LINEAGE_CHECK(buf, "cannot allocate ", total, " bytes for the bandwidth measurement");
#ifdef MADV_HUGEPAGE
  madvise(buf.get(), total, MADV_HUGEPAGE);
#endif
  float* p = buf.get();
  constexpr int64_t kFloats = int64_t(kBlock / sizeof(float));
  // First touch with the same split as the reads: each thread's pages are local to it.
  parallel_for(blocks, [&](int64_t b0, int64_t b1) {
    std::memset(p + b0 * kFloats, 0, size_t(b1 - b0) * kBlock);
  });
  double best = std::numeric_limits<double>::infinity();
  for (int pass = 0; pass <= passes; ++pass) {  // pass 0 warms up
    const double t0 = now();
    parallel_for(blocks, [&](int64_t b0, int64_t b1) {
      g_sink.store(k.sum(p + b0 * kFloats, (b1 - b0) * kFloats), std::memory_order_relaxed);
    });
    if (pass > 0) best = std::min(best, now() - t0);
  }
  return double(total) / best;
}

double measure_peak_flops(DType weights, int threads) {
  LINEAGE_CHECK(threads > 0, "threads ", threads);
  const ThreadScope scope(threads);
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
