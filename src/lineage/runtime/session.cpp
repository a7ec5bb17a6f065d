#include "lineage/runtime/session.h"

#include "lineage/core/error.h"
#include "lineage/model/forward.h"
#include "lineage/model/state_pool.h"

namespace lineage::runtime {

Session::Session(const model::Model& m)
    : model_(m), pool_(m, {.slots = 1}), slot_(pool_.acquire()), options_(m.options) {}

std::span<const float> Session::prefill(std::span<const int32_t> tokens, bool all_positions) {
  const int64_t V = model_.config.vocab_size, T = int64_t(tokens.size());
  if (T == 0) throw Error("prefill needs at least one token");
  logits_.resize(size_t(all_positions ? T : 1) * V);
  const int64_t first = position();
  step_.clear();
  step_.add(slot_, first, tokens);
  model::forward(model_, step_, pool_, all_positions ? model::LogitRows::All : model::LogitRows::Last,
                 logits_.data(), ws_, trace_, options_);
  // A NaN or Inf here would become a silent token (argmax picks id 0, sampling the last candidate).
  const int64_t bad = first_non_finite(DType::F32, logits_.data(), int64_t(logits_.size()));
  if (bad >= 0) {
    const int64_t pos = all_positions ? first + bad / V : first + T - 1;
    throw Error(cat("the logits at position ", pos, " (token id ", tokens[size_t(pos - first)], ") hold ",
                    logits_[size_t(bad)], " for token ", bad % V, ": a weight or an activation is not finite; ",
                    "run with --check-tensors to find a damaged weight"));
  }
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  return logits_;
}

std::span<const float> Session::decode(int32_t token) { return prefill(std::span<const int32_t>(&token, 1)); }

void Session::restore(const model::SequenceState& snapshot, std::span<const int32_t> tokens) {
  LINEAGE_CHECK(snapshot.layers.size() == model_.blocks.size(), "snapshot of a different model");
  LINEAGE_CHECK(tokens.empty() || int64_t(tokens.size()) == snapshot.position,
                "restore: the snapshot's tokens must be one per position");
  pool_.state(slot_).assign(snapshot);
  tokens_.assign(tokens.begin(), tokens.end());
}

void Session::reset() {
  pool_.clear(slot_);
  tokens_.clear();
}

}  // namespace lineage::runtime
