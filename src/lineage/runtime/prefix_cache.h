// The prefix cache: states of finished (or interrupted) sequences kept by their token ids, so a new
// request that starts with the same tokens continues from there instead of from zero.
//   KV caches and MLA latents depend only on their prefix, so an entry's rows serve any shorter
//   prefix of its tokens: cut to length, they are exact.
//   Recurrent layers (S, conv tails) cannot be rolled back: an entry keeps checkpoints of them every
//   `checkpoint_every` positions and at its end, and a request that diverges inside an entry resumes
//   from the nearest checkpoint at or before the divergence.
// A model with only KV layers resumes at the exact common prefix. Entries are held within a budget
// of bytes and evicted least recently used first. Not thread-safe: one owner (a session or the
// serving engine's thread).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <span>
#include <vector>

#include "lineage/model/model.h"
#include "lineage/model/state_pool.h"

namespace lineage::runtime {

struct PrefixCacheOptions {
  size_t budget_bytes = size_t(256) << 20;  // states, checkpoints and token ids; 0 = off
  int64_t checkpoint_every = 256;           // recurrent layers' checkpoint interval, in positions
};

struct PrefixCacheStats {
  int64_t lookups = 0, hits = 0, cached_tokens = 0, evictions = 0, entries = 0;
  size_t bytes = 0;
};

class PrefixCache {
 public:
  PrefixCache(const model::Model& m, PrefixCacheOptions options);

  // Finds the longest cached prefix of `tokens` that a sequence can resume from, leaving at least
  // one token to feed (the logits of the last one are needed), and copies that state into `state`.
  // Returns its length; 0 (and `state` untouched) when nothing is cached for these tokens.
  int64_t restore(std::span<const int32_t> tokens, model::SequenceState& state);

  // Keeps a sequence's state for `tokens` (state.position of them): a checkpoint of its recurrent
  // layers, part of the entry commit() makes later. Called at each multiple of checkpoint_every
  // while a prompt is fed; a no-op for a model without recurrent layers.
  struct Checkpoints {
    std::map<int64_t, model::SequenceState> at;  // position → the recurrent layers' state there
  };
  void checkpoint(const model::SequenceState& state, Checkpoints& into) const;
  // Stores the sequence (the tokens fed, its state after them, and its checkpoints) as an entry. An
  // entry whose tokens this one extends is folded into it; one that extends this one takes its end
  // as a checkpoint.
  void commit(std::span<const int32_t> tokens, const model::SequenceState& state, Checkpoints checkpoints);

  // Whether checkpoints are kept at all (a model with recurrent layers, a cache that is on), and
  // whether `position` is one.
  bool keeps_checkpoints() const { return options_.budget_bytes > 0 && recurrent_; }
  bool wants_checkpoint(int64_t position) const {
    return keeps_checkpoints() && position > 0 && position % options_.checkpoint_every == 0;
  }
  int64_t checkpoint_every() const { return options_.checkpoint_every; }
  const PrefixCacheStats& stats() const { return stats_; }
  void clear();

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    model::SequenceState state;  // after all of tokens
    Checkpoints checkpoints;     // recurrent layers only, at positions < tokens.size()
    size_t bytes = 0;
  };
  using Entries = std::list<Entry>;  // most recently used first
  size_t entry_bytes(const Entry& e) const;
  void evict();

  const model::Model& model_;
  PrefixCacheOptions options_;
  bool recurrent_;
  Entries entries_;
  PrefixCacheStats stats_;
};

}  // namespace lineage::runtime
