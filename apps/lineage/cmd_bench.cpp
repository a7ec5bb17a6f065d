// lineage bench: prefill and decode speed in the spirit of llama-bench, each figure next to its
// roofline measured in the same run: decode against the streaming read bandwidth, prefill against
// the peak FLOP/s of the weight dtype. Definitions and reproduce commands: docs/performance.md.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "common.h"
#include "ranks.h"
#include "lineage/kernels/row_split.h"
#include "lineage/core/error.h"
#include "lineage/core/parallel.h"
#include "lineage/core/rng.h"
#include "lineage/dist/transport.h"
#include "lineage/kernels/linear.h"
#include "lineage/io/expert_stream.h"
#include "lineage/io/mapping_guard.h"
#include "lineage/io/trunk_stream.h"
#include "lineage/kernels/roofline.h"
#include "lineage/model/accounting.h"
#include "lineage/model/archs/presets.h"
#include "lineage/model/forward.h"
#include "lineage/model/quantization.h"
#include "lineage/model/state_pool.h"
#include "lineage/model/workspace.h"
#include "lineage/runtime/cost.h"
#include "lineage/runtime/session.h"

namespace lineage::app {

namespace {

struct BenchOpts {
  ModelSource src;
  int64_t prompt = 512, gen = 32;
  bool no_roofline = false;
  std::vector<int64_t> depths = {0};
  std::vector<int64_t> batches = {1};
  int repetitions = 3;
  bool json = false;
};

// What the run is measured against (measure_ceilings).
struct Ceilings {
  double bandwidth = 0, peak = 0;  // bytes/s, FLOP/s of the weight dtype
  std::string read_kernel, peak_kernel;
};

// One row: "pp512" or "tg32" at one depth.
struct BenchRow {
  std::string test;
  int64_t depth = 0;
  std::vector<double> samples;  // tokens/s of each repetition
  double mean = 0, stddev = 0;
  bool decode = false;
  int64_t batch = 1;             // decode rows: sequences decoding together, one token each a step
  bool compute_bound = false;    // decode rows: the FLOP peak binds before the bandwidth does
  runtime::DecodeBytes bytes;    // decode rows: per step of one sequence (weights once, its state)
  runtime::PrefillFlops decode_flops;  // decode rows: per token
  runtime::PrefillFlops flops;   // prefill rows
  // Decode rows: the read bandwidth measured around each repetition (mean of the probes just
  // before and just after it), bytes/s, one per sample.
  std::vector<double> bandwidth;
  double roofline = 0;         // tokens/s at the best bandwidth (or peak) seen anywhere in the run
  double roofline_paired = 0;  // decode: tokens/s at the mean of `bandwidth`
  double share_paired = 0;     // decode: mean over repetitions of t/s ÷ that repetition's roofline
  // Decode rows under mpirun: the row gathers of the timed repetitions (kernels/row_split.h), their
  // wall time and the tokens they decoded.
  kernels::RowSplitStats gathers;
  double timed_seconds = 0;
  int64_t timed_tokens = 0;
};

// The row gathers between two readings of kernels::row_split_stats(), added to `into`.
void add_gathers(kernels::RowSplitStats& into, const kernels::RowSplitStats& before, const kernels::RowSplitStats& after) {
  into.gathers += after.gathers - before.gathers;
  into.expert_gathers += after.expert_gathers - before.expert_gathers;
  into.floats_sent += after.floats_sent - before.floats_sent;
  into.floats_received += after.floats_received - before.floats_received;
  into.seconds += after.seconds - before.seconds;
}

// The per-repetition bandwidth probe: 256 MiB read twice (≈ 10 ms), far past the caches.
constexpr size_t kProbeBytes = size_t(256) << 20;
constexpr int kProbePasses = 2;

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

void summarize(BenchRow& r) {
  r.mean = mean(r.samples);
  double ss = 0;
  for (double x : r.samples) ss += (x - r.mean) * (x - r.mean);
  r.stddev = r.samples.size() > 1 ? std::sqrt(ss / double(r.samples.size() - 1)) : 0.0;
}

// Refuses what cannot run before any weight is drawn: a prompt or depth + gen past the context limit.
void check_limits(const model::Model& m, const BenchOpts& o) {
  const int64_t limit = m.config.max_positions;
  if (!limit) return;
  const std::string hint = cat(" the model's context limit of ", limit, " tokens (config.json field ",
                               m.config.max_positions_field, ")");
  if (o.prompt > limit) throw Error(cat("--prompt ", o.prompt, " exceeds", hint));
  for (int64_t d : o.depths)
    if (o.gen > 0 && d + o.gen > limit) {
      std::string fix = o.gen < limit ? cat("depths up to ", limit - o.gen) : std::string();
      if (d < limit) fix += cat(fix.empty() ? "" : " or ", "--gen up to ", limit - d);
      throw Error(cat("--depth ", d, " + --gen ", o.gen, " = ", d + o.gen, " tokens exceeds", hint,
                      "\nHINT: use ", fix.empty() ? cat("a depth and --gen adding up to at most ", limit) : fix));
    }
}

// pp N: prefill of N random tokens from an empty state, one warm-up then R timed repetitions.
BenchRow bench_prefill(runtime::Session& s, const BenchOpts& o) {
  const model::Model& m = s.model();
  const auto tokens = random_tokens(o.prompt, m.config.vocab_size, o.src.seed + 101);
  BenchRow r;
  r.test = "pp" + std::to_string(o.prompt);
  for (int rep = 0; rep <= o.repetitions; ++rep) {
    s.reset();
    const double t0 = steady_seconds();
    s.prefill(tokens);
    if (rep > 0) r.samples.push_back(double(o.prompt) / (steady_seconds() - t0));
  }
  return r;
}

// The state after `depth` random tokens, prefilled in pieces of 512 to bound the scratch.
model::SequenceState build_context(runtime::Session& s, int64_t depth, uint64_t seed) {
  s.reset();
  const auto tokens = random_tokens(depth, s.model().config.vocab_size, seed);
  for (size_t i = 0; i < tokens.size(); i += 512)
    s.prefill(std::span<const int32_t>(tokens.data() + i, std::min<size_t>(512, tokens.size() - i)));
  return s.state().clone();
}

// tg N at depth d: every repetition decodes N tokens from the same context snapshot, restored into
// the session's buffers (from the first repetition on, no new pages: the timed decode does not pay
// for growing the KV cache), with the read bandwidth probed just before and just after it.
BenchRow bench_decode(runtime::Session& s, const BenchOpts& o, int64_t depth, const kernels::ReadBandwidthProbe* probe) {
  const model::SequenceState context = build_context(s, depth, o.src.seed + 202 + uint64_t(depth));
  const auto tokens = random_tokens(o.gen, s.model().config.vocab_size, o.src.seed + 303);
  BenchRow r;
  r.test = "tg" + std::to_string(o.gen);
  r.depth = depth;
  r.decode = true;
  double before = 0;
  for (int rep = 0; rep <= o.repetitions; ++rep) {
    s.restore(context);
    if (rep == 1) before = probe ? probe->measure(kProbePasses) : 0.0;
    const kernels::RowSplitStats g0 = kernels::row_split_stats();
    const double t0 = steady_seconds();
    for (int32_t t : tokens) s.decode(t);
    const double t1 = steady_seconds();
    if (rep == 0) continue;
    add_gathers(r.gathers, g0, kernels::row_split_stats());
    r.timed_seconds += t1 - t0, r.timed_tokens += o.gen;
    const double after = probe ? probe->measure(kProbePasses) : 0.0;
    r.samples.push_back(double(o.gen) / (t1 - t0));
    r.bandwidth.push_back(0.5 * (before + after));
    before = after;
  }
  return r;
}

// tg N at depth d with B sequences: B slots of one pool, each restored from the same context
// snapshot, decode N steps together, one token of each sequence a step (the projections one GEMM
// over B rows, each weight read once a step). t/s counts the tokens of all B sequences.
BenchRow bench_decode_batch(runtime::Session& s, const BenchOpts& o, int64_t depth, int64_t B,
                       const kernels::ReadBandwidthProbe* probe) {
  const model::Model& m = s.model();
  const model::SequenceState context = build_context(s, depth, o.src.seed + 202 + uint64_t(depth));
  model::StatePool pool(m, {.slots = B});
  std::vector<int32_t> slots;
  for (int64_t b = 0; b < B; ++b) slots.push_back(pool.acquire());
  std::vector<std::vector<int32_t>> tokens;
  for (int64_t b = 0; b < B; ++b)
    tokens.push_back(random_tokens(o.gen, m.config.vocab_size, o.src.seed + 303 + uint64_t(b)));
  model::Workspace ws;
  layers::Step step;
  std::vector<float> logits(size_t(B * m.config.vocab_size));
  BenchRow r;
  r.test = "tg" + std::to_string(o.gen);
  r.depth = depth;
  r.decode = true;
  r.batch = B;
  double before = 0;
  for (int rep = 0; rep <= o.repetitions; ++rep) {
    for (int32_t slot : slots) pool.state(slot).assign(context);
    if (rep == 1) before = probe ? probe->measure(kProbePasses) : 0.0;
    const kernels::RowSplitStats g0 = kernels::row_split_stats();
    const double t0 = steady_seconds();
    for (int64_t i = 0; i < o.gen; ++i) {
      step.clear();
      for (int64_t b = 0; b < B; ++b) step.add(slots[size_t(b)], depth + i, {&tokens[size_t(b)][size_t(i)], 1});
      model::forward(m, step, pool, model::LogitRows::Last, logits.data(), ws);
    }
    const double t1 = steady_seconds();
    if (rep == 0) continue;
    add_gathers(r.gathers, g0, kernels::row_split_stats());
    r.timed_seconds += t1 - t0, r.timed_tokens += B * o.gen;
    const double after = probe ? probe->measure(kProbePasses) : 0.0;
    r.samples.push_back(double(B * o.gen) / (t1 - t0));
    r.bandwidth.push_back(0.5 * (before + after));
    before = after;
  }
  return r;
}

// The dtype holding most of the weight bytes ("bf16"), which picks the peak FLOP/s.
std::string lower(std::string_view s) {
  std::string r(s);
  for (auto& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

std::string model_label(const ModelSource& src) {
  if (!src.preset.empty()) return src.preset;
  const std::filesystem::path p = std::filesystem::path(src.dir).lexically_normal();
  return p.has_filename() ? p.filename().string() : p.parent_path().filename().string();
}

// "495.8 MB", "179.7 MFLOP": decimal prefixes, like GB/s and GFLOP/s in the header. Decode rows: the
// bytes a token moves (a step's weights shared by its B tokens, plus its own state), or its FLOPs
// where the peak binds.
std::string per_token_label(const BenchRow& r) {
  const bool bytes = r.decode && !r.compute_bound;
  double v = bytes ? r.bytes.weights / double(r.batch) + r.bytes.state
             : r.decode ? r.decode_flops.total()
                        : r.flops.total();
  const char* prefixes[] = {"", "k", "M", "G", "T"};
  int p = 0;
  while (v >= 1000 && p < 4) v /= 1000, ++p;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f %s%s", v, prefixes[p], bytes ? "B" : "FLOP");
  return buf;
}

struct Context {
  std::string model, dtype;
  int threads = 0;
  bool mapped = false;  // weights mapped from checkpoint files, not owned
  std::string mapped_label;  // where mapped: how much of them sits on 2 MiB pages (after the tests)
  double huge_share = 0;     // the same as a fraction of the resident mapped bytes
  bool bf16_dot = false;     // BF16 weights multiplied with bf16 dot products
  std::string products_label;  // for BF16 weights: ", bf16 weights: " + bf16_products_label()
  Ceilings ceil;
};

// Whether any weight is mapped from a file rather than owned, and how much of it the kernel maps with
// 2 MiB entries (owned buffers and the bandwidth probe get huge pages; decode notices the difference).
void print_header(const Context& c, const model::Model& m, const std::vector<BenchRow>& rows) {
  std::printf("lineage bench: %s (%s), weights %s%s, threads %d%s\n", c.model.c_str(), m.config.model_type.c_str(),
              c.dtype.c_str(), c.mapped_label.c_str(), c.threads, c.products_label.c_str());
  std::printf("roofline: read bandwidth %.2f GB/s best (%s), peak %.1f GFLOP/s (%s)\n", c.ceil.bandwidth / 1e9,
              c.ceil.read_kernel.c_str(), c.ceil.peak / 1e9, c.ceil.peak_kernel.c_str());
  double lo = 0, hi = 0;
  for (const BenchRow& r : rows)
    for (double bw : r.bandwidth) {
      lo = lo == 0 ? bw : std::min(lo, bw);
      hi = std::max(hi, bw);
    }
  if (hi > 0)
    std::printf("%% paired: each decode repetition against the read bandwidth probed just before and after "
                "it (%.1f-%.1f GB/s in this run)\n",
                lo / 1e9, hi / 1e9);
  std::printf("\n");
  std::printf("| %-18s | %-5s | %7s | %6s | %6s | %5s | %20s | %12s | %10s | %8s | %12s |\n", "model", "dtype",
              "threads", "test", "depth", "batch", "t/s", "roofline t/s", "% roofline", "% paired", "per token");
  std::printf("| %s | %s | %s: | %s: | %s: | %s: | %s: | %s: | %s: | %s: | %s: |\n", std::string(18, '-').c_str(),
              std::string(5, '-').c_str(), std::string(6, '-').c_str(), std::string(5, '-').c_str(),
              std::string(5, '-').c_str(), std::string(4, '-').c_str(), std::string(19, '-').c_str(),
              std::string(11, '-').c_str(), std::string(9, '-').c_str(), std::string(7, '-').c_str(),
              std::string(11, '-').c_str());
}

void print_row(const Context& c, const BenchRow& r) {
  char tps[48];
  std::snprintf(tps, sizeof tps, "%.2f ± %.2f", r.mean, r.stddev);
  // "±" is two bytes in UTF-8 but one column: pad by hand.
  // --no-roofline measured no ceiling: its columns say so.
  const bool measured = r.roofline > 0 && std::isfinite(r.roofline);
  char paired[16] = "-", share[16] = "-", roof[24] = "-";
  if (measured && r.decode) std::snprintf(paired, sizeof paired, "%.1f %%", 100.0 * r.share_paired);
  if (measured) std::snprintf(share, sizeof share, "%.1f %%", 100.0 * r.mean / r.roofline);
  if (measured) std::snprintf(roof, sizeof roof, "%.2f", r.roofline);
  std::printf("| %-18s | %-5s | %7d | %6s | %6lld | %5lld | %*s | %12s | %10s | %8s | %12s |\n",
              c.model.c_str(), c.dtype.c_str(), c.threads, r.test.c_str(), (long long)r.depth, (long long)r.batch, 21,
              tps, roof, share, paired, per_token_label(r).c_str());
}

nlohmann::json row_json(const Context& c, const BenchRow& r, int repetitions) {
  nlohmann::json j = {{"model", c.model},
                      {"weights_dtype", c.dtype},
                      {"threads", c.threads},
                      {"bf16_dot", c.bf16_dot},
                      {"weights_mapped", c.mapped},
                      {"weights_huge_page_share", c.mapped ? nlohmann::json(c.huge_share) : nlohmann::json()},
                      {"test", r.test},
                      {"depth", r.depth},
                      {"batch", r.batch},
                      {"repetitions", repetitions},
                      {"tokens_per_s", r.mean},
                      {"tokens_per_s_stddev", r.stddev},
                      {"samples_tokens_per_s", r.samples},
                      {"roofline_tokens_per_s", r.roofline},
                      {"roofline_share", r.mean / r.roofline},
                      {"bandwidth_bytes_per_s", c.ceil.bandwidth},
                      {"peak_flops", c.ceil.peak},
                      {"read_kernel", c.ceil.read_kernel},
                      {"peak_kernel", c.ceil.peak_kernel}};
  if (r.decode && ranks().size() > 1 && r.timed_tokens > 0) {
    const double n = double(r.timed_tokens);
    j["ranks"] = ranks().size();
    j["seconds_per_token"] = r.timed_seconds / n;
    j["gather_seconds_per_token"] = r.gathers.seconds / n;
    j["gathers_per_token"] = double(r.gathers.gathers) / n;
    j["bytes_sent_per_token"] = 4.0 * double(r.gathers.floats_sent) / n;
    j["bytes_received_per_token"] = 4.0 * double(r.gathers.floats_received) / n;
  }
  if (r.decode) {
    j["roofline_paired_tokens_per_s"] = r.roofline_paired;
    j["roofline_share_paired"] = r.share_paired;
    j["samples_bandwidth_bytes_per_s"] = r.bandwidth;
    j["bytes_per_token"] = r.bytes.total();
    j["weight_bytes_per_token"] = r.bytes.weights;
    j["state_bytes_per_token"] = r.bytes.state;
    j["flops_per_token"] = r.decode_flops.total();
    j["bound"] = r.compute_bound ? "compute" : "bandwidth";
  } else {
    j["flops_per_token"] = r.flops.total();
    j["weight_flops_per_token"] = r.flops.weights;
    j["mixer_flops_per_token"] = r.flops.mixers;
  }
  return j;
}

// A whole number of tokens (or sequences) ≥ min, with a message that says so (CLI11's ranges print
// 1.8e308).
CLI::Validator tokens_at_least(int64_t min, const char* what = "tokens") {
  return CLI::Validator(
      [min, what](std::string& s) -> std::string {
        const auto v = parse_integer(s);
        if (v && *v >= min) return "";
        return cat("\"", s, "\" is not a whole number of ", what, " >= ", min);
      },
      min ? "N>=1" : "N>=0");
}

// The ceilings, measured before and after the tests; the higher of each is kept, since another
// process on the cores can only lower a measurement, never raise it.
Ceilings measure_ceilings(DType dtype, int threads, const Ceilings& earlier) {
  return {std::max(earlier.bandwidth, kernels::measure_read_bandwidth(threads)),
          std::max(earlier.peak, kernels::measure_peak_flops(dtype, threads)), kernels::read_bandwidth_kernel(),
          kernels::peak_flops_kernel(dtype)};
}

void progress(const BenchRow& r) {
  if (isatty(STDERR_FILENO)) std::fprintf(stderr, "lineage bench: %s at depth %lld: %.2f t/s\n", r.test.c_str(),
                                          (long long)r.depth, r.mean);
}

// Streaming (the model does not fit its --memory-budget): tg N at the first depth from a cold expert
// cache, then again with other tokens on the cache the first pass left (warm): the bytes read from
// disk per token, the true hit rate (experts resident when the router asked), the read bandwidth
// achieved (over the pass's wall time and over the time the layers waited on reads), next to the
// disk's own roofline measured in the same run and the decode roofline it gives: per token, the bytes
// read from disk at the disk's random-read bandwidth plus the resident weights and state at the memory
// bandwidth. Peak RSS (VmHWM) is reported with the plan: budget, state and workspace.
struct StreamPass {
  std::string name;
  double tokens_per_s = 0, bytes_per_token = 0, hit_rate = 0, read_bw_wall = 0, read_bw_wait = 0, roofline = 0;
  double trunk_bytes_per_token = 0, trunk_wait_share = 0;  // a trunk streamed layer by layer
  io::StreamStats stats;
  io::TrunkStats trunk;
};

// `store` and `trunk`: whichever streams (at least one).
std::vector<StreamPass> bench_stream(runtime::Session& s, io::ExpertStore* store, io::TrunkStream* trunk,
                                     const io::StreamPlan& plan, const io::DiskRoofline& disk, const BenchOpts& o,
                                     int64_t depth, double mem_bw) {
  model::Model& m = const_cast<model::Model&>(s.model());
  const model::SequenceState context = build_context(s, depth, o.src.seed + 202 + uint64_t(depth));
  // Per token: the routed experts' share k/E of their bytes (uniform routing), the rest at memory speed.
  double routed_per_token = 0;
  for (const auto& b : m.blocks)
    if (const auto* moe = std::get_if<layers::Moe>(&b.ffn); moe && plan.moe_layers > 0)
      routed_per_token += double(plan.routed_bytes) / double(plan.moe_layers) * double(moe->config.top_k) /
                          double(moe->config.n_experts);
  const runtime::DecodeRoofline whole =
      runtime::decode_roofline(m, runtime::mean_decode_context(depth, o.gen), 1.0, mem_bw, 1e30);
  const double resident_per_token = std::max(0.0, whole.bytes.total() - routed_per_token);
  std::vector<StreamPass> out;
  if (store) io::clear_expert_cache(*store);
  for (const char* name : {"cold", "warm"}) {
    const auto tokens = random_tokens(o.gen, m.config.vocab_size, o.src.seed + 404 + out.size());
    s.restore(context);
    if (store) io::reset_stream_stats(*store);
    if (trunk) io::reset_trunk_stats(*trunk);
    const double t0 = steady_seconds();
    for (int32_t t : tokens) s.decode(t);
    const double wall = steady_seconds() - t0;
    StreamPass p;
    p.name = name;
    if (store) p.stats = io::stream_stats(*store);
    if (trunk) p.trunk = io::trunk_stats(*trunk);
    p.tokens_per_s = double(o.gen) / wall;
    p.bytes_per_token = double(p.stats.bytes_read) / double(o.gen);
    p.trunk_bytes_per_token = double(p.trunk.bytes_read) / double(o.gen);
    p.trunk_wait_share = p.trunk.wait_seconds / wall;
    p.hit_rate = p.stats.requests ? double(p.stats.hits) / double(p.stats.requests) : 0.0;
    p.read_bw_wall = double(p.stats.bytes_read + p.trunk.bytes_read) / wall;
    const double waited = p.stats.read_wait_seconds + p.trunk.wait_seconds;
    p.read_bw_wait = waited > 0 ? double(p.stats.bytes_read + p.trunk.bytes_read) / waited : 0.0;
    // The trunk's reads overlap the layers' compute (one unit read ahead); the experts' follow the router.
    const double t = p.bytes_per_token / std::max(1.0, disk.random) +
                     std::max(p.trunk_bytes_per_token / std::max(1.0, disk.trunk), resident_per_token / mem_bw);
    p.roofline = t > 0 ? 1.0 / t : 0.0;
    out.push_back(p);
  }
  return out;
}

// /proc/self/status's field in bytes (VmHWM: the peak resident set; VmRSS: now).
double status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string want = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(want, 0) == 0) return std::atof(line.c_str() + want.size()) * 1024.0;
  return 0;
}

// Under mpirun, every rank's memory in rank order: its peak resident set and its resident pages of
// the checkpoint's mappings (the weights it has touched: its rows of the split matrices and the
// replicated rest). A collective: every rank calls it.
struct RankMemory {
  double peak_rss = 0, mapped_resident = 0, released = 0;  // released: weight pages it unmapped
};
std::vector<RankMemory> ranks_memory(model::Model& m) {
  dist::Transport& t = ranks();
  const double mapped = weights_mapped(m) ? double(mapped_pages(m).resident) : 0.0;
  // KiB as floats: exact up to 16 GiB, within 2^-24 beyond.
  const float mine[3] = {float(status_bytes("VmHWM") / 1024.0), float(mapped / 1024.0),
                         float(double(io::unmapped_bytes()) / 1024.0)};
  std::vector<float> all(size_t(3 * t.size()));
  const std::vector<int64_t> counts(size_t(t.size()), 3);
  t.all_gather(mine, counts, all.data());
  std::vector<RankMemory> out;
  for (size_t r = 0; r < size_t(t.size()); ++r)
    out.push_back({1024.0 * all[3 * r], 1024.0 * all[3 * r + 1], 1024.0 * all[3 * r + 2]});
  return out;
}

void run_bench(const BenchOpts& o) {
  if (o.prompt == 0 && o.gen == 0) throw Error("--prompt 0 and --gen 0 leave no test to run");
  if (!o.src.preset.empty()) check_limits(model::preset_skeleton(o.src.preset), o);
  const double rss_before_load = status_bytes("VmRSS");
  io::LoadedModel lm = load(o.src, false);
  model::Model& m = lm.model;
  check_limits(m, o);

  Context c;
  c.model = model_label(o.src);
  const DType dtype = main_dtype(m);
  c.mapped = weights_mapped(m);
  c.dtype = lower(dtype_name(dtype));
  c.threads = num_threads();
  const bool bf16 = has_bf16_weights(model::count_params(m));
  c.bf16_dot = bf16 && bf16_dot(m);
  c.products_label = bf16 ? ", bf16 weights: " + bf16_products_label(m) : "";
  if (lm.experts && o.src.int8_dot && kernels::int8_dot_available()) io::set_stream_int8_dot(*lm.experts, true);
  if (o.src.int8_dot && kernels::int8_dot_available() && model::set_int8_dot(m, true))
    c.products_label += ", int4/int8 weights: int8 activations (--int8-dot)";
  if (!o.no_roofline) c.ceil = measure_ceilings(dtype, c.threads, {});

  runtime::Session s(m);
  std::vector<BenchRow> rows;
  const auto done = [&](BenchRow r) {
    summarize(r);
    progress(r);
    rows.push_back(std::move(r));
  };
  if (o.prompt > 0) done(bench_prefill(s, o));
  if (o.gen > 0) {
    std::optional<kernels::ReadBandwidthProbe> probe;
    if (!o.no_roofline) probe.emplace(c.threads, kProbeBytes);
    const kernels::ReadBandwidthProbe* p = probe ? &*probe : nullptr;
    for (int64_t B : o.batches)
      for (int64_t d : o.depths) done(B == 1 ? bench_decode(s, o, d, p) : bench_decode_batch(s, o, d, B, p));
  }
  if (!o.no_roofline) c.ceil = measure_ceilings(dtype, c.threads, c.ceil);
  if (c.mapped) {  // every weight has been read by now
    const io::MappedPages p = mapped_pages(m);
    c.mapped_label = mapped_label(p);
    c.huge_share = p.resident ? double(p.huge) / double(p.resident) : 0.0;
  }
  for (const BenchRow& r : rows)
    for (double bw : r.bandwidth) c.ceil.bandwidth = std::max(c.ceil.bandwidth, bw);
  // Under mpirun each rank reads its rows of the split matrices and the replicated rest: its decode
  // roofline counts those bytes (at the bandwidth this rank measured).
  double weight_share = 1.0, weight_bytes_per_rank = 0;
  std::vector<RankMemory> per_rank;
  if (ranks().size() > 1) {
    const auto [split, replicated] = split_and_replicated(m, DType::F32);
    if (split + replicated > 0) weight_share = (replicated + split / ranks().size()) / (split + replicated);
    weight_bytes_per_rank = replicated + split / ranks().size();
    per_rank = ranks_memory(m);
  }
  for (BenchRow& r : rows) {
    if (r.decode) {
      // A step of B sequences reads the weights once and each sequence's state: B tokens for
      // weights + B·state bytes. It also does B tokens' FLOPs; whichever ceiling binds first.
      const double context = runtime::mean_decode_context(r.depth, o.gen), B = double(r.batch);
      const auto bound = [&](double bandwidth) {
        return runtime::decode_roofline(m, context, B, bandwidth, c.ceil.peak, weight_share).tokens_per_second;
      };
      const runtime::DecodeRoofline best =
          runtime::decode_roofline(m, context, B, c.ceil.bandwidth, c.ceil.peak, weight_share);
      r.bytes = best.bytes;
      r.decode_flops = best.flops;
      r.roofline = best.tokens_per_second;
      r.compute_bound = best.compute_bound;
      r.roofline_paired = bound(mean(r.bandwidth));
      std::vector<double> shares;
      for (size_t i = 0; i < r.samples.size(); ++i) shares.push_back(r.samples[i] / bound(r.bandwidth[i]));
      r.share_paired = mean(shares);
    } else {
      r.flops = runtime::prefill_flops_per_token(m, o.prompt, 0);
      r.roofline = c.ceil.peak / r.flops.total();
    }
  }

  // Streaming: its own passes, the disk measured in the same run.
  std::vector<StreamPass> passes;
  io::DiskRoofline disk;
  const std::shared_ptr<io::TrunkStream> trunk = io::trunk_of(m);
  if ((lm.experts || trunk) && o.gen > 0) {
    if (!o.no_roofline) {
      disk = lm.experts ? io::measure_disk(*lm.experts, uint64_t(1) << 30) : io::measure_disk(*trunk, uint64_t(1) << 30);
      if (trunk) {
        const io::SequentialRead r = io::measure_trunk_reads(*trunk, uint64_t(1) << 30);
        disk.trunk = r.rate, disk.trunk_bytes = r.bytes;
      }
    }
    passes = bench_stream(s, lm.experts.get(), trunk.get(), lm.stream_plan, disk, o, o.depths.front(), c.ceil.bandwidth);
  }
  const io::StreamPlan& plan = lm.stream_plan;
  const nlohmann::json memory = {{"budget_bytes", plan.budget},
                                 {"streaming", plan.streaming},
                                 {"resident_bytes", plan.resident_bytes},
                                 {"routed_expert_bytes", plan.routed_bytes},
                                 {"expert_cache_bytes", plan.cache_bytes},
                                 {"trunk_streamed", plan.trunk_streamed},
                                 {"trunk_window_bytes", plan.trunk.window_bytes},
                                 {"trunk_streamed_bytes", plan.trunk.streamed_bytes},
                                 {"trunk_pinned_bytes", plan.trunk.pinned_bytes},
                                 {"minimum_budget_bytes", plan.minimum_budget},
                                 {"state_bytes", s.state().bytes()},
                                 {"workspace_bytes", layers::Buffer::live_bytes()},
                                 {"rss_before_load_bytes", rss_before_load},
                                 {"rss_peak_bytes", status_bytes("VmHWM")}};
  nlohmann::json ranks_json;  // under mpirun: each rank's memory next to what info --ranks predicts
  if (!per_rank.empty()) {
    ranks_json = {{"ranks", ranks().size()}, {"weight_bytes_per_rank", weight_bytes_per_rank}, {"per_rank", nlohmann::json::array()}};
    for (size_t r = 0; r < per_rank.size(); ++r)
      ranks_json["per_rank"].push_back({{"rank", r},
                                        {"rss_peak_bytes", per_rank[r].peak_rss},
                                        {"mapped_resident_bytes", per_rank[r].mapped_resident},
                                        {"released_bytes", per_rank[r].released}});
  }
  if (o.json) {
    nlohmann::json all = nlohmann::json::array();
    for (const BenchRow& r : rows) all.push_back(row_json(c, r, o.repetitions));
    for (const StreamPass& p : passes)
      all.push_back({{"model", c.model},
                     {"weights_dtype", c.dtype},
                     {"threads", c.threads},
                     {"bf16_dot", c.bf16_dot},
                     {"weights_mapped", c.mapped},
                     {"test", cat("tg", o.gen, " streamed, ", p.name, " cache")},
                     {"streamed", true},
                     {"depth", o.depths.front()},
                     {"tokens_per_s", p.tokens_per_s},
                     {"roofline_tokens_per_s", p.roofline},
                     {"disk_bytes_per_token", p.bytes_per_token},
                     {"trunk_bytes_per_token", p.trunk_bytes_per_token},
                     {"trunk_wait_share", p.trunk_wait_share},
                     {"expert_requests", p.stats.requests},
                     {"expert_hits", p.stats.hits},
                     {"hit_rate", p.hit_rate},
                     {"reads", p.stats.reads},
                     {"evictions", p.stats.evictions},
                     {"read_bandwidth_wall_bytes_per_s", p.read_bw_wall},
                     {"read_bandwidth_wait_bytes_per_s", p.read_bw_wait},
                     {"disk_sequential_bytes_per_s", disk.sequential},
                     {"disk_random_bytes_per_s", disk.random},
                     {"disk_random_reads", disk.random_reads},
                     {"disk_trunk_bytes_per_s", disk.trunk},
                     {"io", p.stats.io}});
    for (auto& row : all) {  // the run's, on each row
      row["memory"] = memory;
      if (!ranks_json.is_null()) row["memory"]["ranks"] = ranks_json;
    }
    std::printf("%s\n", all.dump(2).c_str());
    return;
  }
  print_header(c, m, rows);
  for (const BenchRow& r : rows) print_row(c, r);
  if (ranks().size() > 1) {  // tensor parallelism: what the gathers cost a decoded token (rank 0's view)
    std::printf("\nranks: %d over %s, each linear map's output rows split and gathered; the rooflines count the "
                "%.1f %% of the weights' bytes a rank reads; per decoded token on rank 0:\n",
                ranks().size(), ranks().name().c_str(), 100.0 * weight_share);
    for (const BenchRow& r : rows) {
      if (!r.decode || r.timed_tokens == 0) continue;
      const double n = double(r.timed_tokens), total = r.timed_seconds / n, comm = r.gathers.seconds / n;
      std::printf("  %s at depth %lld, batch %lld: %.3f ms = %.3f ms compute + %.3f ms in %.1f gathers (%.1f %%); "
                  "sends %s, receives %s\n",
                  r.test.c_str(), (long long)r.depth, (long long)r.batch, 1e3 * total, 1e3 * (total - comm), 1e3 * comm,
                  double(r.gathers.gathers) / n, 100.0 * comm / total,
                  format_bytes(4.0 * double(r.gathers.floats_sent) / n).c_str(),
                  format_bytes(4.0 * double(r.gathers.floats_received) / n).c_str());
    }
    std::printf("memory per rank (info --ranks: %s of weights a rank):", format_bytes(weight_bytes_per_rank).c_str());
    for (size_t r = 0; r < per_rank.size(); ++r)
      std::printf("%s rank %zu peak RSS %s, mapped weights resident %s (%s of other ranks' rows unmapped)",
                  r ? ";" : "", r, format_bytes(per_rank[r].peak_rss).c_str(),
                  format_bytes(per_rank[r].mapped_resident).c_str(), format_bytes(per_rank[r].released).c_str());
    std::printf("\n");
  }
  if (plan.streaming) {
    if (plan.trunk_streamed)
      std::printf("\ntrunk streamed layer by layer: %s of it read from the files each token, %s held once read%s%s\n",
                  format_bytes(double(plan.trunk.streamed_bytes)).c_str(), format_bytes(double(plan.trunk.pinned_bytes)).c_str(),
                  plan.trunk.streamed_bytes
                      ? cat(", at most ", format_bytes(double(plan.trunk.window_bytes)), " of the rest held (",
                            plan.trunk.window_units, ": one unit running, one read ahead)").c_str()
                      : " (the embedding read by rows)",
                  plan.trunk.fixed_bytes ? cat(", ", format_bytes(double(plan.trunk.fixed_bytes)), " in memory").c_str() : "");
    if (lm.experts)
      std::printf("%sexperts streamed: budget %s = %s %s + %s expert cache (%s of routed experts on disk); %s\n",
                  plan.trunk_streamed ? "" : "\n", format_bytes(double(plan.budget)).c_str(),
                  format_bytes(double(plan.trunk_streamed ? plan.trunk.window_bytes + plan.trunk.pinned_bytes +
                                                                plan.trunk.fixed_bytes
                                                          : plan.resident_bytes)).c_str(),
                  plan.trunk_streamed ? "for the trunk" : "resident", format_bytes(double(plan.cache_bytes)).c_str(),
                  format_bytes(double(plan.routed_bytes)).c_str(), passes.empty() ? "" : passes.front().stats.io.c_str());
    if (!passes.empty()) {
      if (o.no_roofline) {
        std::printf("disk roofline: not measured (--no-roofline)");
      } else {
        std::printf("disk roofline: %.2f GB/s sequential (%s)", disk.sequential / 1e9,
                    format_bytes(double(disk.sequential_bytes)).c_str());
        if (lm.experts)
          std::printf(", %.2f GB/s random whole experts (%lld reads at once)", disk.random / 1e9,
                      (long long)disk.random_reads);
        if (trunk)
          std::printf(", %.2f GB/s the trunk's units read as its reader reads them (%s)", disk.trunk / 1e9,
                      format_bytes(double(disk.trunk_bytes)).c_str());
      }
      std::printf("\n| %-10s | %9s | %12s | %14s | %14s | %8s | %16s | %16s | %12s |\n", "cache", "t/s", "roofline t/s",
                  "experts/token", "trunk/token", "hit rate", "read GB/s (wall)", "read GB/s (wait)", "trunk waits");
      for (const StreamPass& p : passes)
        std::printf("| %-10s | %9.2f | %12.2f | %14s | %14s | %6.1f %% | %16.2f | %16.2f | %10.1f %% |\n", p.name.c_str(),
                    p.tokens_per_s, p.roofline, format_bytes(p.bytes_per_token).c_str(),
                    format_bytes(p.trunk_bytes_per_token).c_str(), 100.0 * p.hit_rate, p.read_bw_wall / 1e9,
                    p.read_bw_wait / 1e9, 100.0 * p.trunk_wait_share);
    }
  }
  std::printf("\nmemory: peak RSS %s (%s before the load); budget %s, state %s, workspace %s\n",
              format_bytes(status_bytes("VmHWM")).c_str(), format_bytes(rss_before_load).c_str(),
              format_bytes(double(plan.budget)).c_str(), format_bytes(double(s.state().bytes())).c_str(),
              format_bytes(double(layers::Buffer::live_bytes())).c_str());
}

}  // namespace

void add_bench(CLI::App& app) {
  static BenchOpts o;
  auto* cmd = app.add_subcommand("bench", "prefill (ppN) and decode (tgN at depth D) tokens/s next to the roofline "
                                          "measured in the same run");
  add_model_options(*cmd, o.src, true);
  add_threads_option(*cmd);
  add_numerics_options(*cmd, o.src);
  cmd->add_option("--prompt", o.prompt, "pp test: tokens prefilled from an empty state (default 512; 0 skips it)")
      ->check(tokens_at_least(0));
  cmd->add_option("--gen", o.gen, "tg test: tokens decoded after each depth (default 32; 0 skips it)")
      ->check(tokens_at_least(0));
  cmd->add_option("--depth", o.depths, "comma-separated context depths for the tg test (default 0)")
      ->delimiter(',')
      ->check(tokens_at_least(0));
  cmd->add_option("--batch", o.batches,
                  "comma-separated numbers of sequences decoding together in the tg test, one token each a step "
                  "(default 1)")
      ->delimiter(',')
      ->check(tokens_at_least(1, "sequences"));
  cmd->add_option("--repetitions", o.repetitions, "timed repetitions of each test after one warm-up (default 3)")
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", o.json, "print one JSON array of result objects");
  cmd->add_flag("--no-roofline", o.no_roofline,
                "skip the roofline probes (memory bandwidth, peak FLOP/s, the disk): their buffers would hide the peak "
                "RSS of a --memory-budget run");
  cmd->callback([] { run_bench(o); });
}

}  // namespace lineage::app
