#include "lineage/runtime/generate.h"

#include <chrono>

#include "lineage/core/error.h"

namespace lineage::runtime {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

GenerateStats generate(Session& session, const tokenizer::Tokenizer& tok, std::span<const int32_t> prompt,
                       const GenerateOptions& opt, const std::function<void(std::string_view)>& on_text,
                       std::span<const float> logits) {
  GenerateStats st;
  if (prompt.empty() && (logits.empty() || session.position() == 0))
    throw Error("the prompt is empty; generation needs at least one token");
  Sampler sampler(opt.sampling);
  if (opt.rng) sampler.rng() = Rng(*opt.rng);
  tokenizer::StreamDecoder stream(tok);
  st.prompt_tokens = int64_t(prompt.size());
  auto t0 = std::chrono::steady_clock::now();
  if (!prompt.empty()) logits = session.prefill(prompt);
  st.prefill_seconds = seconds_since(t0);
  const int64_t limit = session.model().config.max_positions;
  const auto room = [&] { return limit <= 0 || session.position() < limit; };
  t0 = std::chrono::steady_clock::now();
  bool fed = true;  // whether `logits` follow the last token sampled
  for (int i = 0; i < opt.max_tokens; ++i) {
    const int32_t next = sampler.sample(logits);
    fed = false;
    const bool eos = opt.eos && next == *opt.eos;
    bool stop = eos;
    if (eos) {
      st.stopped_at_eos = true;
    } else {
      st.tokens.push_back(next);
      ++st.generated_tokens;
      on_text(stream.push(next));
      stop = opt.stop && opt.stop();
    }
    const bool last = stop || i + 1 == opt.max_tokens;
    if (!room() || (last && !opt.feed_last)) break;
    logits = session.decode(next);
    fed = true;
    if (last) break;
  }
  on_text(stream.flush());
  st.decode_seconds = seconds_since(t0);
  if (opt.feed_last && fed) st.last_logits.assign(logits.begin(), logits.end());
  st.rng = sampler.rng().snapshot();
  return st;
}

}  // namespace lineage::runtime
