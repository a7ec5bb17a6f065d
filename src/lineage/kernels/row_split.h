// Tensor parallelism's hook in the kernels (issue 41, docs/distributed.md): while a RowSplit is
// installed, linear() and linear_group() called on the installing thread compute only this rank's
// share of each [out, in] weight's output rows, and `gather` assembles every rank's rows in rank
// order on every rank. Nothing is ever summed across ranks: each output row is the dot products of
// one rank, computed by the same kernels a lone process runs, so the ranks' results are bit for bit
// those of one process whatever the rank count. Weights stored [in, out] (GPT-2's mapped Conv1D) are
// computed whole on every rank. The hook knows nothing of MPI: the caller (the lineage command)
// gives the gather over its transport (dist/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>

#include "lineage/core/tensor.h"
#include "lineage/kernels/activation.h"
#include "lineage/kernels/linear.h"

namespace lineage::kernels {

struct RowSplit {
  int rank = 0, ranks = 1;
  // Matrices smaller than this are computed whole on every rank: a gather costs more than reading
  // them (MLA's per-head absorbed products, routers of few experts).
  size_t min_bytes = 0;
  // Every rank's counts[r] floats, gathered in rank order into `out` on every rank; `mine` holds
  // this rank's counts[rank].
  std::function<void(const float* mine, std::span<const int64_t> counts, float* out)> gather;
  // The routed experts placed by rank (--parallel expert, layers/ffn/moe.cpp): rank r runs the
  // experts [E·r/P, E·(r+1)/P) whole on the rows that chose them, and one gather gives every rank
  // their outputs. Otherwise each expert is split inside itself by rows, as every other matrix.
  bool experts_by_rank = false;
};

// Installs `split` for linear() calls on this thread (the one that calls the collectives), or
// removes it (ranks <= 1). Calls on other threads compute every row, as do calls inside a parallel
// region.
void set_row_split(const RowSplit& split);
void clear_row_split();
bool row_split_active();

// Rank `rank`'s rows of `out` among `ranks`: [out·rank/ranks, out·(rank+1)/ranks).
std::pair<int64_t, int64_t> rank_rows(int64_t out, int rank, int ranks);

// What the split has done in this process: gathers made, floats this rank contributed and
// floats it received, and the seconds spent in gather (communication, waiting for the slowest rank
// included).
struct RowSplitStats {
  int64_t gathers = 0, floats_sent = 0, floats_received = 0;
  int64_t expert_gathers = 0;  // of them, gathers of the experts placed by rank
  double seconds = 0;
};
RowSplitStats row_split_stats();

// The split this call may use: the one installed on this thread, outside a parallel region (null
// otherwise). For layers that split a computation of several matrices themselves (the routed experts).
const RowSplit* row_split_now();
// Whether W's rows are split under s: stored [out, in] and at least s.min_bytes.
bool splits(const RowSplit& s, const Weight& W);
// Rows [o0, o1) of W (its codes, block scales, group scales and zeros): y [T, o1 - o0] = x·W[o0:o1]ᵀ,
// no bias, computed as linear() computes those rows of the whole product.
void linear_rows(const float* x, int64_t T, const Weight& W, int64_t o0, int64_t o1, float* y);
// s.gather, counted in row_split_stats() (as an experts' gather with `experts`).
void gather_rows(const RowSplit& s, const float* mine, std::span<const int64_t> counts, float* out,
                 bool experts = false);

// Heads split by rank (attention's KV caches, the delta rule's states): under the split installed on
// this thread (row_split_now), this rank's heads [heads·r/P, heads·(r+1)/P) of `heads`; nothing
// without a split, or with fewer heads than ranks (every rank then runs every head).
std::optional<std::pair<int64_t, int64_t>> rank_heads_now(int64_t heads);
// Rows split by units: [N, units·per] rows of which rank r computed units rank_rows(units, r, P),
// packed [N, n_r·per] (`mine` on this rank). One gather gives every rank all of them in `out`
// [N, units·per].
void gather_columns(const RowSplit& s, const float* mine, int64_t N, int64_t units, int64_t per, float* out);
// gather_columns over the split installed on this thread (row_split_now), units being heads: a
// layer's heads' outputs where its states hold only this rank's heads. An error where no split is
// installed (such a state used elsewhere).
void gather_heads(const float* mine, int64_t N, int64_t heads, int64_t per, float* out);

// While one lives, calls on this thread compute every row, unsplit: a rank running its own experts
// whole (RowSplit::experts_by_rank).
class RowSplitPause {
 public:
  RowSplitPause();
  ~RowSplitPause();
  RowSplitPause(const RowSplitPause&) = delete;
  RowSplitPause& operator=(const RowSplitPause&) = delete;

 private:
  bool was_;
};

// For linear() and linear_group(): where a split is installed on this thread and the call is not
// inside a parallel region, computes each output whose W is split (stored [out, in], at least
// min_bytes) on this rank's rows of W (and of its bias) with `whole`, gathers every rank's rows of
// all of them in one gather, computes the other outputs whole, and returns true; false otherwise
// (the caller computes everything). `then` callbacks are the caller's.
using LinearFn = void (*)(const float* x, int64_t T, const Weight& W, const Tensor* bias, float* y,
                          std::optional<Activation> act);
bool linear_group_split(const float* x, int64_t T, std::span<const LinearOut> outs, LinearFn whole);
// linear_rows with the product `whole` (linear.cpp's).
void linear_rows_with(const float* x, int64_t T, const Weight& W, int64_t o0, int64_t o1, float* y, LinearFn whole);

}  // namespace lineage::kernels
