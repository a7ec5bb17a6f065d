// The int8-activation mode for int4 and int8 codes (QuantWeight::int8_dot, linear.h) on AVX512_VNNI:
// x quantized to int8 per block of 32 columns, and each vpdpbusd adding 64 products of unsigned codes
// and signed x bytes in int32, where the exact path decodes every weight to f32.
//
// x prepared, per line of kLine columns (128 for 4-bit codes, 64 for 8-bit):
//   4-bit: 64 bytes of x codes at the even columns, 64 at the odd ones; 8-bit: 64 bytes of x codes;
//   then -offset·X[16] (int32; X lane k's sum of x codes over columns 8k … 8k + 7, or 4k … 4k + 3;
//   offset 8 for nibbles, 128 for bytes), dx[16] (f32, the scale of lane k's block) and X[16].
// A weight row's line gives, in lane k, D = Σ u·xq over the lane's columns (u the stored code: the
// nibble, or the byte whose value is u - 128) less (offset + zero)·X, so D = Σ (value - zero)·xq
// exactly; then acc += f32(D) · (scale · dx) in f32, lines into four accumulators in turn, summed in
// a fixed tree: the same operations for every number of rows of x. Speed and accuracy:
// docs/quantization.md.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "lineage/kernels/linear.h"
#include "lineage/kernels/x86/avx512_util.h"
#include "lineage/kernels/x86/gemv.h"

namespace lineage::kernels {
namespace {

// The x orders (GemvQuant::order): after gemv_quant.h's three, one per line width.
constexpr int kOrderNibbles = 3, kOrderBytes = 4;
constexpr int64_t kBlock = 32;  // columns of x a scale

int64_t line_of(const QuantWeight& W) { return W.codes == QuantCodes::Int4 ? 128 : 64; }

int order(const QuantWeight& W) {
  if (W.codes != QuantCodes::Int4 && W.codes != QuantCodes::Int8) return -1;
  const int64_t line = line_of(W);
  if (W.in % line || W.group % line) return -1;
  return W.codes == QuantCodes::Int4 ? kOrderNibbles : kOrderBytes;
}

// The block's scale and codes, as ref::quantize_x_int8 defines them.
void quantize_block(const float* x, int8_t* q, float& d) {
  float amax = 0.0f;
  bool nan = false;
  for (int64_t c = 0; c < kBlock; ++c) {
    nan |= x[c] != x[c];
    amax = std::fmax(amax, std::fabs(x[c]));
  }
  d = nan ? NAN : amax / 127.0f;  // a NaN in x makes the block's products NaN, as in the exact path
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int64_t c = 0; c < kBlock; ++c) {
    const float r = std::nearbyint(x[c] * inv);
    q[c] = int8_t(r != r ? 0 : r > 127.0f ? 127 : r < -127.0f ? -127 : int(r));
  }
}

void prepare(const QuantWeight& W, const float* x, float* xd) {
  const int64_t line = line_of(W);
  auto* out = reinterpret_cast<uint8_t*>(xd);
  int8_t q[128];
  float d[4];
  const int offset = W.codes == QuantCodes::Int4 ? 8 : 128;
  for (int64_t c0 = 0; c0 < W.in; c0 += line, out += line + 192) {
    for (int64_t b = 0; b < line / kBlock; ++b) quantize_block(x + c0 + b * kBlock, q + b * kBlock, d[b]);
    int32_t X[16], NX[16];
    float dx[16];
    const int64_t per_lane = line / 16;  // 8 or 4 columns
    for (int k = 0; k < 16; ++k) {
      int32_t s = 0;
      for (int64_t j = 0; j < per_lane; ++j) s += q[k * per_lane + j];
      X[k] = s;
      NX[k] = -offset * s;
      dx[k] = d[k * per_lane / kBlock];
    }
    if (line == 128) {
      for (int i = 0; i < 64; ++i) {
        out[i] = uint8_t(q[2 * i]);
        out[64 + i] = uint8_t(q[2 * i + 1]);
      }
    } else {
      std::memcpy(out, q, 64);
    }
    std::memcpy(out + line, NX, 64);
    std::memcpy(out + line + 64, dx, 64);
    std::memcpy(out + line + 128, X, 64);
  }
}

// Line l of a weight row (codes q, 64 bytes a line) into accumulator P of each of G prepared rows of
// x (ldx floats apart; P fixed at compile time and the function always inlined, so that the
// accumulators stay in registers: on the stack the kernel ran three times slower). s: the line's scale; z: its zero point
// (zr: whether there are any).
template <int G, bool kNibbles, int P>
[[gnu::always_inline]] inline void line(const uint8_t* xd, int64_t ldx, const uint8_t* q, int64_t l, __m512 s, __m512i z, bool zr,
                 __m512 (&a)[G][4]) {
  constexpr int64_t kLine = kNibbles ? 128 : 64, kStride = kLine + 192;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const auto* xl = xd + l * kStride;
  // requested kStreamAheadBytes ahead, non-temporal, as the bf16 dot GEMV does (cold Qwen3-Next
  // q_proj: 222 → 212 µs)
  _mm_prefetch(reinterpret_cast<const char*>(q + l * 64) + kStreamAheadBytes, _MM_HINT_NTA);
  __m512i lo, hi;
  if constexpr (kNibbles) {
    const __m512i v = _mm512_loadu_si512(q + l * 64);
    lo = _mm512_and_si512(v, low4);
    hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
  } else {
    lo = _mm512_loadu_si512(q + l * 64);
    hi = lo;
  }
  for (int g = 0; g < G; ++g) {
    const uint8_t* xg = xl + g * ldx * 4;
    __m512i acc = _mm512_loadu_si512(xg + kLine);  // -offset·X
    if (zr) acc = _mm512_sub_epi32(acc, _mm512_mullo_epi32(_mm512_loadu_si512(xg + kLine + 128), z));
    acc = _mm512_dpbusd_epi32(acc, lo, _mm512_loadu_si512(xg));
    if constexpr (kNibbles) acc = _mm512_dpbusd_epi32(acc, hi, _mm512_loadu_si512(xg + 64));
    const __m512 sd = _mm512_mul_ps(_mm512_loadu_ps(reinterpret_cast<const float*>(xg + kLine + 64)), s);
    // (the masked conversion: GCC 12 warns of the plain one's undefined pass-through operand)
    a[g][P] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, acc), sd, a[g][P]);
  }
}

// Sets a group's scale and zero point at its first line (a counter: a division a line cost more than
// the line).
struct GroupCursor {
  const float* sc;
  const float* zr;
  int64_t per_group, grp = 0, next = 0;
  [[gnu::always_inline]] void operator()(int64_t l, __m512& s, __m512i& z) {
    if (l != next) return;
    s = _mm512_set1_ps(sc[grp]);
    if (zr) z = _mm512_set1_epi32(int(zr[grp]));
    ++grp, next += per_group;
  }
};

// One weight row (o) against G prepared rows of x: lines into the four accumulators in turn.
template <int G, bool kNibbles>
inline void dot(const float* xd, int64_t ldx, const QuantWeight& W, int64_t o, float* y, int64_t ldy) {
  constexpr int64_t kLine = kNibbles ? 128 : 64;
  const uint8_t* q = W.q + o * W.row_bytes;
  const auto* x = reinterpret_cast<const uint8_t*>(xd);
  const float* sc = W.scale + o * W.groups;
  const float* zr = W.zero ? W.zero + o * W.groups : nullptr;
  __m512 a[G][4];
  for (int g = 0; g < G; ++g) a[g][0] = a[g][1] = a[g][2] = a[g][3] = _mm512_setzero_ps();
  const int64_t lines = W.in / kLine, per_group = W.group / kLine;
  __m512 s = _mm512_setzero_ps();
  __m512i z = _mm512_setzero_si512();
  GroupCursor at{sc, zr, per_group};
  int64_t l = 0;
  for (; l + 4 <= lines; l += 4) {
    at(l, s, z), line<G, kNibbles, 0>(x, ldx, q, l, s, z, zr, a);
    at(l + 1, s, z), line<G, kNibbles, 1>(x, ldx, q, l + 1, s, z, zr, a);
    at(l + 2, s, z), line<G, kNibbles, 2>(x, ldx, q, l + 2, s, z, zr, a);
    at(l + 3, s, z), line<G, kNibbles, 3>(x, ldx, q, l + 3, s, z, zr, a);
  }
  if (l < lines) at(l, s, z), line<G, kNibbles, 0>(x, ldx, q, l, s, z, zr, a), ++l;
  if (l < lines) at(l, s, z), line<G, kNibbles, 1>(x, ldx, q, l, s, z, zr, a), ++l;
  if (l < lines) at(l, s, z), line<G, kNibbles, 2>(x, ldx, q, l, s, z, zr, a), ++l;
  for (int g = 0; g < G; ++g)
    y[g * ldy] = avx512::hsum(_mm512_add_ps(_mm512_add_ps(a[g][0], a[g][1]), _mm512_add_ps(a[g][2], a[g][3])));
}

template <int G>
inline void dot_any(const float* xd, int64_t ldx, const QuantWeight& W, int64_t o, float* y, int64_t ldy) {
  if (W.codes == QuantCodes::Int4) dot<G, true>(xd, ldx, W, o, y, ldy);
  else dot<G, false>(xd, ldx, W, o, y, ldy);
}

void out_in(const float* xd, const QuantWeight& W, int64_t o0, int64_t o1, float* y) {
  for (int64_t o = o0; o < o1; ++o) dot_any<1>(xd, 0, W, o, y + o, 0);
}

// Four rows of x at a time against each weight row, the rest one by one, over tiles of kTile weight
// rows: a tile's codes stay in L1 while each four rows of x pass (four rows of x against every weight
// row in turn thrashed L1 from 8 rows of x on: 8 rows of the Kimi expert 355 → µs).
void out_in_rows(const float* xd, int64_t ldx, int64_t rows, const QuantWeight& W, int64_t o0, int64_t o1, float* y,
                 int64_t ldy) {
  constexpr int G = 4;
  constexpr int64_t kTile = 8;
  for (int64_t t0 = o0; t0 < o1; t0 += kTile) {
    const int64_t t1 = std::min(o1, t0 + kTile);
    int64_t g = 0;
    for (; g + G <= rows; g += G)
      for (int64_t o = t0; o < t1; ++o) dot_any<G>(xd + g * ldx, ldx, W, o, y + g * ldy + o, ldy);
    for (; g < rows; ++g)
      for (int64_t o = t0; o < t1; ++o) dot_any<1>(xd + g * ldx, 0, W, o, y + g * ldy + o, 0);
  }
}

}  // namespace

const GemvQuant& gemv_quant_int8_avx512vnni() {
  static const GemvQuant table{order, prepare, out_in, out_in_rows, nullptr};
  return table;
}

}  // namespace lineage::kernels
