// Room serve/: the HTTP face of the runtime: the OpenAI-compatible API (openai.h parses and renders
// its JSON), this server and its chat page (page.html, embedded at build time). Uses runtime, chat
// and what they use.
//
// `lineage serve`: an OpenAI-compatible HTTP server (Debian's cpp-httplib) over the serving engine.
//   POST /v1/completions, POST /v1/chat/completions   (SSE streaming with "stream": true)
//   GET  /v1/models, /health, /metrics (Prometheus text), / (the chat page), /trace (lineage trace's
//   page, fetching POST /trace/data)
// With an API key, every endpoint but /health and the pages / and /trace wants `Authorization: Bearer KEY` (401 otherwise).
// Every request decodes in the engine's shared steps over its own state slot; the prefix cache
// reuses what earlier requests computed. Bad requests get an OpenAI-style error object and the
// right status; a client that goes away frees its slot within a heartbeat (docs/serve.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "lineage/chat/chat_template.h"
#include "lineage/io/load_model.h"
#include "lineage/runtime/engine.h"
#include "lineage/serve/openai.h"

namespace httplib {
class Server;
}

namespace lineage::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (port() tells which)
  runtime::EngineOptions engine;
  size_t max_body_bytes = size_t(4) << 20;  // a larger body is refused with 413
  int read_timeout_seconds = 10;            // a client that sends its request slower is dropped
  int threads = 0;                          // HTTP worker threads; 0: slots + queue + 16
  std::string model_name;                   // /v1/models id; default: the directory's name
  int64_t default_max_tokens = 1024;        // when a request gives none and the context is unbounded
  // Non-empty: every endpoint but /health and the page at / answers 401 unless the request carries
  // `Authorization: Bearer <api_key>` (compared in time that does not depend on where they differ).
  std::string api_key;
  // Template variables every chat request gets (llama-server's --chat-template-kwargs), under the
  // request's own chat_template_kwargs: {"enable_thinking": false}.
  nlohmann::ordered_json template_kwargs;
  int64_t trace_max_tokens = 512;  // the longest prompt POST /trace/data traces (the page at /trace)
};

// Whether `header` (an Authorization header's value) is "Bearer <key>", the scheme's case ignored;
// the time taken depends on the key's length only.
bool bearer_matches(const std::string& header, const std::string& key);

// The model's chat template: a GGUF file's tokenizer.chat_template, else a directory's
// (chat_template.jinja or tokenizer_config.json), else none.
std::optional<chat::ChatTemplate> model_chat_template(const io::LoadedModel& m);

class Server {
 public:
  // The model (with its tokenizer) must outlive the server.
  Server(const io::LoadedModel& model, ServerOptions options);
  ~Server();
  // Binds host:port (throws Error when it cannot) and returns the port.
  int bind();
  void listen();  // serves until stop(); bind() first
  void stop();
  int port() const { return port_; }
  const runtime::Engine& engine() const { return *engine_; }

 private:
  void routes();
  std::string metrics() const;
  std::vector<int32_t> prompt_tokens(const CompletionRequest& r) const;

  const io::LoadedModel& model_;
  ServerOptions options_;
  std::optional<chat::ChatTemplate> template_;
  std::unique_ptr<runtime::Engine> engine_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  int listen_fd_ = -1;
  mutable std::mutex mu_;
  std::mutex trace_mu_;  // one /trace/data recording at a time
  std::map<int, int64_t> http_errors_;  // status → count
  std::atomic<int64_t> streams_{0}, disconnects_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace lineage::serve
