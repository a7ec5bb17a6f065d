#include "lineage/core/parallel.h"

#include <omp.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "lineage/core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace lineage {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// A worker spins this long for the next region before it sleeps: decode starts a region every few
// microseconds, and waking a sleeping thread costs tens of them.
constexpr auto kSpin = std::chrono::microseconds(200);

// The engine's threads: the calling thread is participant 0, workers 1 .. n-1 wait for the next
// region by watching a generation counter (spinning a while, then sleeping on it). Starting and
// finishing a region costs about 1.3 µs here, against ~3.5 µs for an OpenMP parallel region.
class Pool {
 public:
  // More threads than cores: a spinning thread would take the core from one with work, so waiting
  // threads yield or sleep at once (as libgomp throttles its spinning then).
  explicit Pool(int threads) : oversubscribed_(threads > int(std::thread::hardware_concurrency())) {
    for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w] { work(w); });
  }
  ~Pool() {
    stop_.store(true);
    start_region(0);
    for (auto& t : workers_) t.join();
  }
  int size() const { return int(workers_.size()) + 1; }

  // Runs body(p) for participants p in [0, parts), parts <= size(), and returns when all are done.
  // The first exception thrown by any participant is rethrown here. One caller at a time.
  template <class Body>
  void run(int parts, const Body& body) {
    body_ = [](const void* b, int p) { (*static_cast<const Body*>(b))(p); };
    body_arg_ = &body;
    error_ = nullptr;
    pending_.store(parts - 1, std::memory_order_relaxed);
    start_region(parts);
    participate(0);
    for (int64_t i = 0; pending_.load(std::memory_order_acquire) != 0; ++i)
      if (i < (1 << 16) && !oversubscribed_) cpu_relax();
      else std::this_thread::yield();  // a worker was descheduled: let it have the core
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // The generation word carries the region's participant count in its low 8 bits, so a worker
  // reads both at once (a worker that does not take part must not read a later region's count).
  void start_region(int parts) {
    generation_.store(((generation_.load(std::memory_order_relaxed) >> 8) + 1) << 8 | uint32_t(parts),
                      std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
  }

  void participate(int p) {
    t_in_region = true;
    try {
      body_(body_arg_, p);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    t_in_region = false;
  }

  void work(int w) {
    uint32_t seen = 0;  // the value before any region, not a later one the thread may start after
    for (;;) {
      uint32_t g = wait_for_change(seen);
      seen = g;
      if (stop_.load()) return;
      if (w < int(g & 0xff)) {
        participate(w);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

  uint32_t wait_for_change(uint32_t seen) {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (int i = 1; !oversubscribed_; ++i) {
      const uint32_t g = generation_.load(std::memory_order_acquire);
      if (g != seen) return g;
      cpu_relax();
      if (i % 64 == 0 && std::chrono::steady_clock::now() > until) break;
    }
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    uint32_t g;
    while ((g = generation_.load(std::memory_order_seq_cst)) == seen) generation_.wait(seen, std::memory_order_seq_cst);
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    return g;
  }

 public:
  static thread_local bool t_in_region;

 private:
  const bool oversubscribed_;
  std::vector<std::thread> workers_;
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  void (*body_)(const void*, int) = nullptr;
  const void* body_arg_ = nullptr;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

thread_local bool Pool::t_in_region = false;

constexpr int kMaxThreads = kMaxParts;  // the generation word's participant count is 8 bits
static_assert(kMaxParts <= 255);
int g_threads = 0;
// OpenMP's default (OMP_NUM_THREADS, else the hardware threads), read once before any thread's
// OpenMP setting is changed (kernels/blas_threads.h sets it to 1 where OpenBLAS is called).
const int g_default_threads = omp_get_max_threads();
std::unique_ptr<Pool>* g_pool = new std::unique_ptr<Pool>;  // never destroyed: workers may outlive main

std::mutex g_region;  // held while a region runs (and while the pool is made or remade)

Pool& pool() {
  // A forked child has none of the parent's workers: it abandons the pool object (never touching its
  // threads) and makes its own on its first region.
  static const bool fork_handler = pthread_atfork(nullptr, nullptr, [] {
    (void)g_pool->release();
  }) == 0;
  (void)fork_handler;
  const int n = std::min(num_threads(), kMaxThreads);
  if (!*g_pool || (*g_pool)->size() != n) *g_pool = std::make_unique<Pool>(n);
  return **g_pool;
}

// Runs body(p) for p in [0, parts) on the pool, or all on this thread where the pool is taken by
// another application thread.
template <class Body>
void run_region(int parts, const Body& body) {
  std::unique_lock<std::mutex> lock(g_region, std::try_to_lock);
  if (!lock.owns_lock()) {
    for (int p = 0; p < parts; ++p) body(p);
    return;
  }
  pool().run(parts, body);
}

}  // namespace

void set_num_threads(int n) { g_threads = n > 0 ? n : omp_get_num_procs(); }

bool in_parallel_region() { return Pool::t_in_region; }

int num_threads() { return g_threads > 0 ? g_threads : g_default_threads; }

int parts_for(int64_t items) {
  return int(std::max<int64_t>(1, std::min<int64_t>(std::min(num_threads(), kMaxThreads), items)));
}

void parallel_for(int64_t n, RangeFn fn, int64_t min_grain) {
  if (n <= 0) return;
  const int64_t max_parts = std::max<int64_t>(1, n / std::max<int64_t>(1, min_grain));
  const int parts = parts_for(max_parts);
  if (parts <= 1 || Pool::t_in_region) {
    fn(0, n);
    return;
  }
  run_region(parts, [&](int p) {
    const int64_t begin = n * p / parts, end = n * (p + 1) / parts;
    if (begin < end) fn(begin, end);
  });
}

namespace {

// One thread's share of items, [front, back) packed in one word: the owner takes the front item,
// a thread that has run out of its own takes the back one.
struct alignas(64) Share {
  std::atomic<uint64_t> range;
  void set(int64_t front, int64_t back) {
    range.store(uint64_t(front) << 32 | uint64_t(back), std::memory_order_relaxed);
  }
  // The taken item, or -1 when the share is empty.
  int64_t take(bool from_back) {
    uint64_t r = range.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t front = r >> 32, back = r & 0xffffffffu;
      if (front >= back) return -1;
      const uint64_t next = from_back ? (front << 32 | (back - 1)) : ((front + 1) << 32 | back);
      if (range.compare_exchange_weak(r, next, std::memory_order_relaxed))
        return int64_t(from_back ? back - 1 : front);
    }
  }
};

// Runs item(i) for every i in [0, starts[parts]), participant p starting on [starts[p], starts[p+1]).
template <class Item>
void run_shares(const int64_t* starts, int parts, const Item& item) {
  LINEAGE_CHECK(starts[parts] < (int64_t(1) << 32), "parallel_chunks: ", starts[parts], " chunks, at most 2^32 - 1");
  thread_local std::vector<Share> shares;  // the caller's; the workers reach it through the lambda
  if (shares.size() < size_t(parts)) shares = std::vector<Share>(size_t(parts));
  for (int p = 0; p < parts; ++p) shares[p].set(starts[p], starts[p + 1]);
  Share* sh = shares.data();
  run_region(parts, [&](int p) {
    for (int64_t i; (i = sh[p].take(false)) >= 0;) item(i);
    for (int d = 1; d < parts; ++d)
      for (int64_t i; (i = sh[(p + d) % parts].take(true)) >= 0;) item(i);
  });
}

}  // namespace

void parallel_chunks(int64_t n, int64_t chunk, RangeFn fn) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(1, chunk);
  const int64_t chunks = (n + chunk - 1) / chunk;
  const int parts = parts_for(chunks);
  if (parts <= 1 || Pool::t_in_region) {
    fn(0, n);
    return;
  }
  int64_t starts[kMaxThreads + 1];
  for (int p = 0; p <= parts; ++p) starts[p] = chunks * p / parts;
  run_shares(starts, parts, [&](int64_t k) { fn(k * chunk, std::min(n, (k + 1) * chunk)); });
}

void parallel_shares(std::span<const int64_t> starts, RangeFn fn) {
  LINEAGE_CHECK(!starts.empty() && starts.front() == 0, "parallel_shares: starts must begin at 0");
  const int parts = int(starts.size()) - 1;
  const int64_t n = starts.back();
  for (int p = 0; p < parts; ++p)
    LINEAGE_CHECK(starts[p] <= starts[p + 1], "parallel_shares: starts must not decrease");
  if (n <= 0) return;
  LINEAGE_CHECK(parts <= parts_for(n), "parallel_shares: ", parts, " shares for ", parts_for(n), " threads");
  if (parts <= 1 || Pool::t_in_region) {
    for (int64_t i = 0; i < n; ++i) fn(i, i + 1);
    return;
  }
  run_shares(starts.data(), parts, [&](int64_t i) { fn(i, i + 1); });
}

}  // namespace lineage
