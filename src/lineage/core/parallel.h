// One thread pool for the whole engine (OpenMP); OpenBLAS is linked in its OpenMP flavour so GEMM
// and parallel_for share the same threads and never oversubscribe the cores.
#pragma once

#include <cstdint>
#include <algorithm>
#include <functional>

namespace lineage {

void set_num_threads(int n);  // n <= 0: all hardware threads
int num_threads();

// Calls fn(begin, end) on contiguous, statically assigned ranges of [0, n): the split depends only
// on n and the thread count, so reductions inside a range are deterministic.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_grain = 1);

// The smallest number of items worth handing to one thread when each costs `work_per_item`
// multiply-adds: waking a thread costs about as much as 32k of them (more on a loaded machine).
inline int64_t grain_for(int64_t work_per_item) {
  constexpr int64_t kMinWork = 1 << 15;
  return work_per_item >= kMinWork ? 1 : (kMinWork + work_per_item - 1) / std::max<int64_t>(1, work_per_item);
}

}  // namespace lineage
