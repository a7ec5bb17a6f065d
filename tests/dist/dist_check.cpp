// lineage_dist_check: the collectives of dist::world() checked on every rank (tests/dist/run.sh runs
// it under mpirun with 1 to 4 ranks, over shared memory and over TCP).
//   lineage_dist_check              all-gather (uneven counts, a rank with none), broadcast from every
//                                   root (0 bytes to 3 MiB), barrier, any_failed with no failure
//   lineage_dist_check --fail R     rank R reports an error through any_failed: every rank prints it
//                                   ("error: rank R: ...") and exits 3
//   lineage_dist_check --die R      rank R exits at once (signal-like, code 9) before a collective:
//                                   the others must not hang (mpirun ends them)
// Prints "dist ok: rank r of p over NAME" per rank on success.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/dist/transport.h"

using namespace lineage;

namespace {

void expect(bool ok, const std::string& what) {
  if (!ok) throw Error("check failed: " + what);
}

void collectives(dist::Transport& t) {
  const int r = t.rank(), p = t.size();
  // Uneven counts, the middle rank with none: rank q holds q·3 + 1 floats (0 for q = p / 2 when p > 2).
  std::vector<int64_t> counts(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q) counts[size_t(q)] = (p > 2 && q == p / 2) ? 0 : q * 3 + 1;
  std::vector<float> mine(static_cast<size_t>(counts[size_t(r)]));
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = float(r * 1000 + int(i));
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<float> all(size_t(total), -1.0f);
  t.all_gather(mine.data(), counts, all.data());
  int64_t at = 0;
  for (int q = 0; q < p; ++q)
    for (int64_t i = 0; i < counts[size_t(q)]; ++i, ++at)
      expect(all[size_t(at)] == float(q * 1000 + int(i)), cat("all_gather: rank ", q, "'s value ", i, " at ", at));
  // In place: this rank's floats already at their place in the output.
  std::vector<float> again(size_t(total), -1.0f);
  int64_t offset = 0;
  for (int q = 0; q < r; ++q) offset += counts[size_t(q)];
  std::copy(mine.begin(), mine.end(), again.begin() + offset);
  t.all_gather(again.data() + offset, counts, again.data());
  expect(again == all, "all_gather in place");
  // Broadcast from every root: 0 bytes, 1 byte, 3 MiB.
  for (int root = 0; root < p; ++root)
    for (size_t bytes : {size_t(0), size_t(1), size_t(3) << 20}) {
      std::vector<unsigned char> buf(bytes, static_cast<unsigned char>(r == root ? 0 : 0xFF));
      if (r == root)
        for (size_t i = 0; i < bytes; ++i) buf[i] = static_cast<unsigned char>((i * 7 + size_t(root)) & 0xFF);
      t.broadcast(buf.data(), bytes, root);
      for (size_t i = 0; i < bytes; ++i)
        if (buf[i] != static_cast<unsigned char>((i * 7 + size_t(root)) & 0xFF))
          expect(false, cat("broadcast from ", root, ": byte ", i, " of ", bytes));
    }
  t.barrier();
  expect(!t.any_failed(false, "").has_value(), "any_failed without a failure");
  // Two ranks fail: every rank hears the lower one.
  if (p > 1) {
    const auto f = t.any_failed(r >= p - 2, cat("trouble on ", r));
    expect(f && *f == cat("rank ", p - 2, ": trouble on ", p - 2), cat("any_failed's message: ", f ? *f : "none"));
  }
}

}  // namespace

int main(int argc, char** argv) {
  int fail = -1, die = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--fail")) fail = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--die")) die = std::atoi(argv[i + 1]);
  }
  try {
    auto t = dist::world();
    t->barrier();
    if (t->rank() == die) std::_Exit(9);
    if (fail >= 0) {
      const auto f = t->any_failed(t->rank() == fail, "the checkpoint's shard 3 is damaged");
      if (f) {
        std::fprintf(stderr, "error: %s (seen by rank %d)\n", f->c_str(), t->rank());
        return 3;
      }
    }
    if (die >= 0) {  // the others wait in a collective the dead rank never joins
      t->barrier();
      std::vector<float> x(4, 1.0f), y(4 * size_t(t->size()));
      t->all_gather(x.data(), std::vector<int64_t>(size_t(t->size()), 4), y.data());
    }
    collectives(*t);
    std::printf("dist ok: rank %d of %d over %s\n", t->rank(), t->size(), t->name().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
