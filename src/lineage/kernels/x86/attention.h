// The AVX-512 builds of attention's prefill query tile and decode step; attention.cpp calls them where
// the dispatcher chose AVX-512 and runs its portable twins elsewhere.
#pragma once

#include <cstdint>

namespace lineage::kernels {

// Queries per tile: attention_causal hands out (query tile, head) pairs.
constexpr int64_t kAttentionQueryTile = 64;

// out[i, :] (row stride ldo) = causal softmax attention of the nq queries q[i, :] (row stride ldq)
// at positions first_pos + i over keys/values k, v ([n, hd] contiguous, n = first_pos + nq).
void attend_tile_avx512(const float* q, int64_t ldq, int64_t nq, int64_t first_pos, const float* k, const float* v,
                        int64_t hd, float scale, float* out, int64_t ldo);

// Decode: one query (row of hd) against keys/values k, v ([n_keys, hd] contiguous); out = softmax
// weighted values. hd <= kAttentionDecodeMaxHead (the query and the output stay in registers).
constexpr int64_t kAttentionDecodeMaxHead = 128;
void attend_one_avx512(const float* q, int64_t n_keys, const float* k, const float* v, int64_t hd, float scale,
                       float* out);

}  // namespace lineage::kernels
