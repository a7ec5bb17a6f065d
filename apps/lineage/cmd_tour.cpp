// lineage tour: the lineage's argument as one table, one row per architecture preset — what each
// remembers (state bytes as the context grows), what decoding costs at depth, prefill speed, and
// whether chunked prefill equals token-by-token decode.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/core/rng.h"
#include "lineage/model/accounting.h"
#include "lineage/model/archs/presets.h"
#include "lineage/runtime/session.h"
#include "lineage/runtime/split_check.h"

namespace lineage::app {

namespace {

constexpr int64_t kDepths[] = {1024, 4096, 16384};
constexpr int kDecodeSteps = 8;

struct TourRow {
  std::string preset, note;
  size_t state_bytes[3] = {};
  double decode_ms[3] = {};
  bool reached[3] = {};
  double prefill_tok_s = 0, split_rel_rms = 0;
};

std::string fmt_sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", v);
  return buf;
}

TourRow measure(const std::string& label, const model::Model& m, uint64_t seed) {
  TourRow r;
  r.preset = label;
  const int64_t limit = m.config.max_positions;
  if (limit && limit < 2 * (kDecodeSteps + 1))
    throw Error(cat("tour needs a context of at least ", 2 * (kDecodeSteps + 1), " positions; ", label, " has ",
                    limit));
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
      const double t0 = steady_seconds();
      s.prefill(std::span<const int32_t>(toks.data() + j, n));
      prefill_s += steady_seconds() - t0;
      prefilled += int64_t(n);
    }
    r.state_bytes[i] = s.state().bytes();
    runtime::Session probe(m);  // decode from a snapshot so the next depth starts where this one did
    probe.restore(s.state());
    probe.decode(int32_t(rng.next_u64() % uint64_t(m.config.vocab_size)));  // warm the scratch buffers
    std::vector<double> ms;
    for (int k = 0; k < kDecodeSteps; ++k) {
      const double t0 = steady_seconds();
      probe.decode(int32_t(rng.next_u64() % uint64_t(m.config.vocab_size)));
      ms.push_back((steady_seconds() - t0) * 1e3);
    }
    std::sort(ms.begin(), ms.end());
    r.decode_ms[i] = ms[ms.size() / 2];  // the median step: robust to a stray scheduling hiccup
    r.reached[i] = true;
    if (depth < kDepths[i]) r.note = "context limit " + std::to_string(limit);
  }
  r.prefill_tok_s = prefilled / std::max(prefill_s, 1e-9);
  const int64_t checked = limit ? std::min<int64_t>(48, limit) : 48;
  const auto split_tokens = runtime::split_check_tokens(m.config.vocab_size, checked);
  r.split_rel_rms = runtime::prefill_decode_rel_rms(m, split_tokens);
  if (!runtime::prefill_equals_decode(r.split_rel_rms)) {  // say where, and whether it is a routing tie
    const runtime::Divergence d = runtime::first_divergence(m, split_tokens);
    if (d.routing_flip)
      r.note = cat("a near tie among the router's scores picks other experts at ", d.name.substr(0, d.name.find('.')),
                   " (router logits agree to ", fmt_sci(d.router_rel_rms), ")") + (r.note.empty() ? "" : "; " + r.note);
    else if (!d.name.empty())
      r.note = cat("first differs at ", d.name, " (", fmt_sci(d.rel_rms), ")") + (r.note.empty() ? "" : "; " + r.note);
  }
  return r;
}

// The seeds' two columns: how each layer kind writes its memory and how it forgets, the kinds of a
// hybrid joined ("delta rule / append latent").
std::pair<std::string, std::string> write_and_forget(const model::Model& m) {
  std::vector<std::string> write, forget;
  const auto add = [](std::vector<std::string>& v, const std::string& s) {
    if (std::find(v.begin(), v.end(), s) == v.end()) v.push_back(s);
  };
  for (const auto& b : m.blocks)
    std::visit(
        [&](const auto& x) {
          using X = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<X, layers::DeltaRule>) {
            const auto& c = x.config;
            add(write, c.delta ? "delta rule" : "add k vT");
            using D = layers::DeltaRule::DecayInput;
            add(forget, c.decay == D::None        ? "none"
                        : c.decay == D::PerHeadProj ? "decay per head"
                        : c.gate_lower_bound < 0    ? cat("decay per channel in (", c.gate_lower_bound, ", 0)")
                                                    : std::string("decay per channel"));
          } else {
            add(write, std::is_same_v<X, layers::Mla> ? "append latent" : "append K, V");
            add(forget, "none");
          }
        },
        b.mixer);
  const auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : " / ") + x;
    return s;
  };
  return {join(write), join(forget)};
}

void print_row(const TourRow& r, const model::Model& m) {
  std::string mem, dec;
  for (int i = 0; i < 3; ++i) {
    mem += (i ? " / " : "") + (r.reached[i] ? format_bytes(double(r.state_bytes[i])) : std::string("-"));
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", r.decode_ms[i]);
    dec += (i ? " / " : "") + (r.reached[i] ? std::string(buf) : std::string("-"));
  }
  const model::StateCost sc = model::state_cost(m);
  // What grows: the KV cache (every layer) or, in a hybrid, the layers that keep one (Kimi Linear's
  // MLA latents); the rest is fixed per sequence.
  int64_t growing = 0;
  for (const auto& b : m.blocks) growing += std::visit([](const auto& x) { return x.state_bytes_per_token() > 0; }, b.mixer);
  std::string kind = sc.per_token ? "grows: " + format_bytes(double(sc.per_token)) + "/token"
                                  : "fixed: " + format_bytes(double(sc.fixed));
  if (sc.per_token && sc.fixed)
    kind += cat(" (", growing, " of ", m.n_layers(), " layers) + ", format_bytes(double(sc.fixed)), " fixed");
  const char* same = runtime::prefill_equals_decode(r.split_rel_rms) ? "yes" : "NO";
  const auto [write, forget] = write_and_forget(m);
  std::printf("%-18s %-58s | %-26s | %-32s | %-32s | %-26s | %11.0f | %s (rel rms %.1e)%s%s\n", r.preset.c_str(),
              kind.c_str(), write.c_str(), forget.c_str(), mem.c_str(), dec.c_str(), r.prefill_tok_s, same, r.split_rel_rms, r.note.empty() ? "" : "; ",
              r.note.c_str());
}

}  // namespace

void add_tour(CLI::App& app) {
  struct TourOpts {
    std::vector<std::string> presets;
    std::string model_dir;
    uint64_t seed = 0;
    std::string dtype = "f32";
    ModelSource src;  // carries --bf16-exact
  };
  static TourOpts o;
  auto* cmd = app.add_subcommand("tour", "one row per architecture: memory vs context, decode cost at depth, "
                                         "prefill speed, chunked = token-by-token check");
  add_threads_option(*cmd);
  add_numerics_options(*cmd, o.src);
  auto* presets = cmd->add_option("--presets", o.presets, "presets to include (default: one per architecture)")
                      ->check(CLI::IsMember([] {
                        std::vector<std::string> v;
                        for (const auto& p : model::presets()) v.push_back(p.name);
                        return v;
                      }()));
  cmd->add_option("--seed", o.seed, "seed of the random weights (and of the random tokens)");
  auto* dtype = cmd->add_option("--weights-dtype", o.dtype, "f32, f16 or bf16")
                    ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd->add_option("--model", o.model_dir, "one row for this Hugging Face model directory instead of the presets")
      ->excludes(presets)
      ->excludes(dtype);
  cmd->callback([] {
    std::vector<std::string> names = o.presets;
    if (names.empty())
      for (const auto& p : model::presets())
        if (p.in_tour) names.push_back(p.name);
    std::printf("%-18s %-58s | %-26s | %-32s | %-32s | %-26s | %11s | %s\n", "preset", "memory", "write", "forgetting",
                "state bytes @ 1k / 4k / 16k",
                "decode ms/tok @ 1k/4k/16k", "prefill t/s", "chunked = decode");
    if (!o.model_dir.empty()) {
      ModelSource src = o.src;
      src.dir = o.model_dir;
      const io::LoadedModel lm = load(src, false);
      print_row(measure(o.model_dir, lm.model, o.seed), lm.model);
      return;
    }
    for (const auto& name : names) {
      model::Model m = model::make_preset(name, o.seed, *dtype_from_user(o.dtype));
      apply_options(o.src, m);
      print_row(measure(name, m, o.seed), m);
    }
  });
}

}  // namespace lineage::app
