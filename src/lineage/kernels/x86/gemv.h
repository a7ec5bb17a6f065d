// Per-ISA inner loops of the streaming GEMV, one table per instruction set; dispatch.cpp picks one
// table at start-up from cpuid. Element types are indexed F32 = 0, F16 = 1, BF16 = 2.
#pragma once

#include <cstdint>

namespace lineage::kernels {

struct GemvTable {
  const char* isa;
  // OutIn weights [out, in]: y[o] = Σ_i x[i]·W[o, i] for o in [o0, o1).
  void (*out_in[3])(const float* x, const void* w, int64_t in, int64_t o0, int64_t o1, float* y);
  // InOut weights [in, out]: y[o] = Σ_i x[i]·W[i, o] for o in [o0, o1); y is overwritten.
  void (*in_out[3])(const float* x, const void* w, int64_t in, int64_t out, int64_t o0, int64_t o1, float* y);
  // dst[i] = widen(src[i]) for i in [0, n).
  void (*widen[3])(const void* src, int64_t n, float* dst);
};

const GemvTable& gemv_table_scalar();
const GemvTable& gemv_table_avx2();
const GemvTable& gemv_table_avx512();

// The table this CPU runs (chosen once); LINEAGE_ISA=scalar|avx2|avx512 overrides for tests.
const GemvTable& gemv_table();
const char* isa_name();

}  // namespace lineage::kernels
