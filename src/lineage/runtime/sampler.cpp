#include "lineage/runtime/sampler.h"

#include <algorithm>
#include <cmath>

namespace lineage::runtime {

double log_sum_exp(const float* logits, int64_t V) {
  double top = logits[0];
  for (int64_t i = 1; i < V; ++i) top = std::max(top, double(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(logits[i]) - top);
  return top + std::log(sum);
}

namespace {

// The largest value: sixteen running maxima the compiler keeps in vector registers, then the
// lanes. A NaN is never the maximum.
float max_value(std::span<const float> x) {
  constexpr size_t L = 16;
  float lane[L];
  std::fill(lane, lane + L, -INFINITY);
  size_t i = 0;
  for (; i + L <= x.size(); i += L)
    for (size_t j = 0; j < L; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  float m = -INFINITY;
  for (size_t j = 0; j < L; ++j) m = lane[j] > m ? lane[j] : m;
  for (; i < x.size(); ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// The lowest id holding the maximum (0 when every value is NaN).
int32_t argmax(std::span<const float> x) {
  const float m = max_value(x);
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] == m) return int32_t(i);
  return 0;
}

// A token whose weight exp(logit/T − max) is below this has probability under 1e-9 of the most
// likely one's: the nucleus is looked for among the tokens above it first.
constexpr float kNucleusFloor = 1e-9f;

}  // namespace

int32_t Sampler::sample(std::span<const float> logits) {
  const int32_t V = int32_t(logits.size());
  if (params_.temperature <= 0.0f) return argmax(logits);
  const float T = params_.temperature;
  const auto by_prob = [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; };
  // Draws from the first n candidates by weight (cand_[i].first, not normalized; their sum z).
  const auto draw = [&](size_t n, double z) {
    double r = rng_.uniform() * z;
    for (size_t i = 0; i < n; ++i) {
      r -= cand_[i].first;
      if (r < 0) return cand_[i].second;
    }
    return cand_[n - 1].second;
  };
  // The smallest prefix of the sorted candidates cand_[0, n) whose weight reaches top_p of z.
  const auto nucleus = [&](size_t n, double z, double& kept) {
    kept = 0;
    size_t keep = 0;
    while (keep < n) {
      kept += cand_[keep++].first;
      if (kept >= params_.top_p * z) break;
    }
    return keep;
  };

  if (params_.top_k > 0 && params_.top_k < V) {
    // Top-k: the k most likely, sorted, then top-p among them.
    cand_.resize(size_t(V));
    for (int32_t i = 0; i < V; ++i) cand_[size_t(i)] = {logits[size_t(i)] / T, i};
    const size_t k = size_t(params_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + ptrdiff_t(k), cand_.end(), by_prob);
    const float m = cand_[0].first;
    double z = 0;
    for (size_t i = 0; i < k; ++i) z += (cand_[i].first = std::exp(cand_[i].first - m));
    if (params_.top_p >= 1.0f) return draw(k, z);
    double kept = 0;
    const size_t n = nucleus(k, z, kept);
    return draw(n, kept);
  }

  // The whole vocabulary: weights in id order, no sort.
  const float m = max_value(logits) / T;
  weights_.resize(size_t(V));
  double z = 0;
  for (int32_t i = 0; i < V; ++i) z += (weights_[size_t(i)] = std::exp(logits[size_t(i)] / T - m));
  if (params_.top_p >= 1.0f) {
    double r = rng_.uniform() * z;
    for (int32_t i = 0; i < V; ++i) {
      r -= weights_[size_t(i)];
      if (r < 0) return i;
    }
    return argmax(logits);
  }
  // Top-p: the nucleus among the tokens above the floor, sorted; all of them sorted only if those
  // do not reach top_p (a distribution flatter than 1e-9 across the vocabulary).
  cand_.clear();
  for (int32_t i = 0; i < V; ++i)
    if (weights_[size_t(i)] >= kNucleusFloor) cand_.push_back({weights_[size_t(i)], i});
  std::sort(cand_.begin(), cand_.end(), by_prob);
  double kept = 0;
  size_t n = nucleus(cand_.size(), z, kept);
  if (kept < params_.top_p * z) {
    cand_.clear();
    for (int32_t i = 0; i < V; ++i) cand_.push_back({weights_[size_t(i)], i});
    std::sort(cand_.begin(), cand_.end(), by_prob);
    n = nucleus(cand_.size(), z, kept);
  }
  return draw(n, kept);
}

}  // namespace lineage::runtime
