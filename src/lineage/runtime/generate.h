// The generation loop: prefill the prompt, then sample and decode until EOS or max tokens,
// streaming text as complete UTF-8 characters.
#pragma once

#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "lineage/tokenizer/tokenizer.h"
#include "lineage/runtime/sampler.h"
#include "lineage/runtime/session.h"

namespace lineage::runtime {

struct GenerateOptions {
  int max_tokens = 64;
  SamplingParams sampling;
  std::optional<int32_t> eos;  // stop when sampled (not printed)
  // The sampler's stream to continue (a state file's) instead of a fresh one from sampling.seed.
  std::optional<Rng::Snapshot> rng;
  // Decode the last sampled token too (EOS included), so the session's state holds every token and
  // GenerateStats::last_logits the next one's distribution: what a saved state needs to continue.
  bool feed_last = false;
  // Asked after each token's text is passed on: true ends generation there (that token is the last;
  // fed when feed_last is set), as a stop sequence found in the text does.
  std::function<bool()> stop;
};

struct GenerateStats {
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  bool stopped_at_eos = false;
  std::vector<int32_t> tokens;  // generated ids
  std::vector<float> last_logits;  // feed_last: the logits after the session's last token (empty if none)
  Rng::Snapshot rng;               // the sampler's stream after the last draw
};

// An empty prompt continues a restored session from `logits`, the distribution after its last
// token (a state file's).
GenerateStats generate(Session& session, const tokenizer::Tokenizer& tok, std::span<const int32_t> prompt,
                       const GenerateOptions& opt, const std::function<void(std::string_view)>& on_text,
                       std::span<const float> logits = {});

}  // namespace lineage::runtime
