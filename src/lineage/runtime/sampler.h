// Next-token sampling: greedy, temperature, top-k, top-p, seeded; and a row's log-sum-exp, from which
// log-probabilities are read.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lineage/core/rng.h"

namespace lineage::runtime {

// log Σ exp(logits[v]) over a row of V logits, in double (the max taken out first): a token's
// log-probability is its logit less this (the server's logprobs, lineage perplexity's rows).
double log_sum_exp(const float* logits, int64_t V);

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax, ties to the lower id)
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : params_(p), rng_(p.seed) {}
  // Keeps the top-k, then the smallest set of most likely tokens whose probability reaches top_p,
  // renormalizes, and draws one. Only the top-k or the nucleus is sorted, never the whole
  // vocabulary (but for a distribution flatter than 1e-9 everywhere): a plain temperature draw
  // walks the weights in id order.
  int32_t sample(std::span<const float> logits);
  Rng& rng() { return rng_; }  // to save and continue the random stream (state files)

 private:
  SamplingParams params_;
  Rng rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<float> weights_;
};

}  // namespace lineage::runtime
