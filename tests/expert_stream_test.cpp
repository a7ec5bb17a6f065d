// Routed experts streamed from the checkpoint files under --memory-budget (io/expert_stream.h), and
// the trunk streamed layer by layer below (io/trunk_stream.h): a budget that forces eviction gives the
// resident run's logits bit for bit, batched and alone, in every split; peak RSS stays within the
// budget; the faults are errors naming the file or the minimum.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "batch_check.h"
#include "lineage/core/error.h"
#include "lineage/core/dtype.h"
#include "lineage/core/rng.h"
#include "lineage/core/tensor.h"
#include "lineage/io/expert_stream.h"
#include "lineage/io/load_model.h"
#include "lineage/io/safetensors.h"
#include "lineage/io/trunk_stream.h"
#include "lineage/layers/common.h"
#include "lineage/runtime/session.h"
#include "test_support.h"

namespace lineage {
namespace {

namespace fs = std::filesystem;
using test::run_lineage;
using test::shell_quote;

const char* kTokens = "5 17 99 3 250 11 42 7 200 8 1 2 77 123 64 9 31";

// The smallest budget that runs `dir` streaming, as lineage's error for a budget of one byte names it:
// with the trunk resident (`trunk_streams` false: the experts alone stream), or streamed layer by layer.
uint64_t minimum_budget(const fs::path& dir, const std::string& policy, bool trunk_streams = false) {
  const auto r = run_lineage("logits --model " + shell_quote(dir.string()) + " --tokens 1 --out " +
                             shell_quote((test::temp_dir() / "x.npy").string()) + " --memory-budget 1 --expert-cache " + policy);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  std::smatch m;
  EXPECT_TRUE(std::regex_search(r.err, m, std::regex(trunk_streams ? "below this model's minimum, ([0-9]+) bytes, with its trunk streamed"
                                                                   : "with the trunk resident the minimum is ([0-9]+) bytes")))
      << r.err;
  return m.empty() ? 0 : std::stoull(m[1].str());
}

// lm's routed experts streamed from dir's files at the smallest global budget (one expert cached).
std::shared_ptr<io::ExpertStore> stream_at_minimum(io::LoadedModel& lm, const fs::path& dir) {
  io::StreamOptions opt;
  opt.budget = minimum_budget(dir, "global");
  io::StreamPlan plan;
  return io::stream_experts(lm.model, opt, plan);
}

std::string logits_bytes(const fs::path& dir, const std::string& options) {
  const fs::path out = test::temp_dir() / "stream_logits.npy";
  const auto r = run_lineage("logits --model " + shell_quote(dir.string()) + " --tokens '" + kTokens + "' --out " +
                             shell_quote(out.string()) + " --threads 2 " + options);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(out, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// At the minimum budget the cache holds one expert (per layer: one a layer), so every step evicts and
// reads again; the logits are the resident run's bits, whole, in chunks of 5 and token by token (the
// read buffers keep each tensor's address modulo 4096: the kernels take the same paths). Every MoE
// family: Qwen3.5-MoE's stacked experts (row slices of one tensor), Kimi Linear's, K3's MXFP4 pairs
// and bf16 shards, Qwen3-Next's.
TEST(ExpertStream, EvictingEveryStepGivesTheResidentBits) {
  for (const char* name : {"qwen3_5_moe/f32", "kimi_linear/f32", "kimi_k3/mxfp4_routed", "kimi_k3/bf16_sharded",
                           "qwen3_next/f32_sharded"}) {
    SCOPED_TRACE(name);
    const fs::path dir = test::testdata() / name;
    for (const char* policy : {"global", "per-layer"}) {
      const uint64_t min = minimum_budget(dir, policy);
      ASSERT_GT(min, 0u);
      for (const char* chunk : {"", "--chunk 5", "--chunk 1"}) {
        const std::string want = logits_bytes(dir, chunk);
        const std::string got = logits_bytes(dir, cat(chunk, " --memory-budget ", min, " --expert-cache ", policy));
        ASSERT_FALSE(want.empty());
        EXPECT_TRUE(got == want) << policy << " " << chunk << ": not bit for bit";
      }
    }
  }
}

// The quantized formats' experts (compressed-tensors int4 with zero points, int8, FP8 blocks,
// transformers' FP8, NVFP4, MXFP4; Qwen3-Next checkpoints) and a GGUF file's stacked experts (Kimi
// Linear's mirror, reference/gguf_mirror.py): the same bits at the minimum budget, whole and token by
// token, each expert's codes and scales read together and prepared from the read buffer.
TEST(ExpertStream, QuantizedAndGgufExpertsStreamExactly) {
  const fs::path gguf = test::temp_dir() / "kimi.gguf";
  const std::string cmd = "/usr/bin/python3 " + shell_quote((test::source_dir() / "reference" / "gguf_mirror.py").string()) +
                          " " + shell_quote((test::testdata() / "kimi_linear" / "f32").string()) + " " + shell_quote(gguf.string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<fs::path> models = {gguf};
  for (const char* q : {"w4a16_asym_g32", "w8a16_g128", "fp8_block", "hf_fp8", "nvfp4", "mxfp4"})
    models.push_back(test::testdata() / "quant" / q);
  for (const fs::path& dir : models) {
    SCOPED_TRACE(dir.string());
    const uint64_t min = minimum_budget(dir, "global");
    ASSERT_GT(min, 0u);
    for (const char* chunk : {"", "--chunk 1"})
      EXPECT_TRUE(logits_bytes(dir, cat(chunk, " --memory-budget ", min)) == logits_bytes(dir, chunk)) << chunk;
  }
}

// The streamed model in a batch: sequences joining and leaving a state pool give each sequence's
// logits alone (the harness's bound, bit for bit at B = 1), and decoding together is decoding alone
// bit for bit, with every step evicting.
TEST(ExpertStream, BatchedEqualsAloneWhileEvicting) {
  for (const char* name : {"kimi_linear/f32", "qwen3_5_moe/f32"}) {
    SCOPED_TRACE(name);
    const fs::path dir = test::testdata() / name;
    io::LoadedModel lm = io::load_model(dir, false);
    lm.model.options.bf16_dot = false;
    io::StreamOptions opt;
    opt.budget = minimum_budget(dir, "global");
    io::StreamPlan plan;
    auto store = io::stream_experts(lm.model, opt, plan);
    ASSERT_TRUE(store && plan.streaming);
    for (int B : {1, 5}) test::expect_batched_equals_alone(lm.model, B, 3e-5);
    test::expect_decode_together_bitwise(lm.model, 4);
    const io::StreamStats st = io::stream_stats(*store);
    EXPECT_GT(st.misses, 0u);
    EXPECT_GT(st.evictions, 0u);
    EXPECT_EQ(st.hits + st.misses, st.requests);
    EXPECT_GT(st.bytes_read, 0u);
  }
}

// A Kimi Linear checkpoint whose experts are 3 MiB each (moe_intermediate_size 4096, 72 MiB of routed
// experts over 3 layers; the shared expert as wide), written from the tiny one with new seeded experts.
// Returns the directory.
fs::path big_experts_checkpoint() {
  const fs::path src = test::testdata() / "kimi_linear" / "f32", dir = test::temp_dir() / "big_experts";
  fs::create_directories(dir);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
  const int64_t F = 4096, D = cfg["hidden_size"].get<int64_t>();
  cfg["moe_intermediate_size"] = F;
  std::ofstream(dir / "config.json") << cfg.dump(2);
  const io::Checkpoint ck = io::Checkpoint::open(src);
  std::vector<std::pair<std::string, Tensor>> tensors;
  Rng rng(11);
  for (const std::string& n : ck.names()) {
    Tensor t = ck.tensor(n);
    if (n.find("experts.") != std::string::npos) {  // the routed experts and the shared one
      const bool down = n.find(".w2.") != std::string::npos || n.find(".down_proj.") != std::string::npos;
      t = Tensor::empty(DType::F32, down ? Shape{D, F} : Shape{F, D});
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(rng.normal() * (down ? 0.02 : 0.15));
    }
    tensors.emplace_back(n, t);
  }
  io::save_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

// lineage bench's last JSON row on `dir` (no probes, 2 threads), with `options`.
nlohmann::json bench_row(const fs::path& dir, const std::string& options) {
  const auto r = run_lineage("bench --model " + shell_quote(dir.string()) + " --repetitions 1 --json --no-roofline --threads 2 " +
                             options);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json rows = nlohmann::json::parse(r.out);
  return rows.empty() ? nlohmann::json() : rows.back();
}

// Peak RSS over the load (a bench row's "memory"), and the bound it must keep under a budget: the
// budget, the state, the workspace (the steps' buffers), and 16 MiB for what the process allocates
// besides (thread stacks, the kernels' per-thread scratch, the allocator's own).
double rss_growth(const nlohmann::json& memory) {
  return memory["rss_peak_bytes"].get<double>() - memory["rss_before_load_bytes"].get<double>();
}
double rss_bound(const nlohmann::json& memory, double budget) {
  return budget + memory["state_bytes"].get<double>() + memory["workspace_bytes"].get<double>() + double(16 << 20);
}

// Peak RSS (VmHWM, /proc/self/status) grows from before the load by at most rss_bound: run in a child
// lineage (one process per budget), over a prefill and 24 decoded tokens. The same bound is broken by the resident run,
// whose experts, 72 MiB, all come into memory: the check can fail.
TEST(ExpertStream, PeakRssStaysWithinTheBudget) {
  const fs::path dir = big_experts_checkpoint();
  const uint64_t min = minimum_budget(dir, "global");
  ASSERT_GT(min, 0u);
  const auto run = [&](const std::string& budget) { return bench_row(dir, "--prompt 0 --gen 24 " + budget)["memory"]; };
  const nlohmann::json streamed = run(cat("--memory-budget ", min + (6 << 20))), resident = run("");
  ASSERT_TRUE(streamed["streaming"].get<bool>());
  ASSERT_FALSE(resident["streaming"].get<bool>());
  const double budget = streamed["budget_bytes"].get<double>();
  std::printf("peak RSS growth: streamed %.1f MiB (bound %.1f MiB), resident %.1f MiB\n", rss_growth(streamed) / 1048576,
              rss_bound(streamed, budget) / 1048576, rss_growth(resident) / 1048576);
  EXPECT_LE(rss_growth(streamed), rss_bound(streamed, budget));
  EXPECT_GT(rss_growth(resident), rss_bound(resident, budget));
  EXPECT_GT(streamed["routed_expert_bytes"].get<double>(), 70.0 * 1048576);
}

// `info --tensors` (what scripts/make-stream-checkpoint.py writes a checkpoint from) lists what a
// checkpoint of the config holds, as lineage binds it: on a directory with its config.json alone, every
// tensor of the real checkpoint with its dtype and shape (Kimi Linear f32, its MLA kv_b_proj joined
// from its parts; K3 with MXFP4 experts as weight_packed / weight_scale pairs), and nothing else.
TEST(ExpertStream, InfoListsTheTensorsACheckpointHolds) {
  for (const char* name : {"kimi_linear/f32", "kimi_k3/mxfp4_routed"}) {
    SCOPED_TRACE(name);
    const fs::path src = test::testdata() / name, dir = test::temp_dir() / "config_only";
    fs::create_directories(dir);
    fs::copy_file(src / "config.json", dir / "config.json", fs::copy_options::overwrite_existing);
    const auto r = run_lineage("info --tensors --json --model " + shell_quote(dir.string()));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const io::Checkpoint ck = io::Checkpoint::open(src);
    size_t listed = 0;
    for (const auto& t : nlohmann::json::parse(r.out)) {
      const std::string n = t["name"];
      ASSERT_TRUE(ck.has(n)) << n;
      EXPECT_EQ(t["dtype"].get<std::string>(), std::string(dtype_name(ck.entry(n).dtype))) << n;
      EXPECT_EQ(t["shape"].get<Shape>(), ck.entry(n).shape) << n;
      ++listed;
    }
    size_t read = 0;  // K3's vision tower and projector are stored beside the text model, not read
    for (const std::string& n : ck.names()) read += !n.starts_with("vision_tower.") && !n.starts_with("mm_projector.");
    EXPECT_EQ(listed, read);
  }
}

// dir's files copied to a fresh directory `name` under the test's temporary directory.
fs::path copy_checkpoint(const fs::path& dir, const std::string& name) {
  const fs::path copy = test::temp_dir() / name;
  fs::create_directories(copy);
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) fs::copy_file(e.path(), copy / e.path().filename(), fs::copy_options::overwrite_existing);
  return copy;
}

// After a prefill on m, `file` gets a new modification time: the next step is an Error naming it, and
// what streams from it (`what`).
void expect_a_changed_file_named(const model::Model& m, const fs::path& file, const std::string& what) {
  runtime::Session s(m);
  const std::vector<int32_t> prompt = {1, 2, 3};
  s.prefill(prompt);
  fs::last_write_time(file, fs::last_write_time(file) + std::chrono::seconds(5));
  try {
    s.decode(4);
    ADD_FAILURE() << "a changed file went unnoticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file.string() + ": the file changed while lineage streamed " + what),
              std::string::npos)
        << e.what();
  }
}

// Faults: a budget below the minimum names it (and what makes it, with the trunk streamed and
// resident); a trunk that must stream refuses --no-mmap; a malformed size names the option (and
// --no-mmap, which copies the trunk alone, streams the experts to the same bits);
// a checkpoint file that changes under the run is an Error naming it at the next step.
TEST(ExpertStream, FaultsAreNamed) {
  const fs::path kimi = test::testdata() / "kimi_linear" / "f32";
  const auto logits = [](const fs::path& dir, const std::string& options) {
    return run_lineage("logits --model " + shell_quote(dir.string()) + " --tokens '1 2 3' --out " +
                       shell_quote((test::temp_dir() / "x.npy").string()) + " " + options);
  };
  auto r = logits(kimi, "--memory-budget 100K");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--memory-budget 102400 bytes is below this model's minimum"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("with its trunk streamed layer by layer"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("one running and one read ahead) + "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(the largest expert); with the trunk resident the minimum is"), std::string::npos) << r.err;
  r = logits(test::testdata() / "gpt2" / "f32_gpt2_shapes", "--memory-budget 10K");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("with its trunk streamed layer by layer"), std::string::npos) << r.err;
  // The trunk streams only from the mapped files: --no-mmap would copy it whole.
  r = logits(kimi, cat("--no-mmap --memory-budget ", minimum_budget(kimi, "global", true)));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("its trunk streams layer by layer from the mapped files, which --no-mmap would copy whole"),
            std::string::npos) << r.err;
  // --no-mmap copies the trunk; the experts still stream from the files, each tensor at its file
  // alignment as in a mapped run (an owned copy starts every tensor on a cache line, which sums some
  // rows in another order: 4e-7 apart here): the mapped run's bits.
  EXPECT_TRUE(logits_bytes(kimi, cat("--no-mmap --memory-budget ", minimum_budget(kimi, "global"))) ==
              logits_bytes(kimi, ""));
  for (const char* bad : {"lots", "-4G", "12Q", "0"}) {
    r = logits(kimi, cat("--memory-budget ", bad));
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_NE(r.err.find(cat("--memory-budget: '", bad, "' is not a size")), std::string::npos) << r.err;
  }

  const fs::path copy = copy_checkpoint(kimi, "kimi_copy");
  io::LoadedModel lm = io::load_model(copy, false);
  auto store = stream_at_minimum(lm, copy);
  ASSERT_TRUE(store);
  expect_a_changed_file_named(lm.model, copy / "model.safetensors", "experts");
}

// A read that fails (EIO) or comes back one byte short is an Error naming the file and the bytes, on
// the first read of a step and on one in the middle of a prefill's batch of reads; the failed step's
// leftovers are dropped, and the same model then gives the undamaged run's logits bit for bit.
TEST(ExpertStream, ReadErrorsAreNamedAndTheRunGoesOn) {
  const fs::path kimi = test::testdata() / "kimi_linear" / "f32";
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  const auto run = [&](runtime::Session& s) {
    s.reset();
    s.prefill(prompt);
    const auto l = s.decode(9);
    return std::vector<float>(l.begin(), l.end());
  };
  io::LoadedModel ref = io::load_model(kimi, false);
  runtime::Session rs(ref.model);
  const std::vector<float> want = run(rs);

  io::LoadedModel lm = io::load_model(kimi, false);
  auto store = stream_at_minimum(lm, kimi);
  ASSERT_TRUE(store);
  runtime::Session s(lm.model);
  for (const int err : {EIO, 0})
    for (const int64_t nth : {int64_t(1), int64_t(3)}) {
      SCOPED_TRACE(cat("fault ", err, " at read ", nth));
      io::clear_expert_cache(*store);
      io::inject_read_fault(nth, err);
      try {
        run(s);
        ADD_FAILURE() << "a failed read went unnoticed";
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find((kimi / "model.safetensors").string() + ": "), std::string::npos) << what;
        EXPECT_NE(what.find(err ? "failed: Input/output error" : "a short read of experts at byte"), std::string::npos)
            << what;
      }
      io::inject_read_fault(0, 0);
      EXPECT_EQ(run(s), want) << "the run after a failed read";
    }
}

// The trunk streamed a sublayer at a time (io/trunk_stream.h) at its minimum budget, where the expert
// cache holds one expert: the resident run's logits bit for bit, whole, in chunks of 5 and token by
// token, on every family's layers (GPT-2's Conv1D and tied head, the delta rule, Kimi Linear's KDA and
// MLA with streamed experts, K3's AttnRes mixes and MXFP4 experts, Qwen3.5's gated attention and
// Qwen3-Next's shared experts).
TEST(TrunkStream, StreamingTheTrunkGivesTheResidentBits) {
  for (const char* name : {"gpt2/f32_untied_lm_head", "gpt2/f32_gpt2_shapes", "gated_deltanet/f32_defaults", "kimi_linear/f32",
                           "kimi_k3/mxfp4_routed", "qwen3_5/f32", "qwen3_next/f32_sharded"}) {
    SCOPED_TRACE(name);
    const fs::path dir = test::testdata() / name;
    const uint64_t min = minimum_budget(dir, "global", true);
    ASSERT_GT(min, 0u);
    for (const char* chunk : {"", "--chunk 5", "--chunk 1"}) {
      const std::string want = logits_bytes(dir, chunk);
      ASSERT_FALSE(want.empty());
      EXPECT_TRUE(logits_bytes(dir, cat(chunk, " --memory-budget ", min)) == want) << chunk << ": not bit for bit";
    }
  }
}

// Batched and alone with the trunk and the experts streaming: each sequence's logits as alone, and
// decoding together is decoding alone bit for bit; every unit is read again each step (the reader's
// count).
TEST(TrunkStream, BatchedEqualsAloneAndUnitsLeave) {
  const fs::path dir = test::testdata() / "kimi_linear" / "f32";
  io::LoadedModel lm = io::load_model(dir, false);
  lm.model.options.bf16_dot = false;
  io::StreamOptions opt;
  opt.budget = minimum_budget(dir, "global", true);
  io::StreamPlan plan;
  auto store = io::stream_experts(lm.model, opt, plan);
  ASSERT_TRUE(store && plan.trunk_streamed);
  const std::shared_ptr<io::TrunkStream> trunk = io::trunk_of(lm.model);
  ASSERT_TRUE(trunk);
  for (int B : {1, 5}) test::expect_batched_equals_alone(lm.model, B, 3e-5);
  test::expect_decode_together_bitwise(lm.model, 4);
  runtime::Session s(lm.model);
  const std::vector<int32_t> prompt = {1, 2, 3};
  s.prefill(prompt);
  io::reset_trunk_stats(*trunk);
  s.decode(4);
  const io::TrunkStats st = io::trunk_stats(*trunk);
  // A step reads every unit but the embedding (a step reads its rows) once. Its first, block 0's
  // mixer, is read ahead as the step before it ends, and again for the next step as this one ends;
  // either read may complete inside or outside the counted span.
  EXPECT_LE(st.bytes_read, plan.trunk.streamed_bytes + plan.trunk.unit_bytes[1]);
  EXPECT_GE(st.bytes_read + plan.trunk.unit_bytes[1], plan.trunk.streamed_bytes);
  EXPECT_GT(plan.trunk.unit_bytes[1], 0u);
}

// Between the minimum and the budget the trunk would fit in, the largest units that fit stay once read
// (pinned): a step reads only the others, the expert cache gets what is left, and the logits are the
// resident run's bits, prefill and decode.
TEST(TrunkStream, PinnedUnitsStayAndTheRestStream) {
  const fs::path dir = test::testdata() / "kimi_linear" / "f32";
  const uint64_t min = minimum_budget(dir, "global", true), resident_min = minimum_budget(dir, "global");
  ASSERT_LT(min, resident_min);
  io::LoadedModel lm = io::load_model(dir, false), ref = io::load_model(dir, false);
  io::StreamOptions opt;
  opt.budget = min + (resident_min - min) / 2;
  io::StreamPlan plan;
  ASSERT_TRUE(io::stream_experts(lm.model, opt, plan));
  ASSERT_TRUE(plan.trunk_streamed);
  EXPECT_GT(plan.trunk.pinned_bytes, 0u);
  EXPECT_GT(plan.trunk.streamed_bytes, 0u);
  EXPECT_LE(plan.trunk.pinned_bytes + plan.trunk.window_bytes + plan.cache_bytes, opt.budget);
  runtime::Session s(lm.model), r(ref.model);
  const std::vector<int32_t> prompt = {5, 17, 99, 3, 250};
  const auto a = s.prefill(prompt), b = r.prefill(prompt);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
  const std::shared_ptr<io::TrunkStream> trunk = io::trunk_of(lm.model);
  ASSERT_TRUE(trunk);
  for (const int32_t t : {11, 42, 7}) {
    io::reset_trunk_stats(*trunk);
    const auto x = s.decode(t), y = r.decode(t);
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end())) << "token " << t;
    // The pinned units are not read again; block 0's mixer may be read ahead once more.
    EXPECT_LE(io::trunk_stats(*trunk).bytes_read, plan.trunk.streamed_bytes + plan.trunk.unit_bytes[1]);
  }
}

// A checkpoint file that changes under a run whose trunk streams from it is an Error naming the file at
// the next step (a dense GPT-2: no expert store checks its files).
TEST(TrunkStream, AFileChangedUnderTheRunIsNamed) {
  const fs::path copy = copy_checkpoint(test::testdata() / "gpt2" / "f32_gpt2_shapes", "gpt2_copy");
  io::LoadedModel lm = io::load_model(copy, false);
  io::StreamOptions opt;
  opt.budget = minimum_budget(copy, "global", true);
  io::StreamPlan plan;
  io::stream_experts(lm.model, opt, plan);
  ASSERT_TRUE(plan.trunk_streamed);
  expect_a_changed_file_named(lm.model, copy / "model.safetensors", "the trunk");
}

// The bytes of m's mapped weights present in this process (/proc/self/pagemap's bit 63), each page once.
size_t weight_pages_held(model::Model& m) {
  std::set<uintptr_t> pages;
  m.for_each_tensor([&](const std::string&, Tensor& t, const Shape&, layers::Init) {
    if (!t.is_borrowed() || !t.nbytes()) return;
    const uintptr_t b = reinterpret_cast<uintptr_t>(t.raw());
    for (uintptr_t p = b / 4096; p <= (b + t.nbytes() - 1) / 4096; ++p) pages.insert(p);
  });
  const int fd = ::open("/proc/self/pagemap", O_RDONLY);
  EXPECT_GE(fd, 0);
  size_t held = 0;
  for (const uintptr_t p : pages) {
    uint64_t entry = 0;
    if (::pread(fd, &entry, 8, off_t(p * 8)) == 8 && (entry >> 63)) held += 4096;
  }
  ::close(fd);
  return held;
}

// A GPT-2 checkpoint whose trunk is 100 MiB (8 layers of 512, a vocabulary of 8192, f32; seeded
// random weights for the tensors `info --tensors` lists for its config). Returns the directory.
fs::path big_trunk_checkpoint() {
  const fs::path dir = test::temp_dir() / "big_trunk";
  fs::create_directories(dir);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(test::testdata() / "gpt2" / "f32_gpt2_shapes" / "config.json"));
  cfg["n_embd"] = 512, cfg["n_layer"] = 8, cfg["n_head"] = 8, cfg["vocab_size"] = 8192, cfg["n_positions"] = 256;
  cfg["torch_dtype"] = "float32";
  std::ofstream(dir / "config.json") << cfg.dump(2);
  const auto r = run_lineage("info --tensors --json --model " + shell_quote(dir.string()));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::pair<std::string, Tensor>> tensors;
  Rng rng(5);
  for (const auto& t : nlohmann::json::parse(r.out)) {
    Tensor x = Tensor::empty(DType::F32, t["shape"].get<Shape>());
    const bool norm = t["name"].get<std::string>().find("ln_") != std::string::npos;
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = norm ? 1.0f + float(rng.normal() * 0.1) : float(rng.normal() * 0.02);
    tensors.emplace_back(t["name"].get<std::string>(), x);
  }
  io::save_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

// Peak RSS with the trunk streamed: growth over the load within rss_bound, over a prefill and 24 decoded tokens; the resident run of the
// same 100 MiB breaks it. `info` plans the same window.
TEST(TrunkStream, PeakRssStaysWithinTheBudget) {
  const fs::path dir = big_trunk_checkpoint();
  const uint64_t min = minimum_budget(dir, "global", true);
  ASSERT_GT(min, 0u);
  const auto run = [&](const std::string& budget) { return bench_row(dir, "--prompt 16 --gen 24 " + budget); };
  const nlohmann::json streamed = run(cat("--memory-budget ", min)), resident = run("");
  ASSERT_TRUE(streamed["memory"]["trunk_streamed"].get<bool>());
  ASSERT_FALSE(resident["memory"]["streaming"].get<bool>());
  EXPECT_GT(streamed["trunk_bytes_per_token"].get<double>(), 90.0 * 1048576);  // every unit, each token
  const double budget = double(min);
  std::printf("peak RSS growth: trunk streamed %.1f MiB (bound %.1f MiB), resident %.1f MiB\n",
              rss_growth(streamed["memory"]) / 1048576, rss_bound(streamed["memory"], budget) / 1048576,
              rss_growth(resident["memory"]) / 1048576);
  EXPECT_LE(rss_growth(streamed["memory"]), rss_bound(streamed["memory"], budget));
  EXPECT_GT(rss_growth(resident["memory"]), rss_bound(resident["memory"], budget));
  // info's plan from the stored bytes: the window within a page a tensor of the run's.
  const auto info = run_lineage("info --json --model " + shell_quote(dir.string()) + cat(" --memory-budget ", min));
  ASSERT_EQ(info.exit_code, 0) << info.err;
  const nlohmann::json plan = nlohmann::json::parse(info.out)["memory_plan"];
  EXPECT_TRUE(plan["trunk_streamed"].get<bool>());
  EXPECT_LE(plan["trunk_window_bytes"].get<double>(), streamed["memory"]["trunk_window_bytes"].get<double>());
  EXPECT_GT(plan["trunk_window_bytes"].get<double>(), streamed["memory"]["trunk_window_bytes"].get<double>() - 64 * 4096);

  // Between steps the process holds of the trunk the unit read ahead for the next step, and the
  // pages the kernel maps about a fault (fault-around, at most 64 KiB at each of a unit's ends).
  io::LoadedModel lm = io::load_model(dir, false);
  io::StreamOptions opt;
  opt.budget = min;
  io::StreamPlan sp;
  ASSERT_FALSE(io::stream_experts(lm.model, opt, sp));
  ASSERT_TRUE(sp.trunk_streamed && io::trunk_of(lm.model));
  runtime::Session s(lm.model);
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  s.prefill(prompt);
  s.decode(5);
  const size_t held = weight_pages_held(lm.model), slack = sp.trunk.unit_bytes.size() * 2 * (64 << 10);
  std::printf("trunk held between steps: %.1f MiB (window %.1f MiB + at most %.1f MiB; trunk %.1f MiB)\n",
              double(held) / 1048576, double(sp.trunk.window_bytes) / 1048576, double(slack) / 1048576,
              double(sp.trunk.streamed_bytes) / 1048576);
  EXPECT_LE(held, sp.trunk.window_bytes + slack);
  EXPECT_GT(held, 0u);
}

// A tied head pinned is the embedding: a step's end does not drop the embedding's pages, or the
// head would be read back page by page, a major fault each, at every step (as it was before). On the
// 112 MiB GPT-2, whose 16 MiB head is far from the other units (fault-around maps a tiny model's
// neighbouring pages back in whatever is dropped).
TEST(TrunkStream, APinnedTiedHeadStays) {
  const fs::path dir = big_trunk_checkpoint();
  const uint64_t whole = minimum_budget(dir, "global");  // a dense model: every weight resident
  io::LoadedModel lm = io::load_model(dir, false);
  ASSERT_TRUE(lm.model.config.tied_lm_head);
  io::StreamOptions opt;
  opt.budget = whole - 1;
  io::StreamPlan plan;
  io::stream_experts(lm.model, opt, plan);
  ASSERT_TRUE(plan.trunk_streamed);
  ASSERT_TRUE(plan.trunk.pinned.back()) << "the head is not pinned at this budget";
  runtime::Session s(lm.model);
  const std::vector<int32_t> prompt = {1, 2, 3};
  s.prefill(prompt);
  s.decode(4);
  // Page faults, minor and major: every unit is pinned at this budget, so a step takes none. A head
  // dropped and read back takes one a page, or with fault-around one per 16, or on 2 MiB pages (the
  // mapping is advised for them) one per 2 MiB: at least 8 a step for its 16 MiB (measured: 42).
  const auto faults = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt + u.ru_majflt;
  };
  const long before = faults();
  for (const int32_t t : {5, 6, 7, 8}) s.decode(t);
  const double head_pages = double(plan.trunk.unit_bytes.back()) / 4096, per_step = double(faults() - before) / 4;
  std::printf("page faults a step: %.0f (the head: %.0f pages; the units streamed: %.0f pages)\n", per_step, head_pages,
              double(plan.trunk.streamed_bytes) / 4096);
  EXPECT_EQ(plan.trunk.streamed_bytes, 0u);
  EXPECT_LT(per_step, 4.0);
}

}  // namespace
}  // namespace lineage
