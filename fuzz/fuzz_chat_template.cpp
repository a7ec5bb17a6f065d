// A chat template's source through chat::ChatTemplate: parse, then render over a fixed conversation
// (system, user, assistant with a tool call, tool result, user) with and without tools, under tight
// limits. Parsing or rendering may refuse with an Error; nothing may crash, hang, leak or grow past
// the limits. A template that renders must render the same bytes twice (no state leaks between
// renders) and, without strftime_now, nothing but UTF-8 when the conversation and the template are.
#include <string>

#include "fuzz_support.h"
#include "lineage/core/error.h"
#include "lineage/chat/chat_template.h"

using namespace lineage;

namespace {

nlohmann::ordered_json conversation(bool with_tools) {
  using J = nlohmann::ordered_json;
  J messages = J::array();
  messages.push_back({{"role", "system"}, {"content", "You are terse."}});
  messages.push_back({{"role", "user"}, {"content", "Weather in Oslo? {{ not a tag }} caf\xC3\xA9 \xF0\x9F\x98\x80"}});
  J call = {{"id", "call12345"}, {"type", "function"},
            {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Oslo"}}}}}};
  messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", J::array({call})}});
  messages.push_back({{"role", "tool"}, {"tool_call_id", "call12345"}, {"content", "{\"temp\": -3}"}});
  messages.push_back({{"role", "user"}, {"content", "Thanks"}});
  J vars = {{"messages", messages}, {"add_generation_prompt", true}, {"bos_token", "<s>"}, {"eos_token", "</s>"}};
  if (with_tools) {
    vars["tools"] = J::array({{{"type", "function"},
                               {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}});
  }
  return vars;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  std::optional<chat::ChatTemplate> t = fuzz::load_or_reject([&] { return chat::ChatTemplate(source, "fuzz.jinja"); });
  if (!t) return 0;
  chat::ChatTemplate::Limits limits;
  limits.max_steps = 200'000;
  limits.max_bytes = 1 << 20;
  limits.max_items = 1 << 16;
  t->set_limits(limits);
  for (const bool with_tools : {false, true}) {
    const nlohmann::ordered_json vars = conversation(with_tools);
    std::string first;
    try {
      first = t->render_context(vars);
    } catch (const Error& e) {
      fuzz::rejected(e);
      continue;
    }
    if (first.size() > size_t(limits.max_bytes)) fuzz::violated("the render is longer than max_bytes");
    // Not caught: a template that rendered once must render again, identically.
    const std::string second = t->render_context(vars);
    if (second != first && source.find("strftime_now") == std::string::npos)
      fuzz::violated("two renders of the same template and variables differ");
    if (fuzz::valid_utf8(source) && source.find('\\') == std::string::npos && !fuzz::valid_utf8(first))
      fuzz::violated("a UTF-8 template over a UTF-8 conversation rendered invalid UTF-8");
  }
  return 0;
}
