#include "lineage/runtime/session.h"

#include "lineage/core/error.h"

namespace lineage::runtime {

Session::Session(const model::Model& m) : model_(m), state_(m.new_state()) {}

std::span<const float> Session::prefill(std::span<const int32_t> tokens, bool all_positions) {
  const int64_t V = model_.config.vocab_size, T = int64_t(tokens.size());
  if (T == 0) throw Error("prefill needs at least one token");
  logits_.resize(size_t(all_positions ? T : 1) * V);
  model::forward(model_, tokens, state_, all_positions ? model::LogitRows::All : model::LogitRows::Last,
                 logits_.data(), scratch_, trace_);
  return logits_;
}

std::span<const float> Session::decode(int32_t token) { return prefill(std::span<const int32_t>(&token, 1)); }

void Session::restore(const model::SequenceState& snapshot) {
  LINEAGE_CHECK(snapshot.layers.size() == model_.blocks.size(), "snapshot of a different model");
  state_.assign(snapshot);
}

void Session::reset() { state_.clear(); }

}  // namespace lineage::runtime
