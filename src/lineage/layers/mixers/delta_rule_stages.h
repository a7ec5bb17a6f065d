// The stages of DeltaRule's forward, shared by inference (delta_rule.cpp) and training
// (delta_rule_train.cpp, which keeps each stage's input and runs their backward). Internal to the
// mixer: nothing outside layers/mixers includes it.
#pragma once

#include <span>

#include "lineage/core/parallel.h"
#include "lineage/kernels/delta_rule.h"
#include "lineage/layers/mixers/delta_rule.h"

namespace lineage::layers::delta_rule_stages {

// What every stage of one forward shares: the mixer, the step and its options, the per-sequence
// states, the buffers, and the widths of the packed q | k | v rows.
struct Pass {
  const DeltaRule& m;
  const Call& call;
  std::span<DeltaRule::State* const> states;
  DeltaRule::Buffers& buf;
  int64_t N = 0, H = 0, KVH = 0, HV = 0, K = 0, V = 0;
  int64_t Cq = 0, Ck = 0, Cv = 0, C = 0;  // channels of q, k, v as projected, and their sum (the short conv's row)
  int64_t decay_width = 0;                // HV, or HV·K for the per-channel gate
  bool one_token = false;                 // one sequence, one token: every projection in one GEMV region
  float *raw = nullptr, *qkv = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *beta = nullptr, *decay = nullptr,
        *low_decay = nullptr, *gate = nullptr, *low_gate = nullptr, *core = nullptr;
  // Where a stage that works in place keeps its input: the same buffer as its output for inference;
  // separate (DeltaRule::Saved) for training, whose backward reads them. decay_in: the decay's
  // projection, then + dt_bias; gate_in: the output gate before its activation; q_mapped, k_mapped:
  // q and k before their normalization (null: not kept); normed: the normed, gated output o_proj reads.
  float *decay_in = nullptr, *gate_in = nullptr, *q_mapped = nullptr, *k_mapped = nullptr, *normed = nullptr;

  kernels::Weight lin(const kernels::Matrix& w) const { return w.view(call.options.bf16_dot); }
  bool per_channel() const { return m.config.per_channel(); }
  bool low_rank_decay() const { return m.config.decay == DeltaRule::DecayInput::PerChannelLowRank; }
  bool swish_gate() const { return m.config.out_gate == DeltaRule::OutGate::Swish; }
  bool sigmoid_gate() const { return m.config.out_gate == DeltaRule::OutGate::Sigmoid; }
  bool low_rank_gate() const { return m.config.out_gate == DeltaRule::OutGate::SigmoidLowRank; }
  bool has_beta() const { return m.config.delta && m.config.has_beta; }
};

Pass make_pass(const DeltaRule& m, const Call& call, std::span<DeltaRule::State* const> states,
               DeltaRule::Buffers& buf);

// Runs fn(r0, r1) over rows split across the threads once there are enough of them (prefill); each
// row costs about `work` operations.
inline void over_rows(int64_t rows, int64_t work, RangeFn fn) { parallel_for(rows, fn, grain_for(work)); }

void split_heads(const Pass& p, const float* qkv, float* q, float* k, float* v);
kernels::DeltaRuleArgs seq_args(const Pass& p, int64_t b, float* S, float* z);

// The stages in order (delta_rule.cpp says what each computes).
void project(Pass& p, const float* x);
void convolve(Pass& p);
void heads(Pass& p, const Trace& trace);
void gates(Pass& p, const Trace& trace);
void recur(Pass& p, const Trace& trace);
void output(Pass& p, float* y, const Trace& trace);

}  // namespace lineage::layers::delta_rule_stages
