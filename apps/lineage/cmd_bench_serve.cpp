// lineage bench-serve: `lineage serve` on loopback in this process, and streaming clients over real
// HTTP at each concurrency: aggregate generated tokens/s, time to first token and per-token latency
// (p50 / p99), next to a roofline of the round's work measured in the same run (every request's
// prefill at the FLOP peak, then its decode at the batched-decode roofline), and the decode phase
// apart: the engine's steps in which every sequence decoded, against the decode roofline at their
// mean batch (docs/serve.md). With --url the same clients drive another OpenAI-compatible server
// (llama-server in scripts/bench-peers.sh) serving the same model, against the same roofline.
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/kernels/roofline.h"
#include "lineage/core/parallel.h"
#include "lineage/runtime/cost.h"
#include "lineage/runtime/engine.h"
#include "lineage/serve/server.h"

namespace lineage::app {

namespace {

struct BenchServeOpts {
  ModelSource src;
  std::vector<int64_t> clients = {1, 4, 16, 64};
  int64_t requests = 4, prompt = 64, gen = 32, slots = 0;
  bool json = false;
  std::string url;  // another server's http://HOST:PORT; empty: lineage serve in this process
};

struct Endpoint {
  std::string host = "127.0.0.1";
  int port = 0;
};

// --url's http://HOST:PORT (a trailing slash allowed; no path, no TLS).
Endpoint parse_url(const std::string& url) {
  const std::string scheme = "http://";
  Endpoint e;
  std::string rest = url.rfind(scheme, 0) == 0 ? url.substr(scheme.size()) : "";
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  bool ok = colon != std::string::npos && colon > 0 && colon + 1 < rest.size() && rest.size() - colon <= 6 &&
            rest.find('/') == std::string::npos;
  if (ok) {
    e.host = rest.substr(0, colon);
    for (char c : rest.substr(colon + 1)) ok = ok && c >= '0' && c <= '9';
    if (ok) e.port = std::stoi(rest.substr(colon + 1));
    ok = ok && e.port >= 1 && e.port <= 65535;
  }
  if (!ok) throw Error(cat("--url: expected http://HOST:PORT (a port in 1..65535), found '", url, "'"));
  return e;
}

struct Sample {
  double ttft = 0, per_token = 0;
  int64_t tokens = 0;
  bool ok = false;
  std::string error;
};

// One streamed completion of `prompt` (token ids) for `gen` tokens; times from the request's start.
Sample one_request(const Endpoint& at, const std::vector<int32_t>& prompt, int64_t gen) {
  httplib::Client cli(at.host, at.port);
  cli.set_read_timeout(3600, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = nlohmann::json{{"prompt", prompt},
                            {"max_tokens", gen},
                            {"temperature", 0},
                            {"ignore_eos", true},
                            {"stream", true},
                            {"stream_options", {{"include_usage", true}}}}
                 .dump();
  Sample s;
  std::string pending;
  double t_first = 0, t_last = 0;
  const double t0 = steady_seconds();
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    pending.append(data, n);
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (event.rfind("data: {", 0) != 0) continue;
      const nlohmann::json j = nlohmann::json::parse(event.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("usage")) s.tokens = j["usage"]["completion_tokens"].get<int64_t>();
      // Per-token latency runs from the first text to the finishing event (the server may send a
      // few tokens' text in one event when the client reads slower than they come).
      if (j.contains("choices") && !j["choices"].empty()) {
        if (t_first == 0 && !j["choices"][0].value("text", "").empty()) t_first = steady_seconds();
        if (!j["choices"][0]["finish_reason"].is_null()) t_last = steady_seconds();
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  s.ok = cli.send(req, res, err) && res.status == 200 && t_first > 0;
  if (!s.ok) s.error = cat(httplib::to_string(err), " ", res.status, " ", res.body.substr(0, 200));
  s.ttft = t_first - t0;
  s.per_token = s.tokens > 1 ? (t_last - t_first) / double(s.tokens - 1) : 0;
  return s;
}

std::string printf_string(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string printf_string(const char* format, ...) {
  char buf[256];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[size_t(std::max(0.0, std::ceil(q * double(v.size())) - 1))];
}

struct BenchServeRow {
  int64_t clients = 0, requests = 0, tokens = 0, failed = 0;
  double seconds = 0, tokens_per_second = 0, roofline = 0;
  double prefill_seconds = 0, decode_seconds = 0;  // the roofline's: the round's least time for each
  // The decode phase: the engine's decode-only steps of the round (runtime::EngineStats).
  int64_t decode_steps = 0, decode_tokens = 0;
  double decode_step_seconds = 0, decode_roofline = 0;
  double decode_tokens_per_second() const { return decode_step_seconds > 0 ? double(decode_tokens) / decode_step_seconds : 0; }
  double decode_batch() const { return decode_steps ? double(decode_tokens) / double(decode_steps) : 0; }
  bool compute_bound = false;
  double ttft_p50 = 0, ttft_p99 = 0, tok_p50 = 0, tok_p99 = 0;
  std::string error;  // the first failure's
};

// `server`: lineage's, whose engine counts the decode phase; nullptr for another server at `at`.
BenchServeRow run_clients(const serve::Server* server, const Endpoint& at, const BenchServeOpts& o, int64_t clients,
                          int32_t vocab, uint64_t seed) {
  std::vector<std::vector<Sample>> samples{size_t(clients)};
  std::vector<std::thread> threads;
  const runtime::EngineStats before = server ? server->engine().stats() : runtime::EngineStats{};
  const double t0 = steady_seconds();
  for (int64_t c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      std::mt19937_64 rng(seed + uint64_t(c));
      for (int64_t r = 0; r < o.requests; ++r) {
        // Distinct random prompts: no prefix is shared, so the cache serves none of them.
        std::vector<int32_t> prompt(size_t(o.prompt));
        for (auto& t : prompt) t = int32_t(rng() % uint64_t(std::max(1, vocab - 1)));
        samples[size_t(c)].push_back(one_request(at, prompt, o.gen));
      }
    });
  for (auto& t : threads) t.join();
  BenchServeRow row;
  row.clients = clients;
  row.seconds = steady_seconds() - t0;
  const runtime::EngineStats after = server ? server->engine().stats() : runtime::EngineStats{};
  row.decode_steps = after.decode_steps - before.decode_steps;
  row.decode_tokens = after.decode_step_tokens - before.decode_step_tokens;
  row.decode_step_seconds = after.decode_step_seconds - before.decode_step_seconds;
  std::vector<double> ttft, tok;
  for (const auto& per_client : samples)
    for (const Sample& s : per_client) {
      ++row.requests;
      if (!s.ok) {
        if (!row.failed) row.error = s.error;
        ++row.failed;
        continue;
      }
      row.tokens += s.tokens;
      ttft.push_back(s.ttft);
      if (s.tokens > 1) tok.push_back(s.per_token);
    }
  row.tokens_per_second = double(row.tokens) / row.seconds;
  row.ttft_p50 = percentile(ttft, 0.5), row.ttft_p99 = percentile(ttft, 0.99);
  row.tok_p50 = percentile(tok, 0.5), row.tok_p99 = percentile(tok, 0.99);
  return row;
}

void run_bench_serve(BenchServeOpts& o) {
  for (int64_t c : o.clients)
    if (c < 1 || c > 4096) throw Error(cat("--clients: expected counts in [1, 4096], found ", c));
  io::LoadedModel m = load(o.src, true);
  const bool peer = !o.url.empty();
  Endpoint at = peer ? parse_url(o.url) : Endpoint{};
  if (!peer) require_tokenizer(m, "bench-serve");
  const int64_t most = *std::max_element(o.clients.begin(), o.clients.end());
  serve::ServerOptions so;
  so.port = 0;
  so.engine.slots = o.slots > 0 ? o.slots : most;
  so.engine.queue = std::max<int64_t>(64, most);
  so.engine.cache.budget_bytes = 0;  // every prompt is new: the cache would only copy states
  const int64_t ctx = m.model.config.max_positions;
  if (ctx > 0 && o.prompt + o.gen > ctx)
    throw Error(cat("--prompt ", o.prompt, " + --gen ", o.gen, " exceed the model's context of ", ctx));
  so.engine.ctx = o.prompt + o.gen;
  std::unique_ptr<serve::Server> server;
  std::thread http;
  if (!peer) {
    server = std::make_unique<serve::Server>(m, so);
    at.port = server->bind();
    http = std::thread([&] { server->listen(); });
  }

  const int threads = num_threads();
  const DType dtype = main_dtype(m.model);
  double bandwidth = kernels::measure_read_bandwidth(threads), peak = kernels::measure_peak_flops(dtype, threads);
  const Sample warm = one_request(at, std::vector<int32_t>(size_t(o.prompt), 0), std::min<int64_t>(o.gen, 4));  // pages, caches
  if (peer && !warm.ok) throw Error(cat("--url ", o.url, ": the warm-up completion failed: ", warm.error));
  std::vector<BenchServeRow> rows;
  for (int64_t c : o.clients) {
    rows.push_back(run_clients(server.get(), at, o, c, int32_t(m.model.config.vocab_size), 1000 * uint64_t(c)));
    if (isatty(2))
      std::fprintf(stderr, "lineage bench-serve: %lld clients: %.1f tok/s\n", (long long)c, rows.back().tokens_per_second);
  }
  // The ceilings again after the run; the higher of each is kept (another process can only lower them).
  bandwidth = std::max(bandwidth, kernels::measure_read_bandwidth(threads));
  peak = std::max(peak, kernels::measure_peak_flops(dtype, threads));
  // The round's least time: each request's prefill (its first token comes from it) at the FLOP peak,
  // and its gen - 1 decode steps at the batched roofline of min(clients, slots) sequences.
  const double context = runtime::mean_decode_context(o.prompt, o.gen - 1);
  const double prefill_flops = double(o.prompt) * runtime::prefill_flops_per_token(m.model, o.prompt, 0).total();
  for (BenchServeRow& r : rows) {
    const runtime::DecodeRoofline rf =
        runtime::decode_roofline(m.model, context, double(std::min(r.clients, so.engine.slots)), bandwidth, peak);
    const double ok = double(r.requests - r.failed);
    r.prefill_seconds = ok * prefill_flops / peak;
    r.decode_seconds = ok * double(o.gen - 1) / rf.tokens_per_second;
    r.roofline = ok * double(o.gen) / (r.prefill_seconds + r.decode_seconds);
    r.compute_bound = rf.compute_bound;
    if (r.decode_steps)
      r.decode_roofline = runtime::decode_roofline(m.model, context, r.decode_batch(), bandwidth, peak).tokens_per_second;
  }
  if (server) {
    server->stop();
    http.join();
  }

  if (o.json) {
    nlohmann::json all = nlohmann::json::array();
    for (const BenchServeRow& r : rows)
      all.push_back({{"clients", r.clients},
                     {"requests", r.requests},
                     {"failed", r.failed},
                     {"generated_tokens", r.tokens},
                     {"seconds", r.seconds},
                     {"tokens_per_second", r.tokens_per_second},
                     {"roofline_tokens_per_second", r.roofline},
                     {"roofline_prefill_seconds", r.prefill_seconds},
                     {"roofline_decode_seconds", r.decode_seconds},
                     {"roofline_bound", r.compute_bound ? "compute" : "bandwidth"},
                     {"decode_steps", r.decode_steps},
                     {"decode_tokens", r.decode_tokens},
                     {"decode_seconds", r.decode_step_seconds},
                     {"decode_mean_batch", r.decode_batch()},
                     {"decode_tokens_per_second", r.decode_tokens_per_second()},
                     {"decode_roofline_tokens_per_second", r.decode_roofline},
                     {"ttft_p50_ms", r.ttft_p50 * 1e3},
                     {"ttft_p99_ms", r.ttft_p99 * 1e3},
                     {"per_token_p50_ms", r.tok_p50 * 1e3},
                     {"per_token_p99_ms", r.tok_p99 * 1e3},
                     {"slots", so.engine.slots},
                     {"prompt_tokens", o.prompt},
                     {"gen_tokens", o.gen},
                     {"threads", threads},
                     {"bandwidth_bytes_per_s", bandwidth},
                     {"peak_flops", peak}});
    std::printf("%s\n", all.dump(2).c_str());
    return;
  }
  const std::string what = o.src.dir.empty() ? "preset " + o.src.preset : o.src.dir;
  std::printf("lineage bench-serve: %s%s, %lld slots, prompts of %lld random tokens, %lld generated each, "
              "%lld requests per client, %d threads, over HTTP on %s\n",
              peer ? cat("the server at ", o.url, ", against the roofline of ").c_str() : "", what.c_str(),
              (long long)so.engine.slots, (long long)o.prompt, (long long)o.gen, (long long)o.requests, threads,
              peer ? cat(at.host, ":", at.port).c_str() : "127.0.0.1");
  std::printf("roofline: read bandwidth %.2f GB/s, peak %.1f GFLOP/s (%s); each request's prefill at the peak, then "
              "its decode batched at min(clients, slots) sequences, mean context %.0f\n",
              bandwidth / 1e9, peak / 1e9, std::string(dtype_name(dtype)).c_str(), context);
  std::printf("| %7s | %8s | %9s | %12s | %10s | %10s | %7s | %10s | %8s | %9s | %9s | %11s | %11s |\n", "clients",
              "requests", "tok/s", "roofline t/s", "% roofline", "decode t/s", "batch", "roofline", "% decode",
              "TTFT p50", "TTFT p99", "per tok p50", "per tok p99");
  std::printf("| ------: | -------: | --------: | -----------: | ---------: | ---------: | ------: | ---------: | "
              "-------: | --------: | --------: | ----------: | ----------: |\n");
  for (const BenchServeRow& r : rows) {
    // The decode phase's columns: lineage's engine counts them; another server's are "-".
    const std::string decode =
        r.decode_steps ? printf_string("%10.1f | %7.1f | %10.1f | %7.1f%%", r.decode_tokens_per_second(), r.decode_batch(),
                                    r.decode_roofline,
                                    r.decode_roofline > 0 ? 100.0 * r.decode_tokens_per_second() / r.decode_roofline : 0.0)
                       : printf_string("%10s | %7s | %10s | %8s", "-", "-", "-", "-");
    std::printf("| %7lld | %8lld | %9.1f | %12.1f | %9.1f%% | %s | %7.1f ms | %7.1f ms "
                "| %8.2f ms | %8.2f ms |%s\n",
                (long long)r.clients, (long long)r.requests, r.tokens_per_second, r.roofline,
                100.0 * r.tokens_per_second / r.roofline, decode.c_str(),
                r.ttft_p50 * 1e3, r.ttft_p99 * 1e3, r.tok_p50 * 1e3, r.tok_p99 * 1e3,
                r.failed ? cat(" ", r.failed, " failed, the first: ", r.error).c_str() : "");
  }
  std::printf("tok/s: generated tokens of all requests over the wall time of the round; roofline: the same tokens "
              "in the least time of the round's work (every prompt's prefill FLOPs at the peak, the decode steps "
              "%s-bound). decode: the engine's steps in which every sequence decoded, their tokens over their time, "
              "at their mean batch, against the decode roofline at that batch\n",
              rows.empty() || !rows.back().compute_bound ? "bandwidth" : "compute");
}

}  // namespace

void add_bench_serve(CLI::App& app) {
  static BenchServeOpts o;
  auto* cmd = app.add_subcommand("bench-serve", "lineage serve under 1, 4, 16, 64 concurrent streaming clients over "
                                                "loopback HTTP: tok/s, time to first token, per-token latency, next to "
                                                "the batched-decode roofline");
  add_model_options(*cmd, o.src, true);
  add_threads_option(*cmd);
  add_numerics_options(*cmd, o.src);
  cmd->add_option("--clients", o.clients, "concurrencies to run, e.g. 1,4,16,64 (default)")->delimiter(',');
  cmd->add_option("--requests", o.requests, "requests per client (default 4)")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  cmd->add_option("--prompt", o.prompt, "prompt tokens per request (default 64)")->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  cmd->add_option("--gen", o.gen, "tokens generated per request (default 32)")->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  cmd->add_option("--slots", o.slots, "the server's slots (default: the largest --clients)")
      ->check(CLI::Range(int64_t(1), int64_t(4096)));
  cmd->add_flag("--json", o.json, "one JSON object per concurrency instead of the table");
  cmd->add_option("--url", o.url, "drive another OpenAI-compatible server at http://HOST:PORT serving the same model "
                                  "(e.g. llama-server) instead of lineage serve; --model/--preset give the roofline "
                                  "and the vocabulary, --slots that server's parallel slots; no decode-phase columns");
  cmd->callback([] { run_bench_serve(o); });
}

}  // namespace lineage::app
