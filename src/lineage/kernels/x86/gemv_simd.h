// The GEMV loops written once over a SIMD traits type; included by one .cpp per instruction set,
// each compiled with its own target flags. Everything here has internal linkage (anonymous
// namespace), so the linker can never hand an AVX-512 copy of a helper to the portable code (the
// ctest isa_objects_export_no_wide_code checks that nothing it calls leaks such a copy either).
// Every reduction has a fixed order (lane-wise partial sums combined in a fixed tree), so results
// are deterministic for a given ISA.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lineage/core/dtype.h"
#include "lineage/core/scratch.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels::simd {
namespace {

template <class S, int DT>
inline typename S::Vec load(const void* w, int64_t i) {
  if constexpr (DT == 0) return S::load_f32(static_cast<const float*>(w) + i);
  else if constexpr (DT == 1) return S::load_f16(static_cast<const uint16_t*>(w) + i);
  else return S::load_bf16(static_cast<const uint16_t*>(w) + i);
}

// The first n elements at w + i (0 < n ≤ the vector width), the other lanes zero.
template <class S, int DT>
inline typename S::Vec load_n(const void* w, int64_t i, int n) {
  if constexpr (DT == 0) return S::load_f32_n(static_cast<const float*>(w) + i, n);
  else if constexpr (DT == 1) return S::load_f16_n(static_cast<const uint16_t*>(w) + i, n);
  else return S::load_bf16_n(static_cast<const uint16_t*>(w) + i, n);
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

// How many elements of a weight row starting at element `at` come before its first 64-byte boundary
// (0 where elements are not aligned to their own size, or for the scalar build). The [in, out] loops
// and the f32 [out, in] loop start there, so their vector loads of a streamed weight straddle no
// cache line (16-bit [out, in] rows start at their first element; see out_in): checkpoint tensors
// lie wherever the safetensors header leaves them (GPT-2's: 48 bytes past a line), and f32 rows read
// through straddling 512-bit loads streamed at 35 GB/s where aligned ones reached 55 (two threads,
// c_fc's shape; 16-bit rows, read 256 bits at a time, were not slowed).
template <class S, int DT>
inline int64_t to_line(const void* w, int64_t at) {
  constexpr int64_t kElem = DT == 0 ? 4 : 2;
  if constexpr (S::kWidth == 1) return 0;
  const auto addr = reinterpret_cast<uintptr_t>(w) + uintptr_t(at * kElem);
  return addr % kElem ? 0 : int64_t((64 - addr % 64) % 64) / kElem;
}

// Requests the lines of the N elements at w + i kStreamAheadBytes further on, non-temporally
// (S::prefetch_stream: prefetchnta; nothing in the scalar build), as the bf16 dot GEMV does. The
// [in, out] loop does it for 16-bit rows (GPT-2 Conv1D weights mapped from a bf16 checkpoint):
// `gemv(_mapped)/bf16(dot)/in_out` 3–33 % faster, and decode of a mapped bf16 GPT-2 checkpoint at depth
// 128 faster in 9 of 12 alternating runs. f32 rows ([in, out] or [out, in]) and the 16-bit [out, in]
// loop showed no gain and stream without it.
template <class S, int DT, int N>
inline void stream_ahead(const void* w, int64_t i) {
  constexpr int64_t kElem = DT == 0 ? 4 : 2;
  const char* p = static_cast<const char*>(w) + i * kElem + kStreamAheadBytes;
  for (int64_t b = 0; b < N * kElem; b += 64) S::prefetch_stream(p + b);
}

template <class S, int DT, int G>
inline void dot_rows(const float* x, int64_t ldx, const void* w, int64_t in, int64_t o, float* y, int64_t ldy);

template <class S, int DT>
void out_in(const float* x, const void* w, int64_t in, int64_t o0, int64_t o1, float* y) {
  // One row at a time, front to back: each thread reads its rows as a single sequential stream,
  // which the hardware prefetchers follow at full bandwidth (interleaving two or four rows halves
  // the bandwidth on Zen 5). Four accumulators hide the FMA latency; fixed combine order. An f32
  // row's elements before its first cache line boundary (to_line) and any row's elements after its
  // last full vector are taken by masked steps (added one by one, they were a chain of dependent
  // scalar adds per row). Where every row starts at the same place in a line, x is first copied so
  // that its element at the peeled row's first boundary sits on a line too: otherwise every 512-bit
  // load of x straddles two (mapped f32 KDA with K = V = 128, 1024-wide rows 24 bytes past a line:
  // decode 54.2 → 64.2 tok/s; mapped GPT-2 f32 81.4 → 89.9). 16-bit rows are neither peeled nor
  // is x copied: their 256-bit loads straddle a line at most every other step, and that costs less
  // than a peeled row's lead (mapped bf16 KDA: 101–106 tok/s unpeeled, 90 peeled with x copied, 81
  // peeled with scalar steps and x straddling).
  constexpr int W = S::kWidth;
  constexpr bool kPeel = DT == 0;
  if constexpr (W > 1 && kPeel) {
    if (o1 > o0 && in % 16 == 0) {
      const int64_t head = std::min(in, to_line<S, DT>(w, o0 * in));
      if (reinterpret_cast<uintptr_t>(x + head) % 64) {
        // On the stack where x fits (whichever thread runs a chunk, no first-use allocation), else
        // in a buffer kept per thread.
        constexpr int64_t kStackFloats = 8192 + 32;
        alignas(64) float on_stack[in + 16 <= kStackFloats ? kStackFloats : 16];
        thread_local std::vector<char> buffer;
        float* moved = in + 16 <= kStackFloats
                           ? on_stack
                           : static_cast<float*>(aligned_scratch(buffer, size_t(in + 16) * sizeof(float)));
        moved += (16 - head % 16) % 16;
        std::memcpy(moved, x, size_t(in) * sizeof(float));
        x = moved;
      }
    }
  }
  // The loop of dot_rows<1> (the same operations in the same order: a batch's rows get these bits),
  // written out for the one row decode streams.
  for (int64_t o = o0; o < o1; ++o) {
    const int64_t row = o * in, head = kPeel ? std::min(in, to_line<S, DT>(w, row)) : 0;
    const int64_t unroll_end = head + (in - head) / (4 * W) * (4 * W), vec_end = head + (in - head) / W * W;
    typename S::Vec a0 = S::zero(), a1 = S::zero(), a2 = S::zero(), a3 = S::zero();
    for (int64_t i = 0; i < head; i += W) {
      const int n = int(std::min<int64_t>(W, head - i));
      a3 = S::fma(S::load_f32_n(x + i, n), load_n<S, DT>(w, row + i, n), a3);
    }
    int64_t i = head;
    for (; i < unroll_end; i += 4 * W) {
      a0 = S::fma(S::load_f32(x + i), load<S, DT>(w, row + i), a0);
      a1 = S::fma(S::load_f32(x + i + W), load<S, DT>(w, row + i + W), a1);
      a2 = S::fma(S::load_f32(x + i + 2 * W), load<S, DT>(w, row + i + 2 * W), a2);
      a3 = S::fma(S::load_f32(x + i + 3 * W), load<S, DT>(w, row + i + 3 * W), a3);
    }
    for (; i < vec_end; i += W) a0 = S::fma(S::load_f32(x + i), load<S, DT>(w, row + i), a0);
    if (i < in) a1 = S::fma(S::load_f32_n(x + i, int(in - i)), load_n<S, DT>(w, row + i, int(in - i)), a1);
    y[o] = S::sum(S::add(S::add(a0, a1), S::add(a2, a3)));
  }
}

// y[g·ldy] = Σ_i x[g·ldx + i]·W[o, i] for the G rows g of x: row o of W is loaded once per vector
// and used for all G rows, each with its own accumulators in out_in's exact order (the same peel,
// unroll, tails and combine), so each row's result is bit for bit what out_in gives it alone.
template <class S, int DT, int G>
inline void dot_rows(const float* x, int64_t ldx, const void* w, int64_t in, int64_t o, float* y, int64_t ldy) {
  constexpr int W = S::kWidth;
  constexpr bool kPeel = DT == 0;
  const int64_t row = o * in, head = kPeel ? std::min(in, to_line<S, DT>(w, row)) : 0;
  const int64_t unroll_end = head + (in - head) / (4 * W) * (4 * W), vec_end = head + (in - head) / W * W;
  typename S::Vec a[G][4];
  for (int g = 0; g < G; ++g) a[g][0] = a[g][1] = a[g][2] = a[g][3] = S::zero();
  for (int64_t i = 0; i < head; i += W) {
    const int n = int(std::min<int64_t>(W, head - i));
    const typename S::Vec wv = load_n<S, DT>(w, row + i, n);
    for (int g = 0; g < G; ++g) a[g][3] = S::fma(S::load_f32_n(x + g * ldx + i, n), wv, a[g][3]);
  }
  int64_t i = head;
  for (; i < unroll_end; i += 4 * W) {
    const typename S::Vec w0 = load<S, DT>(w, row + i), w1 = load<S, DT>(w, row + i + W);
    const typename S::Vec w2 = load<S, DT>(w, row + i + 2 * W), w3 = load<S, DT>(w, row + i + 3 * W);
    for (int g = 0; g < G; ++g) {
      const float* xg = x + g * ldx + i;
      a[g][0] = S::fma(S::load_f32(xg), w0, a[g][0]);
      a[g][1] = S::fma(S::load_f32(xg + W), w1, a[g][1]);
      a[g][2] = S::fma(S::load_f32(xg + 2 * W), w2, a[g][2]);
      a[g][3] = S::fma(S::load_f32(xg + 3 * W), w3, a[g][3]);
    }
  }
  for (; i < vec_end; i += W) {
    const typename S::Vec wv = load<S, DT>(w, row + i);
    for (int g = 0; g < G; ++g) a[g][0] = S::fma(S::load_f32(x + g * ldx + i), wv, a[g][0]);
  }
  if (i < in) {
    const typename S::Vec wv = load_n<S, DT>(w, row + i, int(in - i));
    for (int g = 0; g < G; ++g) a[g][1] = S::fma(S::load_f32_n(x + g * ldx + i, int(in - i)), wv, a[g][1]);
  }
  for (int g = 0; g < G; ++g) y[g * ldy] = S::sum(S::add(S::add(a[g][0], a[g][1]), S::add(a[g][2], a[g][3])));
}

// dot_rows for O consecutive weight rows o .. o+O-1 at once, whose rows start at the same place in
// a cache line (the same head): per accumulator index j of out_in (a0 .. a3), one pass over the
// rows' vectors j, j + 4, j + 8, ... with an accumulator per (weight row, row of x), so each load of
// x serves O weight rows and each load of a weight row G rows of x (half a load per FMA at 4 × 4;
// dot_rows alone needs one and a quarter). Each accumulator sees exactly the terms, in exactly the
// order, that out_in's does (the head peel first in a3, the whole-vector tail last in a0, the masked
// tail last in a1), and the four are combined as there: bit for bit out_in's result. The first pass
// requests the lines the later passes read.
template <class S, int DT, int G, int O>
inline void dot_block(const float* x, int64_t ldx, const void* w, int64_t in, int64_t o, int64_t head, float* y,
                      int64_t ldy, bool ahead) {
  constexpr int W = S::kWidth;
  constexpr int64_t kElem = DT == 0 ? 4 : 2;
  const int64_t unroll_end = head + (in - head) / (4 * W) * (4 * W), vec_end = head + (in - head) / W * W;
  typename S::Vec part[4][O][G];
  for (int j = 0; j < 4; ++j) {
    typename S::Vec acc[O][G];
    for (int r = 0; r < O; ++r)
      for (int g = 0; g < G; ++g) acc[r][g] = S::zero();
    if (j == 3)
      for (int64_t i = 0; i < head; i += W) {
        const int n = int(std::min<int64_t>(W, head - i));
        for (int r = 0; r < O; ++r) {
          const typename S::Vec wv = load_n<S, DT>(w, (o + r) * in + i, n);
          for (int g = 0; g < G; ++g) acc[r][g] = S::fma(S::load_f32_n(x + g * ldx + i, n), wv, acc[r][g]);
        }
      }
    for (int64_t i = head + j * W; i < unroll_end; i += 4 * W) {
      if (j == 0)
        for (int r = 0; r < O; ++r)
          for (int k = 1; k < 4; ++k)
            S::prefetch(static_cast<const char*>(w) + ((o + r) * in + i + k * W) * kElem);
      if (ahead)  // the next block's rows, vector for vector: over the four passes, every line of them
        for (int r = 0; r < O; ++r) S::prefetch(static_cast<const char*>(w) + ((o + O + r) * in + i) * kElem);
      typename S::Vec wv[O];
      for (int r = 0; r < O; ++r) wv[r] = load<S, DT>(w, (o + r) * in + i);
      for (int g = 0; g < G; ++g) {
        const typename S::Vec xv = S::load_f32(x + g * ldx + i);
        for (int r = 0; r < O; ++r) acc[r][g] = S::fma(xv, wv[r], acc[r][g]);
      }
    }
    if (j == 0)
      for (int64_t i = unroll_end; i < vec_end; i += W)
        for (int r = 0; r < O; ++r) {
          const typename S::Vec wv = load<S, DT>(w, (o + r) * in + i);
          for (int g = 0; g < G; ++g) acc[r][g] = S::fma(S::load_f32(x + g * ldx + i), wv, acc[r][g]);
        }
    if (j == 1 && vec_end < in)
      for (int r = 0; r < O; ++r) {
        const typename S::Vec wv = load_n<S, DT>(w, (o + r) * in + vec_end, int(in - vec_end));
        for (int g = 0; g < G; ++g)
          acc[r][g] = S::fma(S::load_f32_n(x + g * ldx + vec_end, int(in - vec_end)), wv, acc[r][g]);
      }
    for (int r = 0; r < O; ++r)
      for (int g = 0; g < G; ++g) part[j][r][g] = acc[r][g];
  }
  for (int r = 0; r < O; ++r)
    for (int g = 0; g < G; ++g)
      y[g * ldy + r] = S::sum(S::add(S::add(part[0][r][g], part[1][r][g]), S::add(part[2][r][g], part[3][r][g])));
}

// out_in for `rows` rows of x (row stride ldx) into rows of y (stride ldy), outputs [o0, o1): each
// weight row is read from memory once for all of them (blocks of four weight rows against four rows
// of x, dot_block; what is left in dot_rows), and every result equals out_in's on that row alone, bit
// for bit. Batched decode (a few tokens of different sequences) thereby reads each weight once a step
// and gives each sequence exactly what it gets decoding alone.
template <class S, int DT>
void out_in_rows(const float* x, int64_t ldx, int64_t rows, const void* w, int64_t in, int64_t o0, int64_t o1,
                 float* y, int64_t ldy) {
  constexpr bool kPeel = DT == 0;
  int64_t o = o0;
  for (; o + 4 <= o1; o += 4) {
    const int64_t head = kPeel ? std::min(in, to_line<S, DT>(w, o * in)) : 0;
    bool same = true;
    for (int r = 1; r < 4 && kPeel; ++r) same = same && std::min(in, to_line<S, DT>(w, (o + r) * in)) == head;
    int64_t g = 0;
    if (same)
      for (; g + 4 <= rows; g += 4)
        dot_block<S, DT, 4, 4>(x + g * ldx, ldx, w, in, o, head, y + g * ldy + o, ldy, g == 0 && o + 8 <= o1);
    for (int r = 0; r < 4; ++r)
      for (int64_t h = g; h < rows; ++h) dot_rows<S, DT, 1>(x + h * ldx, 0, w, in, o + r, y + h * ldy + o + r, 0);
  }
  for (; o < o1; ++o) {
    int64_t g = 0;
    for (; g + 4 <= rows; g += 4) dot_rows<S, DT, 4>(x + g * ldx, ldx, w, in, o, y + g * ldy + o, ldy);
    for (; g < rows; ++g) dot_rows<S, DT, 1>(x + g * ldx, 0, w, in, o, y + g * ldy + o, 0);
  }
}

template <class S, int DT>
void in_out(const float* x, const void* w, int64_t out, int64_t i0, int64_t i1, float* p) {
  // Rows [i0, i1) front to back, each row added into the partial sums p (out floats, in L1 for the
  // widths of these models): one sequential stream per thread, as in out_in. Walking the rows down
  // 128-column blocks instead (eight accumulators in registers, the next rows prefetched) read 16-bit
  // weights at 38-44 GB/s where this reads 50-57 (a stand-alone two-thread test on c_fc's shape), and
  // GPT-2 decode from a mapped bf16 checkpoint ran ~40 % faster with this; two or four rows at a time
  // (fewer passes over p) halve the bandwidth, as interleaved rows do in out_in. Each p[o] adds its
  // rows in order: deterministic. Columns before the row's first cache line boundary (to_line) and
  // after its last full vector go one by one: independent adds here, not a chain as in out_in, and
  // masked steps measured no faster (mapped GPT-2 bf16, tensors 16 and 48 bytes past a line: 144.5
  // and 149.0 tok/s masked, 152.1 and 160.1 one by one; alternating series of 6 and 5).
  constexpr int W = S::kWidth;
  for (int64_t o = 0; o < out; ++o) p[o] = 0.0f;
  for (int64_t i = i0; i < i1; ++i) {
    const typename S::Vec xv = S::broadcast(x[i]);
    const int64_t row = i * out, head = std::min(out, to_line<S, DT>(w, row));
    const int64_t unroll_end = head + (out - head) / (4 * W) * (4 * W), vec_end = head + (out - head) / W * W;
    int64_t o = 0;
    for (; o < head; ++o) p[o] += x[i] * load_scalar<DT>(w, row + o);
    for (; o < unroll_end; o += 4 * W) {
      if constexpr (DT != 0) stream_ahead<S, DT, 4 * W>(w, row + o);
      S::store(p + o, S::fma(xv, load<S, DT>(w, row + o), S::load_f32(p + o)));
      S::store(p + o + W, S::fma(xv, load<S, DT>(w, row + o + W), S::load_f32(p + o + W)));
      S::store(p + o + 2 * W, S::fma(xv, load<S, DT>(w, row + o + 2 * W), S::load_f32(p + o + 2 * W)));
      S::store(p + o + 3 * W, S::fma(xv, load<S, DT>(w, row + o + 3 * W), S::load_f32(p + o + 3 * W)));
    }
    for (; o < vec_end; o += W) S::store(p + o, S::fma(xv, load<S, DT>(w, row + o), S::load_f32(p + o)));
    for (; o < out; ++o) p[o] += x[i] * load_scalar<DT>(w, row + o);
  }
}

// y[o] = Σ_k parts[k·stride + o] for k in [0, n), in order of k.
template <class S>
void sum_parts(const float* parts, int64_t n, int64_t stride, int64_t out, float* y) {
  constexpr int W = S::kWidth;
  int64_t o = 0;
  for (; o + W <= out; o += W) {
    typename S::Vec a = S::load_f32(parts + o);
    for (int64_t k = 1; k < n; ++k) a = S::add(a, S::load_f32(parts + k * stride + o));
    S::store(y + o, a);
  }
  for (; o < out; ++o) {
    float a = parts[o];
    for (int64_t k = 1; k < n; ++k) a += parts[k * stride + o];
    y[o] = a;
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
                   {out_in_rows<S, 0>, out_in_rows<S, 1>, out_in_rows<S, 2>},
                   {in_out<S, 0>, in_out<S, 1>, in_out<S, 2>},
                   {widen<S, 0>, widen<S, 1>, widen<S, 2>},
                   sum_parts<S>,
                   {},
                   {}};
}

}  // namespace
}  // namespace lineage::kernels::simd
