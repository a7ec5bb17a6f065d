// AVX-512 build of prefill attention's query tile (attention.cpp keeps the portable one). The tile's
// up to 64 queries lie across the 16 lanes of four zmm registers: the scores are computed transposed,
// S'[key, query], by a register tile that broadcasts key elements against the pre-scaled queries (no
// packing of K), so the online softmax runs down columns, 16 queries at a time, with no horizontal
// reductions; the weighted values are a register tile that reads V's rows in place.

// GCC 12 flags the _mm512_undefined_* placeholders inside its own AVX-512 intrinsics as maybe
// uninitialized once they are inlined (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "lineage/kernels/x86/attention.h"
#include "lineage/kernels/x86/avx512_util.h"
#include "lineage/kernels/x86/vmath_loops.h"

namespace lineage::kernels {
namespace {

constexpr int64_t kQ = kAttentionQueryTile;  // 64 queries = 4 zmm of lanes
constexpr int64_t kKeys = 64;                // keys per step of the online softmax: S' and P' stay in L1
constexpr int kRows = 6;                     // register tiles: 6 × 4 = 24 accumulators
constexpr int kMaxOneRegisters = kAttentionDecodeMaxHead / 16;

inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1); }


// The register tile of both products: c[m, 0:64] (+)= Σ_s a[m·a_row + s·a_step] · b[s·b_step + 0:64]
// for M rows, s < steps; lanes of the 64 columns outside `cols` are neither read nor written.
//   scores:          a = K (a_row hd, a_step 1), b = Q' (b_step 64), c = S', steps = hd;
//   weighted values: a = P' (a_row 1, a_step 64), b = V from column c0 (b_step hd), c += O, steps = keys.
struct Columns {
  __mmask16 k[4];
  explicit Columns(int64_t n) : k{lanes(n), lanes(n - 16), lanes(n - 32), lanes(n - 48)} {}
};

// Loads 16 floats, or the lanes of m only. A masked load is not the same as a plain one on the
// development CPU (Zen 5): streaming K and V rows through masked loads halved decode attention's
// bandwidth, so where every lane is wanted (Full) the plain load runs.
template <bool Full>
inline __m512 load(const float* x, __mmask16 m) {
  return Full ? _mm512_loadu_ps(x) : _mm512_maskz_loadu_ps(m, x);
}
template <bool Full>
inline void store(float* x, __mmask16 m, __m512 v) {
  if (Full) _mm512_storeu_ps(x, v);
  else _mm512_mask_storeu_ps(x, m, v);
}

template <int M, bool Full>
void tile(const float* a, int64_t a_row, int64_t a_step, int64_t steps, const float* b, int64_t b_step, Columns cols,
          float* c, int64_t ldc, bool accumulate) {
  __m512 acc[M][4];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < 4; ++v)
      acc[m][v] = accumulate ? load<Full>(c + m * ldc + 16 * v, cols.k[v]) : _mm512_setzero_ps();
  for (int64_t s = 0; s < steps; ++s, a += a_step, b += b_step) {
    const __m512 b0 = load<Full>(b, cols.k[0]), b1 = load<Full>(b + 16, cols.k[1]), b2 = load<Full>(b + 32, cols.k[2]),
                 b3 = load<Full>(b + 48, cols.k[3]);
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m512 am = _mm512_set1_ps(a[m * a_row]);
      acc[m][0] = _mm512_fmadd_ps(am, b0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(am, b1, acc[m][1]);
      acc[m][2] = _mm512_fmadd_ps(am, b2, acc[m][2]);
      acc[m][3] = _mm512_fmadd_ps(am, b3, acc[m][3]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < 4; ++v) store<Full>(c + m * ldc + 16 * v, cols.k[v], acc[m][v]);
}

using TileFn = void (*)(const float*, int64_t, int64_t, int64_t, const float*, int64_t, Columns, float*, int64_t, bool);
// The register tile for m rows (1 .. kRows).
TileFn tile_for(int64_t m, bool full) {
  static constexpr TileFn full_tiles[kRows + 1] = {nullptr,           tile<1, true>, tile<2, true>, tile<3, true>,
                                                   tile<4, true>, tile<5, true>, tile<6, true>};
  static constexpr TileFn masked_tiles[kRows + 1] = {nullptr,            tile<1, false>, tile<2, false>, tile<3, false>,
                                                     tile<4, false>, tile<5, false>, tile<6, false>};
  return (full ? full_tiles : masked_tiles)[m];
}

// One query against n_keys keys, online softmax over key tiles of 64; the query and the running
// output stay in NV zmm registers (hd <= 16·NV; Full: hd = 16·NV).

template <int NV, bool Full>
void attend_one(const float* q, int64_t n_keys, const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t hd,
                float scale, float* out) {
  __mmask16 km[NV];
  for (int u = 0; u < NV; ++u) km[u] = lanes(hd - 16 * u);
  __m512 qv[NV], acc[NV];
#pragma GCC unroll 8
  for (int u = 0; u < NV; ++u) {
    qv[u] = _mm512_mul_ps(_mm512_set1_ps(scale), _mm512_maskz_loadu_ps(km[u], q + 16 * u));
    acc[u] = _mm512_setzero_ps();
  }
  alignas(64) float s[kKeys], p[kKeys];
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = 0; j0 < n_keys; j0 += kKeys) {
    const int64_t n = std::min(kKeys, n_keys - j0);
    const float* kj = k + j0 * ldk;
    const char* vrow = reinterpret_cast<const char*>(v + j0 * ldv);
    // This tile's V rows are requested while its K rows are read: two streams in flight. Sixteen
    // keys' products are summed across lanes together (one transposing reduction, ~2.5 instructions
    // a key, where a reduction per key took ~10: a stream's instructions per line decide how many
    // lines it keeps in flight). Heads over 64 wide take a key at a time: their 16 products would
    // not fit in the registers beside the query and the output, and the reduction weighs less
    // against their longer rows.
    auto score = [&](const float* kr, const char* vr) {
      for (int64_t b = 0; b < hd * 4; b += 64) _mm_prefetch(vr + b, _MM_HINT_T0);
      __m512 d = _mm512_mul_ps(qv[0], load<Full>(kr, km[0]));
#pragma GCC unroll 8
      for (int u = 1; u < NV; ++u) d = _mm512_fmadd_ps(qv[u], load<Full>(kr + 16 * u, km[u]), d);
      return d;
    };
    int64_t key = 0;
    if constexpr (NV <= 4)
      for (; key + 16 <= n; key += 16) {
        __m512 d[16];
#pragma GCC unroll 16
        for (int r = 0; r < 16; ++r, kj += ldk, vrow += ldv * 4) d[r] = score(kj, vrow);
        _mm512_store_ps(s + key, avx512::hsum16(d));
      }
    for (; key < n; ++key, kj += ldk, vrow += ldv * 4) s[key] = _mm512_reduce_add_ps(score(kj, vrow));
    __m512 mx = _mm512_set1_ps(m);
    for (int64_t j = 0; j < n; j += 16) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, lanes(n - j), s + j));
    const float m_new = _mm512_reduce_max_ps(mx);
    const __m512 vm = _mm512_set1_ps(m_new);
    for (int64_t j = 0; j < n; j += 16) _mm512_store_ps(s + j, _mm512_sub_ps(_mm512_load_ps(s + j), vm));
    vmath_loops::exp_nonpositive(s, p, n);
    const float correction = std::exp(m - m_new);  // exp(-inf) = 0 on the first tile
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) sum = _mm512_add_ps(sum, _mm512_maskz_load_ps(lanes(n - j), p + j));
    l = l * correction + _mm512_reduce_add_ps(sum);
    m = m_new;
    const __m512 vc = _mm512_set1_ps(correction);
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) acc[u] = _mm512_mul_ps(acc[u], vc);
    const float* vj = v + j0 * ldv;
    for (int64_t j = 0; j < n; ++j, vj += ldv) {
      const __m512 pj = _mm512_set1_ps(p[j]);
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) acc[u] = _mm512_fmadd_ps(pj, load<Full>(vj + 16 * u, km[u]), acc[u]);
    }
  }
  const __m512 inv = _mm512_set1_ps(1.0f / l);
  for (int u = 0; u < NV; ++u) _mm512_mask_storeu_ps(out + 16 * u, km[u], _mm512_mul_ps(inv, acc[u]));
}

using OneFn = void (*)(const float*, int64_t, const float*, int64_t, const float*, int64_t, int64_t, float, float*);

// The decode step for a head of `registers` zmm (1 .. kMaxOneRegisters).
OneFn one_for(int64_t registers, bool full) {
  static constexpr OneFn full_ones[kMaxOneRegisters + 1] = {
      nullptr, attend_one<1, true>, attend_one<2, true>, attend_one<3, true>, attend_one<4, true>,
      attend_one<5, true>, attend_one<6, true>, attend_one<7, true>, attend_one<8, true>};
  static constexpr OneFn masked_ones[kMaxOneRegisters + 1] = {
      nullptr, attend_one<1, false>, attend_one<2, false>, attend_one<3, false>, attend_one<4, false>,
      attend_one<5, false>, attend_one<6, false>, attend_one<7, false>, attend_one<8, false>};
  return (full ? full_ones : masked_ones)[registers];
}

}  // namespace

void attend_tile_avx512(const float* q, int64_t ldq, int64_t nq, int64_t first_pos, const float* k, int64_t ldk,
                        const float* v, int64_t ldv, int64_t dk, int64_t dv, float scale, float* out, int64_t ldo) {
  // Per-thread working space, grown once: the queries transposed and pre-scaled (Q'[c, i], zero past
  // nq), S' and P' for one step of keys, the running output O[i, c] (+ 16 floats to align).
  thread_local std::vector<float> buf;
  buf.resize(size_t(kQ * dk + 2 * kKeys * kQ + kQ * dv + 16) + 16);
  float* QT = buf.data() + (16 - reinterpret_cast<uintptr_t>(buf.data()) / 4 % 16) % 16;  // 64-byte aligned
  float* ST = QT + kQ * dk;
  float* PT = ST + kKeys * kQ;
  float* O = PT + kKeys * kQ;
  // 16 queries × 16 columns at a time through a register transpose (element by element, the strided
  // stores took 7 % of the tile's time).
  const __m512 vs = _mm512_set1_ps(scale);
  for (int64_t i0 = 0; i0 < kQ; i0 += 16)
    for (int64_t c0 = 0; c0 < dk; c0 += 16) {
      const __mmask16 cols = lanes(dk - c0);
      __m512i r[16];
      for (int64_t i = 0; i < 16; ++i) {
        const float* row = q + (i0 + i) * ldq + c0;
        r[i] = i0 + i < nq ? _mm512_castps_si512(_mm512_mul_ps(vs, _mm512_maskz_loadu_ps(cols, row)))
                           : _mm512_setzero_si512();
      }
      avx512::transpose16x16(r);
      for (int64_t c = 0; c < std::min<int64_t>(16, dk - c0); ++c)
        _mm512_store_si512(QT + (c0 + c) * kQ + i0, r[c]);
    }
  std::fill(O, O + nq * dv, 0.0f);
  __m512 m[4], l[4];  // running maximum and sum of each query's weights, 16 queries a register
  for (int g = 0; g < 4; ++g) m[g] = _mm512_set1_ps(-INFINITY), l[g] = _mm512_setzero_ps();
  const int64_t groups = (nq + 15) / 16;
  const int64_t n_keys = first_pos + nq;  // keys visible to the tile's last query
  alignas(64) float corr[kQ];
  for (int64_t j0 = 0; j0 < n_keys; j0 += kKeys) {
    const int64_t nk = std::min(kKeys, n_keys - j0);
    for (int64_t j = 0; j < nk; j += kRows)
      tile_for(std::min<int64_t>(kRows, nk - j), true)(k + (j0 + j) * ldk, ldk, 1, dk, QT, kQ, Columns(kQ),
                                                       ST + j * kQ, kQ, false);
    // Per group of 16 queries: the running maximum over the visible keys, then one pass that shifts
    // the scores by it, exponentiates (0 where not visible) and sums the weights.
    for (int64_t g = 0; g < groups; ++g) {
      // Key j0 + j is visible to query i = 16g + lane when lane >= j0 + j - first_pos - 16g.
      const int64_t shift = j0 - first_pos - 16 * g;
      auto visible = [&](int64_t j) -> __mmask16 {
        const int64_t t = shift + j;
        return t <= 0 ? __mmask16(0xffff) : t >= 16 ? __mmask16(0) : __mmask16(0xffffu << t);
      };
      __m512 mx = m[g];
      for (int64_t j = 0; j < nk; ++j) mx = _mm512_mask_max_ps(mx, visible(j), mx, _mm512_load_ps(ST + j * kQ + 16 * g));
      __m512 sum = _mm512_setzero_ps();
      for (int64_t j = 0; j < nk; ++j) {
        const __m512 t = _mm512_sub_ps(_mm512_load_ps(ST + j * kQ + 16 * g), mx);
        const __m512 p = _mm512_maskz_mov_ps(visible(j), avx512::exp_nonpositive16(t));
        _mm512_store_ps(PT + j * kQ + 16 * g, p);
        sum = _mm512_add_ps(sum, p);
      }
      // m_old - m_new rescales the running sums (-inf - finite on the first step: exp gives 0).
      const __m512 c = avx512::exp_nonpositive16(_mm512_sub_ps(m[g], mx));
      _mm512_store_ps(corr + 16 * g, c);
      l[g] = _mm512_fmadd_ps(l[g], c, sum);
      m[g] = mx;
    }
    for (int64_t i = 0; i < nq; ++i) {
      if (corr[i] == 1.0f) continue;
      const __m512 vc = _mm512_set1_ps(corr[i]);
      for (int64_t c = 0; c < dv; c += 16) {
        const __mmask16 km = lanes(dv - c);
        _mm512_mask_storeu_ps(O + i * dv + c, km, _mm512_mul_ps(vc, _mm512_maskz_loadu_ps(km, O + i * dv + c)));
      }
    }
    // Queries [i, i + rows) see keys below position first_pos + i + rows: on the diagonal the
    // weights past that are zeros, and their rows of V are skipped.
    for (int64_t i = 0; i < nq; i += kRows) {
      const int64_t rows = std::min<int64_t>(kRows, nq - i), keys = std::min(nk, first_pos + i + rows - j0);
      if (keys <= 0) continue;
      for (int64_t c0 = 0; c0 < dv; c0 += 64)
        tile_for(rows, dv - c0 >= 64)(PT + i, 1, kQ, keys, v + j0 * ldv + c0, ldv, Columns(dv - c0), O + i * dv + c0,
                                      dv, true);
    }
  }
  alignas(64) float total[kQ];
  for (int g = 0; g < 4; ++g) _mm512_store_ps(total + 16 * g, l[g]);
  for (int64_t i = 0; i < nq; ++i) {
    const __m512 inv = _mm512_set1_ps(1.0f / total[i]);
    for (int64_t c = 0; c < dv; c += 16) {
      const __mmask16 km = lanes(dv - c);
      _mm512_mask_storeu_ps(out + i * ldo + c, km, _mm512_mul_ps(inv, _mm512_maskz_loadu_ps(km, O + i * dv + c)));
    }
  }
}

void attend_one_avx512(const float* q, int64_t n_keys, const float* k, int64_t ldk, const float* v, int64_t ldv,
                       int64_t hd, float scale, float* out) {
  one_for((hd + 15) / 16, hd % 16 == 0)(q, n_keys, k, ldk, v, ldv, hd, scale, out);
}

}  // namespace lineage::kernels
