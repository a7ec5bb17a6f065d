#include "lineage/model/forward.h"

#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <variant>

#include "lineage/core/error.h"
#include "lineage/kernels/linear.h"
#include "lineage/kernels/matrix.h"
#include "lineage/model/residual.h"

namespace lineage::model {


namespace {

void embed_tokens(const Model& m, const layers::Step& step, float* x, float* pos) {
  const int64_t D = m.config.d_model;
  const bool positions = m.pos_embed.defined() && m.pos_embed.numel();
  for (int64_t b = 0; b < step.n_seqs(); ++b)
    for (int64_t i = 0; i < step.length(b); ++i) {
      const int64_t t = step.begin(b) + i;
      const int64_t token = step.tokens[size_t(t)];
      if (m.embed_blocks.quant.defined()) kernels::decode_rows(m.embed_blocks, token, token + 1, x + t * D);
      else kernels::widen_row(m.embed, token * D, D, x + t * D);
      if (!positions) continue;
      kernels::widen_row(m.pos_embed, (step.starts[size_t(b)] + i) * D, D, pos);
      for (int64_t c = 0; c < D; ++c) x[t * D + c] += pos[c];
    }
}

void check_step(const Model& m, const layers::Step& step, const StatePool& pool) {
  LINEAGE_CHECK(&pool.model() == &m, "the state pool belongs to another model");
  LINEAGE_CHECK(step.seq_begin.size() == step.slots.size() + 1 && step.starts.size() == step.slots.size() &&
                    step.seq_begin.front() == 0 && step.seq_begin.back() == step.n_tokens(),
                "malformed step: ", step.slots.size(), " sequences, ", step.seq_begin.size(), " offsets, ",
                step.n_tokens(), " tokens");
  const int64_t limit = pool.options().ctx > 0 ? pool.options().ctx : m.config.max_positions;
  for (int64_t b = 0; b < step.n_seqs(); ++b) {
    const int32_t slot = step.slots[size_t(b)];
    if (!pool.in_use(slot)) throw Error(cat("step sequence ", b, ": state slot ", slot, " is not in use"));
    for (int64_t c = 0; c < b; ++c)
      if (step.slots[size_t(c)] == slot) throw Error(cat("state slot ", slot, " appears twice in one step"));
    const int64_t p0 = step.starts[size_t(b)], T = step.length(b);
    if (T < 1) throw Error(cat("step sequence ", b, " (slot ", slot, ") has no tokens"));
    if (p0 != pool.position(slot))
      throw Error(cat("step sequence ", b, " starts at position ", p0, ", but slot ", slot, " is at position ",
                      pool.position(slot)));
    for (int64_t i = 0; i < T; ++i) {
      const int32_t tok = step.tokens[size_t(step.begin(b) + i)];
      if (tok < 0 || tok >= m.config.vocab_size)
        throw Error(cat("token id ", tok, " at position ", p0 + i, " is outside the vocabulary [0, ",
                        m.config.vocab_size, ")"));
    }
    if (limit > 0 && p0 + T > limit) {
      if (pool.options().ctx > 0)
        throw Error(cat("context of ", p0 + T, " tokens exceeds the state pool's room of ", limit,
                        " positions per sequence (--ctx)"));
      throw Error(cat("context of ", p0 + T, " tokens exceeds the model's limit of ", limit, " (config.json field ",
                      m.config.max_positions_field, ")"));
    }
  }
}

// Pointers to layer i's state of each sequence of the step.
template <class S>
std::span<S* const> layer_states(std::vector<S*>& out, const layers::Step& step, StatePool& pool, size_t i) {
  out.clear();
  for (const int32_t slot : step.slots) out.push_back(&std::get<S>(pool.state(slot).layers[i]));
  return out;
}

}  // namespace

void forward(const Model& m, const layers::Step& step, StatePool& pool, LogitRows rows, float* logits, Workspace& ws,
             const layers::Trace& trace) {
  forward(m, step, pool, rows, logits, ws, trace, m.options);
}

void forward(const Model& m, const layers::Step& step, StatePool& pool, LogitRows rows, float* logits, Workspace& ws,
             const layers::Trace& trace, const layers::Options& options) {
  const int64_t N = step.n_tokens(), B = step.n_seqs(), D = m.config.d_model;
  if (N == 0) return;
  check_step(m, step, pool);
  const layers::Call call{step, options};
  float* x = ws.x.get(size_t(N) * D);
  float* a = ws.normed.get(size_t(N) * D);
  float* y = ws.out.get(size_t(N) * D);
  // A streamed trunk's units (TrunkSource): 0 the embedding, 1 + 2i and 2 + 2i block i's mixer and
  // ffn, 2L + 1 the final mix and norm, 2L + 2 the head (read ahead from the last ffn on; a step
  // without logits reads no head, and reads the first mixer ahead for the next step).
  TrunkSource* const trunk = m.trunk.get();
  const int64_t L = m.n_layers(), final_unit = 2 * L + 1, head_unit = 2 * L + 2;
  const int64_t after_blocks = rows == LogitRows::None ? 1 : head_unit;
  if (trunk) trunk->enter(0, 1);
  embed_tokens(m, step, x, y);
  if (trunk) trunk->leave(0);
  trace("embed", x, {N, D});

  ResidualStream stream(m, x, N, ws);
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const Block& b = m.blocks[i];
    const int64_t mixer_unit = 2 * int64_t(i) + 1, ffn_unit = mixer_unit + 1;
    if (trunk) trunk->enter(mixer_unit, ffn_unit);
    const layers::Trace tr = trace.on() ? trace.with_prefix("h" + std::to_string(i) + ".") : layers::Trace{};
    layers::forward(b.norm1, stream.input(2 * i, tr), N, a);
    tr(b.names.norm1, a, {N, D});
    std::visit(
        [&](const auto& mixer) {
          using Mixer = std::decay_t<decltype(mixer)>;
          if constexpr (std::is_same_v<Mixer, layers::Attention>)
            forward(mixer, call, a, layer_states(ws.attention_states, step, pool, i), y, ws.attention, tr);
          else if constexpr (std::is_same_v<Mixer, layers::GatedAttention>)
            forward(mixer, call, a, layer_states(ws.attention_states, step, pool, i), y, ws.gated_attention, tr);
          else if constexpr (std::is_same_v<Mixer, layers::Mla>)
            forward(mixer, call, a, layer_states(ws.mla_states, step, pool, i), y, ws.mla, tr);
          else
            forward(mixer, call, a, layer_states(ws.delta_rule_states, step, pool, i), y, ws.delta_rule, tr);
        },
        b.mixer);
    stream.add(2 * i, y);
    if (trunk) trunk->leave(mixer_unit);
    if (trunk) trunk->enter(ffn_unit, int64_t(i) + 1 < L ? ffn_unit + 1 : after_blocks);
    tr("resid_mid", stream.state(), {N, D});
    layers::forward(b.norm2, stream.input(2 * i + 1, tr), N, a);
    tr(b.names.norm2, a, {N, D});
    std::visit(
        [&](const auto& ffn) {
          using Ffn = std::decay_t<decltype(ffn)>;
          if constexpr (std::is_same_v<Ffn, layers::Mlp>) forward(ffn, call, a, y, ws.mlp, tr);
          else if constexpr (std::is_same_v<Ffn, layers::Moe>) forward(ffn, call, a, y, ws.moe, tr);
          else forward(ffn, call, a, y, ws.gated_mlp, tr);
        },
        b.ffn);
    stream.add(2 * i + 1, y);
    if (trunk) trunk->leave(ffn_unit);
    tr("out", stream.state(), {N, D});
  }
  for (int64_t s = 0; s < B; ++s) pool.state(step.slots[size_t(s)]).position += step.length(s);

  if (trunk) trunk->enter(final_unit, after_blocks);
  layers::forward(m.final_norm, stream.output(trace), N, a);
  if (trunk) trunk->leave(final_unit);
  trace(m.names.final_norm.substr(m.names.final_norm.rfind('.') + 1), a, {N, D});
  if (rows == LogitRows::None) return;
  if (trunk) trunk->enter(head_unit, 1);
  const float* head_in = a;
  int64_t n = N;
  if (rows == LogitRows::Last) {  // the last row of each sequence, then one product for all of them
    float* last = ws.head_rows.get(size_t(B) * D);
    for (int64_t s = 0; s < B; ++s)
      std::memcpy(last + s * D, a + (step.begin(s) + step.length(s) - 1) * D, size_t(D) * sizeof(float));
    head_in = last, n = B;
  }
  if (const kernels::Matrix* blocks = m.output_blocks()) kernels::linear(head_in, n, *blocks, nullptr, logits);
  else kernels::linear(head_in, n, {&m.output_weight(), kernels::Layout::OutIn, options.bf16_dot}, nullptr, logits);
  if (trunk) trunk->leave(head_unit);
  trace("logits", logits, {n, m.config.vocab_size});
}

void prepare(Model& m, bool owned) {
  if (m.output_res.defined()) m.output_res.prepare();
  for (Block& b : m.blocks) {
    if (b.attn_res.defined()) b.attn_res.prepare();
    if (b.mlp_res.defined()) b.mlp_res.prepare();
    if (auto* d = std::get_if<layers::DeltaRule>(&b.mixer)) d->prepare();
    if (auto* a = std::get_if<layers::Mla>(&b.mixer)) a->prepare();
    if (auto* e = std::get_if<layers::Moe>(&b.ffn)) e->prepare();
    if (!owned) continue;
    const layers::MatrixVisitor to_out_in = [](kernels::Matrix& w) { kernels::store_out_in(w); };
    std::visit([&](auto& mixer) { mixer.for_each_matrix(to_out_in); }, b.mixer);
    std::visit([&](auto& ffn) { ffn.for_each_matrix(to_out_in); }, b.ffn);
  }
}

}  // namespace lineage::model
