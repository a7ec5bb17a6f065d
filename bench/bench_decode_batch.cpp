// Batched decode end to end: one step of B sequences of GPT-2 124M (f32 and bf16 weights, preset),
// each at depth 128, one token each; items_per_second is the aggregate decode rate. The roofline is
// whichever binds first: every weight read once a step plus each sequence's KV rows against the read
// bandwidth, or B tokens' FLOPs against the peak (`lineage bench --batch` reports the same per row).
#include <memory>
#include <string>

#include "bench_support.h"
#include "lineage/model/archs/presets.h"
#include "lineage/model/model.h"
#include "lineage/model/state_pool.h"
#include "lineage/model/workspace.h"
#include "lineage/model/forward.h"
#include "lineage/runtime/cost.h"

namespace lineage::bench {
namespace {

constexpr int64_t kDepth = 128;

// The preset, built once per dtype for all batch sizes.
model::Model& gpt2(DType dtype) {
  static std::unique_ptr<model::Model> held[2];
  auto& m = held[dtype == DType::BF16];
  if (!m) m = std::make_unique<model::Model>(model::make_preset("gpt2-124m", 1, dtype));
  return *m;
}

void bm_decode_batch(benchmark::State& state, DType dtype, int64_t B) {
  model::Model& m = gpt2(dtype);
  constexpr int64_t kRoom = 1024;  // decode steps before the sequences go back to the context
  model::StatePool pool(m, {.slots = B, .ctx = kDepth + kRoom});
  model::Workspace ws;
  layers::Step step;
  std::vector<int32_t> slots;
  for (int64_t b = 0; b < B; ++b) slots.push_back(pool.acquire());
  std::vector<int32_t> context(static_cast<size_t>(kDepth));
  for (size_t i = 0; i < context.size(); ++i) context[i] = int32_t((i * 7919) % 50257);
  step.add(slots[0], 0, context);
  model::forward(m, step, pool, model::LogitRows::None, nullptr, ws);
  for (int64_t b = 1; b < B; ++b) pool.copy(slots[0], slots[size_t(b)]);
  const model::SequenceState snapshot = pool.state(slots[0]).clone();
  std::vector<float> logits(size_t(B * m.config.vocab_size));
  const runtime::DecodeBytes bytes = runtime::decode_bytes_per_token(m, double(kDepth + 1));
  const runtime::PrefillFlops flops = runtime::prefill_flops_per_token(m, 1, kDepth);
  Work w;
  w.bytes = bytes.weights + double(B) * bytes.state;
  w.flops = double(B) * flops.total();
  w.tokens = double(B);
  w.weights = dtype;
  w.memory_bound = w.bytes / ceilings().bandwidth > w.flops / ceilings().peak(dtype);
  int64_t i = 0;
  run(state, w, [&] {
    if (pool.position(slots[0]) >= kDepth + kRoom)  // back to the context, into the same buffers
      for (int32_t s : slots) pool.state(s).assign(snapshot);
    step.clear();
    for (int64_t b = 0; b < B; ++b) {
      const int32_t tok = int32_t((i * 31 + b * 17) % 50257);
      step.add(slots[size_t(b)], pool.position(slots[size_t(b)]), {&tok, 1});
    }
    ++i;
    model::forward(m, step, pool, model::LogitRows::Last, logits.data(), ws);
    benchmark::DoNotOptimize(logits.data());
  });
}

const bool registered = [] {
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t B : {1, 2, 4, 8, 16, 32}) {
      const std::string name = std::string("decode_batch/gpt2-124m/") + dtype_label(dt) + "/B" + std::to_string(B);
      benchmark::RegisterBenchmark(name.c_str(), bm_decode_batch, dt, B)->UseRealTime()->Unit(benchmark::kMillisecond);
    }
  return true;
}();

}  // namespace
}  // namespace lineage::bench
