// lineage tour: the lineage's argument as one table, one row per architecture preset — what each
// remembers (state bytes as the context grows), what decoding costs at depth, prefill speed, and
// whether chunked prefill equals token-by-token decode.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "common.h"
#include "lineage/core/rng.h"
#include "lineage/model/archs/presets.h"
#include "lineage/runtime/session.h"

namespace lineage::app {

namespace {

constexpr int64_t kDepths[] = {1024, 4096, 16384};
constexpr int kDecodeSteps = 8;

struct Row {
  std::string preset, note;
  size_t state_bytes[3] = {};
  double decode_ms[3] = {};
  bool reached[3] = {};
  double prefill_tok_s = 0, split_rel_rms = 0;
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng.next_u64() % uint64_t(vocab));
  return t;
}

// Relative RMS difference between one whole-sequence prefill and token-by-token decode.
double split_check(const model::Model& m) {
  const int64_t T = 48, V = m.config.vocab_size;
  const auto toks = random_tokens(T, V, 7);
  runtime::Session whole(m), step(m);
  const auto all = whole.prefill(toks, true);
  const std::vector<float> ref(all.begin(), all.end());
  double num = 0, den = 0;
  for (int64_t t = 0; t < T; ++t) {
    const auto l = step.decode(toks[t]);
    for (int64_t v = 0; v < V; ++v) {
      const double d = double(l[v]) - ref[t * V + v];
      num += d * d;
      den += double(ref[t * V + v]) * ref[t * V + v];
    }
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

Row measure(const std::string& name, uint64_t seed, DType dtype) {
  Row r;
  r.preset = name;
  const model::Model m = model::make_preset(name, seed, dtype);
  const int64_t limit = m.config.max_positions;
  runtime::Session s(m);
  Rng rng(seed + 1);
  double prefill_s = 0;
  int64_t prefilled = 0;
  for (int i = 0; i < 3; ++i) {
    const int64_t depth = limit ? std::min(kDepths[i], limit - kDecodeSteps - 1) : kDepths[i];
    if (i > 0 && depth <= s.position()) break;  // clipped to the context limit already measured
    const auto toks = random_tokens(depth - s.position(), m.config.vocab_size, seed + 10 + i);
    for (size_t j = 0; j < toks.size(); j += 512) {
      const size_t n = std::min<size_t>(512, toks.size() - j);
      const double t0 = now();
      s.prefill(std::span<const int32_t>(toks.data() + j, n));
      prefill_s += now() - t0;
      prefilled += int64_t(n);
    }
    r.state_bytes[i] = s.state().bytes();
    runtime::Session probe(m);  // decode from a snapshot so the next depth starts where this one did
    probe.restore(s.state());
    probe.decode(int32_t(rng.next_u64() % uint64_t(m.config.vocab_size)));  // warm the scratch buffers
    std::vector<double> ms;
    for (int k = 0; k < kDecodeSteps; ++k) {
      const double t0 = now();
      probe.decode(int32_t(rng.next_u64() % uint64_t(m.config.vocab_size)));
      ms.push_back((now() - t0) * 1e3);
    }
    std::sort(ms.begin(), ms.end());
    r.decode_ms[i] = ms[ms.size() / 2];  // the median step: robust to a stray scheduling hiccup
    r.reached[i] = true;
    if (depth < kDepths[i]) r.note = "context limit " + std::to_string(limit);
  }
  r.prefill_tok_s = prefilled / std::max(prefill_s, 1e-9);
  r.split_rel_rms = split_check(m);
  return r;
}

}  // namespace

void add_tour(CLI::App& app) {
  struct Opts {
    std::vector<std::string> presets;
    uint64_t seed = 0;
    std::string dtype = "f32";
  };
  static Opts o;
  auto* cmd = app.add_subcommand("tour", "one row per architecture: memory vs context, decode cost at depth, "
                                         "prefill speed, chunked = token-by-token check");
  add_threads_option(*cmd);
  add_bf16_options(*cmd);
  cmd->add_option("--presets", o.presets, "presets to include (default: one per architecture)")
      ->check(CLI::IsMember([] {
        std::vector<std::string> v;
        for (const auto& p : model::presets()) v.push_back(p.name);
        return v;
      }()));
  cmd->add_option("--seed", o.seed, "seed of the random weights");
  cmd->add_option("--weights-dtype", o.dtype, "f32, f16 or bf16")->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd->callback([] {
    std::vector<std::string> names = o.presets;
    if (names.empty())
      for (const auto& p : model::presets())
        if (p.in_tour) names.push_back(p.name);
    std::printf("%-18s %-44s | %-32s | %-26s | %11s | %s\n", "preset", "memory", "state bytes @ 1k / 4k / 16k",
                "decode ms/tok @ 1k/4k/16k", "prefill t/s", "chunked = decode");
    for (const auto& name : names) {
      const Row r = measure(name, o.seed, *dtype_from_user(o.dtype));
      std::string mem, dec;
      for (int i = 0; i < 3; ++i) {
        mem += (i ? " / " : "") + (r.reached[i] ? format_bytes(double(r.state_bytes[i])) : std::string("-"));
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.2f", r.decode_ms[i]);
        dec += (i ? " / " : "") + (r.reached[i] ? std::string(buf) : std::string("-"));
      }
      const model::Model m = model::make_preset(name, o.seed, DType::F32);
      const model::StateCost sc = model::state_cost(m);
      const std::string kind = sc.per_token ? "grows: " + format_bytes(double(sc.per_token)) + "/token"
                                            : "fixed: " + format_bytes(double(sc.fixed));
      std::printf("%-18s %-44s | %-32s | %-26s | %11.0f | %s (rel rms %.1e)%s%s\n", name.c_str(), kind.c_str(),
                  mem.c_str(), dec.c_str(), r.prefill_tok_s, r.split_rel_rms < 1e-4 ? "yes" : "NO", r.split_rel_rms,
                  r.note.empty() ? "" : "; ", r.note.c_str());
    }
  });
}

}  // namespace lineage::app
