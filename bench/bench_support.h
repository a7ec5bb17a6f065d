// What every micro-benchmark shares: the roofline ceilings (measured once, before the benchmarks),
// seeded random inputs, and the loop that reports a rate and its share of the ceiling.
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "lineage/core/tensor.h"

namespace lineage::bench {

struct Ceilings {
  double bandwidth = 0;              // bytes/s, streaming read
  double peak_f32 = 0, peak_bf16 = 0;  // FLOP/s
  double peak(DType weights) const { return weights == DType::BF16 ? peak_bf16 : peak_f32; }
};
// Measured by main() with the benchmark's thread count before any benchmark runs (best of three).
const Ceilings& ceilings();
void measure_ceilings(int threads);

// Seeded values uniform in [-scale, scale).
std::vector<float> random_floats(int64_t n, uint64_t seed, float scale = 1.0f);
// Copies of one random [rows, cols] weight in `dtype`, as many as it takes to exceed 512 MiB
// together, so cycling through them streams every call from memory as a decode step does (one
// matrix alone would sit in the caches). Holds the last set made, so the repeated calls of one
// benchmark (Google Benchmark calls each several times) do not redraw them.
const std::vector<Tensor>& cold_weights(int64_t rows, int64_t cols, DType dtype);
inline constexpr size_t kColdBytes = size_t(512) << 20;
// The same copies written to a temporary file and mapped read-only from it, as a checkpoint's
// weights are by default (page-cache pages in whatever folios the writes made, where the copies
// above sit on huge pages; a checkpoint read in through the loader's advised mapping comes in
// mostly as 2 MiB folios where the file system keeps large folios). The file is unlinked at once;
// the mapping lives with the set.
const std::vector<Tensor>& mapped_cold_weights(int64_t rows, int64_t cols, DType dtype);
// "f32", "f16", "bf16".
const char* dtype_label(DType t);

// The work one iteration does and which ceiling bounds it.
struct Work {
  double bytes = 0;     // moved from memory
  double flops = 0;
  double tokens = 0;    // reported as items_per_second when > 0
  bool memory_bound = true;
  DType weights = DType::F32;  // picks the peak when compute-bound
};

// Runs `body` in the benchmark loop, then sets bytes_per_second and FLOPS (rates over real time),
// items_per_second for tokens, and of_roofline: the achieved rate over the bounding ceiling.
template <class Body>
void run(benchmark::State& state, const Work& w, Body&& body) {
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) body();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  using benchmark::Counter;
  const double iters = double(state.iterations());
  if (w.bytes > 0) state.counters["bytes_per_second"] = Counter(w.bytes, Counter::kIsIterationInvariantRate);
  if (w.flops > 0) state.counters["FLOPS"] = Counter(w.flops, Counter::kIsIterationInvariantRate);
  if (w.tokens > 0) state.SetItemsProcessed(int64_t(w.tokens * iters));
  const double achieved = (w.memory_bound ? w.bytes : w.flops) * iters / seconds;
  const double ceiling = w.memory_bound ? ceilings().bandwidth : ceilings().peak(w.weights);
  if (ceiling > 0 && seconds > 0) state.counters["of_roofline"] = achieved / ceiling;
}

}  // namespace lineage::bench
