// Causal softmax attention, tiled with an online softmax (f32), so no T×T matrix is ever formed.
#pragma once

#include <cstdint>
#include <span>

namespace lineage::kernels {

// The heads every sequence of a call shares: H heads, q·k over dk channels, values of dv channels
// (GPT-2: dk = dv = 64; MLA: dk = 192, dv = 128), scores scaled by `scale`.
struct AttentionHeads {
  int64_t H = 0, dk = 0, dv = 0;
  float scale = 1.0f;
};

// One sequence of a batched call: T new queries at positions p0 .. p0+T-1 against its own keys and
// values 0 .. p0+T-1. Query t, head h at q + t·ldq + h·dk (ldq = H·dk for [T, H, dk]; 3·H·dk reads the
// queries in place from a fused [T, q | k | v] projection). Key j of head h at k + h·k_stride + j·ldk,
// value j at v + h·v_stride + j·ldv (a KV cache's [H, capacity, d] layout: ldk = dk, ldv = dv, the
// defaults when 0; MLA's expanded values are read in place from the [j][head][k | v] rows of kv_b's
// product: ldv = H·(d_nope + dv)). Output t, head h at out + t·ldo + h·dv; out must not alias q, k or v.
struct AttentionSeq {
  const float* q = nullptr;
  int64_t ldq = 0, T = 0, p0 = 0;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t k_stride = 0, v_stride = 0;
  float* out = nullptr;
  int64_t ldo = 0;
  int64_t ldk = 0, ldv = 0;
};

// out[t, h, :] = Σ_{j ≤ p0+t} softmax_j(scale · q[t,h]·k[h,j]) · v[h,j] for every sequence of
// `seqs`, each against its own keys only. A sequence with T ≥ 16 (prefill): tiles of 64
// queries per head against steps of keys (64 in the AVX-512 build, 256 in the portable one) as
// small matrix products. All other queries of the call (the decode tokens of a batch) are one
// query at a time, every (sequence, token, head) of the call in one parallel region. Every output
// is reduced in a fixed order that does not depend on the other sequences, the split or the thread
// count: a sequence gives the same bits alone as in a batch.
void attention_causal(std::span<const AttentionSeq> seqs, const AttentionHeads& heads);

// One sequence, dk = dv = hd, out packed [T, H, hd]; keys and values share head_stride.
void attention_causal(const float* q, int64_t ldq, int64_t T, int64_t p0, const float* k, const float* v,
                      int64_t head_stride, int64_t H, int64_t hd, float scale, float* out);

// Multi-query attention of one token (MLA's absorbed decode): H query rows q + h·ldq of dk channels
// against n_keys rows shared by every head, row j at kv + j·ldkv, whose first dk elements are its
// key and first dv its value (dv <= dk: MLA's cached [ĉ | k_r] rows, the latent ĉ both key part and
// value). out + h·ldo = Σ_j softmax_j(scale · q_h·k_j) v_j, f32 throughout.
struct LatentQuery {
  const float* q = nullptr;
  int64_t ldq = 0, n_keys = 0;
  const float* kv = nullptr;
  int64_t ldkv = 0;
  float* out = nullptr;
  int64_t ldo = 0;
};

// Every query of `qs` (the decode tokens of a step, each against its own sequence's rows) with H
// heads. The rows are read once per group of heads (heads are split into groups only as far as the
// threads need work), and each head's result does not depend on the grouping, the other queries
// or the thread count. dv <= kLatentMaxValue.
constexpr int64_t kLatentMaxValue = 1024;
void latent_attention(std::span<const LatentQuery> qs, int64_t H, int64_t dk, int64_t dv, float scale);

// The softmax weights the calls above apply, for the trace hook (lineage trace): scalar, scores and
// sums in f64, written as f32. Query t of s, head h: w + t·ldt + h·(s.p0 + s.T) gets its p0 + t + 1
// weights over keys 0 .. p0+t, and zeros up to p0 + T.
void attention_weights(const AttentionSeq& s, const AttentionHeads& heads, float* w, int64_t ldt);
// The same for one latent query: w + h·n_keys gets head h's weights over q's n_keys rows.
void latent_attention_weights(const LatentQuery& q, int64_t H, int64_t dk, float scale, float* w);

}  // namespace lineage::kernels
