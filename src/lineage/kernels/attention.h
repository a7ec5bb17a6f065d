// Causal softmax attention, tiled with an online softmax (f32), so no T×T matrix is ever formed.
#pragma once

#include <cstdint>

namespace lineage::kernels {

// out[t, h, :] = Σ_{j ≤ p0+t} softmax_j(scale · q[t,h]·k[h,j]) · v[h,j]  for T new queries at
// positions p0 .. p0+T-1. q[t, h] at q + t·ldq + h·hd (ldq = H·hd for [T, H, hd]; 3·H·hd reads the
// queries in place from a fused [T, q | k | v] projection); keys and values of head h, position j at
// k[h*head_stride + j*hd] (the KV cache's [H, capacity, hd] layout); out: [T, H, hd], must not
// alias q, k or v. T ≥ 16 (prefill): tiles of 64 queries per head against steps of keys (64 in the
// AVX-512 build, 256 in the portable one) as small matrix products; otherwise one query at a time. Threaded over (tile or token, head); every output is
// reduced in a fixed order, so results are deterministic.
void attention_causal(const float* q, int64_t ldq, int64_t T, int64_t p0, const float* k, const float* v,
                      int64_t head_stride, int64_t H, int64_t hd, float scale, float* out);

}  // namespace lineage::kernels
