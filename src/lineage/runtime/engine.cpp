#include "lineage/runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "lineage/core/error.h"
#include "lineage/model/forward.h"
#include "lineage/model/state_pool.h"
#include "lineage/runtime/sampler.h"

namespace lineage::runtime {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr int kMaxTopLogprobs = 20;

// `token`'s log-probability in the logits row [V], and the `top` most likely tokens.
TokenLogprob token_logprob(const float* row, int64_t V, int32_t token, int top) {
  const double lse = log_sum_exp(row, V);
  TokenLogprob t;
  t.token = token;
  t.logprob = float(double(row[token]) - lse);
  if (top > 0) {  // the k best in one pass: a heap whose front is the worst of them
    const auto better = [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); };
    const size_t k = std::min(size_t(top), size_t(V));
    std::vector<int32_t> best;
    best.reserve(k + 1);
    for (int64_t v = 0; v < V; ++v) {
      if (best.size() == k && !better(int32_t(v), best.front())) continue;
      best.push_back(int32_t(v));
      std::push_heap(best.begin(), best.end(), better);
      if (best.size() > k) {
        std::pop_heap(best.begin(), best.end(), better);
        best.pop_back();
      }
    }
    std::sort(best.begin(), best.end(), better);
    for (const int32_t id : best) t.top.emplace_back(id, float(double(row[id]) - lse));
  }
  return t;
}

}  // namespace

// A request in a slot: how much of its prompt is in the state, the token to feed next, every token
// fed (for the prefix cache), its sampler and the checkpoints its prefill left.
struct Engine::Live {
  uint64_t id;
  EngineRequest request;
  int32_t slot;
  double submitted;
  Sampler sampler;
  int64_t fed = 0;  // prompt tokens in the state
  std::optional<int32_t> next;
  std::vector<int32_t> history;
  PrefixCache::Checkpoints checkpoints;
  EngineResult result;
  bool follows = false;               // waits for its prefill group's leader (EngineRequest::prefill_group)
  std::vector<float> first_logits;    // a follower's: the leader's row to sample its first token from
};

Engine::Engine(const model::Model& m, EngineOptions options)
    : model_(m),
      options_(options),
      limit_(options.ctx > 0 ? options.ctx : m.config.max_positions),
      pool_(m, {.slots = options.slots, .ctx = options.ctx}),
      cache_(m, options.cache) {
  if (options.slots < 1) throw Error(cat("--slots: expected at least 1, found ", options.slots));
  if (options.prefill_chunk < 1) throw Error(cat("prefill chunk: expected at least 1, found ", options.prefill_chunk));
  stats_.slots = options.slots;
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::optional<uint64_t> Engine::submit(EngineRequest request) {
  std::vector<EngineRequest> one;
  one.push_back(std::move(request));
  const std::optional<std::vector<uint64_t>> ids = submit_many(std::move(one));
  if (!ids) return std::nullopt;
  return (*ids)[0];
}

void Engine::check(const EngineRequest& request) const {
  const int64_t n = int64_t(request.prompt.size());
  if (n == 0) throw Error("the prompt is empty; generation needs at least one token");
  if (limit_ > 0 && (n > limit_ || (n == limit_ && !options_.allow_full_prompt)))
    throw Error(cat("the prompt has ", n, " tokens; the context holds ", limit_, " (prompt and completion)"));
  if (request.options.max_tokens < (request.prompt_logprobs ? 0 : 1))
    throw Error(cat("max_tokens must be at least ", request.prompt_logprobs ? 0 : 1, ", found ", request.options.max_tokens));
  if (request.logprobs > kMaxTopLogprobs)
    throw Error(cat("logprobs: at most ", kMaxTopLogprobs, " alternatives, found ", request.logprobs));
  for (int32_t t : request.prompt)
    if (t < 0 || t >= model_.config.vocab_size)
      throw Error(cat("token id ", t, " is outside the vocabulary of ", model_.config.vocab_size));
}

std::optional<std::vector<uint64_t>> Engine::submit_many(std::vector<EngineRequest> requests) {
  for (const EngineRequest& r : requests) check(r);
  std::lock_guard lock(mu_);
  if (int64_t(queue_.size() + requests.size()) > options_.queue) {
    stats_.rejected += int64_t(requests.size());
    return std::nullopt;
  }
  std::vector<uint64_t> ids;
  const double t = now();
  for (EngineRequest& r : requests) {
    ids.push_back(next_id_++);
    queue_.push_back({ids.back(), std::move(r), t});
    ++stats_.requests;
  }
  stats_.queued = int64_t(queue_.size());
  wake_.notify_all();
  return ids;
}

void Engine::cancel(uint64_t id) {
  std::unique_lock lock(mu_);
  for (auto it = queue_.begin(); it != queue_.end(); ++it)
    if (it->id == id) {
      Waiting w = std::move(*it);
      queue_.erase(it);
      stats_.queued = int64_t(queue_.size());
      ++stats_.finished;
      lock.unlock();
      EngineResult r;
      r.prompt_tokens = int64_t(w.request.prompt.size());
      r.finish_reason = "cancelled";
      r.seconds = r.queued_seconds = now() - w.submitted;
      if (w.request.on_done) w.request.on_done(std::move(r));
      return;
    }
  cancelled_.insert(id);
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Engine::finish(std::vector<Live>& live, size_t k, const char* reason, std::string error) {
  Live& l = live[k];
  l.result.finish_reason = reason;
  l.result.error = std::move(error);
  l.result.seconds = now() - l.submitted;
  model::SequenceState& s = pool_.state(l.slot);
  l.result.state_bytes = s.bytes();
  if (l.history.size() == size_t(s.position)) cache_.commit(l.history, s, std::move(l.checkpoints));
  pool_.release(l.slot);
  {
    std::lock_guard lock(mu_);
    ++stats_.finished;
    stats_.active = int64_t(live.size()) - 1;  // before on_done: a caller woken by it sees the slot free
    stats_.state_bytes = pool_.bytes();          // and its state gone, also when no step follows
    stats_.generated_tokens += int64_t(l.result.tokens.size());
    cancelled_.erase(l.id);
  }
  if (l.request.on_done) l.request.on_done(std::move(l.result));
  live.erase(live.begin() + int64_t(k));
}

void Engine::emit(std::vector<Live>& live, size_t b, const float* row) {
  Live& l = live[b];
  const int64_t V = model_.config.vocab_size, pos = pool_.position(l.slot);
  const GenerateOptions& o = l.request.options;
  const int64_t bad = first_non_finite(DType::F32, row, V);
  if (bad >= 0) {
    finish(live, b, "error", cat("the logits at position ", pos - 1, " hold ", row[bad], " for token ", bad,
                                 ": a weight or an activation is not finite"));
    return;
  }
  const int32_t next = l.sampler.sample({row, size_t(V)});
  if (l.result.tokens.empty()) l.result.first_token_seconds = now() - l.submitted;
  if (o.eos && next == *o.eos) {
    finish(live, b, "stop");
    return;
  }
  if (l.request.logprobs >= 0) {
    l.result.logprobs.push_back(token_logprob(row, V, next, l.request.logprobs));
    if (l.request.on_logprob) l.request.on_logprob(l.result.logprobs.back());
  }
  l.result.tokens.push_back(next);
  l.next = next;
  if (l.request.on_token && !l.request.on_token(next)) finish(live, b, "cancelled");
  else if (int64_t(l.result.tokens.size()) >= o.max_tokens) finish(live, b, "length");
  else if (limit_ > 0 && pos >= limit_) finish(live, b, "context");
}

void Engine::run() {
  std::vector<Live> live;
  live.reserve(size_t(options_.slots));
  while (true) {
    std::vector<Waiting> admitted;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || !live.empty(); });
      if (stopping_) break;
      while (!queue_.empty() && int64_t(live.size() + admitted.size()) < options_.slots) {
        admitted.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      stats_.queued = int64_t(queue_.size());
    }
    for (Waiting& w : admitted) {
      Sampler sampler(w.request.options.sampling);
      Live l{w.id, std::move(w.request), pool_.acquire(), w.submitted, std::move(sampler), 0, {}, {}, {}, {}, false, {}};
      l.result.prompt_tokens = int64_t(l.request.prompt.size());
      l.result.queued_seconds = now() - w.submitted;
      // A member of a prefill group whose leader is still prefilling follows it instead.
      const uint64_t group = l.request.prefill_group;
      const bool can_follow = group != 0 && !l.request.prompt_logprobs && l.request.options.max_tokens > 0;
      for (const Live& o : live)
        l.follows = l.follows || (can_follow && o.request.prefill_group == group && !o.follows &&
                                  o.fed < int64_t(o.request.prompt.size()) && o.request.prompt == l.request.prompt);
      l.fed = l.request.prompt_logprobs || l.follows ? 0 : cache_.restore(l.request.prompt, pool_.state(l.slot));
      l.result.cached_tokens = l.fed;
      l.history.assign(l.request.prompt.begin(), l.request.prompt.begin() + l.fed);
      std::lock_guard lock(mu_);
      stats_.prompt_tokens += l.result.prompt_tokens;
      stats_.cached_tokens += l.fed;
      live.push_back(std::move(l));
      stats_.active = int64_t(live.size());
    }
    try {
      step(live);
    } catch (const std::exception& e) {  // (a callback's, or memory): every request ends with it, the engine lives on
      while (!live.empty()) finish(live, live.size() - 1, "error", cat("the engine's step failed: ", e.what()));
    }
  }
  // Stopping: every request still here ends cancelled.
  while (!live.empty()) finish(live, live.size() - 1, "cancelled");
  std::deque<Waiting> rest;
  {
    std::lock_guard lock(mu_);
    rest.swap(queue_);
  }
  for (Waiting& w : rest) {
    EngineResult r;
    r.finish_reason = "cancelled";
    if (w.request.on_done) w.request.on_done(std::move(r));
  }
}

void Engine::step(std::vector<Live>& live) {
  std::vector<size_t> gone;
  {
    std::lock_guard lock(mu_);
    for (size_t k = live.size(); k-- > 0;)
      if (cancelled_.count(live[k].id)) gone.push_back(k);  // last first: the indices before stay valid
  }
  for (size_t k : gone) finish(live, k, "cancelled");
  if (live.empty()) return;
  const int64_t V = model_.config.vocab_size, every = cache_.checkpoint_every();
  step_.clear();
  // A follower whose leader is gone (ended before its prefill did) prefills alone.
  for (Live& l : live)
    if (l.follows) {
      bool leader = false;
      for (const Live& o : live)
        leader = leader || (&o != &l && !o.follows && o.request.prefill_group == l.request.prefill_group &&
                            o.fed < int64_t(o.request.prompt.size()));
      l.follows = leader;
    }
  // seq[b]: live[b]'s sequence in the step, or -1 for a follower waiting on its leader.
  std::vector<int64_t> seq(live.size(), -1);
  for (size_t b = 0; b < live.size(); ++b) {
    Live& l = live[b];
    if (l.follows) continue;
    seq[b] = step_.n_seqs();
    const int64_t pos = pool_.position(l.slot), n = int64_t(l.request.prompt.size());
    if (l.fed < n) {
      // A prefill piece, cut at the next checkpoint position so the recurrent layers can be kept there.
      int64_t piece = std::min(options_.prefill_chunk, n - l.fed);
      if (cache_.keeps_checkpoints()) piece = std::min(piece, (pos / every + 1) * every - pos);
      step_.add(l.slot, pos, {l.request.prompt.data() + l.fed, size_t(piece)});
      l.history.insert(l.history.end(), l.request.prompt.begin() + l.fed, l.request.prompt.begin() + l.fed + piece);
      l.fed += piece;
    } else {
      step_.add(l.slot, pos, {&*l.next, 1});
      l.history.push_back(*l.next);
    }
  }
  // Every row's logits when a prefill piece wants its prompt's log-probabilities; else each last.
  bool all_rows = false;
  for (size_t b = 0; b < live.size(); ++b)
    all_rows = all_rows || (seq[b] >= 0 && live[b].request.prompt_logprobs && step_.length(seq[b]) > 1);
  if (step_.n_seqs() == 0) return;  // every request waits on a leader that has ended: next step
  logits_.resize(size_t((all_rows ? step_.n_tokens() : step_.n_seqs()) * V));
  const double t0 = now();
  try {
    model::forward(model_, step_, pool_, all_rows ? model::LogitRows::All : model::LogitRows::Last, logits_.data(), ws_);
  } catch (const Error& e) {  // every request of the step ends: its state is no longer known
    for (Live& l : live) l.history.clear();
    while (!live.empty()) finish(live, live.size() - 1, "error", e.what());
    return;
  }
  const double dt = now() - t0;
  // The step's figures go in before any of its tokens reaches a client (as finish() counts a request
  // before waking its caller), so a client that has read a token sees the step that made it counted.
  int64_t decoded = 0;  // sequences that decoded a token (not a prefill piece)
  for (size_t b = 0; b < live.size(); ++b)
    if (seq[b] >= 0 && live[b].fed >= int64_t(live[b].request.prompt.size()) && live[b].next) ++decoded;
  {
    std::lock_guard lock(mu_);
    ++stats_.steps;
    stats_.busy_seconds += dt;
    if (decoded > 0) stats_.decode_tokens_per_second = 0.8 * stats_.decode_tokens_per_second + 0.2 * (decoded / dt);
    if (decoded > 0 && decoded == step_.n_seqs()) {
      ++stats_.decode_steps;
      stats_.decode_step_tokens += decoded;
      stats_.decode_step_seconds += dt;
    }
  }
  for (size_t b = live.size(); b-- > 0;) {
    if (seq[b] < 0) continue;  // a follower: served after the loop, once its leader's prefill is done
    Live& l = live[b];
    const int64_t n = int64_t(l.request.prompt.size()), pos = pool_.position(l.slot), sb = seq[b];
    const GenerateOptions& o = l.request.options;
    const int64_t last_row = all_rows ? step_.begin(sb) + step_.length(sb) - 1 : sb;
    if (l.fed < n || !l.next) {  // a prefill piece
      if (l.request.prompt_logprobs) {  // row j predicts the piece's token j + 1, the last row the next piece's first
        const int64_t first = l.fed - step_.length(sb);
        for (int64_t j = 0; j < step_.length(sb) && first + j + 1 < n; ++j)
          l.result.prompt_logprobs.push_back(token_logprob(logits_.data() + (last_row - step_.length(sb) + 1 + j) * V, V,
                                                           l.request.prompt[size_t(first + j + 1)],
                                                           std::max(l.request.logprobs, 0)));
      }
      if (l.fed == n && l.request.prefill_group != 0)  // its followers continue from a copy of its state
        for (size_t f = 0; f < live.size(); ++f)
          if (live[f].follows && live[f].request.prefill_group == l.request.prefill_group) {
            Live& w = live[f];
            pool_.state(w.slot).assign(pool_.state(l.slot));
            w.fed = n, w.history = l.history, w.follows = false, w.result.cached_tokens = n;
            std::lock_guard lock(mu_);
            stats_.cached_tokens += n;
            const float* r = logits_.data() + last_row * V;
            w.first_logits.assign(r, r + V);
          }
      if (l.request.on_progress) l.request.on_progress(l.fed, n);
      if (cache_.wants_checkpoint(pos) && l.fed < n) cache_.checkpoint(pool_.state(l.slot), l.checkpoints);
      if (l.fed < n) continue;
      if (o.max_tokens == 0) {  // the prompt's log-probabilities only
        finish(live, b, "length");
        continue;
      }
    }
    emit(live, b, logits_.data() + last_row * V);
  }
  // Followers whose leader's prefill ended in this step: their first token, from the leader's row.
  for (size_t b = live.size(); b-- > 0;)
    if (!live[b].first_logits.empty()) {
      const std::vector<float> row = std::move(live[b].first_logits);
      live[b].first_logits.clear();
      emit(live, b, row.data());
    }
  std::lock_guard lock(mu_);
  stats_.most_together = std::max(stats_.most_together, step_.n_seqs());
  stats_.active = int64_t(live.size());
  stats_.state_bytes = pool_.bytes();
  const PrefixCacheStats& c = cache_.stats();
  stats_.cache_lookups = c.lookups, stats_.cache_hits = c.hits, stats_.cache_entries = c.entries;
  stats_.cache_bytes = c.bytes;
}

}  // namespace lineage::runtime
