// A training-free study of the delta-rule family's write rules (the seed's sections on linear
// attention, DeltaNet, Gated DeltaNet and KDA): random unit key-value pairs written into one head's
// state S [D, D] and read back, writes and reads both through kernels::delta_rule_recurrent.
// It measures capacity (additive fills and corrupts), overwriting a repeated key (delta replaces,
// additive blends) and forgetting (scalar vs per-channel decay). Setup and results: docs/study.md.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace lineage::study {

// The four write rules, all β = 1 and scale 1 (S starts at 0; k, v unit vectors):
//   additive     S += k vᵀ                              (linear attention without its normalizer)
//   delta        S += k (v − Sᵀk)ᵀ                      (DeltaNet)
//   gated-delta  S ← α S, then the delta write          (Gated DeltaNet, one scalar α)
//   kda          S ← diag(α) S, then the delta write    (KDA, one α per key channel)
enum class WriteRule : uint8_t { Additive, Delta, GatedDelta, PerChannel };
inline constexpr WriteRule kWriteRules[] = {WriteRule::Additive, WriteRule::Delta, WriteRule::GatedDelta,
                                            WriteRule::PerChannel};
const char* rule_name(WriteRule r);    // "additive", "delta", "gated-delta", "kda"
const char* rule_write(WriteRule r);   // "S += k vT", ...
const char* rule_forget(WriteRule r);  // "never", "by overwriting a key", "scalar decay", "per-channel decay"

// The decays, as lifetimes τ in writes, given as multiples of D (log α = −1 / (τ·D) per write; reads
// do not decay). kda: key channels [0, D/2) fast, [D/2, D) slow. gated-delta: one scalar whose log α
// is the mean of kda's per-channel ones (the same product of decay factors over the channels, so the
// same total forgetting, only spread evenly): 1/τ = (1/τ_fast + 1/τ_slow) / 2.
struct DecaySetup {
  double fast_lifetime = 0.25, slow_lifetime = 16;
  double scalar_lifetime() const { return 2 / (1 / fast_lifetime + 1 / slow_lifetime); }
};

struct MemoryStudyConfig {
  std::vector<int64_t> dims = {64, 128};                 // D = K = V of the head; even, >= 2
  std::vector<double> ratios = {0.25, 0.5, 1, 2, 4, 8};  // N / D; N = round(ratio · D) >= 1
  int trials = 8;                                        // independent heads, averaged
  uint64_t seed = 0;
  DecaySetup decay;
  std::vector<double> between = {0, 0.25, 1};  // repeated key: other pairs between the two writes, × D
  double horizon = 4;                          // forgetting: random writes after the fact, × D
};

// Capacity: N pairs written, then every key read (q = k). accuracy: the share of reads whose nearest
// stored value by cosine is their own; cosine: the mean cosine of a read to its own value. The
// recent_ pair: the same over the newest `recent` = min(N, max(1, D/4)) pairs written only.
struct CapacityResult {
  WriteRule rule{};
  int64_t D = 0, N = 0, recent = 0;
  double ratio = 0, accuracy = 0, cosine = 0, recent_accuracy = 0, recent_cosine = 0;
};

// Repeated key: (k, v1), `between` other random pairs, (k, v2), then k read; mean cosines to v2, v1.
struct RepeatedKeyResult {
  WriteRule rule{};
  int64_t D = 0, between = 0;
  double cos_new = 0, cos_old = 0;
};

// Where a forgetting fact's key lies: in kda's slow channels, in its fast channels, or anywhere.
enum class FactKey : uint8_t { Slow, Fast, Any };
const char* fact_key_name(FactKey k);  // "slow channels", "fast channels", "all channels"

// Forgetting: one fact (k, v) written, then random pairs (keys over all channels); after t of them
// the fact is read: cosine[i] is the mean cosine to v after steps[i] writes. steps_to_half: the first
// measured t whose cosine is below 0.5 (-1: none within the horizon).
struct ForgettingCurve {
  WriteRule rule{};
  int64_t D = 0;
  FactKey key{};
  std::vector<int64_t> steps;
  std::vector<double> cosine;
  int64_t steps_to_half = -1;
};

struct MemoryStudy {
  MemoryStudyConfig config;
  std::vector<CapacityResult> capacity;        // rule-major, then D, then ratio (the config's order)
  std::vector<RepeatedKeyResult> repeated;     // rule-major, then D, then between
  std::vector<ForgettingCurve> forgetting;     // rule-major, then D, then key Slow, Fast, Any
  double seconds = 0;                          // wall time of run_memory_study
};

// Runs the three experiments. Deterministic for a config, for any thread count (the kernel is
// bit-identical across thread counts and every reduction has a fixed order). Contract: the config
// satisfies the comments above (the command checks what users give it).
MemoryStudy run_memory_study(const MemoryStudyConfig& c);

// One capacity trial's pairs: n random unit keys then n random unit values (normalized Gaussians),
// each [n, d] row-major, drawn from Rng(capacity_seed(seed, d, n, trial)). Public so that a test can
// recompute a capacity cell without the kernel.
struct Associations {
  std::vector<float> keys, values;  // [n, d] each
};
uint64_t capacity_seed(uint64_t seed, int64_t d, int64_t n, int trial);
Associations random_associations(uint64_t seed, int64_t n, int64_t d);

// The printed report: the capacity table (one row per rule, D, N/D), the repeated-key table and the
// forgetting table, with the setup in a few lines above them.
std::string memory_study_text(const MemoryStudy& s);
// Everything above as one JSON object: config, decay, capacity, repeated_key, forgetting, seconds.
nlohmann::json memory_study_json(const MemoryStudy& s);
// Writes memory_capacity.svg (accuracy vs N/D), memory_newest.svg (the newest reads' cosine vs N/D),
// memory_forgetting_d<D>.svg (one per D), memory.json and memory.html (self-contained: the plots
// inlined, the tables, the setup) into dir, which is created if missing.
// Returns the paths written; a directory or file that cannot be written is an Error naming it.
std::vector<std::string> write_memory_study_files(const MemoryStudy& s, const std::string& dir);

}  // namespace lineage::study
