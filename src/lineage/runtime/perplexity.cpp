#include "lineage/runtime/perplexity.h"

#include <algorithm>
#include <cmath>

#include "lineage/core/error.h"
#include "lineage/runtime/sampler.h"
#include "lineage/runtime/session.h"

namespace lineage::runtime {

namespace {

double mean(const std::vector<double>& v) {
  double s = 0;
  for (const double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

// The standard error of the mean of v.
double mean_error(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = mean(v);
  double ss = 0;
  for (const double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / double(v.size() - 1) / double(v.size()));
}

// log-softmax of logits[V] into out[V], in double, rounded to f32 at the end.
void log_softmax(const float* logits, int64_t V, float* out) {
  const double lse = log_sum_exp(logits, V);
  for (int64_t i = 0; i < V; ++i) out[i] = float(double(logits[i]) - lse);
}

}  // namespace

double PerplexityResult::ppl() const { return std::exp(mean(nll)); }

double PerplexityResult::ppl_error() const { return ppl() * mean_error(nll); }

int64_t scored_per_window(int64_t ctx) { return ctx - 1 - ctx / 2; }

int64_t window_count(int64_t tokens, const PerplexityOptions& o) {
  if (o.ctx < 4) throw Error(cat("perplexity: --ctx ", o.ctx, " is too short; expected at least 4 tokens"));
  int64_t n = tokens / o.ctx;
  if (o.max_windows > 0) n = std::min(n, o.max_windows);
  if (n == 0)
    throw Error(cat("perplexity: the data holds ", tokens, " tokens, fewer than one window of --ctx ", o.ctx,
                    "; expected at least ", o.ctx));
  return n;
}

std::vector<int32_t> scored_targets(std::span<const int32_t> tokens, const PerplexityOptions& o) {
  const int64_t windows = window_count(int64_t(tokens.size()), o);
  std::vector<int32_t> targets;
  for (int64_t w = 0; w < windows; ++w)
    for (int64_t j = o.ctx / 2; j < o.ctx - 1; ++j) targets.push_back(tokens[size_t(w * o.ctx + j + 1)]);
  return targets;
}

PerplexityResult perplexity(const model::Model& m, std::span<const int32_t> tokens, const PerplexityOptions& o,
                            const std::function<void(std::span<const float>)>& rows,
                            const std::function<void(int64_t, int64_t, double)>& progress) {
  const int64_t windows = window_count(int64_t(tokens.size()), o), V = m.config.vocab_size;
  const int64_t first = o.ctx / 2, scored = scored_per_window(o.ctx);
  PerplexityResult r;
  r.windows = windows, r.vocab = V;
  r.targets = scored_targets(tokens, o);
  Session s(m);
  std::vector<int32_t> window(size_t(o.ctx));
  std::vector<float> block(size_t(scored * V));
  for (int64_t w = 0; w < windows; ++w) {
    std::copy_n(tokens.begin() + w * o.ctx, o.ctx, window.begin());
    if (o.bos) window[0] = *o.bos;
    s.reset();
    const std::span<const float> logits = s.prefill(window, true);
    for (int64_t j = 0; j < scored; ++j) {
      const int64_t at = first + j;
      float* row = block.data() + j * V;
      log_softmax(logits.data() + at * V, V, row);
      r.nll.push_back(-double(row[r.targets[size_t(w * scored + j)]]));
    }
    if (rows) rows(block);
    if (progress) progress(w + 1, windows, r.ppl());
  }
  return r;
}

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const double at = p * double(sorted.size() - 1);
  const size_t lo = size_t(std::floor(at)), hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (at - double(lo)) * (sorted[hi] - sorted[lo]);
}

void KlDivergence::add(std::span<const float> base, std::span<const float> q, std::span<const int32_t> targets) {
  const int64_t n = int64_t(targets.size()), V = vocab_;
  LINEAGE_CHECK(int64_t(base.size()) == n * V && int64_t(q.size()) == n * V, "KL divergence: rows of ", V,
                " for ", n, " positions expected");
  for (int64_t i = 0; i < n; ++i) {
    const float* b = base.data() + i * V;
    const float* a = q.data() + i * V;
    double kld = 0;
    int64_t top_b = 0, top_a = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double lb = b[v];
      kld += std::exp(lb) * (lb - double(a[v]));
      if (b[v] > b[top_b]) top_b = v;
      if (a[v] > a[top_a]) top_a = v;
    }
    const int32_t t = targets[size_t(i)];
    kld_.push_back(kld);
    nll_base_.push_back(-double(b[t]));
    nll_q_.push_back(-double(a[t]));
    dp_.push_back(std::exp(double(a[t])) - std::exp(double(b[t])));
    same_top_ += top_a == top_b;
  }
}

KlDivergence::Stats KlDivergence::stats() const {
  Stats s;
  s.n = int64_t(kld_.size());
  if (s.n == 0) return s;
  s.ppl_base = std::exp(mean(nll_base_));
  s.ppl_q = std::exp(mean(nll_q_));
  std::vector<double> diff(kld_.size());
  for (size_t i = 0; i < diff.size(); ++i) diff[i] = nll_q_[i] - nll_base_[i];
  s.ln_ratio = mean(diff), s.ln_ratio_error = mean_error(diff);
  const double mb = mean(nll_base_), mq = mean(nll_q_);
  double sbq = 0, sbb = 0, sqq = 0;
  for (size_t i = 0; i < kld_.size(); ++i) {
    sbq += (nll_base_[i] - mb) * (nll_q_[i] - mq);
    sbb += (nll_base_[i] - mb) * (nll_base_[i] - mb);
    sqq += (nll_q_[i] - mq) * (nll_q_[i] - mq);
  }
  s.nll_correlation = sbb > 0 && sqq > 0 ? sbq / std::sqrt(sbb * sqq) : 1.0;
  std::vector<double> k = kld_;
  std::sort(k.begin(), k.end());
  s.kld_mean = mean(kld_), s.kld_error = mean_error(kld_);
  s.kld_median = percentile(k, 0.5), s.kld_p90 = percentile(k, 0.9), s.kld_p99 = percentile(k, 0.99);
  s.kld_p999 = percentile(k, 0.999), s.kld_max = k.back();
  s.top1 = double(same_top_) / double(s.n);
  s.top1_error = std::sqrt(s.top1 * (1 - s.top1) / double(s.n));
  std::vector<double> d = dp_;
  std::sort(d.begin(), d.end());
  double sq = 0;
  for (const double x : dp_) sq += x * x;
  s.dp_mean = mean(dp_), s.dp_rms = std::sqrt(sq / double(s.n));
  s.dp_p1 = percentile(d, 0.01), s.dp_p99 = percentile(d, 0.99);
  return s;
}

}  // namespace lineage::runtime
