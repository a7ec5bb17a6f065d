#include "lineage/runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

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

// A round's bytes (Engine::Round): plain values in this machine's byte order (every rank runs the
// same build), vectors and strings after their length.
class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <class T>
  void put_all(const std::vector<T>& v) {
    put(uint64_t(v.size()));
    if (!v.empty()) out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void put_all(const std::string& v) {
    put(uint64_t(v.size()));
    out_ += v;
  }

 private:
  std::string& out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <class T>
  T get() {
    T v;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  template <class T>
  void get_all(std::vector<T>& v) {
    const uint64_t n = get<uint64_t>();
    if (n > in_.size() / sizeof(T)) cut();
    v.resize(size_t(n));
    if (n > 0) std::memcpy(v.data(), take(size_t(n) * sizeof(T)), size_t(n) * sizeof(T));
  }
  void get_all(std::string& v) {
    const uint64_t n = get<uint64_t>();
    if (n > in_.size()) cut();
    v.assign(take(size_t(n)), size_t(n));
  }
  bool done() const { return at_ == in_.size(); }

 private:
  [[noreturn]] static void cut() { throw Error("the engine's round from rank 0 is cut short or damaged"); }
  const char* take(size_t n) {
    if (n > in_.size() - at_) cut();
    const char* p = in_.data() + at_;
    at_ += n;
    return p;
  }
  std::string_view in_;
  size_t at_ = 0;
};

}  // namespace

// What rank 0 decided before a step, for every rank to replay (EngineRanks).
struct Engine::Round {
  bool stop = false;
  std::vector<uint64_t> ended;  // requests whose on_token returned false in the last step
  std::string error;            // a callback's failure since the last round: every request ends
  std::vector<Waiting> admitted;
  std::vector<uint64_t> gone;   // cancelled requests
};

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
      cache_(m, options.cache),
      root_(options.ranks.rank == 0) {
  if (options.slots < 1) throw Error(cat("--slots: expected at least 1, found ", options.slots));
  if (options.prefill_chunk < 1) throw Error(cat("prefill chunk: expected at least 1, found ", options.prefill_chunk));
  if (options.ranks.ranks > 1 && !options.ranks.broadcast)
    throw Error(cat("an engine over ", options.ranks.ranks, " ranks needs their broadcast"));
  stats_.slots = options.slots;
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() {
  if (root_) {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  join();  // a follower's engine ends when rank 0's does
}

void Engine::join() {
  if (thread_.joinable()) thread_.join();
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
  if (!root_) throw Error(cat("rank ", options_.ranks.rank, "'s engine follows rank 0's and takes no requests"));
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
  if (l.request.on_done) callback([&] { l.request.on_done(std::move(l.result)); });
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
  if (l.request.logprobs >= 0 && root_) {
    l.result.logprobs.push_back(token_logprob(row, V, next, l.request.logprobs));
    if (l.request.on_logprob) callback([&] { l.request.on_logprob(l.result.logprobs.back()); });
  }
  l.result.tokens.push_back(next);
  l.next = next;
  bool keep = true;
  if (l.request.on_token) callback([&] { keep = l.request.on_token(next); });
  // The caller ended it: it ends at the next round, where every rank learns of it.
  if (!keep) ended_.push_back(l.id);
  else if (int64_t(l.result.tokens.size()) >= o.max_tokens) finish(live, b, "length");
  else if (limit_ > 0 && pos >= limit_) finish(live, b, "context");
}

void Engine::callback(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    if (callback_error_.empty()) callback_error_ = e.what();
  }
}

void Engine::broadcast_round(Round& round) {
  if (options_.ranks.ranks <= 1) return;
  std::string bytes;
  if (root_) {
    Writer w(bytes);
    w.put(uint8_t(round.stop));
    w.put_all(round.ended);
    w.put_all(round.error);
    w.put_all(round.gone);
    w.put(uint64_t(round.admitted.size()));
    for (const Waiting& a : round.admitted) {  // what the engine reads of a request; the callbacks stay here
      const EngineRequest& r = a.request;
      w.put(a.id);
      w.put_all(r.prompt);
      w.put(r.options.max_tokens);
      w.put(r.options.sampling);
      w.put(uint8_t(r.options.eos.has_value()));
      w.put(r.options.eos.value_or(0));
      w.put(uint8_t(r.prompt_logprobs));
      w.put(r.prefill_group);
    }
  }
  options_.ranks.broadcast(bytes);
  if (root_) return;
  Reader in(bytes);
  round.stop = in.get<uint8_t>() != 0;
  in.get_all(round.ended);
  in.get_all(round.error);
  in.get_all(round.gone);
  const uint64_t n = in.get<uint64_t>();
  for (uint64_t i = 0; i < n; ++i) {
    Waiting a{in.get<uint64_t>(), {}, now()};
    EngineRequest& r = a.request;
    in.get_all(r.prompt);
    r.options.max_tokens = in.get<int>();
    r.options.sampling = in.get<SamplingParams>();
    const bool has_eos = in.get<uint8_t>() != 0;
    const int32_t eos = in.get<int32_t>();
    if (has_eos) r.options.eos = eos;
    r.prompt_logprobs = in.get<uint8_t>() != 0;
    r.prefill_group = in.get<uint64_t>();
    round.admitted.push_back(std::move(a));
  }
  if (!in.done()) throw Error("the engine's round from rank 0 has bytes past its end");
}

void Engine::settle(std::vector<Live>& live, const std::vector<uint64_t>& ended, std::string& error) {
  for (const uint64_t id : ended)
    for (size_t k = 0; k < live.size(); ++k)
      if (live[k].id == id) {
        finish(live, k, "cancelled");
        break;
      }
  if (root_) error = std::exchange(callback_error_, {});
  // A callback failed (on rank 0): every request ends with it, the engine lives on.
  if (!error.empty())
    while (!live.empty()) finish(live, live.size() - 1, "error", cat("the engine's step failed: ", error));
  if (root_) callback_error_.clear();  // failures of requests that have just ended
}

void Engine::run() {
  if (options_.ranks.on_thread) options_.ranks.on_thread();
  std::vector<Live> live;
  live.reserve(size_t(options_.slots));
  while (true) {
    Round round;
    if (root_) {
      round.ended.swap(ended_);
      settle(live, round.ended, round.error);
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || !live.empty(); });
      round.stop = stopping_;
      while (!round.stop && !queue_.empty() && int64_t(live.size() + round.admitted.size()) < options_.slots) {
        round.admitted.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      stats_.queued = int64_t(queue_.size());
      for (const Live& l : live)
        if (cancelled_.count(l.id)) round.gone.push_back(l.id);
      for (const Waiting& w : round.admitted)
        if (cancelled_.count(w.id)) round.gone.push_back(w.id);
    }
    broadcast_round(round);
    if (!root_) settle(live, round.ended, round.error);
    if (round.stop) break;
    for (Waiting& w : round.admitted) {
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
      step(live, round.gone);
    } catch (const std::exception& e) {  // (memory): every request ends with it, the engine lives on
      const std::string message = cat("the engine's step failed: ", e.what());
      // With several ranks the others cannot know of it, and wait in the step's collectives.
      if (options_.ranks.ranks > 1 && options_.ranks.fail) options_.ranks.fail(message);
      while (!live.empty()) finish(live, live.size() - 1, "error", message);
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
    if (w.request.on_done) callback([&] { w.request.on_done(std::move(r)); });
  }
}

void Engine::step(std::vector<Live>& live, const std::vector<uint64_t>& gone) {
  for (size_t k = live.size(); k-- > 0;)  // last first: the indices before stay valid
    if (std::find(gone.begin(), gone.end(), live[k].id) != gone.end()) finish(live, k, "cancelled");
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
      if (l.request.prompt_logprobs && root_) {  // row j predicts the piece's token j + 1, the last row the next piece's first
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
      if (l.request.on_progress) callback([&] { l.request.on_progress(l.fed, n); });
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
