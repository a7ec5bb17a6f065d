// Per-ISA GEMM blocks for linear() with T > 1: packed weight panels and register-tiled micro-kernels
// that compute one rectangle of y = x·W. linear.cpp splits the work over threads and owns the
// scratch; dispatch.cpp picks the table. Element types are indexed F32 = 0, F16 = 1, BF16 = 2.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lineage::kernels {

// One product y[t, o] = Σ_i x[t, i]·W(i, o) (+ bias[o]), summed over the whole reduction.
struct GemmProblem {
  const float* x;  // [T, in] f32, row-major
  const void* w;   // out_in ? [out, in] : [in, out], element type `dtype`, row-major; MXFP4: codes [out, in/2]
  int dtype;       // 0 F32, 1 F16, 2 BF16, 3 MXFP4 (gemm_mxfp4_avx512 only)
  bool out_in;
  int64_t T, in, out;
  float* y;  // [T, out] f32, row-major; must not alias x
  const float* bias = nullptr;  // [out] f32 added to y after the whole reduction, or null
  bool gelu = false;            // then y ← GELU(y), tanh form (GPT-2's gelu_new), as y is stored
  const uint8_t* scales = nullptr;  // MXFP4: E8M0 exponents [out, in/32]
  // The exact paths only (linear_strided in linear.h): x[t, i] at x[t·ldx + i], or at x[i·ldx + t]
  // for the strips path (x stored transposed, [in, T]); y[t, o] at y[t·ldy + o]; 0 means dense. With
  // `accumulate` each y element's sum starts from y's value instead of zero (y += x·W in one pass).
  int64_t ldx = 0, ldy = 0;
  bool accumulate = false;
};

// One GEMM implementation. `prepare`, where not null, converts rows [t0, t1) of x into the shared
// `prepared` buffer (prepared_bytes(T, in), 64-byte aligned) before any block runs. `block` then
// overwrites y[t0:t1, o0:o1); o0 is a multiple of `nr`, o1 - o0 <= nc_max, and `scratch` holds
// scratch_bytes, 64-byte aligned, private to the calling thread. Each y element is one fixed-order
// reduction over i, whatever the rectangle, so the result does not depend on how work is split.
struct GemmPath {
  void (*prepare)(const GemmProblem& p, int64_t t0, int64_t t1, void* prepared);
  size_t (*prepared_bytes)(int64_t T, int64_t in);
  void (*block)(const GemmProblem& p, const void* prepared, int64_t t0, int64_t t1, int64_t o0, int64_t o1, void* scratch);
  int64_t nr, nc_max;
  size_t scratch_bytes;
};

// Exact f32 products: weights widened to f32 while packing, f32 FMA. Any dtype.
const GemmPath& gemm_exact_avx512();
// The exact path for an x stored transposed ([in, T]: the output gradient of a weight gradient
// dW = dYᵀ·X), F32 weights: `prepare` copies x into strips of 8 rows (8 × in floats each, 8 rows side
// by side per step of i), which the same register tiles then read. Same results as transposing x
// first and running gemm_exact_avx512.
const GemmPath& gemm_exact_strips_avx512();
// MXFP4 weights [out, in] only: x reordered by `prepare` (per 32 columns the even ones, then the odd
// ones), the codes decoded (exactly: code value · 2^(s - 127)) into f32 panels in the same order while
// packing, then the exact path's register tiles.
const GemmPath& gemm_mxfp4_avx512();
// BF16 weights only: x rounded to bf16 (nearest even) once per call by `prepare`, products by
// vdpbf16ps (pairs along i, f32 accumulation; bf16 denormals count as zero). Needs AVX512_BF16.
const GemmPath& gemm_bf16_dot_avx512bf16();

struct GemmTable {
  const char* isa;
  const GemmPath* exact;     // null: this ISA has no own GEMM and linear() calls OpenBLAS
  const GemmPath* exact_strips;  // with exact: x stored transposed
  const GemmPath* bf16_dot;  // null: the CPU lacks AVX512_BF16 (or the ISA was forced lower)
  const GemmPath* mxfp4;     // null: this ISA has no own GEMM (linear() decodes panels for OpenBLAS)
};

// The table for the ISA gemv_table() chose (so LINEAGE_ISA=scalar|avx2 also turns this off).
const GemmTable& gemm_table();

// How linear() multiplies BF16 weights is the call's choice (Weight::bf16_dot in linear.h):
//   exact:     widen W to f32, f32 FMA; matches ref::linear to ~1e-6 relative RMS.
//   bf16 dot:  round x to bf16 and use vdpbf16ps, about twice the exact path's rate; relative RMS
//              error vs ref::linear ≈ 1.7e-3 for normal data (the rounding of x alone; measured and
//              bounded in linear_test). Where gemm_table().bf16_dot is null, the exact path runs.

}  // namespace lineage::kernels
