// The step (which tokens of which sequences one forward runs) and the options of a call: what every
// layer's forward takes as its `Call`.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace lineage::layers {

// The unit of every forward: N tokens from B sequences. Sequence b owns tokens
// [seq_begin[b], seq_begin[b + 1]) (fla's cu_seqlens), continues the state in pool slot slots[b] and
// starts at position starts[b]. A prefill piece and single decode tokens of other sequences may
// share one step; a slot appears at most once. The vectors keep their capacity across clear(), so
// building a step each decode round allocates nothing once warm.
struct Step {
  std::vector<int32_t> tokens;        // [N]
  std::vector<int64_t> seq_begin{0};  // [B + 1], seq_begin[0] = 0, seq_begin[B] = N
  std::vector<int32_t> slots;         // [B]
  std::vector<int64_t> starts;        // [B]

  void clear() {
    tokens.clear(), slots.clear(), starts.clear();
    seq_begin.assign(1, 0);
  }
  // Appends sequence `slot` at position `start` with `toks` (at least one).
  void add(int32_t slot, int64_t start, std::span<const int32_t> toks) {
    tokens.insert(tokens.end(), toks.begin(), toks.end());
    seq_begin.push_back(int64_t(tokens.size()));
    slots.push_back(slot);
    starts.push_back(start);
  }
  int64_t n_tokens() const { return int64_t(tokens.size()); }
  int64_t n_seqs() const { return int64_t(slots.size()); }
  int64_t begin(int64_t b) const { return seq_begin[size_t(b)]; }
  int64_t length(int64_t b) const { return seq_begin[size_t(b) + 1] - seq_begin[size_t(b)]; }
};

// Which delta-rule kernel a forward uses: Auto picks the recurrent one for sequences shorter than
// chunk_threshold(K) and the chunked one otherwise. Tests force either to compare them.
enum class DeltaRulePath : uint8_t { Auto, Recurrent, Chunked };

// Which form MLA attends in: Auto takes the explicit (expanded keys and values) form for sequences of
// at least kMlaExplicitMin tokens of a step and the absorbed (latent-space) form for shorter ones.
// Tests force either to compare them.
enum class MlaPath : uint8_t { Auto, Explicit, Absorbed };

// Options that change the numerics of a forward. They belong to the model (Model::options) or to
// one call, never to the process, so two models or two requests can differ in one process.
struct Options {
  DeltaRulePath delta_rule_path = DeltaRulePath::Auto;
  MlaPath mla_path = MlaPath::Auto;
  // BF16 weights multiplied with bf16 dot products (x rounded to bf16 once per product) where the
  // CPU has AVX512_BF16; false: widened to f32, exact f32 products (the CLI's --bf16-exact).
  bool bf16_dot = true;
};

// What one forward call hands every layer: the step and the options.
struct Call {
  const Step& step;
  const Options& options;
};

}  // namespace lineage::layers
