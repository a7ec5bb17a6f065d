// The GEMV loops written once over a SIMD traits type; included by one .cpp per instruction set,
// each compiled with its own target flags. Everything here has internal linkage (anonymous
// namespace), so the linker can never hand an AVX-512 copy of a helper to the portable code.
// Every reduction has a fixed order (lane-wise partial sums combined in a fixed tree), so results
// are deterministic for a given ISA.
#pragma once

#include <cstdint>
#include <cstring>

#include "lineage/core/dtype.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels::simd {
namespace {

template <class S, int DT>
inline typename S::Vec load(const void* w, int64_t i) {
  if constexpr (DT == 0) return S::load_f32(static_cast<const float*>(w) + i);
  else if constexpr (DT == 1) return S::load_f16(static_cast<const uint16_t*>(w) + i);
  else return S::load_bf16(static_cast<const uint16_t*>(w) + i);
}

template <int DT>
inline float load_scalar(const void* w, int64_t i) {
  if constexpr (DT == 0) {
    return static_cast<const float*>(w)[i];
  } else if constexpr (DT == 1) {
    return f16_to_f32(static_cast<const uint16_t*>(w)[i]);  // out of line, portable code
  } else {
    const uint32_t u = uint32_t(static_cast<const uint16_t*>(w)[i]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
}

template <class S, int DT>
void out_in(const float* x, const void* w, int64_t in, int64_t o0, int64_t o1, float* y) {
  // One row at a time, front to back: each thread reads its rows as a single sequential stream,
  // which the hardware prefetchers follow at full bandwidth (interleaving two or four rows halves
  // the bandwidth on Zen 5). Four accumulators hide the FMA latency; fixed combine order.
  constexpr int W = S::kWidth;
  const int64_t unroll_end = in / (4 * W) * (4 * W), vec_end = in / W * W;
  for (int64_t o = o0; o < o1; ++o) {
    const int64_t row = o * in;
    typename S::Vec a0 = S::zero(), a1 = S::zero(), a2 = S::zero(), a3 = S::zero();
    int64_t i = 0;
    for (; i < unroll_end; i += 4 * W) {
      a0 = S::fma(S::load_f32(x + i), load<S, DT>(w, row + i), a0);
      a1 = S::fma(S::load_f32(x + i + W), load<S, DT>(w, row + i + W), a1);
      a2 = S::fma(S::load_f32(x + i + 2 * W), load<S, DT>(w, row + i + 2 * W), a2);
      a3 = S::fma(S::load_f32(x + i + 3 * W), load<S, DT>(w, row + i + 3 * W), a3);
    }
    for (; i < vec_end; i += W) a0 = S::fma(S::load_f32(x + i), load<S, DT>(w, row + i), a0);
    float r = S::sum(S::add(S::add(a0, a1), S::add(a2, a3)));
    for (; i < in; ++i) r += x[i] * load_scalar<DT>(w, row + i);
    y[o] = r;
  }
}

template <class S, int DT>
void in_out(const float* x, const void* w, int64_t in, int64_t out, int64_t o0, int64_t o1, float* y) {
  constexpr int W = S::kWidth;
  // Eight vectors of columns stay in registers while the rows stream by, so each row contributes
  // a run of 8·W contiguous weights (whole cache lines) before the walk jumps a row down. The
  // prefetchers do not follow that stride far enough ahead, so the block kPrefetchRows rows below is
  // requested explicitly, 16 KiB of the block's data ahead (in alternating A/B runs of GPT-2 decode
  // on Zen 5: f32 ~10 % faster than 4 KiB ahead, bf16 the same; no prefetch: bf16 ~25 % slower),
  // into L2 rather than L1 (`__builtin_prefetch(p, 0, 2)`: the L1 has too few miss buffers for that
  // many lines in flight; c_fc-shaped GEMVs 12-13 % faster in alternating micro-benchmark runs).
  constexpr int kAcc = 8;
  constexpr int64_t kBlock = kAcc * W;
  constexpr int64_t kElem = DT == 0 ? 4 : 2;
  constexpr int64_t kPrefetchRows = 16384 / (kBlock * kElem);
  const char* bytes = static_cast<const char*>(w);
  int64_t o = o0;
  for (; o + kBlock <= o1; o += kBlock) {
    typename S::Vec a[kAcc];
    for (int j = 0; j < kAcc; ++j) a[j] = S::zero();
    for (int64_t i = 0; i < in; ++i) {
      if (i + kPrefetchRows < in) {
        const char* ahead = bytes + ((i + kPrefetchRows) * out + o) * kElem;
        for (int64_t line = 0; line < kBlock * kElem; line += 64) __builtin_prefetch(ahead + line, 0, 2);
      }
      const typename S::Vec xv = S::broadcast(x[i]);
      const int64_t base = i * out + o;
      for (int j = 0; j < kAcc; ++j) a[j] = S::fma(xv, load<S, DT>(w, base + j * W), a[j]);
    }
    for (int j = 0; j < kAcc; ++j) S::store(y + o + j * W, a[j]);
  }
  for (; o + W <= o1; o += W) {
    typename S::Vec a = S::zero();
    for (int64_t i = 0; i < in; ++i) a = S::fma(S::broadcast(x[i]), load<S, DT>(w, i * out + o), a);
    S::store(y + o, a);
  }
  for (; o < o1; ++o) {
    float r = 0;
    for (int64_t i = 0; i < in; ++i) r += x[i] * load_scalar<DT>(w, i * out + o);
    y[o] = r;
  }
}

template <class S, int DT>
void widen(const void* src, int64_t n, float* dst) {
  constexpr int W = S::kWidth;
  int64_t i = 0;
  for (; i + W <= n; i += W) S::store(dst + i, load<S, DT>(src, i));
  for (; i < n; ++i) dst[i] = load_scalar<DT>(src, i);
}

template <class S>
GemvTable make_table(const char* isa) {
  return GemvTable{isa,
                   {out_in<S, 0>, out_in<S, 1>, out_in<S, 2>},
                   {in_out<S, 0>, in_out<S, 1>, in_out<S, 2>},
                   {widen<S, 0>, widen<S, 1>, widen<S, 2>}};
}

}  // namespace
}  // namespace lineage::kernels::simd
