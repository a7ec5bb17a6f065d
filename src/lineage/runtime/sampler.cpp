#include "lineage/runtime/sampler.h"

#include <algorithm>
#include <cmath>

namespace lineage::runtime {

int32_t Sampler::sample(std::span<const float> logits) {
  const int32_t V = int32_t(logits.size());
  if (params_.temperature <= 0.0f) {
    int32_t best = 0;
    for (int32_t i = 1; i < V; ++i)
      if (logits[i] > logits[best]) best = i;
    return best;
  }
  cand_.resize(V);
  for (int32_t i = 0; i < V; ++i) cand_[i] = {logits[i] / params_.temperature, i};
  const auto by_prob = [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; };
  size_t n = V;
  if (params_.top_k > 0 && params_.top_k < V) {
    n = size_t(params_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + n, cand_.end(), by_prob);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_prob);
  }
  const float m = cand_[0].first;
  double z = 0;
  for (size_t i = 0; i < n; ++i) z += (cand_[i].first = std::exp(cand_[i].first - m));
  if (params_.top_p < 1.0f) {
    double acc = 0;
    size_t keep = 0;
    while (keep < n) {
      acc += cand_[keep++].first / z;
      if (acc >= params_.top_p) break;
    }
    n = keep;
    z = 0;
    for (size_t i = 0; i < n; ++i) z += cand_[i].first;
  }
  double r = rng_.uniform() * z;
  for (size_t i = 0; i < n; ++i) {
    r -= cand_[i].first;
    if (r < 0) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace lineage::runtime
