#include "lineage/serve/openai.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lineage/core/error.h"
#include "lineage/core/text.h"

namespace lineage::serve {

using nlohmann::json;

std::string ApiError::body() const {
  json e = {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}};
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

ApiError bad(const std::string& param, const std::string& message) {
  return {400, cat("field \"", param, "\": ", message), "invalid_request_error", param, "invalid_value"};
}

std::string found(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

double number(const json& v, const char* key, double lo, double hi) {
  if (!v.is_number() || v.get<double>() < lo || v.get<double>() > hi)
    throw bad(key, cat("expected a number in [", lo, ", ", hi, "], found ", found(v)));
  return v.get<double>();
}

int64_t integer(const json& v, const char* key, int64_t lo, int64_t hi) {
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi ||
      (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)))
    throw bad(key, cat("expected an integer in [", lo, ", ", hi, "], found ", found(v)));
  return v.get<int64_t>();
}

bool boolean(const json& v, const char* key) {
  if (!v.is_boolean()) throw bad(key, cat("expected true or false, found ", found(v)));
  return v.get<bool>();
}

// A message's content: a string, or OpenAI's list of parts of which the text ones are joined.
std::string content_text(const json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return "";
  if (!c.is_array()) throw bad(where, cat("expected a string or a list of text parts, found ", found(c)));
  std::string text;
  for (const auto& part : c) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      throw bad(where, cat("expected parts {\"type\": \"text\", \"text\": ...} (only text is supported), found ", found(part)));
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

CompletionRequest parse_request(std::string_view body, bool chat) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // a syntax error, or a number out of range (1e999)
    throw ApiError{400, cat("the body is not valid JSON: ", e.what()), "invalid_request_error", "", "invalid_json"};
  }
  if (!j.is_object())
    throw ApiError{400, cat("the body must be a JSON object, found ", j.type_name()), "invalid_request_error", "", "invalid_json"};
  CompletionRequest r;
  r.chat = chat;
  int top_logprobs = -1;
  std::string tool_choice = "auto";
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    const json& v = item.value();
    if (key == "model") {
      if (!v.is_string()) throw bad(key, cat("expected a string, found ", found(v)));
      r.model = v.get<std::string>();
    } else if (key == "prompt" && !chat) {
      if (v.is_string()) {
        r.prompt = v.get<std::string>();
      } else if (v.is_array() && v.size() == 1 && v[0].is_string()) {
        r.prompt = v[0].get<std::string>();
      } else if (v.is_array() && !v.empty() && (v[0].is_number_integer() || (v.size() == 1 && v[0].is_array()))) {
        // token ids, or one list of them in a list (what lm-evaluation-harness sends)
        const json& list = v[0].is_array() ? v[0] : v;
        if (list.empty()) throw bad(key, "expected at least one token id, found an empty list");
        std::vector<int32_t> ids;
        for (const auto& t : list) ids.push_back(int32_t(integer(t, "prompt", 0, INT32_MAX)));
        r.prompt_ids = std::move(ids);
      } else {
        throw bad(key, cat("expected a string, one string in a list, or a list of token ids (or one such list in a list; ",
                           "one prompt per request), found ", found(v)));
      }
    } else if (key == "messages" && chat) {
      if (!v.is_array() || v.empty()) throw bad(key, cat("expected a non-empty list of messages, found ", found(v)));
      for (size_t i = 0; i < v.size(); ++i) {
        const json& m = v[i];
        const std::string where = cat("messages[", i, "]");
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
          throw bad(where, cat("expected {\"role\": ..., \"content\": ...}, found ", found(m)));
        r.messages.push_back({m["role"].get<std::string>(), m.contains("content") ? content_text(m["content"], where + ".content") : ""});
      }
    } else if (key == "max_tokens" || key == "max_completion_tokens") {
      if (!v.is_null()) r.max_tokens = integer(v, key.c_str(), INT64_MIN / 2, int64_t(1) << 30);
      if (r.max_tokens && *r.max_tokens < 0) throw bad(key, cat("expected at least 0, found ", *r.max_tokens));
    } else if (key == "temperature") {
      if (!v.is_null()) r.temperature = float(number(v, "temperature", 0, 100));
    } else if (key == "top_p") {
      if (!v.is_null()) r.top_p = float(number(v, "top_p", 0, 1));
    } else if (key == "top_k") {
      if (!v.is_null()) r.top_k = int(integer(v, "top_k", 0, 1 << 24));
    } else if (key == "seed") {
      if (!v.is_null()) {
        if (!v.is_number_integer()) throw bad(key, cat("expected an integer, found ", found(v)));
        r.seed = v.is_number_unsigned() ? v.get<uint64_t>() : uint64_t(v.get<int64_t>());
      }
    } else if (key == "stop") {
      if (v.is_string()) r.stop = {v.get<std::string>()};
      else if (v.is_array() && v.size() <= 4 && std::all_of(v.begin(), v.end(), [](const json& s) { return s.is_string(); }))
        for (const auto& s : v) r.stop.push_back(s.get<std::string>());
      else if (!v.is_null()) throw bad(key, cat("expected a string or a list of up to 4 strings, found ", found(v)));
      std::erase(r.stop, std::string());
    } else if (key == "stream") {
      if (!v.is_null()) r.stream = boolean(v, "stream");
    } else if (key == "stream_options") {
      if (v.is_null()) continue;
      if (!v.is_object()) throw bad(key, cat("expected an object, found ", found(v)));
      if (v.contains("include_usage")) r.include_usage = boolean(v["include_usage"], "stream_options.include_usage");
    } else if (key == "n") {
      if (!v.is_null()) r.n = int(integer(v, "n", 1, 16));
    } else if (key == "ignore_eos") {
      r.ignore_eos = boolean(v, "ignore_eos");
    } else if (key == "return_progress") {
      r.return_progress = boolean(v, "return_progress");
    } else if (key == "logprobs" && !chat) {  // an integer: the alternatives per token
      if (!v.is_null() && v != false) r.logprobs = int(integer(v, "logprobs", 0, 20));
    } else if (key == "logprobs" && chat) {  // a boolean; top_logprobs gives the alternatives
      if (!v.is_null() && boolean(v, "logprobs")) r.logprobs = std::max(r.logprobs, 0);
    } else if (key == "top_logprobs" && chat) {
      if (!v.is_null()) top_logprobs = int(integer(v, "top_logprobs", 0, 20));
    } else if (key == "tools" && chat) {
      if (v.is_null()) continue;
      if (!v.is_array()) throw bad(key, cat("expected a list of {\"type\": \"function\", \"function\": {...}}, found ", found(v)));
      for (size_t i = 0; i < v.size(); ++i) {
        const json& t = v[i];
        if (!t.is_object() || !t.contains("type") || t["type"] != "function" || !t.contains("function") ||
            !t["function"].is_object() ||
            !t["function"].contains("name") || !t["function"]["name"].is_string())
          throw bad(cat("tools[", i, "]"), cat("expected {\"type\": \"function\", \"function\": {\"name\": ..., ",
                                              "\"parameters\": ...}}, found ", found(t)));
      }
    } else if (key == "tool_choice" && chat) {
      if (v.is_null() || v == "auto") tool_choice = "auto";
      else if (v == "none") tool_choice = "none";
      else throw bad(key, cat("\"auto\" or \"none\" (lineage does not constrain the output to a call, so \"required\" ",
                              "or a named function cannot be honoured), found ", found(v)));
    } else if (key == "chat_template_kwargs" && chat) {
      if (v.is_null()) continue;
      if (!v.is_object()) throw bad(key, cat("expected an object of template variables, found ", found(v)));
    } else if (key == "echo" && !chat) {
      if (!v.is_null()) r.echo = boolean(v, "echo");
    } else if (key == "echo" || key == "best_of" || key == "suffix") {
      // Would change the answer; only their neutral values are accepted.
      const bool neutral = v.is_null() || v == false || (key == "best_of" && v == 1) || (key == "suffix" && v == "");
      if (!neutral) throw bad(key, "is not supported");
    }
  }
  if (chat && j.contains("chat_template_kwargs") && j["chat_template_kwargs"].is_object()) {
    const nlohmann::ordered_json o = nlohmann::ordered_json::parse(body);
    r.template_kwargs = o["chat_template_kwargs"];
  }
  if (chat && (tool_choice != "none" || j.contains("tools") || !r.template_kwargs.is_null())) {
    // Tools and tool messages go to the template as sent (key order kept: it shows in tojson).
    bool tool_messages = false;
    for (const auto& m : j["messages"])
      tool_messages = tool_messages || m.contains("tool_calls") || m["role"] == "tool";
    const bool tools = j.contains("tools") && !j["tools"].is_null() && !j["tools"].empty();
    if (tools || tool_messages || !r.template_kwargs.is_null()) {
      const nlohmann::ordered_json o = nlohmann::ordered_json::parse(body);
      r.raw_messages = o["messages"];
      // Text parts joined and a null content (an assistant's tool calls) an empty text, as for the
      // other messages and as llama-server passes them: templates test content as a string.
      for (size_t i = 0; i < r.raw_messages.size(); ++i)
        if (!r.raw_messages[i].contains("content") || !r.raw_messages[i]["content"].is_string())
          r.raw_messages[i]["content"] = r.messages[i].content;
      if (tools && tool_choice != "none") r.tools = o["tools"];
    }
  }
  if (top_logprobs >= 0) {
    if (r.logprobs < 0) throw bad("top_logprobs", "needs \"logprobs\": true");
    r.logprobs = top_logprobs;
  }
  if (r.max_tokens && *r.max_tokens == 0 && !(r.echo && r.logprobs >= 0))
    throw bad(j.contains("max_tokens") ? "max_tokens" : "max_completion_tokens",
              "expected at least 1 (0 only with \"echo\": true and \"logprobs\", to score the prompt)");
  if (r.stream && r.echo) throw bad("echo", "is not supported with \"stream\": true yet (send the request unstreamed)");
  if (r.stream && r.n > 1) throw bad("n", "above 1 is not supported with \"stream\": true yet (send the request unstreamed)");
  if (chat && r.messages.empty()) throw ApiError{400, "field \"messages\" is missing", "invalid_request_error", "messages", "missing"};
  if (!chat && !j.contains("prompt")) throw ApiError{400, "field \"prompt\" is missing", "invalid_request_error", "prompt", "missing"};
  return r;
}

bool CompletionRequest::uses_tools() const { return !tools.is_null() || !raw_messages.is_null(); }

namespace {

// {"name": ..., "arguments": {...} or "..."} → a call; nothing when it is not one.
std::optional<ToolCall> call_from_json(std::string_view text) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const json args = j.contains("arguments") ? j["arguments"] : json::object();
  return ToolCall{j["name"].get<std::string>(), args.is_string() ? args.get<std::string>() : args.dump()};
}

}  // namespace

ParsedReply parse_tool_calls(const std::string& text) {
  ParsedReply out;
  std::string rest;
  // Qwen / Hermes: <tool_call> JSON </tool_call> blocks (an unclosed last one runs to the end).
  static const std::string open = "<tool_call>", close = "</tool_call>";
  size_t at = 0;
  while (true) {
    const size_t b = text.find(open, at);
    if (b == std::string::npos) {
      rest += text.substr(at);
      break;
    }
    const size_t e = text.find(close, b + open.size());
    const size_t body_end = e == std::string::npos ? text.size() : e;
    if (const auto call = call_from_json(trim(std::string_view(text).substr(b + open.size(), body_end - b - open.size())))) {
      rest += text.substr(at, b - at);
      out.calls.push_back(*call);
    } else {
      rest += text.substr(at, (e == std::string::npos ? text.size() : e + close.size()) - at);
    }
    if (e == std::string::npos) break;
    at = e + close.size();
  }
  // Kimi: <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>, in a section.
  static const std::string section_begin = "<|tool_calls_section_begin|>", section_end = "<|tool_calls_section_end|>";
  static const std::string call_begin = "<|tool_call_begin|>", arg_begin = "<|tool_call_argument_begin|>",
                           call_end = "<|tool_call_end|>";
  const size_t sb = rest.find(section_begin);
  if (sb != std::string::npos) {
    const size_t se = rest.find(section_end, sb);
    const std::string section = rest.substr(sb, (se == std::string::npos ? rest.size() : se) - sb);
    std::vector<ToolCall> kimi;
    bool whole = true;
    for (size_t p = section.find(call_begin); p != std::string::npos; p = section.find(call_begin, p + 1)) {
      const size_t a = section.find(arg_begin, p), c = section.find(call_end, p);
      if (a == std::string::npos || c == std::string::npos || a > c) {
        whole = false;
        break;
      }
      std::string id = trim(std::string_view(section).substr(p + call_begin.size(), a - p - call_begin.size()));
      if (id.rfind("functions.", 0) == 0) id = id.substr(10);
      const std::string name = id.substr(0, id.rfind(':'));
      const std::string args = trim(std::string_view(section).substr(a + arg_begin.size(), c - a - arg_begin.size()));
      if (name.empty() || json::parse(args, nullptr, false).is_discarded()) {
        whole = false;
        break;
      }
      kimi.push_back({name, args});
    }
    if (whole && !kimi.empty()) {
      out.calls.insert(out.calls.end(), kimi.begin(), kimi.end());
      rest = rest.substr(0, sb) + (se == std::string::npos ? "" : rest.substr(se + section_end.size()));
    }
  }
  out.content = trim(rest);
  return out;
}

std::string StopFilter::push(std::string_view text) {
  if (stopped_) return "";
  held_ += text;
  size_t cut = std::string::npos;
  for (const auto& s : stops_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }
  // Keep the longest tail that is a proper prefix of some stop sequence.
  size_t keep = 0;
  for (const auto& s : stops_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopFilter::flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  return out;
}

}  // namespace lineage::serve
