// lineage study: training-free experiments on the lineage's claims. `study memory` writes random
// key-value pairs through each write rule of the delta-rule family and measures what comes back
// (capacity, a repeated key, forgetting); the library side is train/study_memory.h.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <nlohmann/json.hpp>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/study/memory.h"
#include "lineage/study/recall.h"
#include "lineage/plot/svg_plot.h"

namespace lineage::app {

namespace {

constexpr int64_t kMaxDim = 1024;
constexpr double kMaxRatio = 64;

CLI::Validator even_dim() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const auto v = parse_integer(s);
        if (v && *v >= 2 && *v <= kMaxDim && *v % 2 == 0) return "";
        return cat("\"", s, "\" is not an even whole number from 2 to ", kMaxDim,
                   " (the key channels split into a fast and a slow half)");
      },
      "D");
}

CLI::Validator positive_ratio() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = s.empty() ? 0 : std::strtod(s.c_str(), &end);
        if (end && *end == '\0' && std::isfinite(v) && v > 0 && v <= kMaxRatio) return "";
        return cat("\"", s, "\" is not a number of pairs per key dimension in (0, ", kMaxRatio, "]");
      },
      "N/D");
}

CLI::Validator whole_number() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (!s.empty() && s.size() <= 20 && s.find_first_not_of("0123456789") == std::string::npos &&
            (s.size() < 20 || s <= "18446744073709551615"))
          return "";
        return cat("\"", s, "\" is not a whole number from 0 to 18446744073709551615");
      },
      "S");
}

struct StudyOpts {
  study::MemoryStudyConfig config;
  std::string out;
  bool json = false;
};

void check(const StudyOpts& o) {
  for (int64_t D : o.config.dims)
    for (double r : o.config.ratios)
      if (std::llround(r * double(D)) < 1)
        throw Error(cat("--ratios ", r, " at D = ", D, " (--dims) writes no pair: expected N/D · D >= 1"));
}

void run_study(const StudyOpts& o) {
  check(o);
  const study::MemoryStudy s = study::run_memory_study(o.config);
  std::vector<std::string> files;
  if (!o.out.empty()) files = study::write_memory_study_files(s, o.out);
  if (o.json) {
    nlohmann::json j = study::memory_study_json(s);
    if (!o.out.empty()) j["files"] = files;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s", study::memory_study_text(s).c_str());
    if (!o.out.empty()) {
      std::printf("\nfiles written to %s:\n", o.out.c_str());
      for (const auto& f : files) std::printf("  %s\n", f.c_str());
    }
  }
  std::fprintf(stderr, "lineage study memory: %.2f s\n", s.seconds);
}

struct RecallOpts {
  study::RecallConfig config;
  std::vector<std::string> set;  // ROW:FIELD=VALUE
  std::string out;
  bool json = false;
};

void run_recall(RecallOpts& o) {
  o.config.overrides.clear();
  for (const std::string& s : o.set) {
    // The row before the last ':' ahead of the first '=' (a row's name may hold ':', "KDA/MLA 3:1 hybrid").
    const size_t eq = s.find('='), colon = eq == std::string::npos ? eq : s.rfind(':', eq);
    if (colon == std::string::npos || colon == 0 || colon + 1 == eq || eq + 1 == s.size())
      throw Error(cat("--set: expected ROW:FIELD=VALUE (e.g. 'Gated DeltaNet:use_gate=false'); got '", s, "'"));
    o.config.overrides.push_back({s.substr(0, colon), s.substr(colon + 1, eq - colon - 1), s.substr(eq + 1)});
  }
  for (const int64_t P : o.config.pairs)
    if (P < 1 || P > o.config.keys)
      throw Error(cat("--pairs: ", P, " pairs need as many distinct keys; expected 1 to --keys (", o.config.keys, ")"));
  if (o.config.d_model % o.config.heads)
    throw Error(cat("--d-model: ", o.config.d_model, " is not a multiple of --heads (", o.config.heads, ")"));
  int width = 24;  // the architecture column: the longest row name, a --set shown in it included
  for (const study::RecallArch& a : study::recall_archs(o.config)) {  // throws for an unknown row
    width = std::max(width, int(study::recall_label(o.config, a.name).size()));
    if (!a.trainable && !o.json) std::printf("%-24s not trained: %s\n", a.name.c_str(), a.why.c_str());
  }
  if (!o.json) std::printf("%-*s %6s %8s %9s %11s %13s %8s\n", width, "architecture", "pairs", "seq len", "accuracy",
                           "final loss", "state bytes", "seconds");
  const auto rows = study::run_recall(o.config, [&](const study::RecallRow& r) {
    if (o.json) return;
    std::printf("%-*s %6lld %8lld %9.3f %11.4f %13zu %8.1f\n", width, r.arch.c_str(), (long long)r.pairs,
                (long long)r.seq_len, r.accuracy, r.final_loss, r.state_bytes, r.seconds);
    std::fflush(stdout);
  });
  nlohmann::json j = nlohmann::json::array();
  std::vector<plot::PlotSeries> series;
  for (const study::RecallRow& r : rows) {
    j.push_back({{"arch", r.arch}, {"pairs", r.pairs}, {"seq_len", r.seq_len}, {"batch", r.batch},
                 {"accuracy", r.accuracy}, {"final_loss", r.final_loss}, {"state_bytes", r.state_bytes},
                 {"seconds", r.seconds}});
    if (series.empty() || series.back().label != r.arch) {
      series.emplace_back();
      series.back().label = r.arch;
    }
    series.back().points.emplace_back(double(r.pairs), r.accuracy);
  }
  if (o.json) std::printf("%s\n", j.dump().c_str());
  if (o.out.empty()) return;
  std::filesystem::create_directories(o.out);
  plot::PlotSpec spec;
  spec.title = "MQAR: accuracy vs key-value pairs";
  spec.x_label = "key-value pairs in the sequence";
  spec.y_label = "recall accuracy";
  spec.log_x = true, spec.log_x_base = 2, spec.y_min = 0, spec.y_max = 1, spec.id = "recall";
  std::ofstream(std::filesystem::path(o.out) / "recall.svg") << plot::svg_line_plot(spec, series) << "\n";
  std::ofstream(std::filesystem::path(o.out) / "recall.json") << j.dump(2) << "\n";
  if (!o.json) std::printf("wrote %s/recall.svg and recall.json\n", o.out.c_str());
}

}  // namespace

void add_study(CLI::App& app) {
  static StudyOpts o;
  auto* study = app.add_subcommand("study", "training-free experiments that measure the lineage's claims");
  study->require_subcommand(1);
  auto* cmd = study->add_subcommand(
      "memory", "capacity, repeated keys and forgetting of the write rules (additive, delta, gated delta, KDA), "
                "measured through the engine's delta-rule kernel");
  add_threads_option(*cmd);
  cmd->add_option("--dims", o.config.dims, "comma-separated head widths D (default 64,128)")
      ->delimiter(',')
      ->check(even_dim());
  cmd->add_option("--ratios", o.config.ratios, "comma-separated loads N/D (default 0.25,0.5,1,2,4,8)")
      ->delimiter(',')
      ->check(positive_ratio());
  cmd->add_option("--trials", o.config.trials, "independent trials (heads) averaged (default 4)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--seed", o.config.seed, "seed of the random keys and values (default 0)")->check(whole_number());
  cmd->add_option("--out", o.out, "write memory.html, memory.json and the SVG plots into this directory");
  cmd->add_flag("--json", o.json, "print the results as one JSON object instead of the tables");
  cmd->callback([] { run_study(o); });

  static RecallOpts r;
  auto* rec = study->add_subcommand(
      "recall", "multi-query associative recall (MQAR): each row of the lineage trained at one width, accuracy vs "
                "key-value pairs");
  add_threads_option(*rec);
  rec->add_option("--pairs", r.config.pairs, "comma-separated key-value pairs per sequence (default 8,16,32,64)")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  rec->add_option("--archs", r.config.archs, "rows to train (default: every row with a backward)")->delimiter(',');
  rec->add_option("--d-model", r.config.d_model, "model width (default 64)")->check(CLI::Range(8, 4096));
  rec->add_option("--layers", r.config.layers, "layers (default 2)")->check(CLI::Range(1, 64));
  rec->add_option("--heads", r.config.heads, "heads (default 2)")->check(CLI::Range(1, 64));
  rec->add_option("--keys", r.config.keys, "key vocabulary (default 64)")->check(CLI::Range(1, 100000));
  rec->add_option("--values", r.config.values, "value vocabulary (default 64)")->check(CLI::Range(1, 100000));
  rec->add_option("--steps", r.config.steps, "training steps per model (default 300)")->check(CLI::Range(1, 1000000));
  rec->add_option("--batch", r.config.batch, "sequences per step (default 16)")->check(CLI::Range(1, 4096));
  rec->add_option("--tokens-per-step", r.config.tokens_per_step,
                  "instead of --batch: max(1, N / (4 x pairs)) sequences per step, the same tokens at every P")
      ->check(CLI::Range(1, 1 << 24));
  rec->add_option("--lr", r.config.lr, "peak learning rate (default 3e-3)")->check(CLI::PositiveNumber);
  rec->add_option("--decay-scale", r.config.decay_scale,
                  "the gated rows' initial decay rate A = exp(A_log) as fla's U(1, 16) times this (default 1)")
      ->check(CLI::Range(1e-6, 1e6));
  rec->add_option("--set", r.set,
                  "ROW:FIELD=VALUE: replace one field of a row's config.json (VALUE as JSON), e.g. "
                  "'Gated DeltaNet:use_gate=false'; repeatable; the row's name in the results shows it");
  rec->add_option("--eval", r.config.eval_sequences, "held-out sequences scored (default 64)")->check(CLI::Range(1, 100000));
  rec->add_option("--seed", r.config.seed, "seed of the weights and the sequences")->check(whole_number());
  rec->add_option("--out", r.out, "write recall.svg and recall.json into this directory");
  rec->add_option("--save-models", r.config.save_dir,
                  "write each trained model into this directory (ROW-pP: config.json, model.safetensors) and "
                  "repeated-key-pP.tokens, an MQAR sequence with a repeated key, for lineage trace (docs/trace.md)");
  rec->add_flag("--json", r.json, "print the rows as one JSON array instead of the table");
  rec->callback([] { run_recall(r); });
}

}  // namespace lineage::app
