#include "lineage/kernels/row_split.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "lineage/core/parallel.h"

namespace lineage::kernels {

namespace {

struct Installed {
  RowSplit split;
  std::thread::id thread;
};
std::optional<Installed> g_split;
RowSplitStats g_stats;

const RowSplit* row_split_here() {
  return g_split && g_split->thread == std::this_thread::get_id() ? &g_split->split : nullptr;
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
void reset_row_split_stats() { g_stats = {}; }

namespace {

// Rows [o0, o0 + n) of a 2-D tensor stored row by row (`row_bytes` bytes a row), borrowed.
Tensor rows_of(const Tensor& t, int64_t o0, int64_t n, int64_t row_bytes) {
  return Tensor::borrow(t.dtype(), Shape{n, t.dim(1)}, static_cast<const char*>(t.raw()) + o0 * row_bytes, nullptr);
}

}  // namespace

bool linear_split(const float* x, int64_t T, const Weight& W, const Tensor* bias, float* y,
                  std::optional<Activation> act, LinearFn whole) {
  const RowSplit* s = row_split_here();
  if (!s || T <= 0 || W.layout != Layout::OutIn || in_parallel_region()) return false;
  const int64_t out = W.out();
  const auto [o0, o1] = rank_rows(out, s->rank, s->ranks);
  const int64_t n = o1 - o0;
  // This rank's rows of W (its codes, block scales, group scales and zeros) and of the bias.
  Tensor w_rows, scale_rows, bias_rows;
  QuantWeight q_rows;
  Weight mine = W;
  if (n > 0) {
    w_rows = rows_of(*W.w, o0, n, int64_t(W.w->nbytes()) / W.w->dim(0));
    mine.w = &w_rows;
    if (W.scales) {
      scale_rows = rows_of(*W.scales, o0, n, int64_t(W.scales->nbytes()) / W.scales->dim(0));
      mine.scales = &scale_rows;
    }
    if (W.quant) {
      q_rows = *W.quant;
      q_rows.out = n;
      q_rows.q += o0 * q_rows.row_bytes;
      if (q_rows.scale) q_rows.scale += o0 * q_rows.groups;
      if (q_rows.zero) q_rows.zero += o0 * q_rows.groups;
      mine.quant = &q_rows;
    }
    if (bias) bias_rows = Tensor::borrow(bias->dtype(), Shape{n},
                                         static_cast<const char*>(bias->raw()) + o0 * dtype_size(bias->dtype()), nullptr);
  }
  thread_local std::vector<float> rows, all;
  rows.resize(size_t(T * n));
  if (n > 0) whole(x, T, mine, bias ? &bias_rows : nullptr, rows.data(), act);
  std::vector<int64_t> counts(size_t(s->ranks));
  for (int r = 0; r < s->ranks; ++r) {
    const auto [a, b] = rank_rows(out, r, s->ranks);
    counts[size_t(r)] = T * (b - a);
  }
  const auto start = std::chrono::steady_clock::now();
  if (T == 1) {
    s->gather(rows.data(), counts, y);  // one token: the ranks' rows in rank order are y
  } else {  // each rank's [T, n_r] block, then every token's row put together
    all.resize(size_t(T * out));
    s->gather(rows.data(), counts, all.data());
    const float* block = all.data();
    for (int r = 0; r < s->ranks; ++r) {
      const auto [a, b] = rank_rows(out, r, s->ranks);
      for (int64_t t = 0; t < T; ++t)
        std::copy(block + t * (b - a), block + (t + 1) * (b - a), y + t * out + a);
      block += T * (b - a);
    }
  }
  g_stats.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  g_stats.gathers += 1;
  g_stats.floats_sent += T * n;
  g_stats.floats_received += T * (out - n);
  return true;
}

}  // namespace lineage::kernels
