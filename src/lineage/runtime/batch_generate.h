// Continuous batching: many prompts decoded together over one state pool. Each step holds the next
// piece of every prompt still being prefilled and the last sampled token of every sequence decoding;
// a sequence that finishes frees its slot, and the next waiting prompt takes it in the next step.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "lineage/model/model.h"
#include "lineage/runtime/generate.h"

namespace lineage::runtime {

struct BatchRequest {
  std::vector<int32_t> prompt;  // at least one token
  GenerateOptions options;      // max_tokens, sampling (its own seeded sampler), eos
};

struct BatchResult {
  size_t index = 0;              // the request's place in the input
  std::vector<int32_t> tokens;   // generated ids (EOS not included)
  int64_t prompt_tokens = 0;
  std::string finish_reason;     // "stop" (EOS), "length" (max_tokens) or "context" (the context limit)
};

struct BatchOptions {
  int64_t max_sequences = 8;  // decoding together at most (state slots)
  int64_t ctx = 0;            // positions per slot up front; 0 = the model's limit, grown on demand
  int64_t prefill_chunk = 512;  // prompt tokens a sequence feeds per step at most
};

struct BatchStats {
  int64_t prompt_tokens = 0, generated_tokens = 0, steps = 0, most_together = 0;
  double seconds = 0;
};

// Runs every request to its end and hands each result to on_done as it finishes (in finishing
// order). At temperature 0 a request gives the tokens it gives alone through generate() (its logits
// equal to f32 rounding; bit for bit while at most 8 tokens share a step).
BatchStats generate_batch(const model::Model& m, std::span<const BatchRequest> requests, const BatchOptions& opt,
                          const std::function<void(BatchResult&&)>& on_done);

}  // namespace lineage::runtime
