#include "lineage/runtime/generate.h"

#include <chrono>

#include "lineage/core/error.h"

namespace lineage::runtime {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

GenerateStats generate(Session& session, const io::Tokenizer& tok, std::span<const int32_t> prompt,
                       const GenerateOptions& opt, const std::function<void(std::string_view)>& on_text) {
  GenerateStats st;
  if (prompt.empty()) throw Error("the prompt is empty; generation needs at least one token");
  Sampler sampler(opt.sampling);
  io::StreamDecoder stream(tok);
  st.prompt_tokens = int64_t(prompt.size());
  auto t0 = std::chrono::steady_clock::now();
  std::span<const float> logits = session.prefill(prompt);
  st.prefill_seconds = seconds_since(t0);
  const int64_t limit = session.model().config.max_positions;
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < opt.max_tokens; ++i) {
    const int32_t next = sampler.sample(logits);
    if (opt.eos && next == *opt.eos) {
      st.stopped_at_eos = true;
      break;
    }
    st.tokens.push_back(next);
    ++st.generated_tokens;
    on_text(stream.push(next));
    if (i + 1 == opt.max_tokens || (limit > 0 && session.position() >= limit)) break;
    logits = session.decode(next);
  }
  on_text(stream.flush());
  st.decode_seconds = seconds_since(t0);
  return st;
}

}  // namespace lineage::runtime
