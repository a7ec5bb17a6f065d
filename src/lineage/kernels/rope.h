// DeepSeek-V3's interleaved rotary position embedding on one d-wide slot (the rope part of MLA's
// queries and shared key), and its backward. Spec: shared/spec/attention-mla-moe-attnres.md §2.
#pragma once

#include <cstdint>

namespace lineage::kernels {

// x[d] (d even) at position p, in place: pairs (x_2i, x_2i+1) turn by p·θ^(−2i/d). The angles in
// double, so long positions keep their precision; their cosines and sines rounded to f32.
void rope_interleaved(float* x, int64_t d, int64_t p, double theta);

// Its backward, in place: dy[d] → Rᵀ·dy, the turn by the opposite angle with the same f32 cosines
// and sines (exactly the transpose of the forward's map).
void rope_interleaved_backward(float* dy, int64_t d, int64_t p, double theta);

}  // namespace lineage::kernels
