// The engine's thread pool: every index is visited exactly once for any size, grain, chunk, share
// and thread count; parallel_for's split is the documented static one; a share is run front to back
// by its owner and taken from the back by the others; errors thrown on a worker reach the caller;
// nested regions and regions started by several application threads at once still cover
// everything.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "lineage/core/parallel.h"

namespace lineage {
namespace parallel_test {
namespace {

TEST(Parallel, EveryIndexOnceForAnySplit) {
  for (int threads : {1, 2, 3, 5}) {
    const ScopedThreads scope(threads);
    for (int64_t n : {1, 2, 7, 64, 1000}) {
      for (int64_t grain : {1, 3, 100}) {
        std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
        parallel_for(n, [&](int64_t b, int64_t e) {
          ASSERT_LT(b, e);
          for (int64_t i = b; i < e; ++i) seen[size_t(i)]++;
        }, grain);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[size_t(i)].load(), 1) << threads << " " << n << " " << grain;
      }
      for (int64_t chunk : {1, 4, 1000}) {
        std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
        parallel_chunks(n, chunk, [&](int64_t b, int64_t e) {
          // Whole chunks, whichever thread runs them (one thread may get all of them in one call).
          ASSERT_EQ(b % chunk, 0);
          ASSERT_TRUE(e == n || e % chunk == 0);
          for (int64_t i = b; i < e; ++i) seen[size_t(i)]++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[size_t(i)].load(), 1) << threads << " " << n << " " << chunk;
      }
      // Shares: even, all in the first one, and with empty ones in between.
      const int parts = parts_for(n);
      std::vector<std::vector<int64_t>> layouts(3, std::vector<int64_t>(size_t(parts) + 1, n));
      for (int p = 0; p < parts; ++p) {
        layouts[0][size_t(p)] = n * p / parts;
        layouts[1][size_t(p)] = p == 0 ? 0 : n;
        layouts[2][size_t(p)] = p % 2 ? layouts[2][size_t(p) - 1] : n * p / parts;
      }
      for (const auto& starts : layouts) {
        std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
        parallel_shares(starts, [&](int64_t b, int64_t e) {
          ASSERT_EQ(e, b + 1);
          seen[size_t(b)]++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[size_t(i)].load(), 1) << threads << " " << n;
      }
    }
  }
}

// The caller owns share 0 and runs it front to back; the worker, done with its short share first,
// takes the caller's remaining items from the back. The two never cross: everything the worker took
// from share 0 lies above everything the caller ran of it.
TEST(Parallel, OwnersRunFromTheFrontOthersTakeFromTheBack) {
  const ScopedThreads scope(2);
  const std::thread::id caller = std::this_thread::get_id();
  constexpr int64_t kOwn = 200;  // the caller's share: ~20 ms of slow items, time for the worker to come
  std::mutex m;
  std::vector<int64_t> mine, taken;
  const std::vector<int64_t> starts = {0, kOwn, kOwn + 4};
  parallel_shares(starts, [&](int64_t b, int64_t) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (b >= kOwn) return;
    const std::lock_guard<std::mutex> lock(m);
    (std::this_thread::get_id() == caller ? mine : taken).push_back(b);
  });
  ASSERT_FALSE(mine.empty());
  ASSERT_FALSE(taken.empty()) << "the worker took nothing from the caller's share of " << kOwn << " slow items";
  for (size_t i = 1; i < mine.size(); ++i) EXPECT_GT(mine[i], mine[i - 1]) << "the owner runs its share in order";
  for (size_t i = 1; i < taken.size(); ++i) EXPECT_LT(taken[i], taken[i - 1]) << "others take from the back";
  EXPECT_EQ(mine.front(), 0);
  EXPECT_EQ(taken.front(), kOwn - 1);
  EXPECT_GT(taken.back(), mine.back());
  EXPECT_EQ(int64_t(mine.size() + taken.size()), kOwn);
}

// A malformed set of shares is a programming error: the internal check stops the process.
TEST(Parallel, SharesAreChecked) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const ScopedThreads scope(2);
  const auto nothing = [](int64_t, int64_t) {};
  EXPECT_DEATH(parallel_shares(std::vector<int64_t>{1, 4}, nothing), "must begin at 0");
  EXPECT_DEATH(parallel_shares(std::vector<int64_t>{0, 5, 4}, nothing), "must not decrease");
  EXPECT_DEATH(parallel_shares(std::vector<int64_t>{0, 1, 2, 3}, nothing), "3 shares for 2 threads");
}

TEST(Parallel, ForSplitIsStaticAndUsesTheThreads) {
  const ScopedThreads scope(3);
  std::vector<std::pair<int64_t, int64_t>> ranges(3);
  std::vector<std::thread::id> ids(3);
  std::atomic<int> calls{0};
  parallel_for(10, [&](int64_t b, int64_t e) {
    const int p = b == 0 ? 0 : b == 3 ? 1 : 2;  // 10·p/3: 0, 3, 6
    ranges[size_t(p)] = {b, e};
    ids[size_t(p)] = std::this_thread::get_id();
    calls++;
  });
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(ranges[0], std::make_pair(int64_t(0), int64_t(3)));
  EXPECT_EQ(ranges[1], std::make_pair(int64_t(3), int64_t(6)));
  EXPECT_EQ(ranges[2], std::make_pair(int64_t(6), int64_t(10)));
  EXPECT_EQ(ids[0], std::this_thread::get_id());  // the caller is participant 0
  EXPECT_NE(ids[1], ids[0]);
  EXPECT_NE(ids[2], ids[1]);
}

TEST(Parallel, WorkerErrorsReachTheCaller) {
  const ScopedThreads scope(2);
  EXPECT_THROW(parallel_for(100, [](int64_t, int64_t e) {
                 if (e == 100) throw std::runtime_error("last range");
               }),
               std::runtime_error);
  EXPECT_THROW(parallel_chunks(8, 1, [](int64_t b, int64_t) {
                 if (b == 7) throw std::runtime_error("last chunk");
               }),
               std::runtime_error);
  // The pool still works afterwards.
  std::atomic<int64_t> sum{0};
  parallel_for(100, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 100);
}

TEST(Parallel, NestedAndConcurrentRegionsCoverEverything) {
  const ScopedThreads scope(2);
  std::atomic<int64_t> nested{0};
  parallel_for(4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) parallel_chunks(10, 3, [&](int64_t cb, int64_t ce) { nested += ce - cb; });
  });
  EXPECT_EQ(nested.load(), 40);

  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c)
    callers.emplace_back([&] {
      for (int r = 0; r < 200; ++r) parallel_chunks(50, 7, [&](int64_t b, int64_t e) { total += e - b; });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 3 * 200 * 50);
}


// A child forked after the pool started gets a pool of its own (the parent's workers do not exist
// there) and still covers every index.
TEST(Parallel, WorksInAForkedChild) {
  const ScopedThreads scope(2);
  std::atomic<int64_t> sum{0};
  parallel_for(100, [&](int64_t b, int64_t e) { sum += e - b; });  // the parent's pool is running
  ASSERT_EQ(sum.load(), 100);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::atomic<int64_t> child{0};
    parallel_chunks(1000, 7, [&](int64_t b, int64_t e) { child += e - b; });
    parallel_for(1000, [&](int64_t b, int64_t e) { child += e - b; });
    _exit(child.load() == 2000 ? 0 : 1);
  }
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 3000 && (done = waitpid(pid, &status, WNOHANG)) == 0; ++i) usleep(10000);
  if (done == 0) kill(pid, SIGKILL), waitpid(pid, &status, 0);
  ASSERT_EQ(done, pid) << "the child hung for 30 s (waiting for workers it does not have)";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace parallel_test
}  // namespace lineage
