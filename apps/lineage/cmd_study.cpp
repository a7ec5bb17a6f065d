// lineage study: training-free experiments on the lineage's claims. `study memory` writes random
// key-value pairs through each write rule of the delta-rule family and measures what comes back
// (capacity, a repeated key, forgetting); the library side is train/study_memory.h.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common.h"
#include "lineage/core/error.h"
#include "lineage/train/study_memory.h"

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

struct Opts {
  train::MemoryStudyConfig config;
  std::string out;
  bool json = false;
};

void check(const Opts& o) {
  for (int64_t D : o.config.dims)
    for (double r : o.config.ratios)
      if (std::llround(r * double(D)) < 1)
        throw Error(cat("--ratios ", r, " at D = ", D, " (--dims) writes no pair: expected N/D · D >= 1"));
}

void run(const Opts& o) {
  check(o);
  const train::MemoryStudy s = train::run_memory_study(o.config);
  std::vector<std::string> files;
  if (!o.out.empty()) files = train::write_memory_study_files(s, o.out);
  if (o.json) {
    nlohmann::json j = train::memory_study_json(s);
    if (!o.out.empty()) j["files"] = files;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s", train::memory_study_text(s).c_str());
    if (!o.out.empty()) {
      std::printf("\nfiles written to %s:\n", o.out.c_str());
      for (const auto& f : files) std::printf("  %s\n", f.c_str());
    }
  }
  std::fprintf(stderr, "lineage study memory: %.2f s\n", s.seconds);
}

}  // namespace

void add_study(CLI::App& app) {
  static Opts o;
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
  cmd->callback([] { run(o); });
}

}  // namespace lineage::app
