// The AVX-512 build of prefill attention's query tile; attention.cpp calls it where the dispatcher
// chose AVX-512 and runs its portable twin elsewhere.
#pragma once

#include <cstdint>

namespace lineage::kernels {

// Queries per tile: attention_causal hands out (query tile, head) pairs.
constexpr int64_t kAttentionQueryTile = 64;

// out[i, :] (row stride ldo) = causal softmax attention of the nq queries q[i, :] (row stride ldq)
// at positions first_pos + i over keys/values k, v ([n, hd] contiguous, n = first_pos + nq).
void attend_tile_avx512(const float* q, int64_t ldq, int64_t nq, int64_t first_pos, const float* k, const float* v,
                        int64_t hd, float scale, float* out, int64_t ldo);

}  // namespace lineage::kernels
