#include "lineage/runtime/prefix_cache.h"

#include <algorithm>

#include "lineage/core/error.h"
#include "lineage/model/state_pool.h"

namespace lineage::runtime {

namespace {

bool is_recurrent(const model::MixerState& s) { return std::holds_alternative<layers::DeltaRule::State>(s); }

// The recurrent layers' state only: KV layers are left empty (an entry's rows serve them).
model::SequenceState recurrent_only(const model::SequenceState& s) {
  model::SequenceState out;
  out.position = s.position;
  for (const auto& layer : s.layers)
    out.layers.push_back(is_recurrent(layer) ? model::MixerState(std::get<layers::DeltaRule::State>(layer).clone())
                                             : std::visit([](const auto& x) { return model::MixerState(std::decay_t<decltype(x)>{}); }, layer));
  return out;
}

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  return size_t(std::mismatch(a.begin(), a.begin() + int64_t(n), b.begin()).first - a.begin());
}

}  // namespace

PrefixCache::PrefixCache(const model::Model& m, PrefixCacheOptions options)
    : model_(m), options_(options), recurrent_(!model::truncatable(m)) {
  if (options_.checkpoint_every < 1)
    throw Error(cat("--checkpoint-every: expected a number of tokens >= 1, found ", options_.checkpoint_every));
}

int64_t PrefixCache::restore(std::span<const int32_t> tokens, model::SequenceState& state) {
  ++stats_.lookups;
  if (tokens.size() < 2 || entries_.empty()) return 0;
  const size_t usable = tokens.size() - 1;
  Entries::iterator best = entries_.end();
  size_t best_len = 0;
  const model::SequenceState* best_checkpoint = nullptr;
  for (auto e = entries_.begin(); e != entries_.end(); ++e) {
    const size_t c = std::min(common_prefix(e->tokens, tokens), usable);
    size_t len = c;
    const model::SequenceState* cp = nullptr;
    if (recurrent_ && c < e->tokens.size()) {  // inside the entry: the nearest checkpoint at or before c
      auto it = e->checkpoints.at.upper_bound(int64_t(c));
      if (it == e->checkpoints.at.begin()) continue;
      --it;
      len = size_t(it->first);
      cp = &it->second;
    }
    if (len > best_len) best = e, best_len = len, best_checkpoint = cp;
  }
  if (best_len == 0) return 0;
  state.assign(best->state);
  if (best_len < best->tokens.size()) model::set_length(model_, state, int64_t(best_len));  // KV rows cut
  if (best_checkpoint)
    for (size_t i = 0; i < state.layers.size(); ++i)
      if (is_recurrent(state.layers[i]))
        std::get<layers::DeltaRule::State>(state.layers[i]).assign(std::get<layers::DeltaRule::State>(best_checkpoint->layers[i]));
  state.position = int64_t(best_len);
  entries_.splice(entries_.begin(), entries_, best);  // most recently used
  ++stats_.hits;
  stats_.cached_tokens += int64_t(best_len);
  return int64_t(best_len);
}

void PrefixCache::checkpoint(const model::SequenceState& state, Checkpoints& into) const {
  if (recurrent_ && options_.budget_bytes > 0) into.at.insert_or_assign(state.position, recurrent_only(state));
}

size_t PrefixCache::entry_bytes(const Entry& e) const {
  size_t n = e.state.bytes() + e.tokens.size() * sizeof(int32_t);
  for (const auto& [pos, s] : e.checkpoints.at) n += s.bytes();
  return n;
}

void PrefixCache::commit(std::span<const int32_t> tokens, const model::SequenceState& state, Checkpoints checkpoints) {
  LINEAGE_CHECK(int64_t(tokens.size()) == state.position, "PrefixCache::commit: one token per position");
  if (options_.budget_bytes == 0 || tokens.empty()) return;
  const auto account = [&](Entry& e) {
    stats_.bytes -= e.bytes;
    e.checkpoints.at.erase(e.checkpoints.at.lower_bound(int64_t(e.tokens.size())), e.checkpoints.at.end());
    e.bytes = entry_bytes(e);
    stats_.bytes += e.bytes;
  };
  // An entry that already holds these tokens and more: its rows cover this sequence; the recurrent
  // layers gain this end (and the checkpoints) as checkpoints.
  for (auto e = entries_.begin(); e != entries_.end(); ++e) {
    if (e->tokens.size() < tokens.size() || common_prefix(e->tokens, tokens) < tokens.size()) continue;
    if (recurrent_) {
      checkpoints.at.insert_or_assign(int64_t(tokens.size()), recurrent_only(state));
      e->checkpoints.at.merge(checkpoints.at);
      account(*e);
    }
    entries_.splice(entries_.begin(), entries_, e);
    evict();
    return;
  }
  Entry n{{tokens.begin(), tokens.end()}, state.clone(), std::move(checkpoints), 0};
  for (auto e = entries_.begin(); e != entries_.end();) {  // entries this one extends fold into it
    if (e->tokens.size() < tokens.size() && common_prefix(e->tokens, tokens) == e->tokens.size()) {
      if (recurrent_) {
        n.checkpoints.at.emplace(int64_t(e->tokens.size()), recurrent_only(e->state));
        n.checkpoints.at.merge(e->checkpoints.at);
      }
      stats_.bytes -= e->bytes;
      e = entries_.erase(e);
    } else {
      ++e;
    }
  }
  entries_.push_front(std::move(n));
  account(entries_.front());
  evict();
}

void PrefixCache::evict() {
  while (stats_.bytes > options_.budget_bytes && !entries_.empty()) {
    stats_.bytes -= entries_.back().bytes;
    entries_.pop_back();
    ++stats_.evictions;
  }
  stats_.entries = int64_t(entries_.size());
}

void PrefixCache::clear() {
  entries_.clear();
  stats_.bytes = 0;
  stats_.entries = 0;
}

}  // namespace lineage::runtime
