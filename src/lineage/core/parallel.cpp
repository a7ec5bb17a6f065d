#include "lineage/core/parallel.h"

#include <omp.h>

#include <algorithm>

namespace lineage {

namespace {
int g_threads = 0;
}

void set_num_threads(int n) {
  g_threads = n > 0 ? n : omp_get_num_procs();
  omp_set_num_threads(g_threads);
}

int num_threads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_grain) {
  if (n <= 0) return;
  const int64_t max_parts = std::max<int64_t>(1, n / std::max<int64_t>(1, min_grain));
  const int parts = int(std::min<int64_t>(num_threads(), max_parts));
  if (parts <= 1 || omp_in_parallel()) {
    fn(0, n);
    return;
  }
#pragma omp parallel num_threads(parts)
  {
    const int64_t p = omp_get_thread_num();
    const int64_t begin = n * p / parts, end = n * (p + 1) / parts;
    if (begin < end) fn(begin, end);
  }
}

void parallel_chunks(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(1, chunk);
  const int64_t chunks = (n + chunk - 1) / chunk;
  const int parts = int(std::min<int64_t>(num_threads(), chunks));
  if (parts <= 1 || omp_in_parallel()) {
    fn(0, n);
    return;
  }
#pragma omp parallel for num_threads(parts) schedule(dynamic, 1)
  for (int64_t k = 0; k < chunks; ++k) fn(k * chunk, std::min(n, (k + 1) * chunk));
}

}  // namespace lineage
