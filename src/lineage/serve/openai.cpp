#include "lineage/serve/openai.h"

#include <nlohmann/json.hpp>

#include "lineage/core/error.h"

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
      if (!v.is_null() && integer(v, "n", 1, 1) != 1) throw bad(key, "only n = 1 is supported");
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
    } else if (key == "echo" && !chat) {
      if (!v.is_null()) r.echo = boolean(v, "echo");
    } else if (key == "echo" || key == "best_of" || key == "suffix") {
      // Would change the answer; only their neutral values are accepted.
      const bool neutral = v.is_null() || v == false || (key == "best_of" && v == 1) || (key == "suffix" && v == "");
      if (!neutral) throw bad(key, "is not supported");
    }
  }
  if (top_logprobs >= 0) {
    if (r.logprobs < 0) throw bad("top_logprobs", "needs \"logprobs\": true");
    r.logprobs = top_logprobs;
  }
  if (r.max_tokens && *r.max_tokens == 0 && !(r.echo && r.logprobs >= 0))
    throw bad(j.contains("max_tokens") ? "max_tokens" : "max_completion_tokens",
              "expected at least 1 (0 only with \"echo\": true and \"logprobs\", to score the prompt)");
  if (r.stream && (r.logprobs >= 0 || r.echo))
    throw bad(r.echo ? "echo" : "logprobs", "is not supported with \"stream\": true yet (send the request unstreamed)");
  if (chat && r.messages.empty()) throw ApiError{400, "field \"messages\" is missing", "invalid_request_error", "messages", "missing"};
  if (!chat && !j.contains("prompt")) throw ApiError{400, "field \"prompt\" is missing", "invalid_request_error", "prompt", "missing"};
  return r;
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
