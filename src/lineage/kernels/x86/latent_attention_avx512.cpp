// AVX-512 build of the latent (multi-query) attention loop: the loops of latent_attention_loops.h
// compiled with AVX-512 flags.
#include "lineage/kernels/x86/attention.h"
#include "lineage/kernels/x86/latent_attention_loops.h"

namespace lineage::kernels {

void latent_heads_avx512(const float* q, int64_t ldq, int64_t G, int64_t n_keys, const float* kv, int64_t ldkv,
                         int64_t dk, int64_t dv, float scale, float* out, int64_t ldo) {
  latent_loops::heads(q, ldq, G, n_keys, kv, ldkv, dk, dv, scale, out, ldo);
}

}  // namespace lineage::kernels
