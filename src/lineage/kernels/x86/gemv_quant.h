// The GEMV loops for quantized matrices (QuantWeight, linear.h; GemvQuant, gemv.h) over a SIMD traits
// type, one instantiation per instruction set. Every weight is decoded to its defined value,
// (value(code) - zero) · scale in f32, before its f32 product with x: 4-bit codes through a 16-entry
// table of those values built once per group, 8-bit codes converted in registers. The traits add
// `Lut16`, `lut16(table, scale, zero)`, `nibbles(q, lut, even, odd)`, `halves(a, b)`, `bytes_int8(q)`,
// `bytes_fp8(q)`, `mul`, `sub` and `kQuantRows`. Internal linkage throughout (see gemv_simd.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include "lineage/kernels/linear.h"
#include "lineage/kernels/x86/gemv.h"
#include "lineage/kernels/x86/gemv_ggml.h"
#include "lineage/kernels/x86/gemv_mxfp4.h"

namespace lineage::kernels::simd {
namespace {

// The code values of the 16 nibbles: Int4's u - 8, Fp4's e2m1 (bit 3 the sign).
struct NibbleValues {
  float v[16];
};
constexpr NibbleValues nibble_values(QuantCodes c) {
  NibbleValues t{};
  for (int u = 0; u < 16; ++u) t.v[u] = c == QuantCodes::Int4 ? float(u - 8) : kMxfp4Codes[u];
  return t;
}
constexpr NibbleValues kInt4Values = nibble_values(QuantCodes::Int4), kFp4Values = nibble_values(QuantCodes::Fp4);

inline float group_zero(const QuantWeight& W, int64_t o, int64_t g) { return W.zero ? W.zero[o * W.groups + g] : 0.0f; }

// One weight row (o) against G rows of x: 4-bit codes, x prepared (mxfp4_prepare<W>: per run of 2W
// columns the W even ones, then the W odd ones). A run lies in one group (its table folds the zero and
// scale: the same rounding as decoding each weight) unless 2W does not divide the group. Four
// accumulators a row, their indices fixed at compile time so that they stay in registers, combined
// in a fixed tree: the same operations for every G, so each row gets the lone GEMV's bits.
// A run of 2V columns at c decoded through `lut` (the zero and scale folded in) and multiplied into
// accumulators P and P + 1 of each of the G rows of x.
template <class S, int G, int P>
inline void nibble_run(const float* xd, int64_t ldx, const uint8_t* q, int64_t c, const typename S::Lut16& lut,
                       typename S::Vec (&a)[G][4]) {
  constexpr int V = S::kWidth;
  typename S::Vec even, odd;
  S::nibbles(q + c / 2, lut, even, odd);
  for (int g = 0; g < G; ++g) {
    const float* xg = xd + g * ldx + c;
    a[g][P] = S::fma(S::load_f32(xg), even, a[g][P]);
    a[g][P + 1] = S::fma(S::load_f32(xg + V), odd, a[g][P + 1]);
  }
}

// The row's runs, group by group with no test per run: groups of two runs or more take their table
// once and their runs in pairs (alternate pairs of accumulators); groups of one run (AVX-512, 32
// columns) go two groups at a time; groups of 16 on AVX-512 (NVFP4) give each half of a run its own
// zero and scale after a lookup of the bare values; other groups narrower than a run by the general loop.
template <class S, int G>
inline void nibble_dot(const float* xd, int64_t ldx, const QuantWeight& W, int64_t o, float* y, int64_t ldy) {
  constexpr int V = S::kWidth;
  constexpr int64_t kRun = 2 * V;
  const float* values = W.codes == QuantCodes::Int4 ? kInt4Values.v : kFp4Values.v;
  const uint8_t* q = W.q + o * W.row_bytes;
  const float* sc = W.scale + o * W.groups;
  typename S::Vec a[G][4];
  for (int g = 0; g < G; ++g) a[g][0] = a[g][1] = a[g][2] = a[g][3] = S::zero();
  const auto table = [&](int64_t grp) { return S::lut16(values, sc[grp], group_zero(W, o, grp)); };
  if (W.group % kRun == 0 && W.group >= 2 * kRun) {
    for (int64_t c0 = 0, grp = 0; c0 < W.in; c0 += W.group, ++grp) {
      const typename S::Lut16 lut = table(grp);
      const int64_t end = c0 + W.group < W.in ? c0 + W.group : W.in;
      int64_t c = c0;
      for (; c + 2 * kRun <= end; c += 2 * kRun) {
        nibble_run<S, G, 0>(xd, ldx, q, c, lut, a);
        nibble_run<S, G, 2>(xd, ldx, q, c + kRun, lut, a);
      }
      if (c < end) nibble_run<S, G, 0>(xd, ldx, q, c, lut, a);
    }
  } else if (W.group == kRun) {
    int64_t c = 0;
    for (; c + 2 * kRun <= W.in; c += 2 * kRun) {
      nibble_run<S, G, 0>(xd, ldx, q, c, table(c / kRun), a);
      nibble_run<S, G, 2>(xd, ldx, q, c + kRun, table(c / kRun + 1), a);
    }
    if (c < W.in) nibble_run<S, G, 0>(xd, ldx, q, c, table(c / kRun), a);
  } else {  // 2V does not divide the group: each half of a run (V columns) in its group
    const typename S::Lut16 bare = S::lut16(values, 1.0f, 0.0f);
    const bool halves16 = W.group == V;
    for (int64_t c = 0, run = 0; c < W.in; c += kRun, ++run) {
      const int64_t ga = halves16 ? c / V : c / W.group, gb = halves16 ? ga + 1 : (c + V) / W.group;
      typename S::Vec even, odd;
      S::nibbles(q + c / 2, bare, even, odd);
      const typename S::Vec s = S::halves(sc[ga], sc[gb]), z = S::halves(group_zero(W, o, ga), group_zero(W, o, gb));
      even = S::mul(S::sub(even, z), s);
      odd = S::mul(S::sub(odd, z), s);
      for (int g = 0; g < G; ++g) {
        const float* xg = xd + g * ldx + c;
        if (run & 1) {
          a[g][2] = S::fma(S::load_f32(xg), even, a[g][2]);
          a[g][3] = S::fma(S::load_f32(xg + V), odd, a[g][3]);
        } else {
          a[g][0] = S::fma(S::load_f32(xg), even, a[g][0]);
          a[g][1] = S::fma(S::load_f32(xg + V), odd, a[g][1]);
        }
      }
    }
  }
  for (int g = 0; g < G; ++g) y[g * ldy] = S::sum(S::add(S::add(a[g][0], a[g][1]), S::add(a[g][2], a[g][3])));
}

// Lines (traits with `kLines`, AVX-512): 8·W columns whose W dwords of codes each hold 8 columns,
// dword k columns 8k … 8k + 7; `line(q, lut, w)` decodes them into w[j], lane k column 8k + j, a shift
// and a permute a vector (the runs above take a widening more for every two). x is prepared to match:
// within each line, vector j holds columns 8k + j. Taken for int4 codes whose groups and rows are
// whole lines (group 128 and per-channel rows on AVX-512), so a line has one table.
template <class S>
constexpr bool kHasLines = requires { S::kLines; };

enum QuantOrder { kOrderBytes = 0, kOrderRuns = 1, kOrderLines = 2 };

template <class S>
int quant_order(const QuantWeight& W) {
  if (W.codes == QuantCodes::Ggml) return ggml_order<S>(W);
  if (!W.nibbles()) return kOrderBytes;
  if constexpr (kHasLines<S>) {  // int4 only: the lines' tables are Int4's values
    if (W.codes != QuantCodes::Int4) return kOrderRuns;
    constexpr int64_t kLine = 8 * S::kWidth;
    if (W.group % kLine == 0 && W.in % kLine == 0) return kOrderLines;
  }
  return kOrderRuns;
}

// The line dot: four accumulators a row (vector j of a line into a[j % 4]), the same operations for
// every G, so each row gets the lone GEMV's bits.
template <class S, int G>
inline void line_dot(const float* xd, int64_t ldx, const QuantWeight& W, int64_t o, float* y, int64_t ldy) {
  constexpr int V = S::kWidth;
  constexpr int64_t kLine = 8 * V;
  const uint8_t* q = W.q + o * W.row_bytes;
  const float* sc = W.scale + o * W.groups;
  typename S::Vec a[G][4];
  for (int g = 0; g < G; ++g) a[g][0] = a[g][1] = a[g][2] = a[g][3] = S::zero();
  const auto line = [&](int64_t c, const typename S::Lut16& lut) {
    typename S::Vec w[8];
    S::prefetch_stream(reinterpret_cast<const char*>(q + c / 2) + kStreamAheadBytes);
    S::line(q + c / 2, lut, w);
    for (int g = 0; g < G; ++g) {
      const float* xg = xd + g * ldx + c;
      for (int j = 0; j < 8; ++j) a[g][j & 3] = S::fma(S::load_f32(xg + j * V), w[j], a[g][j & 3]);
    }
  };
  if (W.group == kLine) {  // one loop, a table a line (a nest of loops here costs the register moves)
    for (int64_t c = 0, grp = 0; c < W.in; c += kLine, ++grp) line(c, S::lut16(kInt4Values.v, sc[grp], group_zero(W, o, grp)));
  } else {
    for (int64_t c0 = 0, grp = 0; c0 < W.in; c0 += W.group, ++grp) {
      const typename S::Lut16 lut = S::lut16(kInt4Values.v, sc[grp], group_zero(W, o, grp));
      for (int64_t c = c0; c < c0 + W.group; c += kLine) line(c, lut);
    }
  }
  for (int g = 0; g < G; ++g) y[g * ldy] = S::sum(S::add(S::add(a[g][0], a[g][1]), S::add(a[g][2], a[g][3])));
}

template <class S, QuantCodes C>
inline typename S::Vec bytes_of(const uint8_t* q) {
  if constexpr (C == QuantCodes::Int8) return S::bytes_int8(q);
  else return S::bytes_fp8(q);
}

// The same for 8-bit codes, x in its own order: vector k of a row accumulates into a[k % 4] (groups of
// a multiple of 4 vectors: four at a time with fixed indices; other groups one at a time).
template <class S, int G, QuantCodes C>
inline void byte_dot(const float* x, int64_t ldx, const QuantWeight& W, int64_t o, float* y, int64_t ldy) {
  constexpr int V = S::kWidth;
  const uint8_t* q = W.q + o * W.row_bytes;
  const float* sc = W.scale + o * W.groups;
  typename S::Vec a[G][4];
  for (int g = 0; g < G; ++g) a[g][0] = a[g][1] = a[g][2] = a[g][3] = S::zero();
  const auto one = [&](int64_t c, typename S::Vec s, typename S::Vec z, typename S::Vec(&acc)[G][4], auto p) {
    typename S::Vec w = bytes_of<S, C>(q + c);
    w = S::mul(W.zero ? S::sub(w, z) : w, s);
    for (int g = 0; g < G; ++g) acc[g][p.value] = S::fma(S::load_f32(x + g * ldx + c), w, acc[g][p.value]);
  };
  const bool whole = W.group % (4 * V) == 0 && W.in % (4 * V) == 0;
  int64_t k = 0;
  for (int64_t c0 = 0; c0 < W.in; c0 += W.group) {
    const int64_t grp = c0 / W.group, c1 = c0 + W.group < W.in ? c0 + W.group : W.in;
    const typename S::Vec s = S::broadcast(sc[grp]), z = S::broadcast(group_zero(W, o, grp));
    if (whole) {
      for (int64_t c = c0; c < c1; c += 4 * V) {
        one(c, s, z, a, std::integral_constant<int, 0>{});
        one(c + V, s, z, a, std::integral_constant<int, 1>{});
        one(c + 2 * V, s, z, a, std::integral_constant<int, 2>{});
        one(c + 3 * V, s, z, a, std::integral_constant<int, 3>{});
      }
      continue;
    }
    for (int64_t c = c0; c < c1; c += V, ++k) {
      switch (k & 3) {
        case 0: one(c, s, z, a, std::integral_constant<int, 0>{}); break;
        case 1: one(c, s, z, a, std::integral_constant<int, 1>{}); break;
        case 2: one(c, s, z, a, std::integral_constant<int, 2>{}); break;
        default: one(c, s, z, a, std::integral_constant<int, 3>{}); break;
      }
    }
  }
  for (int g = 0; g < G; ++g) y[g * ldy] = S::sum(S::add(S::add(a[g][0], a[g][1]), S::add(a[g][2], a[g][3])));
}

template <class S, int G>
inline void quant_dot(const float* xd, int64_t ldx, const QuantWeight& W, int64_t o, float* y, int64_t ldy) {
  if constexpr (kHasLines<S>) {
    if (quant_order<S>(W) == kOrderLines) return line_dot<S, G>(xd, ldx, W, o, y, ldy);
  }
  if (W.codes == QuantCodes::Ggml) {
    ggml_dot<S, G>(xd, ldx, W, o, y, ldy);
  } else if (W.nibbles()) {
    nibble_dot<S, G>(xd, ldx, W, o, y, ldy);
  } else if (W.codes == QuantCodes::Int8) {
    byte_dot<S, G, QuantCodes::Int8>(xd, ldx, W, o, y, ldy);
  } else {
    byte_dot<S, G, QuantCodes::Fp8>(xd, ldx, W, o, y, ldy);
  }
}

template <class S>
void quant_prepare(const QuantWeight& W, const float* x, float* xd) {
  constexpr int V = S::kWidth;
  switch (quant_order<S>(W)) {
    case kOrderLines:
      for (int64_t c0 = 0; c0 < W.in; c0 += 8 * V)
        for (int j = 0; j < 8; ++j)
          for (int k = 0; k < V; ++k) xd[c0 + j * V + k] = x[c0 + 8 * k + j];
      break;
    case kOrderRuns: mxfp4_prepare<V>(x, W.in, xd); break;
    case kOrderGgmlLines: ggml_prepare_lines(x, W.in, xd); break;
    default:
      for (int64_t c = 0; c < W.in; ++c) xd[c] = x[c];
  }
}

template <class S>
void quant_out_in(const float* xd, const QuantWeight& W, int64_t o0, int64_t o1, float* y) {
  for (int64_t o = o0; o < o1; ++o) quant_dot<S, 1>(xd, 0, W, o, y + o, 0);
}

// Each weight row against S::kQuantRows rows of x at a time, the rest one by one; later passes over a
// row read it from L1.
template <class S>
void quant_out_in_rows(const float* xd, int64_t ldx, int64_t rows, const QuantWeight& W, int64_t o0, int64_t o1,
                       float* y, int64_t ldy) {
  constexpr int G = S::kQuantRows;
  for (int64_t o = o0; o < o1; ++o) {
    int64_t g = 0;
    for (; g + G <= rows; g += G) quant_dot<S, G>(xd + g * ldx, ldx, W, o, y + g * ldy + o, ldy);
    for (; g < rows; ++g) quant_dot<S, 1>(xd + g * ldx, 0, W, o, y + g * ldy + o, 0);
  }
}

// Rows [o0, o1) decoded in prepared order, dst row stride W.in: the values the GEMVs multiply.
template <class S>
void quant_decode(const QuantWeight& W, int64_t o0, int64_t o1, float* dst) {
  constexpr int V = S::kWidth;
  if (W.codes == QuantCodes::Ggml) return ggml_decode<S>(W, o0, o1, dst);
  if constexpr (kHasLines<S>) {
    if (quant_order<S>(W) == kOrderLines) {
      for (int64_t o = o0; o < o1; ++o, dst += W.in)
        for (int64_t c = 0; c < W.in; c += 8 * V) {
          const int64_t g = c / W.group;
          typename S::Vec w[8];
          S::line(W.q + o * W.row_bytes + c / 2, S::lut16(kInt4Values.v, W.scale[o * W.groups + g], group_zero(W, o, g)), w);
          for (int j = 0; j < 8; ++j) S::store(dst + c + j * V, w[j]);
        }
      return;
    }
  }
  for (int64_t o = o0; o < o1; ++o, dst += W.in) {
    const uint8_t* q = W.q + o * W.row_bytes;
    for (int64_t c = 0; c < W.in; c += W.nibbles() ? 2 * V : V) {
      const int64_t g = c / W.group;
      const float s = W.scale[o * W.groups + g], z = group_zero(W, o, g);
      if (W.nibbles()) {
        const float* values = W.codes == QuantCodes::Int4 ? kInt4Values.v : kFp4Values.v;
        const int64_t g2 = (c + V) / W.group;
        typename S::Vec even, odd;
        S::nibbles(q + c / 2, S::lut16(values, 1.0f, 0.0f), even, odd);
        const typename S::Vec sv = S::halves(s, W.scale[o * W.groups + g2]), zv = S::halves(z, group_zero(W, o, g2));
        S::store(dst + c, S::mul(S::sub(even, zv), sv));
        S::store(dst + c + V, S::mul(S::sub(odd, zv), sv));
      } else {
        const typename S::Vec w = W.codes == QuantCodes::Int8 ? S::bytes_int8(q + c) : S::bytes_fp8(q + c);
        S::store(dst + c, S::mul(S::sub(w, S::broadcast(z)), S::broadcast(s)));
      }
    }
  }
}

template <class S>
GemvQuant make_quant_table() {
  return GemvQuant{quant_order<S>, quant_prepare<S>, quant_out_in<S>, quant_out_in_rows<S>, quant_decode<S>};
}

}  // namespace
}  // namespace lineage::kernels::simd
