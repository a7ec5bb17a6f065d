// The step, the state pool, the residual stream and the workspace, through the model's forward.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <vector>

#include "batch_check.h"
#include "lineage/core/error.h"
#include "lineage/model/model.h"
#include "lineage/model/state_pool.h"
#include "lineage/model/workspace.h"
#include "lineage/model/forward.h"
#include "lineage/model/residual.h"
#include "test_support.h"

namespace lineage::model {
namespace step_test {
namespace {

const char* const kPresets[] = {"gpt2-124m", "linear-attention", "mamba2-decay", "deltanet",  "gated-deltanet",
                                "kda",       "kimi-linear",      "kimi-k3",      "qwen3-next"};

// Each sequence of a batched step gives the logits it gives alone: every family, B = 1, 2, 5, 16,
// unequal prompts, sequences joining (mixed prefill + decode steps) and leaving (slots reused).
TEST(Step, BatchedEqualsAloneForEveryPreset) {
  for (const char* name : kPresets) {
    SCOPED_TRACE(name);
    const Model m = test::tiny_preset(name);
    for (int B : {1, 2, 5, 16}) {
      const double worst = test::expect_batched_equals_alone(m, B, 1e-6);
      std::printf("%-17s B %2d: largest relative RMS vs alone %.2g\n", name, B, worst);
    }
  }
}

// Sequences decoding together get the bits they get decoding alone: every preset (owned weights,
// [out, in]), 2 to 8 sequences a step.
TEST(Step, DecodingTogetherIsBitForBitDecodingAlone) {
  for (const char* name : kPresets) {
    SCOPED_TRACE(name);
    const Model m = test::tiny_preset(name);
    for (int B : {2, 3, 5, 8}) test::expect_decode_together_bitwise(m, B);
  }
}

// The options travel with the model: forcing either delta-rule kernel keeps the batch exact too.
TEST(Step, BatchedEqualsAloneOnBothKernelPaths) {
  for (auto path : {layers::DeltaRulePath::Recurrent, layers::DeltaRulePath::Chunked}) {
    Model m = test::tiny_preset("kda");
    m.options.delta_rule_path = path;
    test::expect_batched_equals_alone(m, 5, 1e-6);
  }
  // Both MLA forms, each for every sequence of a step whatever its length.
  for (auto form : {layers::MlaPath::Explicit, layers::MlaPath::Absorbed}) {
    Model m = test::tiny_preset("kimi-linear");
    m.options.mla_path = form;
    test::expect_batched_equals_alone(m, 5, 1e-6);
  }
}

std::vector<float> last_logits(const Model& m, StatePool& pool, Workspace& ws, int32_t slot,
                               std::span<const int32_t> toks) {
  layers::Step step;
  step.add(slot, pool.position(slot), toks);
  std::vector<float> out(size_t(m.config.vocab_size));
  forward(m, step, pool, LogitRows::Last, out.data(), ws);
  return out;
}

// Acquiring and releasing slots leaves the other slots' memory where it was; a copy continues as its
// source would; clear starts over with the same buffers; each slot reports its own bytes.
TEST(StatePool, SlotsAreIndependentAndCopyable) {
  const Model m = test::tiny_preset("gated-deltanet");
  StatePool pool(m);
  Workspace ws;
  const int32_t a = pool.acquire(), b = pool.acquire();
  const std::vector<int32_t> p = {3, 1, 4, 1, 5}, q = {9, 2, 6};
  last_logits(m, pool, ws, a, p);
  const void* S = std::get<layers::DeltaRule::State>(pool.state(a).layers[0]).S.raw();
  for (int i = 0; i < 20; ++i) {  // other sequences come and go
    const int32_t x = pool.acquire(), y = pool.acquire();
    last_logits(m, pool, ws, x, q);
    pool.release(x);
    pool.release(y);
  }
  EXPECT_EQ(std::get<layers::DeltaRule::State>(pool.state(a).layers[0]).S.raw(), S);
  EXPECT_EQ(pool.position(a), 5);
  EXPECT_GT(pool.bytes(a), 0u);
  EXPECT_EQ(pool.bytes(a), pool.state(a).bytes());

  EXPECT_EQ(pool.position(b), 0) << "untouched by the others";
  const int32_t c = pool.acquire();
  last_logits(m, pool, ws, c, q);  // something to overwrite
  pool.copy(a, c);                 // snapshot
  EXPECT_EQ(pool.position(c), 5);
  const auto from_a = last_logits(m, pool, ws, a, q), from_c = last_logits(m, pool, ws, c, q);
  EXPECT_EQ(from_a, from_c);
  pool.clear(c);
  EXPECT_EQ(pool.position(c), 0);
  StatePool fresh(m);
  const int32_t f = fresh.acquire();
  EXPECT_EQ(last_logits(m, pool, ws, c, p), last_logits(m, fresh, ws, f, p)) << "a cleared slot is a new sequence";
}

// Fixed up front: slots and context are allocated once, and running out is an Error, not an overwrite.
TEST(StatePool, FixedCapacityRunsOutWithAClearError) {
  const Model m = test::tiny_preset("gpt2-124m");
  StatePool pool(m, {.slots = 2, .ctx = 8});
  EXPECT_EQ(pool.capacity(), 2);
  const auto& kv = std::get<layers::Attention::State>(pool.state(pool.acquire()).layers[0]);
  EXPECT_EQ(kv.capacity, 8) << "room for --ctx positions from the start";
  pool.acquire();
  try {
    pool.acquire();
    FAIL() << "a third slot of two";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all 2 state slots are in use (a pool of fixed size 2)"), std::string::npos) << e.what();
  }
  Workspace ws;
  const std::vector<int32_t> toks(9, 5);
  try {
    last_logits(m, pool, ws, 0, toks);
    FAIL() << "9 tokens in a context of 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the state pool's room of 8 positions per sequence (--ctx)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(pool.position(0), 0) << "a refused step leaves the slot as it was";
  EXPECT_THROW(StatePool(m, {.ctx = 65}), Error) << "more than n_positions";
  StatePool growing(m, {.ctx = 8});  // slots on demand, each with the room fixed
  const int32_t g = growing.acquire();
  EXPECT_EQ(std::get<layers::Attention::State>(growing.state(g).layers[0]).capacity, 8);
}

// A malformed step is an Error naming what is wrong, before any state changes.
TEST(StatePool, MalformedStepsAreRefused) {
  const Model m = test::tiny_preset("deltanet");
  StatePool pool(m);
  Workspace ws;
  const int32_t a = pool.acquire();
  std::vector<float> logits(size_t(2 * m.config.vocab_size));
  const std::vector<int32_t> t = {1, 2};
  const auto refuse = [&](const layers::Step& st, const std::string& what) {
    try {
      forward(m, st, pool, LogitRows::Last, logits.data(), ws);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  layers::Step twice;
  twice.add(a, 0, t);
  twice.add(a, 0, t);
  refuse(twice, "appears twice in one step");
  layers::Step elsewhere;
  elsewhere.add(a, 3, t);
  refuse(elsewhere, "starts at position 3, but slot 0 is at position 0");
  layers::Step unused;
  unused.add(7, 0, t);
  refuse(unused, "state slot 7 is not in use");
  EXPECT_EQ(pool.position(a), 0);
}

// The residual stream's plain kind is x += f(norm(x)): the layers wired by hand give the model's
// logits bit for bit.
TEST(ResidualStream, PlainEqualsHandWiredBlocks) {
  const Model m = test::tiny_preset("gpt2-124m");
  const std::vector<int32_t> toks = {5, 17, 2, 99, 42, 7};
  const int64_t N = int64_t(toks.size()), D = m.config.d_model, V = m.config.vocab_size;
  StatePool pool(m), hand_pool(m);
  Workspace ws;
  const int32_t slot = pool.acquire(), hs = hand_pool.acquire();
  layers::Step step;
  step.add(slot, 0, toks);
  std::vector<float> want(static_cast<size_t>(V)), got(static_cast<size_t>(V));
  forward(m, step, pool, LogitRows::Last, want.data(), ws);

  layers::Step hstep;
  hstep.add(hs, 0, toks);
  const layers::Call call{hstep, m.options};
  std::vector<float> x(size_t(N * D)), a(x.size()), y(x.size());
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < D; ++c)
      x[size_t(t * D + c)] = m.embed.data<float>()[toks[size_t(t)] * D + c] + m.pos_embed.data<float>()[t * D + c];
  layers::Attention::Buffers ab;
  layers::Mlp::Buffers mb;
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const Block& b = m.blocks[i];
    layers::Attention::State* s = &std::get<layers::Attention::State>(hand_pool.state(hs).layers[i]);
    layers::forward(b.norm1, x.data(), N, a.data());
    layers::forward(std::get<layers::Attention>(b.mixer), call, a.data(), {&s, 1}, y.data(), ab, {});
    for (size_t k = 0; k < x.size(); ++k) x[k] += y[k];
    layers::forward(b.norm2, x.data(), N, a.data());
    layers::forward(std::get<layers::Mlp>(b.ffn), call, a.data(), y.data(), mb, {});
    for (size_t k = 0; k < x.size(); ++k) x[k] += y[k];
  }
  layers::forward(m.final_norm, x.data(), N, a.data());
  kernels::linear(a.data() + (N - 1) * D, 1, {&m.embed, kernels::Layout::OutIn}, nullptr, got.data());
  EXPECT_EQ(got, want);
}

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Once warm, a step allocates nothing: no workspace buffer grows and operator new is never called
// over 100 batched decode steps of 8 sequences (a fixed pool with room for all of them). The page
// faults of those steps are printed, not asserted: the kernel adds minor faults of its own (NUMA
// hinting, compaction) while other processes run, so a count of them would fail by chance. Under
// AddressSanitizer, whose operator new the test binary leaves alone, only the growths are counted.
TEST(Workspace, NoAllocationPerStepOnceWarm) {
  for (const char* name : {"gpt2-124m", "kda", "linear-attention", "kimi-linear", "kimi-k3", "qwen3-next"}) {
    SCOPED_TRACE(name);
    const Model m = test::tiny_preset(name);
    constexpr int B = 8, kSteps = 100;
    StatePool pool(m, {.slots = B, .ctx = 64});
    Workspace ws;
    layers::Step step;
    std::vector<float> logits(size_t(B * m.config.vocab_size));
    std::vector<int32_t> slots;
    for (int b = 0; b < B; ++b) slots.push_back(pool.acquire());
    const auto run = [&](int i) {
      step.clear();
      for (int b = 0; b < B; ++b) {
        const int32_t tok = (i * 7 + b * 13) % 300;
        step.add(slots[size_t(b)], pool.position(slots[size_t(b)]), {&tok, 1});
      }
      forward(m, step, pool, LogitRows::Last, logits.data(), ws);
    };
    // Warm: every position once (the KV rows of a fixed pool are allocated up front but first
    // written, so first touched, as the context fills), then back to the start of each sequence.
    for (int i = 0; i < 60; ++i) run(i);
    for (int32_t s : slots) pool.clear(s);
    const int64_t growths = layers::Buffer::growths(), news = test::allocations();
    const long faults = minor_faults();
    for (int i = 0; i < 60; ++i) run(i);
    for (int32_t s : slots) pool.clear(s);
    for (int i = 0; i < kSteps - 60; ++i) run(i);
    EXPECT_EQ(layers::Buffer::growths(), growths);
    if (news >= 0) {
      EXPECT_EQ(test::allocations() - news, 0) << "operator new calls during 100 warm steps";
    }
    std::printf("%-17s 100 warm steps of 8 sequences: %ld minor page faults\n", name, minor_faults() - faults);
  }
}

}  // namespace
}  // namespace step_test
}  // namespace lineage::model
