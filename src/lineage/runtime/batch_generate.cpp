#include "lineage/runtime/batch_generate.h"

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "lineage/core/error.h"
#include "lineage/runtime/engine.h"

namespace lineage::runtime {

BatchStats generate_batch(const model::Model& m, std::span<const BatchRequest> requests, const BatchOptions& opt,
                          const std::function<void(BatchResult&&)>& on_done) {
  if (opt.max_sequences < 1) throw Error(cat("the batch needs room for at least one sequence, got ", opt.max_sequences));
  const int64_t limit = opt.ctx > 0 ? opt.ctx : m.config.max_positions;
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
  // The engine with the whole list queued and no prefix cache: each request runs from zero, as it
  // would alone. A prompt that fills the whole context still generates its one token.
  EngineOptions eo;
  eo.slots = opt.max_sequences;
  eo.ctx = opt.ctx;
  eo.prefill_chunk = std::max<int64_t>(1, opt.prefill_chunk);
  eo.queue = int64_t(requests.size()) + 1;
  eo.cache.budget_bytes = 0;
  eo.allow_full_prompt = true;
  std::mutex mu;
  std::condition_variable done_cv;
  size_t done = 0;
  std::vector<BatchResult> finished;  // handed to on_done on this thread, in finishing order
  {
    Engine engine(m, eo);
    for (size_t i = 0; i < requests.size(); ++i) {
      EngineRequest r;
      r.prompt = requests[i].prompt;
      r.options = requests[i].options;
      r.on_done = [&, i](EngineResult&& e) {
        BatchResult b{i, std::move(e.tokens), e.prompt_tokens,
                      e.finish_reason == "error" ? "error: " + e.error : e.finish_reason};
        std::lock_guard lock(mu);
        finished.push_back(std::move(b));
        ++done;
        done_cv.notify_all();
      };
      engine.submit(std::move(r));
    }
    size_t handed = 0;
    while (handed < requests.size()) {
      std::vector<BatchResult> ready;
      {
        std::unique_lock lock(mu);
        done_cv.wait(lock, [&] { return done > handed; });
        ready.swap(finished);
      }
      for (BatchResult& b : ready) {
        st.generated_tokens += int64_t(b.tokens.size());
        st.prompt_tokens += b.prompt_tokens;
        ++handed;
        on_done(std::move(b));
      }
    }
    const EngineStats es = engine.stats();
    st.steps = es.steps;
    st.most_together = es.most_together;
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace lineage::runtime
