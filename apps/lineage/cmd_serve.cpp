// lineage serve: the OpenAI-compatible HTTP server (src/lineage/serve) over one model, until SIGINT
// or SIGTERM; under mpirun, over P ranks (rank 0 serves, docs/distributed.md).
#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/runtime/engine.h"
#include "lineage/serve/server.h"
#include "ranks.h"

namespace lineage::app {

namespace {

struct ServeOpts {
  ModelSource src;
  serve::ServerOptions server;
  std::string cache_bytes = "256M";
  std::string api_key_file;
  bool api_key_given = false;
  std::string template_kwargs;
};

// The key in --api-key-file: its first line, surrounding whitespace dropped; an empty one is an error.
std::string read_api_key(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw Error(cat("--api-key-file ", file, ": cannot be read"));
  std::string line;
  std::getline(in, line);
  const size_t a = line.find_first_not_of(" \t\r"), b = line.find_last_not_of(" \t\r");
  if (a == std::string::npos) throw Error(cat("--api-key-file ", file, ": the first line holds no key"));
  return line.substr(a, b - a + 1);
}

void run_serve(ServeOpts& o) {
  // SIGINT / SIGTERM are taken by a thread of their own (sigwait), which stops the server; every
  // other thread, the HTTP workers and the engine's among them, inherits the blocked mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that goes away mid-write is an error return, not a kill

  if (!o.api_key_file.empty()) o.server.api_key = read_api_key(o.api_key_file);
  else if (o.api_key_given && o.server.api_key.empty())
    throw Error("--api-key: the key is empty; expected a key (an empty one would leave the server open)");
  o.server.template_kwargs = parse_template_kwargs(o.template_kwargs);
  io::LoadedModel m = load(o.src, true);
  require_tokenizer(m, "serve");
  o.server.engine.cache.budget_bytes = parse_bytes(o.cache_bytes, "--cache-bytes");
  // Under mpirun: rank 0 serves and decides each step; every other rank replays its engine's steps
  // (runtime::EngineRanks) until rank 0's stops. Signals stay blocked there: the job ends with rank 0.
  o.server.engine.ranks = engine_ranks();
  if (!is_root()) {
    runtime::Engine follower(m.model, o.server.engine);
    follower.join();
    return;
  }
  serve::Server server(m, o.server);
  const int port = server.bind();
  const runtime::Engine& e = server.engine();
  std::fprintf(stderr,
               "lineage serve: %s on http://%s:%d (%lld slots, context %lld, queue %lld, prefix cache %s, "
               "checkpoints every %lld%s)\n",
               (o.src.dir.empty() ? "preset " + o.src.preset : o.src.dir).c_str(), o.server.host.c_str(), port, (long long)o.server.engine.slots,
               (long long)e.context(), (long long)o.server.engine.queue,
               format_bytes(double(o.server.engine.cache.budget_bytes)).c_str(),
               (long long)o.server.engine.cache.checkpoint_every,
               ranks().size() > 1 ? cat(", ", ranks().size(), " ranks over ", ranks().name()).c_str() : "");
  if (!o.server.api_key.empty())
    std::fprintf(stderr, "lineage serve: every endpoint but /health and / wants Authorization: Bearer <the API key>\n");
  else if (o.server.host != "127.0.0.1" && o.server.host != "localhost" && o.server.host != "::1")
    std::fprintf(stderr, "lineage serve: no API key: anyone who reaches %s:%d may use it (--api-key or --api-key-file)\n",
                 o.server.host.c_str(), port);
  std::fflush(stderr);
  std::atomic<bool> signalled{false};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (signalled.exchange(true)) return;  // woken by the main thread below
    std::fprintf(stderr, "lineage serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    server.stop();
  });
  server.listen();
  // listen() also returns when accepting fails; the waiter then still waits for a signal.
  const bool by_signal = signalled.exchange(true);
  if (!by_signal) pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  if (!by_signal) throw Error(cat("--host ", o.server.host, " --port ", port, ": the server stopped accepting connections"));
}

}  // namespace

void add_serve(CLI::App& app) {
  static ServeOpts o;
  auto* cmd = app.add_subcommand("serve", "an OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions "
                                          "(streamed with \"stream\": true), /v1/models, /health, /metrics and a "
                                          "chat page at / (docs/serve.md)");
  add_model_options(*cmd, o.src, true);
  add_threads_option(*cmd);
  add_numerics_options(*cmd, o.src);
  serve::ServerOptions& s = o.server;
  cmd->add_option("--host", s.host, "address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)");
  cmd->add_option("--port", s.port, "port to listen on (default 8080; 0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--slots", s.engine.slots, "requests decoding together at most, each in its own state slot (default 4)")
      ->check(CLI::Range(int64_t(1), int64_t(4096)));
  cmd->add_option("--ctx", s.engine.ctx,
                  "positions per slot, prompt and completion (default: the model's limit, caches grown on demand)")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 31));
  cmd->add_option("--queue", s.engine.queue, "requests waiting for a slot at most; beyond, 503 (default 64)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  cmd->add_option("--prefill-chunk", s.engine.prefill_chunk, "prompt tokens one request feeds per step at most (default 256)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  cmd->add_option("--cache-bytes", o.cache_bytes,
                  "prefix cache budget in bytes, or with K, M, G (default 256M; 0 turns the cache off)");
  cmd->add_option("--checkpoint-every", s.engine.cache.checkpoint_every,
                  "recurrent layers' prefix-cache checkpoint interval in tokens (default 256)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  cmd->add_option("--max-body", s.max_body_bytes, "request body limit in bytes; larger ones get 413 (default 4 MiB)")
      ->check(CLI::Range(size_t(1024), size_t(1) << 30));
  cmd->add_option("--timeout", s.read_timeout_seconds, "seconds a client may take to send its request (default 10)")
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--http-threads", s.threads, "HTTP worker threads (default: slots + queue + 16)")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--trace-max-tokens", s.trace_max_tokens,
                  "the longest prompt the trace page at /trace records (default 512, at most 4096; a trace that would "
                  "hold more than 1 GiB while it records is refused)")
      ->check(CLI::Range(int64_t(1), int64_t(4096)));
  cmd->add_option("--name", s.model_name, "model id in /v1/models and responses (default: the directory's name)");
  auto* key = cmd->add_option("--api-key", s.api_key,
                              "require Authorization: Bearer KEY on every endpoint but /health and the pages at / and /trace (401 otherwise)");
  auto* key_file = cmd->add_option("--api-key-file", o.api_key_file, "the same, the key read from this file's first line (kept out of the process list)");
  key->excludes(key_file);
  key->each([](const std::string&) { o.api_key_given = true; });
  cmd->add_option("--chat-template-kwargs", o.template_kwargs,
                  "variables every chat request's template gets, a JSON object: '{\"enable_thinking\": false}' "
                  "(a request's chat_template_kwargs add to them)");
  cmd->callback([] { run_serve(o); });
}

}  // namespace lineage::app
