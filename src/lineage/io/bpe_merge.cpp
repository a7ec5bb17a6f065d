// The BPE merge loop (Sennrich et al. 2016; GPT-2 encoder.py `bpe`): merge the adjacent pair of
// lowest rank, leftmost first, until none is left. Same order as huggingface/tokenizers word.rs.
#include <queue>

#include "lineage/io/bpe_model.h"

namespace lineage::io {
namespace {

struct Candidate {
  int32_t rank;
  int32_t pos;     // index of the left symbol; positions keep text order, so ties go leftmost
  int32_t new_id;  // what the pair merged into when queued; stale entries no longer match
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

struct Symbol {
  int32_t id;
  int32_t prev;  // -1 at the start
  int32_t next;  // -1 at the end
  bool alive;
};

}  // namespace

void bpe_merge(const std::unordered_map<uint64_t, Merge>& merges, std::vector<int32_t>& symbols) {
  const int32_t n = int32_t(symbols.size());
  if (n < 2) return;
  std::vector<Symbol> sym(n);
  for (int32_t i = 0; i < n; ++i) sym[i] = {symbols[i], i - 1, i + 1 < n ? i + 1 : -1, true};

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto offer = [&](int32_t left) {
    const int32_t right = sym[left].next;
    if (right < 0) return;
    const auto it = merges.find(merge_key(sym[left].id, sym[right].id));
    if (it != merges.end()) queue.push({it->second.rank, left, it->second.id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) offer(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = sym[left.next];
    const auto it = merges.find(merge_key(left.id, right.id));
    if (it == merges.end() || it->second.id != top.new_id) continue;  // the pair changed since queued
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) sym[left.next].prev = top.pos;
    if (left.prev >= 0) offer(left.prev);
    offer(top.pos);
  }

  symbols.clear();
  for (int32_t i = 0; i >= 0; i = sym[i].next) symbols.push_back(sym[i].id);
}

}  // namespace lineage::io
