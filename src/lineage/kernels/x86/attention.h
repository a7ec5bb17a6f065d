// The AVX-512 builds of attention's prefill query tile and decode step; attention.cpp calls them where
// the dispatcher chose AVX-512 and runs its portable twins elsewhere.
#pragma once

#include <cstdint>

namespace lineage::kernels {

// Queries per tile: attention_causal hands out (query tile, head) pairs.
constexpr int64_t kAttentionQueryTile = 64;

// out[i, :dv] (row stride ldo) = causal softmax attention of the nq queries q[i, :dk] (row stride
// ldq) at positions first_pos + i over keys k (rows of dk, stride ldk) and values v (rows of dv,
// stride ldv), n = first_pos + nq of each.
void attend_tile_avx512(const float* q, int64_t ldq, int64_t nq, int64_t first_pos, const float* k, int64_t ldk,
                        const float* v, int64_t ldv, int64_t dk, int64_t dv, float scale, float* out, int64_t ldo);

// Decode: one query (row of hd) against n_keys keys and values of hd (row strides ldk, ldv); out =
// softmax weighted values. hd <= kAttentionDecodeMaxHead (the query and the output stay in registers).
constexpr int64_t kAttentionDecodeMaxHead = 128;
void attend_one_avx512(const float* q, int64_t n_keys, const float* k, int64_t ldk, const float* v, int64_t ldv,
                       int64_t hd, float scale, float* out);

// latent_attention's loop over G <= 8 heads of one query (x86/latent_attention_loops.h).
void latent_heads_avx512(const float* q, int64_t ldq, int64_t G, int64_t n_keys, const float* kv, int64_t ldkv,
                         int64_t dk, int64_t dv, float scale, float* out, int64_t ldo);

}  // namespace lineage::kernels
