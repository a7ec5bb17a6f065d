// Room train/: training: the backward pass through a whole model (backprop.h; each kernel's and
// layer's backward sits beside its forward), AdamW, the training loop of this file with its data
// and checkpoints. Uses runtime, plot and what they use.
//
// The training loop behind `lineage train`: token data with a held-out split, seeded batches,
// gradient accumulation, global-norm clipping, AdamW under a warm-up + cosine schedule, evaluation,
// and checkpoints written as Hugging Face directories with the optimizer state beside them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "lineage/core/dtype.h"
#include "lineage/model/model.h"
#include "lineage/train/adamw.h"
#include "lineage/train/backprop.h"

namespace lineage::tokenizer {
class Tokenizer;
}

namespace lineage::train {

struct TrainConfig {
  int64_t batch = 8;         // sequences per micro-batch (B)
  int64_t seq_len = 256;     // tokens per sequence (T)
  int64_t accum = 1;         // micro-batches per optimizer step
  int64_t steps = 1000;      // optimizer steps in the whole run (the schedule's length)
  int64_t warmup = 100;      // warm-up steps
  double lr = 6e-4, min_lr = 6e-5;
  double grad_clip = 1.0;    // global gradient norm limit; 0 = no clipping
  AdamWConfig adam;
  uint64_t seed = 1;         // batches are a function of (seed, step)
  int64_t eval_every = 100;  // steps between evaluations; 0 = only at the end
  int64_t eval_batches = 8;  // micro-batches of held-out windows per evaluation
  int64_t save_every = 0;    // steps between checkpoints; 0 = only at the end
  DType save_dtype = DType::F32;
};

// A corpus as token ids, split once: the last `val_fraction` of the tokens are held out.
struct TokenData {
  std::vector<int32_t> train, val;
};
// `.bin`: little-endian uint16 ids (nanoGPT's format) for vocabularies up to 65,536, else uint32;
// anything else is UTF-8 text, encoded with `tokenizer`. Errors name the file and what was wrong
// (an id outside the vocabulary, too few tokens for one sequence of either split).
TokenData load_tokens(const std::filesystem::path& file, const tokenizer::Tokenizer* tokenizer, int64_t vocab,
                      double val_fraction, int64_t seq_len);

// The ids of a .bin corpus (the width as load_tokens says); an Error names `file` on a partial id or
// one outside the vocabulary.
std::vector<int32_t> decode_bin(const std::string& bytes, int64_t vocab, const std::filesystem::path& file);

// One row of the loss curve.
struct LogRow {
  int64_t step = 0, tokens = 0;
  double lr = 0, loss = 0, grad_norm = 0;
  std::optional<double> val_loss;
};

// loss.csv as save() writes it (a header, then step,tokens,lr,train_loss,grad_norm,val_loss rows;
// val_loss may be empty); an Error names `file` and the row that is malformed.
std::vector<LogRow> parse_loss_csv(const std::string& text, const std::filesystem::path& file);

class Trainer {
 public:
  Trainer(model::Model& m, const TrainConfig& c, TokenData data);

  // Continues from a checkpoint written by save(): the optimizer's moments, the step and the loss
  // curve so far. Throws Error naming the file when they do not belong to this model.
  void resume(const std::filesystem::path& dir);

  // One optimizer step (accum micro-batches): the row it logs (with val_loss on evaluation steps).
  LogRow step();
  // Mean loss over the held-out windows (eval_batches micro-batches at fixed, evenly spaced offsets).
  double evaluate();
  int64_t steps_done() const { return opt_.steps(); }
  const std::vector<LogRow>& log() const { return log_; }

  // Writes dir/config.json (config_json), model.safetensors (save_dtype), the tokenizer files found
  // in tokenizer_dir, optimizer.safetensors + trainer_state.json (resume) and loss.csv + loss.svg.
  void save(const std::filesystem::path& dir, const std::string& config_json,
            const std::optional<std::filesystem::path>& tokenizer_dir) const;

 private:
  void fill_batch(const std::vector<int32_t>& src, uint64_t stream, int64_t index, std::vector<int32_t>& out) const;
  model::Model& m_;
  TrainConfig c_;
  TokenData data_;
  Backprop bp_;
  std::vector<ParamRef> params_;
  AdamW opt_;
  std::vector<LogRow> log_;
  std::vector<int32_t> batch_;
  int64_t tokens_ = 0;
};

}  // namespace lineage::train
