#include "lineage/runtime/batch_generate.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>

#include "lineage/core/error.h"

namespace lineage::runtime {

namespace {

// One request in flight: its slot, how much of its prompt is fed, its sampler and what it made.
struct Live {
  size_t index;
  int32_t slot;
  size_t fed = 0;           // prompt tokens fed so far
  std::optional<int32_t> next;  // the sampled token to feed in the next step
  Sampler sampler;
  BatchResult result;
};

}  // namespace

BatchStats generate_batch(const model::Model& m, std::span<const BatchRequest> requests, const BatchOptions& opt,
                          const std::function<void(BatchResult&&)>& on_done) {
  if (opt.max_sequences < 1) throw Error(cat("the batch needs room for at least one sequence, got ", opt.max_sequences));
  const int64_t limit = opt.ctx > 0 ? opt.ctx : m.config.max_positions, V = m.config.vocab_size;
  for (size_t i = 0; i < requests.size(); ++i) {
    const int64_t n = int64_t(requests[i].prompt.size());
    if (n == 0) throw Error(cat("prompt ", i, " is empty; generation needs at least one token"));
    if (limit > 0 && n > limit)
      throw Error(cat("prompt ", i, " has ", n, " tokens, more than the context of ", limit,
                      opt.ctx > 0 ? " (--ctx)" : cat(" (config.json field ", m.config.max_positions_field, ")")));
    if (requests[i].options.max_tokens < 1) throw Error(cat("prompt ", i, ": max_tokens must be at least 1"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  BatchStats st;
  model::StatePool pool(m, {.slots = opt.max_sequences, .ctx = opt.ctx});
  model::Workspace ws;
  layers::Step step;
  std::vector<float> logits;
  std::deque<size_t> waiting;
  for (size_t i = 0; i < requests.size(); ++i) waiting.push_back(i);
  std::vector<Live> live;
  live.reserve(size_t(opt.max_sequences));
  std::vector<size_t> rows;  // the live entry of each sequence of the step

  const auto finish = [&](size_t k, const char* reason) {
    Live& l = live[k];
    l.result.finish_reason = reason;
    st.generated_tokens += int64_t(l.result.tokens.size());
    pool.release(l.slot);
    on_done(std::move(l.result));
    live.erase(live.begin() + int64_t(k));
  };

  while (!waiting.empty() || !live.empty()) {
    while (!waiting.empty() && int64_t(live.size()) < opt.max_sequences) {  // a free slot takes the next prompt
      const size_t i = waiting.front();
      waiting.pop_front();
      Live l{i, pool.acquire(), 0, std::nullopt, Sampler(requests[i].options.sampling), {}};
      l.result.index = i;
      l.result.prompt_tokens = int64_t(requests[i].prompt.size());
      st.prompt_tokens += l.result.prompt_tokens;
      live.push_back(std::move(l));
    }
    step.clear();
    rows.clear();
    for (size_t k = 0; k < live.size(); ++k) {
      Live& l = live[k];
      const std::vector<int32_t>& p = requests[l.index].prompt;
      if (l.fed < p.size()) {
        const size_t n = std::min(p.size() - l.fed, size_t(std::max<int64_t>(1, opt.prefill_chunk)));
        step.add(l.slot, pool.position(l.slot), {p.data() + l.fed, n});
        l.fed += n;
      } else {
        step.add(l.slot, pool.position(l.slot), {&*l.next, 1});
      }
      rows.push_back(k);
    }
    logits.resize(size_t(step.n_seqs() * V));
    model::forward(m, step, pool, model::LogitRows::Last, logits.data(), ws);
    ++st.steps;
    st.most_together = std::max(st.most_together, step.n_seqs());
    // Sample for every sequence whose prompt is in; finish the ones that are done, last first so the
    // indices of the others stay valid.
    for (size_t r = rows.size(); r-- > 0;) {
      Live& l = live[rows[r]];
      const GenerateOptions& o = requests[l.index].options;
      if (l.fed < requests[l.index].prompt.size()) continue;  // still prefilling
      const int32_t next = l.sampler.sample({logits.data() + int64_t(r) * V, size_t(V)});
      if (o.eos && next == *o.eos) {
        finish(rows[r], "stop");
        continue;
      }
      l.result.tokens.push_back(next);
      l.next = next;
      if (int64_t(l.result.tokens.size()) >= o.max_tokens) finish(rows[r], "length");
      else if (limit > 0 && pool.position(l.slot) >= limit) finish(rows[r], "context");
    }
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace lineage::runtime
