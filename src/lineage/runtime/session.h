// A session: one sequence's state plus reusable scratch, over a model it does not own.
#pragma once

#include <span>
#include <vector>

#include "lineage/model/model.h"

namespace lineage::runtime {

class Session {
 public:
  explicit Session(const model::Model& m);

  // Feeds any number of tokens (any split gives the same result, beyond float rounding). Returns
  // the logits of the last token [V], or of every fed token [T, V] when all_positions is set.
  std::span<const float> prefill(std::span<const int32_t> tokens, bool all_positions = false);
  // Feeds one token; returns its logits [V].
  std::span<const float> decode(int32_t token);

  int64_t position() const { return state_.position; }
  const model::SequenceState& state() const { return state_; }
  // Continues from a snapshot taken with state().clone() (on this model). The snapshot is copied
  // into the session's own buffers where they are large enough (a KV cache that already held that
  // many positions), so restoring touches no new pages; the snapshot stays as it was.
  void restore(const model::SequenceState& snapshot);
  void reset();  // an empty sequence again; buffers are kept, so no page is faulted in twice
  void set_trace(layers::Trace trace) { trace_ = std::move(trace); }
  const model::Model& model() const { return model_; }

 private:
  const model::Model& model_;
  model::SequenceState state_;
  layers::Scratch scratch_;
  std::vector<float> logits_;
  layers::Trace trace_;
};

}  // namespace lineage::runtime
