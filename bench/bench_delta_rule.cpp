// The delta-rule kernels at the presets' size (H = HV = 12, K = V = 64), delta rule on, for each gate:
// one decode step (T = 1, the recurrent kernel; bound by reading and writing the state) and a 4096-token
// sequence (recurrent and chunked; bound by the multiply-adds). The `/K128` rows repeat the per-channel
// gate at Kimi Linear's head size (H = HV = 6, K = V = 128), the `/K256V512` rows the per-head gate at
// the head size of flash-linear-attention's Gated DeltaNet (head_dim 256, expand_v 2; H = HV = 6).
#include <cmath>
#include <string>

#include "bench_support.h"
#include "lineage/kernels/delta_rule.h"
#include "lineage/layers/mixers/delta_rule.h"

namespace lineage::bench {
namespace {

constexpr int64_t kLayers = 12;

struct Heads {
  int64_t H, K, V;
};
constexpr Heads kPreset{12, 64, 64}, kKimi{6, 128, 128}, kGatedDeltaNet{6, 256, 512};

struct Inputs {
  std::vector<float> q, k, v, beta, log_decay, out;
  std::vector<std::vector<float>> states;
};

// q, k unit rows per head (as the layer's L2 norm leaves them), β ∈ (0.1, 0.9), log decay in
// (−0.11, −0.01] per step: values the trained models produce.
Inputs make_inputs(int64_t T, kernels::Gate gate, Heads hd) {
  const int64_t kH = hd.H, kK = hd.K, kV = hd.V;
  Inputs in;
  in.q = random_floats(T * kH * kK, 6);
  in.k = random_floats(T * kH * kK, 7);
  for (auto* x : {&in.q, &in.k})
    for (int64_t r = 0; r < T * kH; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < kK; ++i) ss += double((*x)[r * kK + i]) * (*x)[r * kK + i];
      for (int64_t i = 0; i < kK; ++i) (*x)[r * kK + i] = float((*x)[r * kK + i] / std::sqrt(ss + 1e-6));
    }
  in.v = random_floats(T * kH * kV, 8);
  in.beta = random_floats(T * kH, 9, 0.4f);
  for (auto& b : in.beta) b += 0.5f;
  const int64_t width = gate == kernels::Gate::PerChannel ? kH * kK : kH;
  if (gate != kernels::Gate::None) {
    in.log_decay = random_floats(T * width, 10, 0.05f);
    for (auto& g : in.log_decay) g = -0.06f + g;
  }
  // One state per layer for a decode step, visited in turn as the model does.
  in.states.assign(T == 1 ? size_t(kLayers) : 1, std::vector<float>(static_cast<size_t>(kH * kK * kV), 0.0f));
  in.out.resize(static_cast<size_t>(T * kH * kV));
  return in;
}

const char* gate_label(kernels::Gate g) {
  switch (g) {
    case kernels::Gate::None: return "none";
    case kernels::Gate::PerHead: return "per_head";
    case kernels::Gate::PerChannel: return "per_channel";
  }
  return "?";
}

void bm_delta_rule(benchmark::State& state, kernels::Gate gate, int64_t T, bool chunked, Heads hd) {
  const int64_t kH = hd.H, kK = hd.K, kV = hd.V;
  Inputs in = make_inputs(T, gate, hd);
  kernels::DeltaRuleArgs a;
  a.T = T, a.H = kH, a.HV = kH, a.K = kK, a.V = kV;
  a.gate = gate;
  a.scale = 1.0f / std::sqrt(float(kK));
  a.q = in.q.data(), a.k = in.k.data(), a.v = in.v.data(), a.beta = in.beta.data();
  a.log_decay = gate == kernels::Gate::None ? nullptr : in.log_decay.data();
  a.out = in.out.data();
  // Per token and value head, as lineage bench counts it: read, write and prediction (2·K·V each)
  // plus the decay's K·V multiplies.
  const double kv = double(kH * kK * kV);
  Work work;
  work.flops = double(T) * kv * (6.0 + (gate == kernels::Gate::None ? 0.0 : 1.0));
  if (T == 1) work.bytes = 2.0 * kv * sizeof(float);
  work.memory_bound = T == 1;
  work.tokens = T > 1 ? double(T) : 0.0;
  size_t layer = 0;
  run(state, work, [&] {
    a.state = in.states[layer].data();
    layer = (layer + 1) % in.states.size();
    if (chunked) kernels::delta_rule_chunked(a, layers::kChunkSize);
    else kernels::delta_rule_recurrent(a);
    benchmark::DoNotOptimize(in.out.data());
    benchmark::ClobberMemory();
  });
}

void register_gate(kernels::Gate g, Heads hd, const std::string& heads) {
  const std::string gate = heads + "/gate_" + gate_label(g);
  benchmark::RegisterBenchmark(("delta_rule_recurrent/T1" + gate).c_str(), bm_delta_rule, g, int64_t(1), false, hd)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(("delta_rule_recurrent/T4096" + gate).c_str(), bm_delta_rule, g, int64_t(4096), false,
                               hd)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("delta_rule_chunked/T4096" + gate).c_str(), bm_delta_rule, g, int64_t(4096), true, hd)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

const bool registered = [] {
  for (kernels::Gate g : {kernels::Gate::None, kernels::Gate::PerHead, kernels::Gate::PerChannel})
    register_gate(g, kPreset, "");
  register_gate(kernels::Gate::PerChannel, kKimi, "/K128");
  register_gate(kernels::Gate::PerHead, kGatedDeltaNet, "/K256V512");
  return true;
}();

}  // namespace
}  // namespace lineage::bench
