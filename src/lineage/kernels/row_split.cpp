#include "lineage/kernels/row_split.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/parallel.h"

namespace lineage::kernels {

namespace {

struct Installed {
  RowSplit split;
  std::thread::id thread;
};
std::optional<Installed> g_split;
RowSplitStats g_stats;
thread_local bool g_paused = false;

const RowSplit* row_split_here() {
  return g_split && !g_paused && g_split->thread == std::this_thread::get_id() ? &g_split->split : nullptr;
}

}  // namespace

void set_row_split(const RowSplit& split) {
  if (split.ranks <= 1) {
    clear_row_split();
    return;
  }
  g_split = Installed{split, std::this_thread::get_id()};
}

void clear_row_split() { g_split.reset(); }

bool row_split_active() { return g_split.has_value(); }

std::pair<int64_t, int64_t> rank_rows(int64_t out, int rank, int ranks) {
  return {out * rank / ranks, out * (rank + 1) / ranks};
}

RowSplitStats row_split_stats() { return g_stats; }

namespace {

// Rows [o0, o0 + n) of a 2-D tensor stored row by row (`row_bytes` bytes a row), borrowed.
Tensor rows_of(const Tensor& t, int64_t o0, int64_t n, int64_t row_bytes) {
  return Tensor::borrow(t.dtype(), Shape{n, t.dim(1)}, static_cast<const char*>(t.raw()) + o0 * row_bytes, nullptr);
}

// This rank's rows [o0, o0 + n) of W (its codes, block scales, group scales and zeros) and of a bias,
// borrowed from the whole ones.
struct RowsOf {
  Tensor w, scales, bias;
  QuantWeight quant;
  Weight W;
  RowsOf(const Weight& whole, const Tensor* b, int64_t o0, int64_t n) : W(whole) {
    w = rows_of(*whole.w, o0, n, int64_t(whole.w->nbytes()) / whole.w->dim(0));
    W.w = &w;
    if (whole.scales) {
      scales = rows_of(*whole.scales, o0, n, int64_t(whole.scales->nbytes()) / whole.scales->dim(0));
      W.scales = &scales;
    }
    if (whole.quant) {
      quant = *whole.quant;
      quant.out = n;
      quant.q += o0 * quant.row_bytes;
      if (quant.scale) quant.scale += o0 * quant.groups;
      if (quant.zero) quant.zero += o0 * quant.groups;
      W.quant = &quant;
    }
    if (b) bias = Tensor::borrow(b->dtype(), Shape{n}, static_cast<const char*>(b->raw()) + o0 * dtype_size(b->dtype()), nullptr);
  }
};

}  // namespace

bool splits(const RowSplit& s, const Weight& W) {
  if (W.layout != Layout::OutIn) return false;
  const size_t bytes = W.w->nbytes() + (W.scales ? W.scales->nbytes() : 0);
  return bytes >= s.min_bytes;
}

const RowSplit* row_split_now() { return in_parallel_region() ? nullptr : row_split_here(); }

void linear_rows_with(const float* x, int64_t T, const Weight& W, int64_t o0, int64_t o1, float* y, LinearFn whole) {
  if (o1 <= o0 || T <= 0) return;
  const RowsOf part(W, nullptr, o0, o1 - o0);
  whole(x, T, part.W, nullptr, y, std::nullopt);
}

std::optional<std::pair<int64_t, int64_t>> rank_heads_now(int64_t heads) {
  const RowSplit* s = row_split_now();
  if (!s || heads < s->ranks) return std::nullopt;
  return rank_rows(heads, s->rank, s->ranks);
}

void gather_columns(const RowSplit& s, const float* mine, int64_t N, int64_t units, int64_t per, float* out) {
  const int P = s.ranks;
  thread_local std::vector<int64_t> counts;  // a decode step's scratch, kept: no allocation per call
  counts.resize(size_t(P));
  for (int r = 0; r < P; ++r) {
    const auto [a, z] = rank_rows(units, r, P);
    counts[size_t(r)] = N * (z - a) * per;
  }
  thread_local std::vector<float> all;
  all.resize(size_t(N * units * per));
  gather_rows(s, mine, counts, all.data());
  const float* at = all.data();
  for (int r = 0; r < P; ++r) {
    const auto [a, z] = rank_rows(units, r, P);
    const int64_t n = (z - a) * per;  // floats a row from rank r
    for (int64_t t = 0; t < N && n > 0; ++t)
      std::memcpy(out + t * units * per + a * per, at + t * n, size_t(n) * sizeof(float));
    at += N * n;
  }
}

void gather_heads(const float* mine, int64_t N, int64_t heads, int64_t per, float* out) {
  const RowSplit* s = row_split_now();
  LINEAGE_CHECK(s, "a state split by heads is used where its split is not installed");
  gather_columns(*s, mine, N, heads, per, out);
}

RowSplitPause::RowSplitPause() : was_(g_paused) { g_paused = true; }
RowSplitPause::~RowSplitPause() { g_paused = was_; }

void gather_rows(const RowSplit& s, const float* mine, std::span<const int64_t> counts, float* out, bool experts) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const auto start = std::chrono::steady_clock::now();
  s.gather(mine, counts, out);
  g_stats.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  g_stats.gathers += 1;
  g_stats.expert_gathers += experts ? 1 : 0;
  g_stats.floats_sent += counts[size_t(s.rank)];
  g_stats.floats_received += total - counts[size_t(s.rank)];
}

bool linear_group_split(const float* x, int64_t T, std::span<const LinearOut> outs, LinearFn whole) {
  const RowSplit* s = row_split_here();
  if (!s || T <= 0 || in_parallel_region()) return false;
  const int P = s->ranks;
  // Each split output's rows of this rank, one after another in `rows` ([T, n_j] each); every rank's
  // part of the gather is its blocks in the outputs' order.
  thread_local std::vector<float> rows, all;  // scratch kept across calls: no allocation per call
  thread_local std::vector<const LinearOut*> split;
  thread_local std::vector<int64_t> counts;
  split.clear();
  counts.assign(size_t(P), 0);
  int64_t mine = 0;
  for (const LinearOut& o : outs) {
    if (!splits(*s, o.W)) {
      whole(x, T, o.W, o.bias, o.y, o.act);
      continue;
    }
    split.push_back(&o);
    for (int r = 0; r < P; ++r) {
      const auto [a, b] = rank_rows(o.W.out(), r, P);
      counts[size_t(r)] += T * (b - a);
    }
  }
  if (split.empty()) return true;
  rows.resize(size_t(counts[size_t(s->rank)]));
  for (const LinearOut* o : split) {
    const auto [o0, o1] = rank_rows(o->W.out(), s->rank, P);
    if (o1 == o0) continue;
    const RowsOf part(o->W, o->bias, o0, o1 - o0);
    whole(x, T, part.W, o->bias ? &part.bias : nullptr, rows.data() + mine, o->act);
    mine += T * (o1 - o0);
  }
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  float* gathered = nullptr;
  if (split.size() == 1 && T == 1) {
    gathered = split.front()->y;  // one output of one token: the ranks' rows in rank order are y
  } else {
    all.resize(size_t(total));
    gathered = all.data();
  }
  gather_rows(*s, rows.data(), counts, gathered);
  if (gathered != all.data()) return true;
  // Rank r's part holds, for each split output, its [T, n_r] block: put every token's row together.
  const float* block = all.data();
  for (int r = 0; r < P; ++r)
    for (const LinearOut* o : split) {
      const int64_t out = o->W.out();
      const auto [a, b] = rank_rows(out, r, P);
      for (int64_t t = 0; t < T; ++t) std::copy(block + t * (b - a), block + (t + 1) * (b - a), o->y + t * out + a);
      block += T * (b - a);
    }
  return true;
}

}  // namespace lineage::kernels
