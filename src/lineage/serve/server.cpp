#include "lineage/serve/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string_view>

#include "lineage/core/error.h"
#include "lineage/serve/page_html.h"  // kChatPage, generated from page.html
#include "lineage/serve/trace_page.h"

namespace lineage::serve {

using nlohmann::json;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// What the engine's thread hands to the HTTP thread of one request: text ready to send, prefill
// progress, and the result at the end. `gone` is set by the HTTP side when its client went away.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::string text;
  std::vector<json> progress;
  std::vector<runtime::TokenLogprob> logprobs;  // of the tokens since the last streamed chunk
  bool done = false, stop_found = false;
  runtime::EngineResult result;
  std::atomic<bool> gone{false};
  uint64_t id = 0;
};

std::string finish_reason(const Channel& ch) {
  const std::string& r = ch.result.finish_reason;
  if (ch.stop_found || r == "stop") return "stop";
  if (r == "length" || r == "context") return "length";
  return r;  // "cancelled", "error"
}

json usage(const runtime::EngineResult& r) {
  const int64_t n = int64_t(r.tokens.size());
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", n},
          {"total_tokens", r.prompt_tokens + n},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
}

// lineage's own numbers for a finished request (the chat page shows them).
json extension(const runtime::EngineResult& r) {
  const int64_t n = int64_t(r.tokens.size());
  const double decode = r.seconds - r.first_token_seconds;
  return {{"cached_tokens", r.cached_tokens},
          {"state_bytes", r.state_bytes},
          {"first_token_ms", r.first_token_seconds * 1e3},
          {"tokens_per_second", n > 1 && decode > 0 ? double(n - 1) / decode : 0.0},
          {"seconds", r.seconds}};
}

// OpenAI's log-probabilities of a finished request. A token's text is its bytes (where they are not
// whole UTF-8 characters, the JSON writer replaces them); chat entries carry the bytes too.
json token_bytes(const std::string& text) {
  json b = json::array();
  for (const char c : text) b.push_back(int(static_cast<unsigned char>(c)));
  return b;
}

// /v1/completions: tokens, token_logprobs, top_logprobs (a map per token) and text_offset (characters
// into the choice's text, counted from `offset`, which is advanced); with `echo_prompt` the prompt's
// tokens first, the first of them without a value (`prompt_lps` scoring the others).
json completion_logprobs(const tokenizer::Tokenizer& tok, std::span<const runtime::TokenLogprob> generated,
                         int64_t& offset, std::span<const int32_t> echo_prompt = {},
                         std::span<const runtime::TokenLogprob> prompt_lps = {}) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  const auto add = [&](int32_t id, const runtime::TokenLogprob* lp) {
    const std::string& text = tok.token_bytes(id);
    tokens.push_back(text);
    offsets.push_back(offset);
    for (const char c : text) offset += (static_cast<unsigned char>(c) & 0xC0) != 0x80;  // UTF-8 lead bytes
    values.push_back(lp ? json(lp->logprob) : json(nullptr));
    if (!lp) {
      tops.push_back(nullptr);
      return;
    }
    json top = json::object();
    for (const auto& [alt, value] : lp->top) top[tok.token_bytes(alt)] = value;
    tops.push_back(top);
  };
  for (size_t i = 0; i < echo_prompt.size(); ++i)
    add(echo_prompt[i], i == 0 || i > prompt_lps.size() ? nullptr : &prompt_lps[i - 1]);
  for (const runtime::TokenLogprob& lp : generated) add(lp.token, &lp);
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// /v1/chat/completions: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
json chat_logprobs(const tokenizer::Tokenizer& tok, std::span<const runtime::TokenLogprob> generated) {
  json content = json::array();
  for (const runtime::TokenLogprob& lp : generated) {
    json top = json::array();
    for (const auto& [alt, value] : lp.top)
      top.push_back({{"token", tok.token_bytes(alt)}, {"logprob", value}, {"bytes", token_bytes(tok.token_bytes(alt))}});
    const std::string& text = tok.token_bytes(lp.token);
    content.push_back({{"token", text}, {"logprob", lp.logprob}, {"bytes", token_bytes(text)}, {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// OpenAI's tool_calls: ids made from the completion's id and the call's index; streamed ones carry
// their index.
json tool_calls_json(const std::vector<ToolCall>& calls, const std::string& completion_id, bool stream) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", cat("call_", completion_id, "_", i)}, {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (stream) c["index"] = i;
    out.push_back(c);
  }
  return out;
}

json choice(bool chat, bool stream, const std::string& text, const json& finish) {
  json c = {{"index", 0}, {"finish_reason", finish}};
  if (!chat) c["text"] = text, c["logprobs"] = nullptr;
  else if (stream) c["delta"] = text.empty() ? json::object() : json{{"content", text}};
  else c["message"] = {{"role", "assistant"}, {"content", text}};
  return c;
}

}  // namespace

std::optional<chat::ChatTemplate> model_chat_template(const io::LoadedModel& m) {
  if (m.chat_template) {
    const io::EmbeddedChatTemplate& t = *m.chat_template;
    return chat::ChatTemplate(t.source, t.where, t.bos_token, t.eos_token);
  }
  if (m.dir.empty()) return std::nullopt;
  return chat::ChatTemplate::from_model_dir(m.dir);
}

Server::Server(const io::LoadedModel& model, ServerOptions options) : model_(model), options_(std::move(options)) {
  if (!model_.tokenizer)
    throw Error(cat(model_.dir.empty() ? std::string("the model") : model_.dir.string(),
                    ": serve needs the model's tokenizer files (tokenizer.json, or vocab.json and merges.txt)"));
  template_ = model_chat_template(model_);
  if (template_ && !options_.template_kwargs.is_null()) template_->set_variables(options_.template_kwargs);
  if (options_.model_name.empty()) {
    std::filesystem::path p = model_.dir;
    if (p.filename().empty()) p = p.parent_path();
    options_.model_name = p.empty() ? "lineage" : p.filename().string();
  }
  engine_ = std::make_unique<runtime::Engine>(model_.model, options_.engine);
  http_ = std::make_unique<httplib::Server>();
  const int threads = options_.threads > 0 ? options_.threads
                                           : int(options_.engine.slots + options_.engine.queue + 16);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_read_timeout(options_.read_timeout_seconds, 0);
  http_->set_write_timeout(10, 0);
  http_->set_keep_alive_timeout(5);
  // Debian's libcpp-httplib listens with a backlog of 5: a burst of clients beyond it waits for a SYN
  // retransmit (1 s). The listening socket is kept here to raise it after bind().
  http_->set_socket_options([this](int fd) {
    httplib::default_socket_options(fd);
    listen_fd_ = fd;
  });
  routes();
}

Server::~Server() { stop(); }

int Server::bind() {
  port_ = options_.port == 0 ? http_->bind_to_any_port(options_.host)
                             : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port_ < 0)
    throw Error(cat("--host ", options_.host, " --port ", options_.port,
                    ": cannot listen there (the port is taken, or the address is not this machine's)"));
  if (listen_fd_ >= 0) ::listen(listen_fd_, 1024);  // Linux takes a second listen() as a new backlog
  return port_;
}

void Server::listen() { http_->listen_after_bind(); }

void Server::stop() {
  stopping_ = true;
  if (http_) http_->stop();
}

std::vector<int32_t> Server::prompt_tokens(const CompletionRequest& r) const {
  const tokenizer::Tokenizer& tok = *model_.tokenizer;
  if (r.prompt_ids) return *r.prompt_ids;
  std::vector<int32_t> ids;
  if (r.chat && r.uses_tools()) {  // through the template with the tools and the messages as sent
    if (!template_)
      throw ApiError{400, "tools, tool messages and chat_template_kwargs need the model's chat template; this model has none",
                     "invalid_request_error", r.tools.is_null() ? "chat_template_kwargs" : "tools", "no_tool_template"};
    if ((!r.tools.is_null() || r.template_kwargs.is_null()) && template_->source().find("tool") == std::string::npos)
      throw ApiError{400, cat("the chat template (", template_->where(), ") does not render tools or tool calls"),
                     "invalid_request_error", "tools", "no_tool_template"};
    // The server's --chat-template-kwargs, then the request's, then the conversation.
    nlohmann::ordered_json vars = template_->variables();
    if (!r.template_kwargs.is_null()) vars.update(r.template_kwargs);
    vars.update(nlohmann::ordered_json{{"messages", r.raw_messages}, {"add_generation_prompt", true},
                                       {"bos_token", template_->bos_token()}, {"eos_token", template_->eos_token()}});
    if (!r.tools.is_null()) vars["tools"] = r.tools;
    ids = tok.encode(template_->render_context(vars));
  } else if (r.chat) {
    ids = chat::encode_chat(tok, template_ ? &*template_ : nullptr, r.messages, true);
  } else {
    ids = tok.encode(r.prompt);
    if (tok.adds_bos() && tok.bos_id()) ids.insert(ids.begin(), *tok.bos_id());
  }
  if (ids.empty()) throw ApiError{400, "the prompt encodes to no tokens", "invalid_request_error", r.chat ? "messages" : "prompt", "empty_prompt"};
  return ids;
}

bool bearer_matches(const std::string& header, const std::string& key) {
  static const std::string scheme = "bearer ";
  bool scheme_ok = header.size() >= scheme.size();
  for (size_t i = 0; scheme_ok && i < scheme.size(); ++i)
    scheme_ok = char(std::tolower(static_cast<unsigned char>(header[i]))) == scheme[i];
  const std::string_view given = scheme_ok ? std::string_view(header).substr(scheme.size()) : std::string_view();
  // Every byte of the key is compared whatever came before: no early exit on the first difference.
  unsigned diff = given.size() != key.size() ? 1u : 0u;
  for (size_t i = 0; i < key.size(); ++i)
    diff |= unsigned(static_cast<unsigned char>(key[i]) ^ static_cast<unsigned char>(i < given.size() ? given[i] : 0));
  return scheme_ok && diff == 0;
}

void Server::routes() {
  const auto error = [](httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(e.body(), "application/json");
  };

  if (!options_.api_key.empty()) {
    http_->set_pre_routing_handler([this, error](const httplib::Request& req, httplib::Response& res) {
      if (req.path == "/health" || req.path == "/" || req.path == "/trace") return httplib::Server::HandlerResponse::Unhandled;
      if (bearer_matches(req.get_header_value("Authorization"), options_.api_key))
        return httplib::Server::HandlerResponse::Unhandled;
      res.set_header("WWW-Authenticate", "Bearer");
      error(res, ApiError{401,
                          req.has_header("Authorization")
                              ? "Incorrect API key provided: the Authorization header is not the server's Bearer key"
                              : "You didn't provide an API key: send it as `Authorization: Bearer KEY` (lineage serve --api-key)",
                          "invalid_request_error", "", "invalid_api_key"});
      return httplib::Server::HandlerResponse::Handled;
    });
  }

  const auto completion = [this, error](bool chat) {
    return [this, error, chat](const httplib::Request& req, httplib::Response& res) {
      try {
        const CompletionRequest r = parse_request(req.body, chat);
        const std::vector<int32_t> prompt = prompt_tokens(r);
        const int64_t n = int64_t(prompt.size()), ctx = engine_->context();
        if (ctx > 0 && n >= ctx)
          throw ApiError{400, cat("the prompt has ", n, " tokens; the context holds ", ctx, " (prompt and completion)"),
                         "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded"};
        runtime::EngineRequest er;
        er.prompt = prompt;
        er.logprobs = r.logprobs;
        er.prompt_logprobs = r.echo && r.logprobs >= 0;
        er.options.max_tokens = int(std::min<int64_t>(r.max_tokens.value_or(ctx > 0 ? ctx - n : options_.default_max_tokens),
                                                      int64_t(1) << 30));
        static std::atomic<uint64_t> seeds{std::random_device{}()};
        // n samples take n steps of the stream of seeds, so no two requests' samples share one.
        er.options.sampling = {r.temperature, r.top_k, r.top_p,
                               r.seed ? *r.seed : seeds.fetch_add(uint64_t(r.n) * 0x9e3779b97f4a7c15ull)};
        if (!r.ignore_eos)
          er.options.eos = model_.model.config.eos_token_id ? model_.model.config.eos_token_id : model_.tokenizer->eos_id();
        // One channel (and engine request) per sample: n of them share the prompt's prefill (a
        // prefill group; not with echo, whose prompt log-probabilities each sample computes).
        const double t0 = now();
        const auto prepare = [&, this](runtime::EngineRequest base, const std::shared_ptr<Channel>& c) {
          auto decoder = std::make_shared<tokenizer::StreamDecoder>(*model_.tokenizer);
          auto filter = std::make_shared<StopFilter>(r.stop);
          // A token's log-probability comes just before the token (on the engine's thread); it joins
          // the channel with the token's text, under one lock, so a chunk carries both or neither.
          auto pending = std::make_shared<std::optional<runtime::TokenLogprob>>();
          if (r.stream && r.logprobs >= 0)
            base.on_logprob = [pending](const runtime::TokenLogprob& lp) { *pending = lp; };
          base.on_token = [c, decoder, filter, pending](int32_t t) {
            std::string text = filter->push(decoder->push(t));
            {
              std::lock_guard lock(c->mu);
              c->text += text;
              c->stop_found = filter->stopped();
              if (*pending) c->logprobs.push_back(std::move(**pending)), pending->reset();
            }
            c->cv.notify_all();
            return !filter->stopped() && !c->gone;
          };
          if (r.stream && r.return_progress)
            base.on_progress = [c, t0](int64_t done, int64_t total) {
              {
                std::lock_guard lock(c->mu);
                c->progress.push_back({{"total", total}, {"processed", done}, {"time_ms", (now() - t0) * 1e3}});
              }
              c->cv.notify_all();
            };
          base.on_done = [c, decoder, filter](runtime::EngineResult&& result) {
            const std::string tail = filter->stopped() ? "" : filter->push(decoder->flush()) + filter->flush();
            {
              std::lock_guard lock(c->mu);
              c->text += tail;
              c->result = std::move(result);
              c->done = true;
            }
            c->cv.notify_all();
          };
          return base;
        };
        static std::atomic<uint64_t> groups{1};
        if (r.n > 1 && !r.echo) er.prefill_group = groups.fetch_add(1);
        std::vector<std::shared_ptr<Channel>> chans;
        std::vector<runtime::EngineRequest> requests;
        for (int i = 0; i < r.n; ++i) {
          runtime::EngineRequest e = er;
          e.options.sampling.seed += uint64_t(i) * 0x9e3779b97f4a7c15ull;  // each sample its own stream
          chans.push_back(std::make_shared<Channel>());
          requests.push_back(prepare(std::move(e), chans.back()));
        }
        // Queued together (admitted in one go where slots allow, so the samples share the prefill).
        const std::optional<std::vector<uint64_t>> ids = engine_->submit_many(std::move(requests));
        if (!ids)
          throw ApiError{503, "the server is busy: every slot and the whole queue are taken; retry later", "server_error",
                         "", "overloaded"};
        for (size_t i = 0; i < chans.size(); ++i) chans[i]->id = (*ids)[i];
        const std::shared_ptr<Channel> ch = chans[0];
        const std::string cid = cat(chat ? "chatcmpl-" : "cmpl-", ch->id);
        const int64_t created = std::time(nullptr);
        const std::string object = chat ? "chat.completion" : "text_completion";
        const json head = {{"id", cid}, {"created", created}, {"model", options_.model_name}};
        // A client that went away: its requests end at the next step, their slots free for the next.
        const auto gone = [this, chans] {
          for (const auto& c : chans) {
            c->gone = true;
            engine_->cancel(c->id);
          }
          ++disconnects_;
          return false;
        };
        if (!r.stream) {
          res.set_chunked_content_provider("application/json", [=, this](size_t, httplib::DataSink& sink) {
            double beat = now();
            for (const auto& c : chans) {
              std::unique_lock lock(c->mu);
              while (!c->done) {
                c->cv.wait_for(lock, std::chrono::milliseconds(100));
                // JSON allows leading whitespace: a space now and then finds a client that left.
                if (!c->done && (now() - beat > 0.25 || stopping_)) {
                  lock.unlock();
                  const bool ok = !stopping_ && sink.write(" ", 1);
                  lock.lock();
                  if (!ok) return gone();
                  beat = now();
                }
              }
            }
            json body = head;
            body["object"] = object;
            body["choices"] = json::array();
            int64_t completion_tokens = 0;
            for (size_t i = 0; i < chans.size(); ++i) {
              const Channel& c = *chans[i];
              if (c.result.finish_reason == "error") {
                body = json::parse(ApiError{500, c.result.error, "server_error", "", "engine_error"}.body());
                break;
              }
              // echo: the prompt's text before the completion's (its ids decoded when it came as ids).
              const std::string echoed = !r.echo ? std::string()
                                         : r.prompt_ids ? model_.tokenizer->decode(*r.prompt_ids) : r.prompt;
              json one = choice(chat, false, echoed + c.text, finish_reason(c));
              one["index"] = i;
              if (chat && !r.tools.is_null()) {  // the calls the model wrote, as tool_calls
                const ParsedReply reply = parse_tool_calls(c.text);
                if (!reply.calls.empty()) {
                  one["message"]["content"] = reply.content.empty() ? json(nullptr) : json(reply.content);
                  one["message"]["tool_calls"] = tool_calls_json(reply.calls, cat(cid, "_", i), false);
                  one["finish_reason"] = "tool_calls";
                }
              }
              if (r.logprobs >= 0) {
                int64_t offset = 0;
                one["logprobs"] = chat ? chat_logprobs(*model_.tokenizer, c.result.logprobs)
                                       : completion_logprobs(*model_.tokenizer, c.result.logprobs, offset,
                                                             r.echo ? std::span<const int32_t>(prompt)
                                                                    : std::span<const int32_t>(),
                                                             c.result.prompt_logprobs);
              }
              body["choices"].push_back(one);
              completion_tokens += int64_t(c.result.tokens.size());
            }
            if (!body.contains("error")) {
              // OpenAI counts the prompt once and every sample's completion.
              body["usage"] = usage(ch->result);
              body["usage"]["completion_tokens"] = completion_tokens;
              body["usage"]["total_tokens"] = ch->result.prompt_tokens + completion_tokens;
              body["lineage"] = extension(ch->result);
            }
            const std::string out = dump(body);
            sink.write(out.data(), out.size());
            sink.done();
            return true;
          });
          return;
        }
        ++streams_;
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider("text/event-stream", [=, this](size_t, httplib::DataSink& sink) {
          const auto send = [&](const json& j) {
            const std::string s = "data: " + dump(j) + "\n\n";
            return sink.write(s.data(), s.size());
          };
          const auto chunk = [&](const std::string& text, const json& finish) {
            json j = head;
            j["object"] = chat ? "chat.completion.chunk" : "text_completion";
            j["choices"] = json::array({choice(chat, true, text, finish)});
            return j;
          };
          if (chat) {
            json first = chunk("", nullptr);
            first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
            if (!send(first)) return gone();
          }
          // With tools the reply is held to the end: only then is it known to be calls or text.
          const bool hold = chat && !r.tools.is_null();
          int64_t stream_offset = 0;  // text_offset across the streamed completion chunks
          std::unique_lock lock(ch->mu);
          while (true) {
            ch->cv.wait_for(lock, std::chrono::milliseconds(250),
                            [&] { return ch->done || (!hold && !ch->text.empty()) || !ch->progress.empty(); });
            std::string text;
            if (!hold || ch->done) text.swap(ch->text);
            std::vector<runtime::TokenLogprob> logprobs;
            if (!text.empty() || ch->done) logprobs.swap(ch->logprobs);  // with the text their tokens made
            std::optional<ParsedReply> reply;
            if (hold && ch->done) {
              reply = parse_tool_calls(text);
              if (!reply->calls.empty()) text = reply->content;
            }
            std::vector<json> progress;
            progress.swap(ch->progress);
            const bool done = ch->done;
            lock.unlock();
            bool ok = !stopping_;
            for (const json& p : progress) {
              json j = head;
              j["object"] = chat ? "chat.completion.chunk" : "text_completion";
              j["choices"] = json::array();
              j["prompt_progress"] = p;
              ok = ok && send(j);
            }
            if (!text.empty() || !logprobs.empty()) {
              json j = chunk(text, nullptr);
              if (r.logprobs >= 0)
                j["choices"][0]["logprobs"] = chat ? chat_logprobs(*model_.tokenizer, logprobs)
                                                   : completion_logprobs(*model_.tokenizer, logprobs, stream_offset);
              ok = ok && send(j);
            }
            else if (progress.empty() && !done) ok = ok && sink.write(": ping\n\n", 8);  // an SSE comment
            if (reply && !reply->calls.empty()) {
              json j = chunk("", nullptr);
              j["choices"][0]["delta"] = {{"tool_calls", tool_calls_json(reply->calls, cid, true)}};
              ok = ok && send(j);
            }
            if (!ok) return gone();
            if (done) {
              if (ch->result.finish_reason == "error") {
                send(json::parse(ApiError{500, ch->result.error, "server_error", "", "engine_error"}.body()));
              } else {
                json last = chunk("", reply && !reply->calls.empty() ? json("tool_calls") : json(finish_reason(*ch)));
                last["lineage"] = extension(ch->result);
                send(last);
                if (r.include_usage) {
                  json u = chunk("", nullptr);
                  u["choices"] = json::array();
                  u["usage"] = usage(ch->result);
                  send(u);
                }
              }
              sink.write("data: [DONE]\n\n", 14);
              sink.done();
              return true;
            }
            lock.lock();
          }
        });
      } catch (const ApiError& e) {
        error(res, e);
      } catch (const Error& e) {
        error(res, ApiError{400, e.what(), "invalid_request_error", "", "invalid_value"});
      }
    };
  };
  http_->Post("/v1/completions", completion(false));
  http_->Post("/v1/chat/completions", completion(true));
  http_->Post("/completions", completion(false));
  http_->Post("/chat/completions", completion(true));

  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const auto& c = model_.model.config;
    const json m = {{"id", options_.model_name},
                    {"object", "model"},
                    {"created", 0},
                    {"owned_by", "lineage"},
                    {"meta",
                     {{"model_type", c.model_type},
                      {"vocab_size", c.vocab_size},
                      {"n_ctx", engine_->context()},
                      {"n_layers", model_.model.n_layers()},
                      {"chat_template", template_ ? template_->where() : std::string("none (plain role: content)")}}}};
    res.set_content(dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
  });
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const runtime::EngineStats s = engine_->stats();
    res.set_content(dump({{"status", "ok"}, {"slots_idle", s.slots - s.active}, {"slots_processing", s.active},
                          {"queued", s.queued}}),
                    "application/json");
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4");
  });
  http_->Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(kChatPage, "text/html; charset=utf-8"); });
  http_->Get("/trace", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(trace_served_html(), "text/html; charset=utf-8");
  });
  // lineage trace's data for a prompt (or token ids), with any heads in full: the page at /trace
  // asks again for a head it does not hold. One trace at a time, beside the engine's steps.
  http_->Post("/trace/data", [this, error](const httplib::Request& req, httplib::Response& res) {
    try {
      if (options_.engine.ranks.ranks > 1)  // the recording runs whole, and each rank maps only its slice
        throw ApiError{501, cat("the trace records on one process; this server runs over ", options_.engine.ranks.ranks,
                                " ranks (mpirun): run lineage serve without mpirun, or lineage trace"),
                       "server_error", "", "not_across_ranks"};
      const std::vector<runtime::TraceLayer> layers = runtime::trace_layers(model_.model);
      const int64_t limit = options_.trace_max_tokens;
      const TraceRequest r = parse_trace_request(req.body, layers, model_.model.config.vocab_size, limit);
      std::vector<int32_t> ids = r.tokens;
      if (ids.empty()) {
        ids = model_.tokenizer->encode(r.prompt);
        if (model_.tokenizer->adds_bos() && model_.tokenizer->bos_id()) ids.insert(ids.begin(), *model_.tokenizer->bos_id());
      }
      check_trace_length(ids.size(), limit);
      const std::vector<LayerHead> detail = trace_detail_heads(layers, int64_t(ids.size()), r.detail_bytes, r.heads);
      const size_t bytes = trace_record_bytes(layers, int64_t(ids.size()), detail), limit_bytes = size_t(1) << 30;
      if (bytes > limit_bytes)
        throw ApiError{400, cat("this trace would hold ", bytes, " bytes while it records (", ids.size(), " tokens, ",
                                detail.size(), " heads in full); the server records at most ", limit_bytes,
                                ": fewer tokens or heads"),
                       "invalid_request_error", "prompt", "trace_too_large"};
      std::unique_lock lock(trace_mu_, std::try_to_lock);  // one recording at a time, no HTTP thread left waiting
      if (!lock.owns_lock()) {
        res.set_header("Retry-After", "1");
        throw ApiError{503, "another trace is being recorded; try again in a moment", "server_error", "", "busy"};
      }
      res.set_content(record_trace_payload(model_.model, &*model_.tokenizer, ids, detail, options_.model_name)
                          .dump(-1, ' ', false, json::error_handler_t::replace),
                      "application/json");
    } catch (const ApiError& e) {
      error(res, e);
    } catch (const Error& e) {
      error(res, ApiError{400, e.what(), "invalid_request_error", "", "invalid_value"});
    }
  });

  // Errors httplib answers itself (no route, a body over the limit, a malformed request) get an
  // OpenAI-style body too; every status >= 400 is counted for /metrics.
  http_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e{res.status, "", res.status >= 500 ? "server_error" : "invalid_request_error", "", ""};
    if (res.status == 404) e.message = cat("no such endpoint: ", req.method, " ", req.path), e.code = "not_found";
    else if (res.status == 413) e.message = "the request body is larger than the server accepts", e.code = "body_too_large";
    else e.message = cat("the request is malformed (HTTP ", res.status, ")");
    res.set_content(e.body(), "application/json");
  });
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(ApiError{500, what, "server_error", "", "internal"}.body(), "application/json");
  });
  http_->set_logger([this](const httplib::Request&, const httplib::Response& res) {
    if (res.status < 400) return;
    std::lock_guard lock(mu_);
    ++http_errors_[res.status];
  });
}

std::string Server::metrics() const {
  const runtime::EngineStats s = engine_->stats();
  std::string out;
  const auto metric = [&](const char* name, const char* type, const char* help, double v) {
    out += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, " ", v, "\n");
  };
  metric("lineage_requests_total", "counter", "Completion requests admitted to the queue.", double(s.requests));
  metric("lineage_requests_finished_total", "counter", "Completion requests finished (any reason).", double(s.finished));
  metric("lineage_requests_rejected_total", "counter", "Requests refused with 503 (queue full).", double(s.rejected));
  metric("lineage_streams_total", "counter", "Streamed (SSE) completions.", double(streams_.load()));
  metric("lineage_disconnects_total", "counter", "Requests whose client went away before the end.", double(disconnects_.load()));
  metric("lineage_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", double(s.prompt_tokens));
  metric("lineage_cached_tokens_total", "counter", "Prompt tokens served from the prefix cache.", double(s.cached_tokens));
  metric("lineage_generated_tokens_total", "counter", "Tokens generated.", double(s.generated_tokens));
  metric("lineage_steps_total", "counter", "Batched forward steps.", double(s.steps));
  metric("lineage_busy_seconds_total", "counter", "Seconds spent in forward steps.", s.busy_seconds);
  metric("lineage_decode_tokens_per_second", "gauge", "Generated tokens per second over the recent steps.", s.decode_tokens_per_second);
  metric("lineage_slots", "gauge", "State slots (requests decoding together at most).", double(s.slots));
  metric("lineage_slots_used", "gauge", "State slots in use.", double(s.active));
  metric("lineage_queue_length", "gauge", "Requests waiting for a slot.", double(s.queued));
  metric("lineage_state_bytes", "gauge", "Bytes of state the active sequences hold.", double(s.state_bytes));
  metric("lineage_cache_lookups_total", "counter", "Prefix cache lookups.", double(s.cache_lookups));
  metric("lineage_cache_hits_total", "counter", "Prefix cache lookups that resumed a prefix.", double(s.cache_hits));
  metric("lineage_cache_entries", "gauge", "Sequences in the prefix cache.", double(s.cache_entries));
  metric("lineage_cache_bytes", "gauge", "Bytes the prefix cache holds.", double(s.cache_bytes));
  out += "# HELP lineage_http_errors_total Responses with status >= 400, by status.\n# TYPE lineage_http_errors_total counter\n";
  std::lock_guard lock(mu_);
  for (const auto& [status, n] : http_errors_) out += cat("lineage_http_errors_total{status=\"", status, "\"} ", n, "\n");
  return out;
}

}  // namespace lineage::serve
