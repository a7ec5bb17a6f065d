// Small AVX-512 helpers shared by the *_avx512*.cpp files. Internal linkage on purpose: each
// includer is compiled with its own ISA flags, so no copy may be shared across files.
#pragma once

#include <immintrin.h>

namespace lineage::kernels::avx512 {
namespace {

// Horizontal sum through memory: GCC 12's _mm512_reduce_add_ps trips -Wmaybe-uninitialized.
inline float hsum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0;
  for (float x : t) s += x;
  return s;
}

}  // namespace
}  // namespace lineage::kernels::avx512
