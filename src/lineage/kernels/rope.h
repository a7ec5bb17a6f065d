// Rotary position embeddings: DeepSeek-V3's interleaved pairs on one d-wide slot (the rope part of
// MLA's queries and shared key) and the NeoX / rotate-half pairing on the first dims of a head
// (Qwen3-Next and Qwen3.5's partial rotary), each with its backward. Spec:
// shared/spec/attention-mla-moe-attnres.md §2; qwen3-next-and-qwen3.5.md §3.3.
#pragma once

#include <cstdint>

namespace lineage::kernels {

// x[d] (d even) at position p, in place: pairs (x_2i, x_2i+1) turn by p·θ^(−2i/d). The angles in
// double, so long positions keep their precision; their cosines and sines rounded to f32.
void rope_interleaved(float* x, int64_t d, int64_t p, double theta);

// Its backward, in place: dy[d] → Rᵀ·dy, the turn by the opposite angle with the same f32 cosines
// and sines (exactly the transpose of the forward's map).
void rope_interleaved_backward(float* dy, int64_t d, int64_t p, double theta);

// x[0 .. d) (d even; the dims after d untouched) at position p, in place: x_i and x_{i+d/2} turn by
// p·θ^(−2i/d) (rotate-half pairing). Angles in double, cosines and sines rounded to f32.
void rope_neox(float* x, int64_t d, int64_t p, double theta);

// Its backward, in place: dy[0 .. d) → Rᵀ·dy with the same f32 cosines and sines.
void rope_neox_backward(float* dy, int64_t d, int64_t p, double theta);

}  // namespace lineage::kernels
