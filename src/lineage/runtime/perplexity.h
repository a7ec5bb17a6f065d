// Perplexity and the KL divergence against a base model, as llama.cpp's llama-perplexity measures
// them: the token stream cut into windows of `ctx` tokens (a last partial window dropped), each run
// from an empty state; in each window the predictions of its second half are scored (positions
// ctx/2 .. ctx−2, each predicting the next token), so every scored token has at least ctx/2 tokens
// of context. What `lineage perplexity` prints, and what the quantization study compares.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "lineage/model/model.h"

namespace lineage::runtime {

struct PerplexityOptions {
  int64_t ctx = 512;       // tokens per window (≥ 4)
  int64_t max_windows = 0;  // 0: every whole window of the stream
  // Where the model starts a sequence with BOS: the first token of each window is replaced by it
  // (llama.cpp's rule), so each window reads as a document's start.
  std::optional<int32_t> bos;
};

// The windows' scored positions: the target token of each, and −log p(target) in double.
struct PerplexityResult {
  int64_t windows = 0, vocab = 0;
  std::vector<int32_t> targets;
  std::vector<double> nll;
  double ppl() const;        // exp(mean nll)
  double ppl_error() const;  // ppl × the standard error of the mean nll (its first-order spread)
};

// How many positions a window of `ctx` tokens scores: ctx − 1 − ctx/2.
int64_t scored_per_window(int64_t ctx);
// How many whole windows the stream holds (at most max_windows when set); an Error when none.
int64_t window_count(int64_t tokens, const PerplexityOptions& o);

// The target of every scored position, in order (what a run scores, before it runs).
std::vector<int32_t> scored_targets(std::span<const int32_t> tokens, const PerplexityOptions& o);

// Runs the windows one after another. `rows`, when set, receives each window's scored log-softmax
// rows [scored_per_window, vocab] (f32, in order) as they are computed, so a caller can stream them
// to a file. `progress` gets (windows done, windows, the perplexity so far).
PerplexityResult perplexity(const model::Model& m, std::span<const int32_t> tokens, const PerplexityOptions& o,
                            const std::function<void(std::span<const float>)>& rows = {},
                            const std::function<void(int64_t, int64_t, double)>& progress = {});

// The divergence of a model Q from a base over the same scored positions, from the two runs' log-softmax
// rows (streamed: add() one block of rows at a time) and the targets. Percentiles interpolate linearly
// between the sorted values (numpy's default).
class KlDivergence {
 public:
  explicit KlDivergence(int64_t vocab) : vocab_(vocab) {}
  // rows of the base and of Q, [n, vocab] each, for the positions whose targets are `targets`.
  void add(std::span<const float> base, std::span<const float> q, std::span<const int32_t> targets);

  struct Stats {
    int64_t n = 0;
    double ppl_base = 0, ppl_q = 0, ln_ratio = 0, ln_ratio_error = 0;  // ln(PPL(Q) / PPL(base)) ± its error
    double nll_correlation = 0;  // Pearson's r of the two runs' −log p(target)
    double kld_mean = 0, kld_error = 0, kld_median = 0, kld_p90 = 0, kld_p99 = 0, kld_p999 = 0, kld_max = 0;
    double top1 = 0, top1_error = 0;  // the fraction of positions where both runs' most likely token is the same
    double dp_mean = 0, dp_rms = 0, dp_p1 = 0, dp_p99 = 0;  // Δp = p_Q(target) − p_base(target)
  };
  Stats stats() const;

 private:
  int64_t vocab_;
  std::vector<double> kld_, nll_base_, nll_q_, dp_;
  int64_t same_top_ = 0;
};

// The value at fraction p ∈ [0, 1] of sorted `v`, linearly interpolated (numpy.percentile's default).
double percentile(const std::vector<double>& sorted, double p);

}  // namespace lineage::runtime
