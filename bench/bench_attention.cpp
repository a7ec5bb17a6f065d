// kernels::attention_causal for GPT-2 small's heads (12 layers, 12 heads of 64): one decoded token at
// depth 1k and 4k, bound by reading the K and V rows of the cache; and a 512-token prefill from an
// empty cache, bound by the multiply-adds of its scores and weighted values (causal: 4·hd FLOPs per
// query-key pair with key <= query).
#include <string>

#include "bench_support.h"
#include "lineage/kernels/attention.h"

namespace lineage::bench {
namespace {

constexpr int64_t kLayers = 12, kH = 12, kHd = 64;

void bm_attention_decode(benchmark::State& state, int64_t depth) {
  // One cache per layer, visited in turn as a decode step does: 12 layers at 4k are 300 MB.
  std::vector<std::vector<float>> k, v;
  for (int64_t l = 0; l < kLayers; ++l) {
    k.push_back(random_floats(kH * depth * kHd, 3 + 2 * uint64_t(l)));
    v.push_back(random_floats(kH * depth * kHd, 4 + 2 * uint64_t(l)));
  }
  const auto q = random_floats(kH * kHd, 5);
  int64_t layer = 0;
  std::vector<float> out(static_cast<size_t>(kH * kHd));
  Work work;
  work.bytes = 2.0 * double(kH * depth * kHd) * sizeof(float);
  work.flops = 4.0 * double(kH * kHd) * double(depth);
  run(state, work, [&] {
    kernels::attention_causal(q.data(), kH * kHd, 1, depth - 1, k[layer].data(), v[layer].data(), depth * kHd, kH, kHd, 0.125f,
                              out.data());
    layer = (layer + 1) % kLayers;
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  });
}

void bm_attention_prefill(benchmark::State& state, int64_t T) {
  const auto q = random_floats(T * kH * kHd, 6), k = random_floats(kH * T * kHd, 7), v = random_floats(kH * T * kHd, 8);
  std::vector<float> out(static_cast<size_t>(T * kH * kHd));
  Work work;
  work.flops = 4.0 * double(kH * kHd) * double(T * (T + 1) / 2);
  work.tokens = double(T);
  work.memory_bound = false;
  run(state, work, [&] {
    kernels::attention_causal(q.data(), kH * kHd, T, 0, k.data(), v.data(), T * kHd, kH, kHd, 0.125f, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  });
}

const bool registered = [] {
  benchmark::RegisterBenchmark("attention_causal/prefill/T512", bm_attention_prefill, 512)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  for (int64_t depth : {1024, 4096})
    benchmark::RegisterBenchmark(("attention_causal/decode/depth_" + std::to_string(depth)).c_str(),
                                 bm_attention_decode, depth)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace
}  // namespace lineage::bench
