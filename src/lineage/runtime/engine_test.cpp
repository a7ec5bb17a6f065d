// The prefix cache and the serving engine: a cached prefix resumes to the logits a fresh run gives
// (KV layers at the exact common prefix, recurrent layers at the nearest checkpoint), least recently
// used entries go first, and requests served together, with the cache warm, give the tokens each
// gives alone.
#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <mutex>

#include "lineage/io/load_model.h"
#include "lineage/model/state_pool.h"
#include "lineage/runtime/engine.h"
#include "lineage/runtime/prefix_cache.h"
#include "lineage/runtime/session.h"
#include "test_support.h"

namespace lineage::runtime {
namespace engine_test {
namespace {

std::vector<int32_t> ids(int64_t n, int64_t vocab, int64_t salt) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(int32_t((i * 7 + salt * 13 + 3 + i * i * salt) % vocab));
  return v;
}

// Logits of `tokens`' last position from a state that holds the first `from` (fresh when from = 0).
std::vector<float> last_logits(const model::Model& m, const model::SequenceState* from, std::span<const int32_t> tokens) {
  Session s(m);
  int64_t start = 0;
  if (from) s.restore(*from), start = from->position;
  const auto l = s.prefill(tokens.subspan(size_t(start)));
  return {l.begin(), l.end()};
}

struct CacheCase {
  const char* dir;
  bool recurrent;
};

class Cache : public ::testing::TestWithParam<CacheCase> {};

TEST_P(Cache, ResumesFromTheLongestUsablePrefix) {
  const io::LoadedModel lm = io::load_model(test::testdata() / GetParam().dir, false);
  const model::Model& m = lm.model;
  const int64_t V = m.config.vocab_size;
  PrefixCache cache(m, {.budget_bytes = size_t(64) << 20, .checkpoint_every = 8});
  EXPECT_EQ(cache.keeps_checkpoints(), GetParam().recurrent);

  // A 30-token sequence fed as the engine feeds it: pieces cut at multiples of 8, checkpoints there.
  const std::vector<int32_t> a = ids(30, V, 1);
  Session s(m);
  PrefixCache::Checkpoints cps;
  for (int64_t at = 0; at < 30;) {
    const int64_t n = std::min<int64_t>(8, 30 - at);
    s.prefill(std::span(a).subspan(size_t(at), size_t(n)));
    at += n;
    if (cache.wants_checkpoint(at)) cache.checkpoint(s.state(), cps);
  }
  cache.commit(a, s.state(), std::move(cps));
  EXPECT_EQ(cache.stats().entries, 1);

  // A request that shares 21 tokens, then diverges: KV-only models resume at 21, recurrent ones at
  // the checkpoint at 16.
  std::vector<int32_t> b(a.begin(), a.begin() + 21);
  for (int32_t t : ids(9, V, 5)) b.push_back(t);
  b[21] = (a[21] + 1) % int32_t(V);
  model::SequenceState st = m.new_state();
  const int64_t got = cache.restore(b, st);
  EXPECT_EQ(got, GetParam().recurrent ? 16 : 21);
  EXPECT_EQ(st.position, got);
  const std::vector<float> resumed = last_logits(m, &st, b), fresh = last_logits(m, nullptr, b);
  EXPECT_LT(test::rel_rms(resumed.data(), fresh.data(), V), 1e-5);

  // Diverging one token before a checkpoint (the 16th token differs, so 15 are shared): that
  // checkpoint holds one token too many; recurrent layers resume at the one before (8), KV-only at
  // 15. Diverging right after it (16 shared): it is exactly usable.
  for (const int64_t shared : {15, 16}) {
    std::vector<int32_t> d(a.begin(), a.begin() + shared);
    for (int32_t t : ids(6, V, 6)) d.push_back(t);
    d[size_t(shared)] = (a[size_t(shared)] + 1) % int32_t(V);
    const int64_t at = cache.restore(d, st);
    EXPECT_EQ(at, GetParam().recurrent ? (shared == 15 ? 8 : 16) : shared) << shared << " shared";
    const std::vector<float> r = last_logits(m, &st, d), f = last_logits(m, nullptr, d);
    EXPECT_LT(test::rel_rms(r.data(), f.data(), V), 1e-5) << shared << " shared";
  }

  // The whole sequence again plus more: resumes at its end (30), one token short of a repeat.
  std::vector<int32_t> c = a;
  c.push_back(4);
  EXPECT_EQ(cache.restore(c, st), 30);
  EXPECT_EQ(cache.restore(a, st), GetParam().recurrent ? 24 : 29) << "at least one token is left to feed";
  EXPECT_EQ(cache.restore(ids(12, V, 9), st), 0);
  EXPECT_EQ(cache.stats().hits, 5);
}

TEST_P(Cache, FoldsExtendedEntriesAndEvictsLeastRecentlyUsed) {
  const io::LoadedModel lm = io::load_model(test::testdata() / GetParam().dir, false);
  const model::Model& m = lm.model;
  const int64_t V = m.config.vocab_size;
  const auto sequence = [&](std::span<const int32_t> t) {
    Session s(m);
    s.prefill(t);
    return s.state().clone();
  };
  const std::vector<int32_t> turn1 = ids(12, V, 2);
  std::vector<int32_t> turn2 = turn1;
  for (int32_t t : ids(6, V, 3)) turn2.push_back(t);
  const model::SequenceState s1 = sequence(turn1), s2 = sequence(turn2);
  const std::vector<int32_t> x = ids(18, V, 7), y = ids(18, V, 8), z = ids(18, V, 11);
  // The budget holds the chat's entry and two others of 18 tokens, not three.
  size_t chat_bytes = 0, other_bytes = 0;
  {
    PrefixCache probe(m, {.budget_bytes = size_t(1) << 30, .checkpoint_every = 256});
    probe.commit(turn1, s1, {});
    probe.commit(turn2, s2, {});
    chat_bytes = probe.stats().bytes;
    probe.commit(x, sequence(x), {});
    other_bytes = probe.stats().bytes - chat_bytes;
  }
  const size_t budget = chat_bytes + 2 * other_bytes + other_bytes / 2;
  // A chat: turn 2 extends turn 1, so turn 1's entry folds into it (its end kept as a checkpoint).
  PrefixCache cache(m, {.budget_bytes = budget, .checkpoint_every = 256});
  cache.commit(turn1, s1, {});
  cache.commit(turn2, s2, {});
  EXPECT_EQ(cache.stats().entries, 1);
  std::vector<int32_t> other = turn1;
  other.push_back(int32_t((turn2[12] + 1) % V));
  other.push_back(1);
  model::SequenceState st = m.new_state();
  EXPECT_EQ(cache.restore(other, st), 12) << "turn 1's end is still a place to resume";
  const std::vector<float> resumed = last_logits(m, &st, other), fresh = last_logits(m, nullptr, other);
  EXPECT_LT(test::rel_rms(resumed.data(), fresh.data(), V), 1e-5);

  // Unrelated sequences fill the budget: the least recently used goes first.
  cache.commit(x, sequence(x), {});
  cache.commit(y, sequence(y), {});
  EXPECT_GT(cache.restore(turn2, st), 0);  // the chat is now the most recent
  cache.commit(z, sequence(z), {});
  EXPECT_GE(cache.stats().evictions, 1);
  EXPECT_LE(cache.stats().bytes, budget);
  EXPECT_EQ(cache.restore(x, st), 0) << "x was the least recently used";
  EXPECT_GT(cache.restore(turn2, st), 0);
}

INSTANTIATE_TEST_SUITE_P(Models, Cache,
                         ::testing::Values(CacheCase{"gpt2/f32_defaults", false}, CacheCase{"kimi_linear/f32", true},
                                           CacheCase{"kda/f32", true}),
                         [](const auto& info) {
                           const std::string d = info.param.dir;
                           return d.substr(0, d.find('/'));
                         });

// Runs a request through the engine and waits for it.
EngineResult run(Engine& e, std::vector<int32_t> prompt, int max_tokens) {
  std::promise<EngineResult> done;
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.options.max_tokens = max_tokens;
  r.options.sampling.temperature = 0;
  r.on_done = [&](EngineResult&& res) { done.set_value(std::move(res)); };
  EXPECT_TRUE(e.submit(std::move(r)));
  return done.get_future().get();
}

// Submits every prompt at once (greedy, max_tokens each) and waits for them all.
std::vector<EngineResult> run_together(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                       int max_tokens) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<EngineResult> results(prompts.size());
  size_t done = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r;
    r.prompt = prompts[i];
    r.options.max_tokens = max_tokens;
    r.options.sampling.temperature = 0;
    r.on_done = [&, i](EngineResult&& res) {
      std::lock_guard lock(mu);
      results[i] = std::move(res);
      ++done;
      cv.notify_all();
    };
    EXPECT_TRUE(engine.submit(std::move(r)));
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return done == prompts.size(); });
  return results;
}

std::vector<int32_t> alone(const model::Model& m, std::span<const int32_t> prompt, int max_tokens) {
  Session s(m);
  auto l = s.prefill(prompt);
  std::vector<int32_t> out;
  for (int i = 0; i < max_tokens; ++i) {
    const int32_t t = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
    out.push_back(t);
    if (i + 1 < max_tokens) l = s.decode(t);
  }
  return out;
}

TEST(Engine, TogetherAndCachedEqualsAlone) {
  const io::LoadedModel lm = io::load_model(test::testdata() / "kimi_linear/f32", false);
  const model::Model& m = lm.model;
  const int64_t V = m.config.vocab_size;
  EngineOptions eo;
  eo.slots = 3;
  eo.prefill_chunk = 5;
  eo.cache.checkpoint_every = 8;
  Engine engine(m, eo);
  std::vector<std::vector<int32_t>> prompts;
  const std::vector<int32_t> shared = ids(20, V, 3);
  for (int i = 0; i < 7; ++i) {
    std::vector<int32_t> p = i % 2 ? shared : ids(4 + 3 * i, V, i);
    for (int32_t t : ids(2 + i, V, 10 + i)) p.push_back(t);
    prompts.push_back(p);
  }
  const std::vector<EngineResult> results = run_together(engine, prompts, 6);
  int64_t cached = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(results[i].tokens, alone(m, prompts[i], 6)) << "request " << i;
    EXPECT_EQ(results[i].finish_reason, "length");
    cached += results[i].cached_tokens;
  }
  // Prompt 3 again (25 tokens): its own prefill left a checkpoint at 24.
  const EngineResult again = run(engine, prompts[3], 6);
  EXPECT_EQ(again.cached_tokens, 24);
  EXPECT_EQ(again.tokens, alone(m, prompts[3], 6));
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.finished, 8);
  EXPECT_EQ(st.active, 0);
  EXPECT_GE(st.cache_hits, 1);
  EXPECT_LE(st.most_together, 3);
  EXPECT_GE(cached + again.cached_tokens, 16);
}

// Through the engine, alone and batched: after a 24-token prompt leaves checkpoints at 8 and 16, two
// requests together that diverge at token 15 (a checkpoint one token past the divergence) and at
// token 16 (one exactly at it) continue as a cold run does, on a delta-rule model (KDA) and on a
// hybrid whose MLA rows are cut with the restore (Kimi Linear).
TEST(Engine, ResumesOnlyWhatMatchesAroundACheckpoint) {
  for (const char* dir : {"kda/f32", "kimi_linear/f32"}) {
    SCOPED_TRACE(dir);
    const io::LoadedModel lm = io::load_model(test::testdata() / dir, false);
    const model::Model& m = lm.model;
    const int64_t V = m.config.vocab_size;
    EngineOptions eo;
    eo.slots = 2;
    eo.prefill_chunk = 8;
    eo.cache.checkpoint_every = 8;
    Engine engine(m, eo);
    const std::vector<int32_t> a = ids(24, V, 4);
    run(engine, a, 1);
    std::vector<std::vector<int32_t>> prompts;
    for (const int64_t shared : {15, 16}) {
      std::vector<int32_t> p(a.begin(), a.begin() + shared);
      for (int32_t t : ids(5, V, 8)) p.push_back(t);
      p[size_t(shared)] = (a[size_t(shared)] + 1) % int32_t(V);
      prompts.push_back(p);
    }
    const std::vector<EngineResult> results = run_together(engine, prompts, 5);
    EXPECT_EQ(results[0].cached_tokens, 8) << "the checkpoint at 16 holds one token past the divergence";
    EXPECT_EQ(results[1].cached_tokens, 16);
    for (size_t i = 0; i < 2; ++i) EXPECT_EQ(results[i].tokens, alone(m, prompts[i], 5)) << "request " << i;
    EXPECT_EQ(run(engine, prompts[0], 5).tokens, alone(m, prompts[0], 5)) << "alone, the cache warm";
  }
}

// n samples of one prompt (a prefill group): the first request prefills, the others wait and continue
// from a copy of its state; each samples with its own seed exactly what it samples alone (a request of
// its own, no group), on a hybrid with recurrent and MLA layers. A member admitted after the leader's
// prefill prefills on its own, with the same result.
TEST(Engine, SamplesOfOnePromptShareItsPrefill) {
  const io::LoadedModel lm = io::load_model(test::testdata() / "kimi_linear/f32", false);
  const model::Model& m = lm.model;
  EngineOptions eo;
  eo.slots = 4;
  eo.prefill_chunk = 7;
  eo.cache.budget_bytes = 0;  // no prefix cache: what is shared comes from the group alone
  const std::vector<int32_t> prompt = ids(19, m.config.vocab_size, 6);
  const auto request = [&](uint64_t seed, uint64_t group, EngineResult* out, std::promise<void>* done) {
    EngineRequest r;
    r.prompt = prompt;
    r.options.max_tokens = 6;
    r.options.sampling = {1.0f, 0, 1.0f, seed};
    r.prefill_group = group;
    r.on_done = [out, done](EngineResult&& res) {
      *out = std::move(res);
      done->set_value();
    };
    return r;
  };
  std::vector<EngineResult> alone_results(3), shared(3);
  {
    Engine solo(m, eo);
    for (uint64_t i = 0; i < 3; ++i) {
      std::promise<void> done;
      ASSERT_TRUE(solo.submit(request(100 + i, 0, &alone_results[i], &done)));
      done.get_future().wait();
    }
  }
  Engine engine(m, eo);
  std::vector<std::promise<void>> done(3);
  std::vector<EngineRequest> group;  // queued together: admitted in one go, the first leading
  for (uint64_t i = 0; i < 3; ++i) group.push_back(request(100 + i, 77, &shared[i], &done[i]));
  ASSERT_TRUE(engine.submit_many(std::move(group)));
  for (auto& d : done) d.get_future().wait();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(shared[i].tokens, alone_results[i].tokens) << "sample " << i;
    EXPECT_EQ(shared[i].finish_reason, "length");
  }
  EXPECT_EQ(shared[0].cached_tokens, 0);
  EXPECT_EQ(shared[1].cached_tokens, 19) << "the prompt came from the leader's state";
  EXPECT_EQ(shared[2].cached_tokens, 19);
  EXPECT_NE(alone_results[0].tokens, alone_results[1].tokens) << "the seeds sample differently (the test can fail)";
  // Late: the group's leader is done, so this one prefills alone.
  EngineResult late;
  std::promise<void> late_done;
  ASSERT_TRUE(engine.submit(request(101, 77, &late, &late_done)));
  late_done.get_future().wait();
  EXPECT_EQ(late.tokens, alone_results[1].tokens);
  EXPECT_EQ(late.cached_tokens, 0);
}

TEST(Engine, CancelFreesTheSlotAndTheQueueIsBounded) {
  const io::LoadedModel lm = io::load_model(test::testdata() / "gpt2/f32_defaults", false);
  const model::Model& m = lm.model;
  EngineOptions eo;
  eo.slots = 1;
  eo.queue = 1;
  Engine engine(m, eo);
  // A request whose caller stops it after 3 tokens (a client gone, a stop string).
  std::promise<EngineResult> first;
  EngineRequest r;
  r.prompt = {1, 2, 3};
  r.options.max_tokens = 30;
  int seen = 0;
  r.on_token = [&](int32_t) { return ++seen < 3; };
  r.on_done = [&](EngineResult&& res) { first.set_value(std::move(res)); };
  ASSERT_TRUE(engine.submit(std::move(r)));
  const EngineResult a = first.get_future().get();
  EXPECT_EQ(a.finish_reason, "cancelled");
  EXPECT_EQ(a.tokens.size(), 3u);
  EXPECT_EQ(engine.stats().active, 0);
  EXPECT_EQ(engine.stats().state_bytes, 0u);

  // A running request cancelled from outside (the server's path when a client disconnects), the
  // only one: it ends at the next step, which then has nothing to run; its state is counted free.
  std::promise<EngineResult> gone;
  std::promise<void> running, cancel_sent;
  std::shared_future<void> sent = cancel_sent.get_future().share();
  EngineRequest c;
  c.prompt = {4, 5, 6};
  c.options.max_tokens = 30;
  bool first_of_c = true;
  c.on_token = [&, sent](int32_t) {
    if (std::exchange(first_of_c, false)) {
      running.set_value();
      sent.wait();  // the engine's thread: the next step sees the cancel
    }
    return true;
  };
  c.on_done = [&](EngineResult&& res) { gone.set_value(std::move(res)); };
  const auto cid = engine.submit(std::move(c));
  ASSERT_TRUE(cid);
  running.get_future().wait();
  engine.cancel(*cid);
  cancel_sent.set_value();
  EXPECT_EQ(gone.get_future().get().finish_reason, "cancelled");
  EXPECT_EQ(engine.stats().active, 0);
  EXPECT_EQ(engine.stats().state_bytes, 0u) << "the cancelled request's state still counted";

  // The context: a prompt that leaves no room is refused; one that fills it ends "context".
  EngineRequest too_long;
  too_long.prompt.assign(40, 1);
  EXPECT_THROW(engine.submit(std::move(too_long)), Error);
  const EngineResult full = run(engine, std::vector<int32_t>(38, 1), 10);
  EXPECT_EQ(full.finish_reason, "context");
  EXPECT_EQ(full.tokens.size(), 3u) << "38 + 2 fed, and the last one sampled";

  // With the slot busy, one request waits and the next is refused; cancel takes one out of the queue.
  std::promise<void> hold_release;
  std::shared_future<void> hold = hold_release.get_future().share();
  std::promise<EngineResult> busy_done, queued_done;
  std::promise<void> started;
  EngineRequest busy;
  busy.prompt = {5, 6};
  busy.options.max_tokens = 20;
  bool first_token = true;
  busy.on_token = [&, hold](int32_t) {
    if (std::exchange(first_token, false)) started.set_value();
    hold.wait();  // the engine's thread waits here: the slot stays taken
    return true;
  };
  busy.on_done = [&](EngineResult&& res) { busy_done.set_value(std::move(res)); };
  ASSERT_TRUE(engine.submit(std::move(busy)));
  started.get_future().wait();
  EngineRequest queued;
  queued.prompt = {7};
  queued.on_done = [&](EngineResult&& res) { queued_done.set_value(std::move(res)); };
  const auto qid = engine.submit(std::move(queued));
  EngineRequest extra;
  extra.prompt = {8};
  EXPECT_FALSE(engine.submit(std::move(extra))) << "the queue holds one";
  if (qid) {
    engine.cancel(*qid);
    EXPECT_EQ(queued_done.get_future().get().finish_reason, "cancelled");
  }
  hold_release.set_value();
  ASSERT_TRUE(qid);
  EXPECT_EQ(busy_done.get_future().get().finish_reason, "length");
  EXPECT_EQ(engine.stats().rejected, 1);
}

}  // namespace
}  // namespace engine_test
}  // namespace lineage::runtime
