// The BPE merge loops (Sennrich et al. 2016; GPT-2 encoder.py `bpe`): merge the adjacent pair of
// lowest rank, leftmost first, until none is left. Same order as huggingface/tokenizers word.rs for
// merges.txt ranks, and as openai/tiktoken byte_pair_merge for the ranks of tiktoken.model.
#include <queue>

#include "lineage/core/error.h"
#include "lineage/tokenizer/bpe_model.h"

namespace lineage::tokenizer {
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

// A part of a word in tiktoken_merge: the bytes [start, start of next).
struct Part {
  uint32_t start;
  int32_t prev;  // -1 at the start
  int32_t next;  // -1 at the end
  bool alive;
};

struct SpanCandidate {
  int32_t rank;
  int32_t pos;   // index of the left part (its byte offset), so ties go leftmost
  uint32_t end;  // end of the right part when queued; a different end now means the pair changed
  bool operator>(const SpanCandidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void tiktoken_merge(const StringMap<int32_t>& ranks, std::string_view word, std::vector<int32_t>& ids) {
  const int32_t n = int32_t(word.size());
  // Parts are indexed by their first byte, so a part's index is also its place in the text.
  std::vector<Part> parts(word.size());
  for (int32_t i = 0; i < n; ++i) parts[i] = {uint32_t(i), i - 1, i + 1 < n ? i + 1 : -1, true};
  auto end_of = [&](int32_t p) { return parts[p].next < 0 ? uint32_t(n) : parts[parts[p].next].start; };
  auto rank_of = [&](uint32_t begin, uint32_t end) {
    const auto it = ranks.find(word.substr(begin, end - begin));
    return it == ranks.end() ? -1 : it->second;
  };

  std::priority_queue<SpanCandidate, std::vector<SpanCandidate>, std::greater<>> queue;
  auto offer = [&](int32_t left) {
    const int32_t right = parts[left].next;
    if (right < 0) return;
    const uint32_t end = end_of(right);
    const int32_t rank = rank_of(parts[left].start, end);
    if (rank >= 0) queue.push({rank, left, end});
  };
  for (int32_t i = 0; i + 1 < n; ++i) offer(i);

  while (!queue.empty()) {
    const SpanCandidate top = queue.top();
    queue.pop();
    Part& left = parts[top.pos];
    if (!left.alive || left.next < 0 || end_of(left.next) != top.end) continue;  // stale
    Part& right = parts[left.next];
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) parts[left.next].prev = top.pos;
    if (left.prev >= 0) offer(left.prev);
    offer(top.pos);
  }

  for (int32_t p = n > 0 ? 0 : -1; p >= 0; p = parts[p].next) {
    const int32_t rank = rank_of(parts[p].start, end_of(p));
    LINEAGE_CHECK(rank >= 0, "tiktoken_merge: part of \"", word, "\" at byte ", parts[p].start, " is not a token");
    ids.push_back(rank);
  }
}

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

}  // namespace lineage::tokenizer
