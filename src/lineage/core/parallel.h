// One thread pool for the whole engine: the calling thread plus n - 1 workers that spin briefly
// between regions (then sleep), so a region costs ~1 µs to start and finish, not the ~3.5 µs of an
// OpenMP parallel region (decode runs 60 to 150 regions a token). OpenBLAS runs single-threaded
// inside these threads (kernels/blas_threads.h), so nothing oversubscribes the cores. The default
// thread count is OpenMP's (OMP_NUM_THREADS, else the hardware threads). A region started from
// inside a region, or while another application thread holds the pool, runs on the calling thread;
// an exception thrown on a worker is rethrown to the caller; a forked child starts its own workers.
#pragma once

#include <cstdint>
#include <algorithm>
#include <functional>
#include <memory>
#include <span>
#include <type_traits>

namespace lineage {

// A non-owning reference to a callable fn(begin, end), what the parallel loops take: passing a
// lambda with any captures allocates nothing (a std::function would, past two words of them, on
// every call: hundreds of allocations a decode step). The callable must outlive the call, which a
// lambda written in the call's arguments does.
class RangeFn {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, RangeFn>>>
  RangeFn(F&& f)  // NOLINT: converts implicitly, as std::function does
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, int64_t a, int64_t b) { (*static_cast<std::remove_reference_t<F>*>(o))(a, b); }) {}
  void operator()(int64_t a, int64_t b) const { call_(obj_, a, b); }

 private:
  void* obj_;
  void (*call_)(void*, int64_t, int64_t);
};

void set_num_threads(int n);  // n <= 0: all hardware threads
int num_threads();
// The most threads one region runs on (more are not started).
inline constexpr int kMaxParts = 255;
// The threads a region of `items` items runs on: min(num_threads(), kMaxParts, items), at least 1.
int parts_for(int64_t items);

// Whether this thread is running a share of a parallel region (its own calls then run serially, and
// which thread runs which share can differ from run to run).
bool in_parallel_region();

// Sets the thread count for its lifetime, then restores the previous one.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : previous_(num_threads()) { set_num_threads(n); }
  ~ScopedThreads() { set_num_threads(previous_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int previous_;
};

// Calls fn(begin, end) on contiguous, statically assigned ranges of [0, n): the split depends only
// on n and the thread count, so reductions inside a range are deterministic.
void parallel_for(int64_t n, RangeFn fn, int64_t min_grain = 1);

// Calls fn(begin, end) on the fixed chunks [k·chunk, min(n, (k+1)·chunk)) of [0, n). Each thread
// starts on its own contiguous share of the chunks (the p-th of near-equal shares) and runs it front
// to back, so what it reads stays one sequential stream and no counter is shared while the shares
// last; a thread that runs out takes the others' remaining chunks one at a time from the back end of
// their shares. The chunk boundaries depend only on n and chunk, not on which thread runs a chunk;
// use it where each item's result does not depend on the range it is computed in (GEMV rows,
// attention heads). A thread that is slowed down (another process on its core, a descheduled vCPU)
// then costs at most its current chunk, not half of the work.
void parallel_chunks(int64_t n, int64_t chunk, RangeFn fn);

// parallel_chunks over single items [0, n) with the shares given: thread p starts on items
// [starts[p], starts[p + 1]), where starts holds parts + 1 nondecreasing values from 0 to n and
// parts <= parts_for(n). For callers that order or size the items of each share (short ones at its
// end, so the threads finish together). fn is called with end = begin + 1.
void parallel_shares(std::span<const int64_t> starts, RangeFn fn);

// The smallest number of items worth handing to one thread when each costs `work_per_item`
// multiply-adds: waking a thread costs about as much as 32k of them (more on a loaded machine).
inline int64_t grain_for(int64_t work_per_item) {
  constexpr int64_t kMinWork = 1 << 15;
  return work_per_item >= kMinWork ? 1 : (kMinWork + work_per_item - 1) / std::max<int64_t>(1, work_per_item);
}

}  // namespace lineage
