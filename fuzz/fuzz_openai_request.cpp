// A request body through serve::parse_request (the JSON lineage serve accepts at /v1/completions and
// /v1/chat/completions), then the stop sequences it asks for through serve::StopFilter over text
// cut into pieces as tokens would cut it. The HTTP framing itself is Debian's cpp-httplib, driven
// with malformed requests by tests/serve/test_load.py.
// Input: the body; the last byte chooses chat (odd) and the piece sizes.
// parse_request may refuse with an ApiError (status 400); what it accepts must be in range. The
// filter's output must be a prefix of the text, hold no stop sequence, and end where one begins (or
// be the whole text when none was found).
#include <string>

#include "fuzz_support.h"
#include "lineage/chat/chat_template.h"
#include "lineage/serve/openai.h"

using namespace lineage;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data), size - 1);
  const uint8_t control = data[size - 1];
  const bool chat = control & 1;
  serve::CompletionRequest r;
  try {
    r = serve::parse_request(body, chat);
  } catch (const serve::ApiError& e) {
    if (e.status != 400 || e.message.empty()) fuzz::violated(cat("refused with status ", e.status, ": ", e.message));
    if (e.body().find("\"error\"") == std::string::npos) fuzz::violated("an error body without \"error\"");
    return 0;
  }
  // max_tokens 0 only to score a prompt (echo with logprobs).
  if (r.max_tokens && *r.max_tokens < (r.echo && r.logprobs >= 0 ? 0 : 1))
    fuzz::violated(cat("accepted max_tokens ", *r.max_tokens));
  if (r.logprobs < -1 || r.logprobs > 20 || r.n < 1 || r.n > 16)
    fuzz::violated(cat("accepted logprobs ", r.logprobs, ", n ", r.n));
  if (r.stream && (r.echo || r.n > 1)) fuzz::violated("accepted echo or n > 1 with stream");
  if (!chat && (!r.tools.is_null() || !r.raw_messages.is_null())) fuzz::violated("tools on a completion");
  if (r.uses_tools() && !r.raw_messages.is_array()) fuzz::violated("tools without the messages as sent");
  if (!(r.temperature >= 0) || !(r.top_p >= 0 && r.top_p <= 1) || r.top_k < 0)
    fuzz::violated(cat("accepted temperature ", r.temperature, ", top_p ", r.top_p, ", top_k ", r.top_k));
  if (r.stop.size() > 4) fuzz::violated(cat("accepted ", r.stop.size(), " stop sequences"));
  for (const std::string& s : r.stop)
    if (s.empty()) fuzz::violated("accepted an empty stop sequence");
  if (chat && r.messages.empty()) fuzz::violated("a chat request without messages");
  if (r.prompt_ids && r.prompt_ids->empty()) fuzz::violated("accepted an empty list of prompt ids");

  // The text the filter sees: the prompt (or the rendered conversation), cut into pieces of 1 to 8 bytes.
  const std::string text = chat ? chat::render_plain_chat(r.messages, true) : r.prompt;
  serve::StopFilter filter(r.stop);
  std::string out;
  size_t at = 0, step = 0;
  while (at < text.size() && !filter.stopped()) {
    const size_t n = std::min(text.size() - at, size_t(1 + ((control >> 1) + step++ * 5) % 8));
    out += filter.push(std::string_view(text).substr(at, n));
    at += n;
  }
  if (!filter.stopped()) out += filter.flush();
  if (text.compare(0, out.size(), out) != 0) fuzz::violated("the filter's output is not a prefix of the text");
  for (const std::string& s : r.stop)
    if (out.find(s) != std::string::npos) fuzz::violated(cat("the output holds the stop sequence \"", s, "\""));
  if (filter.stopped()) {
    bool begins = false;
    for (const std::string& s : r.stop) begins = begins || text.compare(out.size(), s.size(), s) == 0;
    if (!begins) fuzz::violated("the output does not end where a stop sequence begins");
  } else if (out != text) {
    fuzz::violated("no stop sequence found, yet the output is not the whole text");
  }
  return 0;
}
