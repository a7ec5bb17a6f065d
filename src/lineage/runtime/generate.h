// The generation loop: prefill the prompt, then sample and decode until EOS or max tokens,
// streaming text as complete UTF-8 characters.
#pragma once

#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "lineage/io/tokenizer.h"
#include "lineage/runtime/sampler.h"
#include "lineage/runtime/session.h"

namespace lineage::runtime {

struct GenerateOptions {
  int max_tokens = 64;
  SamplingParams sampling;
  std::optional<int32_t> eos;  // stop when sampled (not printed)
};

struct GenerateStats {
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  bool stopped_at_eos = false;
  std::vector<int32_t> tokens;  // generated ids
};

GenerateStats generate(Session& session, const io::Tokenizer& tok, std::span<const int32_t> prompt,
                       const GenerateOptions& opt, const std::function<void(std::string_view)>& on_text);

}  // namespace lineage::runtime
