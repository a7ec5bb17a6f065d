// Room study/: `lineage study`, the lineage's experiments: what each architecture's memory stores
// and how it overwrites (memory.h, training-free) and what it recalls once trained (this file).
// Uses train and what it uses.
//
// Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology", and the DeltaNet paper's
// recall studies): each row of the lineage trained, at one width, on sequences of P key-value pairs
// followed by queries of those keys; accuracy at the query positions vs P, next to the bytes each
// row's memory holds. `lineage study recall`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lineage::study {

// One field of a row's config.json replaced before the row is built (`--set ROW:FIELD=VALUE`), for
// ablations: Gated DeltaNet without its output gate ("use_gate", "false"), DeltaNet with one.
struct RecallOverride {
  std::string row, field;
  std::string value;  // JSON text: false, 0.5, "silu", [1, 2]
};

struct RecallConfig {
  int64_t d_model = 64, layers = 2, heads = 2;
  std::vector<int64_t> pairs{8, 16, 32, 64};  // key-value pairs per sequence (P)
  int64_t keys = 64, values = 64;             // vocabulary: a separator, keys, values
  int64_t batch = 16, steps = 300;
  // > 0: sequences per step max(1, tokens_per_step / 4P) instead of `batch`, so that every P sees the
  // same number of tokens (and queries) per step.
  int64_t tokens_per_step = 0;
  double lr = 3e-3;
  // The gated rows' decay rates at the start: A = exp(A_log) is fla's U(1, 16) times this (A_log +=
  // log of it). A per-token decay of exp(−A·softplus(·)) ≈ exp(−A·dt) with dt in [1e-3, 0.1]: at 1,
  // a 2-head model at this width forgets within the sequence before it learns to hold a pair.
  double decay_scale = 1.0;
  int64_t eval_sequences = 64;
  uint64_t seed = 1;
  std::vector<std::string> archs;  // empty: every row that has a backward
  std::vector<RecallOverride> overrides;
  // Non-empty: each trained model is written here as a Hugging Face directory named after its row and
  // P ("deltanet-p16": config.json, model.safetensors), with repeated-key-p16.tokens beside them (one
  // MQAR sequence whose last pair repeats the first pair's key with another value; its ids as
  // `lineage trace --tokens` takes them).
  std::string save_dir;
};

struct RecallRow {
  std::string arch;        // "softmax attention", "DeltaNet", ...; "Gated DeltaNet [use_gate=false]" overridden
  int64_t pairs = 0, seq_len = 0, batch = 0;  // batch: sequences per training step
  double accuracy = 0;     // argmax at the query positions equal to the key's value
  double final_loss = 0;   // training loss of the last step
  size_t state_bytes = 0;  // the model's per-sequence memory after seq_len tokens
  double seconds = 0;
};

// The rows `archs` may name, in lineage order, and whether each can be trained today. Throws Error
// for a row in `archs` or `overrides` that does not exist, or an override whose value is not JSON.
struct RecallArch {
  std::string name;
  bool trainable = false;
  std::string why;  // when not: the layer without a backward
};
std::vector<RecallArch> recall_archs(const RecallConfig& c);

// A row's name as the results give it: with the fields that `overrides` replace in it,
// "Gated DeltaNet [use_gate=false]".
std::string recall_label(const RecallConfig& c, const std::string& row);

// One MQAR batch: `count` sequences of length 4·P: P pairs (key, value), then P queries (each key
// once, in random order, at even offsets of the second half, with filler 0 between). inputs and
// targets [count, 4P]; a target is the value at a query's position and −1 elsewhere.
void mqar_batch(int64_t count, int64_t pairs, int64_t keys, int64_t values, uint64_t seed,
                std::vector<int32_t>& inputs, std::vector<int32_t>& targets);

// The directory name save_dir gives a row: lower case, words joined by '-', "-p" and P.
std::string recall_model_dir(const std::string& row, int64_t pairs);

// An MQAR sequence of `pairs` pairs (mqar_batch's first, from `seed`) whose last pair's key is the
// first pair's with another value: a repeated key, the delta rule's overwrite against the additive
// rule's blend.
std::vector<int32_t> repeated_key_sequence(int64_t pairs, int64_t keys, int64_t values, uint64_t seed);

// Trains a fresh model per (arch, P) and measures it on held-out sequences; `progress` is called
// after each row.
std::vector<RecallRow> run_recall(const RecallConfig& c, const std::function<void(const RecallRow&)>& progress = {});

}  // namespace lineage::study
