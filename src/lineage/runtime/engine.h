// Room runtime/: running loaded models: sessions (one sequence), batched generation, the serving
// engine (this file) with its prefix cache, samplers, state files, the cost model and the split
// checks. Uses io and what it uses.
//
// The serving engine: continuous batching over a state pool on a thread of its own, with the prefix
// cache. Requests are queued from any thread; between steps the engine admits waiting requests into
// free slots (each first restored from the longest cached prefix of its prompt), and every step
// holds one prefill piece or one decode token of every active request (but a prefill group's
// members waiting for its leader's prefill). A request that ends (EOS,
// max_tokens, the context, a caller's stop or cancel) frees its slot at once and leaves its state in
// the prefix cache for the next request that shares its prefix.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "lineage/model/model.h"
#include "lineage/model/state_pool.h"
#include "lineage/model/workspace.h"
#include "lineage/runtime/generate.h"
#include "lineage/runtime/prefix_cache.h"

namespace lineage::runtime {

// A token's log-probability under the model (log-softmax of its logits row, in double rounded to
// f32) and, when asked for, the `top` most likely tokens there (descending; ties to the lower id).
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

struct EngineResult {
  std::vector<int32_t> tokens;  // generated ids (EOS not included)
  // With EngineRequest::logprobs >= 0: one per generated token (EOS not included);
  // with prompt_logprobs: one per prompt token after the first (the first has no context).
  std::vector<TokenLogprob> logprobs, prompt_logprobs;
  int64_t prompt_tokens = 0, cached_tokens = 0;
  // "stop" (EOS), "length" (max_tokens), "context" (the context limit), "cancelled" (cancel() or
  // on_token returned false), "error" (error says why).
  std::string finish_reason, error;
  double queued_seconds = 0, first_token_seconds = 0, seconds = 0;  // from submit()
  size_t state_bytes = 0;  // the sequence's state at its end
};

// Called on the engine's thread; they must not block for long (every request waits on them).
struct EngineRequest {
  std::vector<int32_t> prompt;  // at least one token
  GenerateOptions options;      // max_tokens, sampling (its own seeded sampler), eos
  // >= 0: each generated token's log-probability and that many top alternatives (at most 20), in
  // EngineResult::logprobs and on_logprob; < 0: none.
  int logprobs = -1;
  // The prompt tokens' log-probabilities too (OpenAI's echo): the prompt is run from an empty state
  // (no prefix-cache restore: a cached prefix has no logits). With it, max_tokens may be 0: the
  // prompt only.
  bool prompt_logprobs = false;
  // Nonzero: requests with this group and the same prompt (n samples of one prompt) share one
  // prefill. The first admitted runs it; one admitted while it does waits for it, then continues
  // from a copy of its state and samples its first token from the same logits with its own sampler.
  // One admitted later (or after the first ended), or one with prompt_logprobs or max_tokens 0,
  // prefills alone, as any request.
  uint64_t prefill_group = 0;
  // Each generated token (not EOS); returning false ends the request (finish_reason "cancelled"):
  // the caller found a stop sequence, or its client went away.
  std::function<bool(int32_t token)> on_token;
  // With logprobs >= 0: each generated token's log-probability, just before its on_token.
  std::function<void(const TokenLogprob&)> on_logprob;
  // After each prefill piece: prompt tokens in the state so far (cached ones included), of total.
  std::function<void(int64_t done, int64_t total)> on_progress;
  std::function<void(EngineResult&&)> on_done;
};

// One engine over several ranks (lineage serve under mpirun, docs/distributed.md). Rank 0's engine
// takes the requests and decides each step; every other rank runs a follower engine (join()) that
// replays those decisions, so the ranks' forwards make the same collectives (the row split's
// gathers) over the same tokens. Before each step rank 0 broadcasts what only it knows: the requests
// it admitted and the ones cancelled, those whose caller ended them in the last step (on_token
// returned false) and a callback's failure. The rest (slots, the prefix cache, every token sampled
// from the gathered logits) each rank computes alike. Only rank 0 calls the requests' callbacks.
struct EngineRanks {
  int rank = 0, ranks = 1;
  // Rank 0's `message` to every rank (the others' is replaced), called on the engine's thread by
  // every rank in the same order; the others may wait long for it (rank 0 idle between requests).
  std::function<void(std::string& message)> broadcast;
  // Called first on the engine's thread (where the row split must be installed to be used).
  std::function<void()> on_thread;
  // A failure on this rank alone (memory) that the other ranks cannot replay: ends every rank
  // (it should not return; the engine throws its message if it does).
  std::function<void(const std::string& message)> fail;
};

struct EngineOptions {
  int64_t slots = 4;            // requests decoding together at most
  int64_t ctx = 0;              // positions per slot: 0 = the model's limit, caches grow on demand
  int64_t prefill_chunk = 256;  // prompt tokens one request feeds per step at most
  int64_t queue = 64;           // requests waiting for a slot at most; submit() refuses beyond
  // Admit a prompt that fills the whole context (it generates its one token and ends "context");
  // a server refuses those, as they leave no room for a completion.
  bool allow_full_prompt = false;
  PrefixCacheOptions cache;
  EngineRanks ranks;
};

struct EngineStats {
  int64_t requests = 0, finished = 0, active = 0, queued = 0, slots = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, cached_tokens = 0, steps = 0, rejected = 0;
  int64_t most_together = 0;  // sequences in one step at most
  int64_t cache_lookups = 0, cache_hits = 0, cache_entries = 0;
  size_t cache_bytes = 0, state_bytes = 0;  // the prefix cache; the active sequences' states
  double busy_seconds = 0;                  // time spent in steps
  // Steps in which every sequence decoded (none fed prompt tokens): how many, the tokens they made and
  // their time: a load's decode phase apart from its prefills (lineage bench-serve).
  int64_t decode_steps = 0, decode_step_tokens = 0;
  double decode_step_seconds = 0;
  double decode_tokens_per_second = 0;      // the last steps' generated tokens over their time
};

class Engine {
 public:
  Engine(const model::Model& m, EngineOptions options);
  ~Engine();  // finishes nothing: active and queued requests end "cancelled"
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request and returns its id, or nothing when the queue is full. Throws Error for a
  // request that can never run: no prompt, a prompt longer than the context, max_tokens < 1 (0 with
  // prompt_logprobs), logprobs above 20.
  std::optional<uint64_t> submit(EngineRequest request);
  // Queues several requests at once (all or none: nothing when the queue cannot take them all), so
  // that they are admitted together where slots allow (a prefill group's samples). Throws as submit().
  std::optional<std::vector<uint64_t>> submit_many(std::vector<EngineRequest> requests);
  // Ends a request at the next step boundary (or takes it out of the queue); its slot is free for
  // the next step. Unknown or finished ids are ignored.
  void cancel(uint64_t id);
  EngineStats stats() const;
  // A follower (options.ranks.rank > 0): returns when rank 0's engine has stopped. It takes no
  // requests (submit throws).
  void join();
  // Positions a request may hold: the prompt and the generated tokens.
  int64_t context() const { return limit_; }
  const model::Model& model() const { return model_; }

 private:
  struct Waiting {
    uint64_t id;
    EngineRequest request;
    double submitted;
  };
  struct Live;
  struct Round;
  void run();
  // Rank 0 fills a round; with several ranks it is broadcast (the others' filled from it).
  void broadcast_round(Round& round);
  // Ends the requests whose callers ended them, then, after a callback failed, every request. On
  // rank 0 `error` is set to the failure (the round carries it); on the others it is the round's.
  void settle(std::vector<Live>& live, const std::vector<uint64_t>& ended, std::string& error);
  void step(std::vector<Live>& live, const std::vector<uint64_t>& gone);
  // A request's callback: one that throws ends every request at the next round (on rank 0 only).
  void callback(const std::function<void()>& f);
  void check(const EngineRequest& request) const;  // what submit() throws for
  // Samples live[b]'s next token from `row` and hands it on; may finish (and erase) live[b].
  void emit(std::vector<Live>& live, size_t b, const float* row);
  void finish(std::vector<Live>& live, size_t k, const char* reason, std::string error = {});

  const model::Model& model_;
  EngineOptions options_;
  int64_t limit_;
  model::StatePool pool_;
  PrefixCache cache_;
  model::Workspace ws_;
  layers::Step step_;
  std::vector<float> logits_;
  const bool root_;                  // rank 0 (or the only rank): takes requests, calls callbacks
  std::vector<uint64_t> ended_;      // requests whose on_token returned false in this step
  std::string callback_error_;       // the first callback failure since the last round

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Waiting> queue_;
  std::unordered_set<uint64_t> cancelled_;
  uint64_t next_id_ = 1;
  bool stopping_ = false;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace lineage::runtime
