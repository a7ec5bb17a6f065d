// A session: one sequence over a model it does not own, the simple API as a thin layer over a
// one-slot state pool: each prefill or decode is a step of one sequence.
#pragma once

#include <span>
#include <vector>

#include "lineage/model/model.h"
#include "lineage/model/state_pool.h"
#include "lineage/model/workspace.h"

namespace lineage::runtime {

class Session {
 public:
  explicit Session(const model::Model& m);

  // Feeds any number of tokens (any split gives the same result, beyond float rounding). Returns
  // the logits of the last token [V], or of every fed token [T, V] when all_positions is set.
  std::span<const float> prefill(std::span<const int32_t> tokens, bool all_positions = false);
  // Feeds one token; returns its logits [V].
  std::span<const float> decode(int32_t token);

  int64_t position() const { return pool_.position(slot_); }
  // Every token fed since the start (or the restored snapshot's tokens), oldest first.
  std::span<const int32_t> tokens() const { return tokens_; }
  const model::SequenceState& state() const { return pool_.state(slot_); }
  // Continues from a snapshot taken with state().clone() (on this model). The snapshot is copied
  // into the session's own buffers where they are large enough (a KV cache that already held that
  // many positions), so restoring touches no new pages; the snapshot stays as it was. `tokens`: the
  // ids the snapshot was fed (tokens() after), when known.
  void restore(const model::SequenceState& snapshot, std::span<const int32_t> tokens = {});
  void reset();  // an empty sequence again; buffers are kept, so no page is faulted in twice
  void set_trace(layers::Trace trace) { trace_ = std::move(trace); }
  // The numerics of this session's forwards (the model's options by default).
  void set_options(const layers::Options& options) { options_ = options; }
  const layers::Options& options() const { return options_; }
  const model::Model& model() const { return model_; }
  const model::Workspace& workspace() const { return ws_; }

 private:
  const model::Model& model_;
  model::StatePool pool_;
  int32_t slot_;
  layers::Options options_;
  layers::Step step_;
  model::Workspace ws_;
  std::vector<float> logits_;
  std::vector<int32_t> tokens_;
  layers::Trace trace_;
};

}  // namespace lineage::runtime
